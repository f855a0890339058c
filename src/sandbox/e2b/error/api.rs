//! Control-plane answers: what an error status means for each operation.

use std::time::Duration;

use super::body::ErrorBody;
use super::call::CallFailure;
use crate::sandbox::{ErrorClass, SandboxError};

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
    Pause,
    /// A template build's calls: ask, upload, start, poll, look up.
    Template,
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
            ApiOp::Pause => "pausing a sandbox",
            ApiOp::Template => "building a template",
        }
    }

    /// Whether the operation names one existing sandbox, so a 404 means it is gone.
    fn names_a_sandbox(self) -> bool {
        !matches!(self, ApiOp::Create | ApiOp::List | ApiOp::Template)
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

/// What an answer's status and hint headers say about trying the request again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryHint {
    /// Done (a success), or the server said no (`Should-Retry: false`, or a status that a
    /// repeat cannot change).
    Never,
    /// Worth repeating; after the server's `Retry-After` when it gave a valid one.
    After(Option<Duration>),
}

/// Reads an answer's retry hints, as E2B's clients do: `Should-Retry: true` retries whatever
/// the status, `Should-Retry: false` never; without the header 429, 502, 503 and 504 retry.
/// `Retry-After` counts only as whole seconds (the date form is not used by E2B).
pub fn retry_hint(status: u16, should_retry: Option<&str>, retry_after: Option<&str>) -> RetryHint {
    if (200..300).contains(&status) {
        return RetryHint::Never;
    }
    let told = should_retry.and_then(|v| match v.trim().to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    });
    let retry = told.unwrap_or(matches!(status, 429 | 502 | 503 | 504));
    if !retry {
        return RetryHint::Never;
    }
    let wait = retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    RetryHint::After(wait)
}

/// As [`retry_hint`], for the control-plane `op`: without a `Should-Retry` header a kill's
/// 500 is repeated too. A kill is idempotent, and one left unproven leaves a sandbox running
/// (and billed) until its timeout.
pub fn api_retry_hint(
    op: ApiOp,
    status: u16,
    should_retry: Option<&str>,
    retry_after: Option<&str>,
) -> RetryHint {
    match retry_hint(status, should_retry, retry_after) {
        RetryHint::Never if op == ApiOp::Kill && status == 500 && should_retry.is_none() => {
            RetryHint::After(None)
        }
        hint => hint,
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
        let body = ErrorBody::parse(body);
        ApiStatus {
            status,
            error_code: body.text_field("error_code").map(str::to_string),
            message: body.message(),
        }
    }

    /// Whether a create answered with this may have made its sandbox anyway: a 500, 502 or
    /// 504 can come after the work was done (a gateway that lost the answer, a failure after
    /// placement), and a 409 says a create with the same idempotency key is still running;
    /// unless a placement code says nothing was placed.
    pub fn create_may_have_landed(&self) -> bool {
        matches!(self.status, 409 | 500 | 502 | 504)
            && !self
                .error_code
                .as_deref()
                .is_some_and(|c| PLACEMENT_CODES.contains(&c))
    }
}

/// Whether `body` is the API's own JSON error (`{"code": <int>, "message": "..."}`), as
/// opposed to a router's or proxy's page for a path it does not serve.
pub fn is_api_error_body(body: &[u8]) -> bool {
    let body = ErrorBody::parse(body);
    body.int_field("code").is_some() && body.text_field("message").is_some()
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

/// The seam error for a control-plane exchange that got no answer.
pub fn api_call_failure(op: ApiOp, sandbox_id: Option<&str>, call: CallFailure) -> SandboxError {
    let target = sandbox_id.map(|id| format!(" {id}")).unwrap_or_default();
    SandboxError::Remote {
        class: call.class,
        message: format!("{}{target}: {}", op.describe(), call.detail),
        source: call.source,
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
    fn retry_hints_follow_the_server_first() {
        use RetryHint::*;
        let secs = |n| Some(Duration::from_secs(n));
        assert_eq!(retry_hint(429, None, None), After(None));
        assert_eq!(retry_hint(429, None, Some("2")), After(secs(2)));
        assert_eq!(retry_hint(503, None, Some(" 7 ")), After(secs(7)));
        assert_eq!(retry_hint(502, None, Some("soon")), After(None));
        assert_eq!(retry_hint(504, None, Some("-1")), After(None));
        assert_eq!(retry_hint(500, None, Some("1")), Never);
        assert_eq!(retry_hint(404, None, None), Never);
        assert_eq!(retry_hint(500, Some("true"), Some("1")), After(secs(1)));
        assert_eq!(retry_hint(409, Some("TRUE"), None), After(None));
        assert_eq!(retry_hint(429, Some("false"), Some("1")), Never);
        assert_eq!(retry_hint(503, Some("maybe"), None), After(None));
        assert_eq!(retry_hint(201, Some("true"), None), Never);
        assert_eq!(api_retry_hint(ApiOp::Kill, 500, None, None), After(None));
        assert_eq!(api_retry_hint(ApiOp::Kill, 500, Some("false"), None), Never);
        assert_eq!(api_retry_hint(ApiOp::Info, 500, None, None), Never);
        assert_eq!(api_retry_hint(ApiOp::Kill, 404, None, None), Never);
    }

    #[test]
    fn only_answers_that_can_follow_the_work_leave_a_create_in_doubt() {
        let landed = |status, body: &[u8]| ApiStatus::parse(status, body).create_may_have_landed();
        assert!(landed(502, b"bad gateway"));
        assert!(landed(504, b""));
        assert!(landed(
            409,
            br#"{"code":409,"message":"still in progress"}"#
        ));
        assert!(landed(500, br#"{"code":500,"message":"boom"}"#));
        assert!(!landed(
            500,
            br#"{"code":500,"message":"x","error_code":"sandbox_create_failed"}"#
        ));
        assert!(!landed(503, b"busy"));
        assert!(!landed(429, b"slow down"));
        assert!(!landed(400, b"bad"));
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

        assert!(is_api_error_body(
            br#"{"code":404,"message":"Sandbox \"x\" doesn't exist"}"#
        ));
        assert!(!is_api_error_body(b"404 page not found"));
        assert!(!is_api_error_body(br#"{"code":"not_found","message":"x"}"#));
        assert!(!is_api_error_body(br#"{"message":"x"}"#));

        let err = api_failure(ApiOp::Kill, Some("isb"), ApiStatus::parse(404, b"nope"));
        assert!(matches!(err, SandboxError::Gone { id } if id == "isb"));
        assert_eq!(ApiStatus::parse(500, b"").message, "(empty body)");
    }
}
