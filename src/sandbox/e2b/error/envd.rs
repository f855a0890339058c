//! envd answers: Connect error codes, error bodies and end-of-stream messages, and what each
//! means for the operation that got it.

use std::fmt;

use serde_json::Value;

use super::body::ErrorBody;
use super::call::{BoxError, CallFailure};
use crate::sandbox::{ErrorClass, SandboxError};

/// A Connect error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

const CODES: [(Code, &str); 16] = [
    (Code::Canceled, "canceled"),
    (Code::Unknown, "unknown"),
    (Code::InvalidArgument, "invalid_argument"),
    (Code::DeadlineExceeded, "deadline_exceeded"),
    (Code::NotFound, "not_found"),
    (Code::AlreadyExists, "already_exists"),
    (Code::PermissionDenied, "permission_denied"),
    (Code::ResourceExhausted, "resource_exhausted"),
    (Code::FailedPrecondition, "failed_precondition"),
    (Code::Aborted, "aborted"),
    (Code::OutOfRange, "out_of_range"),
    (Code::Unimplemented, "unimplemented"),
    (Code::Internal, "internal"),
    (Code::Unavailable, "unavailable"),
    (Code::DataLoss, "data_loss"),
    (Code::Unauthenticated, "unauthenticated"),
];

impl Code {
    pub fn parse(s: &str) -> Option<Code> {
        CODES.iter().find(|(_, name)| *name == s).map(|(c, _)| *c)
    }

    pub fn as_str(self) -> &'static str {
        CODES
            .iter()
            .find(|(c, _)| *c == self)
            .map_or("unknown", |(_, name)| name)
    }

    /// The code a plain HTTP error status stands for (the Connect protocol's table, as the
    /// SDK applies it to answers that carry no Connect code).
    pub fn from_http_status(status: u16) -> Code {
        match status {
            400 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 => Code::AlreadyExists,
            // 507: no space left in the sandbox.
            413 | 429 | 507 => Code::ResourceExhausted,
            499 => Code::Canceled,
            500 => Code::Internal,
            501 | 505 => Code::Unimplemented,
            502 | 503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Unknown,
        }
    }

    /// How a caller should treat an envd error with this code. `not_found` is usually about
    /// a process or path and is refined by [`EnvdFailure::into_error`].
    pub fn class(self) -> ErrorClass {
        match self {
            Code::NotFound => ErrorClass::Gone,
            Code::Unauthenticated | Code::PermissionDenied => ErrorClass::Auth,
            Code::ResourceExhausted => ErrorClass::Capacity,
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::AlreadyExists => ErrorClass::BadRequest,
            Code::Unimplemented => ErrorClass::Unsupported,
            Code::Canceled
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss => ErrorClass::Transport,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An envd error answer, kept as the source of the error it caused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct RpcStatus {
    pub code: Code,
    pub message: String,
}

/// How an envd call failed, before it is said in the terms of the sandbox seam.
#[derive(Debug)]
pub enum EnvdFailure {
    /// No usable answer: connecting, I/O, a timeout, or a garbled stream.
    Call(CallFailure),
    /// The edge proxy says the sandbox does not exist (killed, expired or paused).
    SandboxGone,
    /// A Connect error, from a Connect error body, an end-of-stream message, or a plain HTTP
    /// status mapped to its code.
    Rpc(RpcStatus),
}

/// What a not-found answer is about.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    Sandbox,
    Process(u32),
    Path(&'a str),
}

impl EnvdFailure {
    pub fn rpc(code: Code, message: impl Into<String>) -> EnvdFailure {
        EnvdFailure::Rpc(RpcStatus {
            code,
            message: message.into(),
        })
    }

    /// The server broke the protocol (a garbled or cut stream): a transport failure.
    pub fn protocol(detail: impl Into<String>, source: Option<BoxError>) -> EnvdFailure {
        EnvdFailure::Call(CallFailure::new(ErrorClass::Transport, detail, source))
    }

    pub fn code(&self) -> Option<Code> {
        match self {
            EnvdFailure::Rpc(s) => Some(s.code),
            _ => None,
        }
    }

    /// The seam error for this failure of `what` (e.g. "starting a process") in a sandbox.
    pub fn into_error(self, sandbox_id: &str, what: &str, subject: Subject<'_>) -> SandboxError {
        let id = sandbox_id.to_string();
        match self {
            EnvdFailure::SandboxGone => SandboxError::Gone { id },
            EnvdFailure::Rpc(status) => match (status.code, subject) {
                (Code::NotFound, Subject::Process(pid)) => SandboxError::NoSuchProcess { id, pid },
                (Code::NotFound, Subject::Path(path)) => SandboxError::NotFound {
                    path: path.to_string(),
                },
                (code, _) => SandboxError::Remote {
                    class: code.class(),
                    message: format!("{what} failed in sandbox {id}"),
                    source: Some(Box::new(status)),
                },
            },
            EnvdFailure::Call(call) => SandboxError::Remote {
                class: call.class,
                message: format!("{what} failed in sandbox {id}: {}", call.detail),
                source: call.source,
            },
        }
    }
}

/// Reads an envd error answer. A Connect body (`{"code": "<name>", ...}`) is trusted over the
/// status; otherwise the status decides, except that the edge proxy's 502 means the sandbox
/// is gone unless it names a closed port (envd not listening yet).
pub fn envd_status_failure(status: u16, body: &[u8]) -> EnvdFailure {
    let body = ErrorBody::parse(body);
    let message = body.message();
    if let Some(code) = body.text_field("code").and_then(Code::parse) {
        return EnvdFailure::rpc(code, message);
    }
    if status == 502 && !body.has_field("port") {
        return EnvdFailure::SandboxGone;
    }
    EnvdFailure::rpc(Code::from_http_status(status), message)
}

/// Reads the `error` of an end-of-stream message; `None` when the stream ended well.
pub fn end_of_stream_failure(payload: &[u8]) -> Result<Option<RpcStatus>, serde_json::Error> {
    let json: Value = serde_json::from_slice(payload)?;
    let Some(error) = json.get("error").filter(|e| !e.is_null()) else {
        return Ok(None);
    };
    let code = error
        .get("code")
        .and_then(Value::as_str)
        .and_then(Code::parse)
        .unwrap_or(Code::Unknown);
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(Some(RpcStatus { code, message }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_codes_round_trip_and_classify() {
        for (code, name) in CODES {
            assert_eq!(Code::parse(name), Some(code));
            assert_eq!(code.as_str(), name);
        }
        assert_eq!(Code::parse("NOT_FOUND"), None);
        assert_eq!(Code::NotFound.class(), ErrorClass::Gone);
        assert_eq!(Code::Unauthenticated.class(), ErrorClass::Auth);
        assert_eq!(Code::ResourceExhausted.class(), ErrorClass::Capacity);
        assert_eq!(Code::InvalidArgument.class(), ErrorClass::BadRequest);
        assert_eq!(Code::Unimplemented.class(), ErrorClass::Unsupported);
        assert_eq!(Code::Unavailable.class(), ErrorClass::Transport);
        assert_eq!(Code::DeadlineExceeded.class(), ErrorClass::Transport);
        assert_eq!(Code::from_http_status(404), Code::NotFound);
        assert_eq!(Code::from_http_status(504), Code::DeadlineExceeded);
        assert_eq!(Code::from_http_status(418), Code::Unknown);
    }

    #[test]
    fn envd_answers_trust_the_connect_code_then_the_status() {
        let f = envd_status_failure(
            404,
            br#"{"code":"not_found","message":"process with pid 9 not found"}"#,
        );
        assert_eq!(f.code(), Some(Code::NotFound));
        // A Connect code beats an odd status.
        let f = envd_status_failure(500, br#"{"code":"invalid_argument","message":"x"}"#);
        assert_eq!(f.code(), Some(Code::InvalidArgument));
        // envd's own 401 is plain JSON with an integer code.
        let f = envd_status_failure(401, br#"{"code":401,"message":"unauthorized access"}"#);
        assert_eq!(f.code(), Some(Code::Unauthenticated));
        let f = envd_status_failure(
            502,
            br#"{"code":502,"message":"The sandbox was not found","sandboxId":"isb"}"#,
        );
        assert!(matches!(f, EnvdFailure::SandboxGone));
        let f = envd_status_failure(
            502,
            br#"{"code":502,"message":"The sandbox is running but port is not open","port":49983}"#,
        );
        assert_eq!(f.code(), Some(Code::Unavailable));
        assert!(matches!(
            envd_status_failure(502, b"<html>"),
            EnvdFailure::SandboxGone
        ));
    }

    #[test]
    fn not_found_is_refined_by_its_subject() {
        let nf = || EnvdFailure::rpc(Code::NotFound, "gone");
        let e = nf().into_error("isb", "x", Subject::Process(7));
        assert!(matches!(e, SandboxError::NoSuchProcess { pid: 7, .. }));
        let e = nf().into_error("isb", "x", Subject::Path("/home/user/a"));
        assert!(matches!(e, SandboxError::NotFound { ref path } if path == "/home/user/a"));
        assert_eq!(e.class(), ErrorClass::BadRequest);
        let e = nf().into_error("isb", "x", Subject::Sandbox);
        assert_eq!(e.class(), ErrorClass::Gone);
        let e = EnvdFailure::SandboxGone.into_error("isb", "x", Subject::Path("/p"));
        assert!(matches!(e, SandboxError::Gone { .. }));
    }

    #[test]
    fn end_of_stream_errors_are_read() {
        assert_eq!(end_of_stream_failure(b"{}").unwrap(), None);
        assert_eq!(end_of_stream_failure(br#"{"metadata":{}}"#).unwrap(), None);
        let e =
            end_of_stream_failure(br#"{"error":{"code":"deadline_exceeded","message":"late"}}"#)
                .unwrap()
                .unwrap();
        assert_eq!(e.code, Code::DeadlineExceeded);
        assert_eq!(e.message, "late");
        let e = end_of_stream_failure(br#"{"error":{"code":"bogus"}}"#)
            .unwrap()
            .unwrap();
        assert_eq!(e.code, Code::Unknown);
        assert!(end_of_stream_failure(b"not json").is_err());
    }
}
