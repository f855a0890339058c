//! Classification of everything E2B can answer, in one place per kind of answer:
//! control-plane statuses ([`api_class`]), Connect error codes ([`Code::class`]), envd HTTP
//! statuses ([`envd_status_failure`]) and failed exchanges ([`call_failure`]). Errors are
//! classified where they are read (status, `code` field, `error_code` field), never by searching
//! message text.

mod api;
mod body;
mod call;
mod envd;

pub use api::{
    api_call_failure, api_class, api_failure, api_retry_hint, is_api_error_body, retry_hint, ApiOp,
    ApiStatus, RetryHint,
};
pub use call::{call_failure, CallFailure, Limits};
pub use envd::{end_of_stream_failure, envd_status_failure, Code, EnvdFailure, RpcStatus, Subject};
