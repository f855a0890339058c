//! Classification of everything E2B can answer, in one place per kind of answer:
//! control-plane statuses ([`api_class`]), Connect error codes ([`Code::class`]), envd HTTP
//! statuses ([`envd_status_failure`]) and failed exchanges ([`call_failure`]). Errors are
//! classified where they are read (status, `code` field, `error_code` field), never by searching
//! message text.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use serde_json::Value;

use crate::sandbox::{ErrorClass, SandboxError};

type BoxError = Box<dyn StdError + Send + Sync>;

/// The control-plane operation an answer belongs to; it decides what a 404 or a 5xx means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiOp {
    Create,
    Connect,
    Info,
    List,
    Kill,
    SetTimeout,
    SetNetwork,
}

impl ApiOp {
    pub fn describe(self) -> &'static str {
        match self {
            ApiOp::Create => "creating a sandbox",
            ApiOp::Connect => "connecting to a sandbox",
            ApiOp::Info => "reading sandbox info",
            ApiOp::List => "listing sandboxes",
            ApiOp::Kill => "killing a sandbox",
            ApiOp::SetTimeout => "setting a sandbox timeout",
            ApiOp::SetNetwork => "updating a sandbox network",
        }
    }

    /// Whether the operation names one existing sandbox, so a 404 means it is gone.
    fn names_a_sandbox(self) -> bool {
        !matches!(self, ApiOp::Create | ApiOp::List)
    }
}

/// `error_code` values the API sends when it cannot place a sandbox right now.
const PLACEMENT_CODES: &[&str] = &[
    "sandbox_capacity_unavailable",
    "sandbox_no_compatible_node",
    "sandbox_placement_timeout",
    "sandbox_create_failed",
];

/// The class of a control-plane error status.
pub fn api_class(op: ApiOp, status: u16, error_code: Option<&str>) -> ErrorClass {
    if error_code.is_some_and(|c| PLACEMENT_CODES.contains(&c)) {
        return ErrorClass::Capacity;
    }
    let places = matches!(op, ApiOp::Create | ApiOp::Connect);
    match status {
        401 | 403 => ErrorClass::Auth,
        404 if op.names_a_sandbox() => ErrorClass::Gone,
        // Create and connect (which may resume) need room on a host; anything else failing
        // with these is the service having trouble, which a fresh try may not see.
        429 => ErrorClass::Capacity,
        500 | 502 | 503 | 504 if places => ErrorClass::Capacity,
        // "The sandbox is still transitioning": a moment later it may work.
        409 if op.names_a_sandbox() => ErrorClass::Transport,
        400..=499 => ErrorClass::BadRequest,
        _ => ErrorClass::Transport,
    }
}

/// A control-plane error answer, kept as the source of the error it caused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP {status}: {message}")]
pub struct ApiStatus {
    pub status: u16,
    /// The semantic code some answers carry (`sandbox_capacity_unavailable`, ...).
    pub error_code: Option<String>,
    pub message: String,
}

impl ApiStatus {
    /// Reads an error body: `{"code": <int>, "message": "...", "error_code"?: "..."}`, or
    /// anything else, kept as text.
    pub fn parse(status: u16, body: &[u8]) -> ApiStatus {
        let json: Option<Value> = serde_json::from_slice(body).ok();
        let field = |k: &str| {
            json.as_ref()
                .and_then(|j| j.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        ApiStatus {
            status,
            error_code: field("error_code"),
            message: field("message").unwrap_or_else(|| body_text(body)),
        }
    }
}

/// The error a control-plane answer `status` stands for.
pub fn api_failure(op: ApiOp, sandbox_id: Option<&str>, status: ApiStatus) -> SandboxError {
    let class = api_class(op, status.status, status.error_code.as_deref());
    if let (ErrorClass::Gone, Some(id)) = (class, sandbox_id) {
        return SandboxError::Gone { id: id.to_string() };
    }
    let target = sandbox_id.map(|id| format!(" {id}")).unwrap_or_default();
    SandboxError::Remote {
        class,
        message: format!(
            "e2b refused {}{target} (HTTP {})",
            op.describe(),
            status.status
        ),
        source: Some(Box::new(status)),
    }
}

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
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let message = json
        .as_ref()
        .and_then(|j| j.get("message"))
        .and_then(Value::as_str)
        .map_or_else(|| body_text(body), str::to_string);
    let connect_code = json
        .as_ref()
        .and_then(|j| j.get("code"))
        .and_then(Value::as_str)
        .and_then(Code::parse);
    if let Some(code) = connect_code {
        return EnvdFailure::rpc(code, message);
    }
    let names_port = json.as_ref().is_some_and(|j| j.get("port").is_some());
    if status == 502 && !names_port {
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

/// The time limits of one request, so that a timeout can say which one fired.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The whole exchange; `None` for process streams, which live as long as the process.
    pub total: Option<Duration>,
    pub connect: Duration,
    /// The longest a stream may stay silent (envd sends keepalives well within it).
    pub silence: Option<Duration>,
}

/// A request that got no usable answer.
#[derive(Debug)]
pub struct CallFailure {
    pub class: ErrorClass,
    /// What went wrong in our words, naming the deadline when one fired.
    pub detail: String,
    /// Which ureq timeout fired, if one did.
    pub timeout: Option<ureq::Timeout>,
    pub source: Option<BoxError>,
}

impl CallFailure {
    pub fn new(class: ErrorClass, detail: impl Into<String>, source: Option<BoxError>) -> Self {
        CallFailure {
            class,
            detail: detail.into(),
            timeout: None,
            source,
        }
    }
}

/// Classifies a failed exchange. Anything on the network is Transport; a request that could
/// not even be formed (bad URL, bad header) is BadRequest.
pub fn call_failure(e: ureq::Error, limits: &Limits) -> CallFailure {
    let (class, detail, timeout) = match &e {
        ureq::Error::Timeout(t) => {
            let detail = match t {
                ureq::Timeout::Global | ureq::Timeout::PerCall => match limits.total {
                    Some(total) => format!("no complete answer within {}", secs(total)),
                    None => "timed out".to_string(),
                },
                ureq::Timeout::Resolve | ureq::Timeout::Connect => {
                    format!("could not connect within {}", secs(limits.connect))
                }
                ureq::Timeout::PerRead => match limits.silence {
                    Some(s) => format!("the server sent nothing for {}", secs(s)),
                    None => "a read timed out".to_string(),
                },
                other => format!("the {other} timeout fired"),
            };
            (ErrorClass::Transport, detail, Some(*t))
        }
        ureq::Error::BadUri(_)
        | ureq::Error::Http(_)
        | ureq::Error::RequireHttpsOnly(_)
        | ureq::Error::InvalidProxyUrl => (
            ErrorClass::BadRequest,
            "the request could not be formed".to_string(),
            None,
        ),
        _ => (
            ErrorClass::Transport,
            "the request failed".to_string(),
            None,
        ),
    };
    CallFailure {
        class,
        detail,
        timeout,
        source: Some(Box::new(e)),
    }
}

/// The seam error for a control-plane exchange that got no answer.
pub fn api_call_failure(op: ApiOp, sandbox_id: Option<&str>, call: CallFailure) -> SandboxError {
    let target = sandbox_id.map(|id| format!(" {id}")).unwrap_or_default();
    SandboxError::Remote {
        class: call.class,
        message: format!("{}{target}: {}", op.describe(), call.detail),
        source: call.source,
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// A short, printable excerpt of a non-JSON body.
fn body_text(body: &[u8]) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let text = text.trim();
    if text.is_empty() {
        "(empty body)".to_string()
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_statuses_are_classified_per_operation() {
        use ApiOp::*;
        use ErrorClass::*;
        let cases = [
            (Create, 401, None, Auth),
            (Kill, 403, None, Auth),
            (Create, 429, None, Capacity),
            (Create, 500, None, Capacity),
            (Create, 502, None, Capacity),
            (Create, 503, None, Capacity),
            (Connect, 504, None, Capacity),
            (Create, 400, None, BadRequest),
            (Create, 404, None, BadRequest),
            (Create, 409, None, BadRequest),
            (Create, 422, None, BadRequest),
            (Connect, 404, None, Gone),
            (Info, 404, None, Gone),
            (SetTimeout, 404, None, Gone),
            (SetNetwork, 409, None, Transport),
            (List, 400, None, BadRequest),
            (List, 500, None, Transport),
            (Kill, 503, None, Transport),
            (Kill, 429, None, Capacity),
            (Create, 507, None, Transport),
            // The semantic code wins over an unusual status.
            (Create, 400, Some("sandbox_capacity_unavailable"), Capacity),
            (Create, 500, Some("internal_server_error"), Capacity),
            (Create, 400, Some("something_else"), BadRequest),
        ];
        for (op, status, code, want) in cases {
            assert_eq!(
                api_class(op, status, code),
                want,
                "{op:?} {status} {code:?}"
            );
        }
    }

    #[test]
    fn api_failures_keep_the_answer_as_source() {
        let status = ApiStatus::parse(
            503,
            br#"{"code":503,"message":"Failed to place sandbox","error_code":"sandbox_capacity_unavailable"}"#,
        );
        assert_eq!(
            status.error_code.as_deref(),
            Some("sandbox_capacity_unavailable")
        );
        let err = api_failure(ApiOp::Create, None, status);
        assert_eq!(err.class(), ErrorClass::Capacity);
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(source.contains("Failed to place sandbox"), "{source}");

        let err = api_failure(ApiOp::Kill, Some("isb"), ApiStatus::parse(404, b"nope"));
        assert!(matches!(err, SandboxError::Gone { id } if id == "isb"));
        assert_eq!(ApiStatus::parse(500, b"").message, "(empty body)");
    }

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

    #[test]
    fn timeouts_name_their_deadline() {
        let limits = Limits {
            total: Some(Duration::from_secs(30)),
            connect: Duration::from_secs(10),
            silence: Some(Duration::from_secs(65)),
        };
        let f = call_failure(ureq::Error::Timeout(ureq::Timeout::Global), &limits);
        assert_eq!(f.class, ErrorClass::Transport);
        assert!(f.detail.contains("30.000 s"), "{}", f.detail);
        assert_eq!(f.timeout, Some(ureq::Timeout::Global));
        let f = call_failure(ureq::Error::Timeout(ureq::Timeout::PerRead), &limits);
        assert!(f.detail.contains("nothing for 65.000 s"), "{}", f.detail);
        let f = call_failure(ureq::Error::Timeout(ureq::Timeout::Connect), &limits);
        assert!(f.detail.contains("connect within 10.000 s"), "{}", f.detail);
        let f = call_failure(ureq::Error::BadUri("x".into()), &limits);
        assert_eq!(f.class, ErrorClass::BadRequest);
        let f = call_failure(ureq::Error::ConnectionFailed, &limits);
        assert_eq!(f.class, ErrorClass::Transport);
    }
}
