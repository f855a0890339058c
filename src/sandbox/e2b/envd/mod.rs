//! The client of one sandbox's envd: Connect RPCs with the JSON codec (unary and
//! server-streaming), and the plain `/files` and `/health` endpoints. Every request carries the
//! routing headers and, when the sandbox has one, its access token.
//!
//! Calls that are safe to repeat (file reads, process lists, health) are repeated on the
//! server's hints and after a lost answer, on the control plane's one schedule
//! ([`RetryPolicy::run`]); a process start or a stdin write, whose effect may have happened,
//! is sent once. Unary calls are bounded by the request limit, file transfers by idleness,
//! streams by their own lifetime and silence.
//!
//! Layout: `events` (process streams), `files` (`/files`), `version` (envd versions and what
//! they gate).

mod events;
mod files;
pub mod version;

use std::sync::Arc;
use std::time::Duration;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use serde_json::Value;
use ureq::http::Response;
use ureq::{Agent, Body, RequestBuilder};

use super::config::ENVD_PORT;
use super::envelope;
use super::error::{
    call_failure, envd_status_failure, retry_hint, CallFailure, Code, EnvdFailure, Limits,
    RetryHint,
};
use super::gate::Clock;
use super::retry::{Attempt, Retries, RetryPolicy};
use crate::sandbox::ErrorClass;
pub use events::{EventStream, StreamEvent};
use version::EnvdVersion;

/// Largest unary answer we read.
const MAX_UNARY_BODY: u64 = 16 << 20;
/// Largest error body kept for the message.
const MAX_ERROR_BODY: u64 = 64 << 10;
/// How much longer than a command's own timeout a foreground run may take end to end: envd
/// kills the command at its timeout, and the end of the stream follows shortly after.
pub const RUN_GRACE: Duration = Duration::from_secs(10);
/// Bound on the health probe that tells a dead sandbox from a network problem.
const HEALTH_PROBE: Duration = Duration::from_secs(5);

/// Decodes standard base64 with or without padding.
const B64_STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
/// Decodes URL-safe base64 with or without padding (ProtoJSON parsers accept it).
const B64_URL_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

pub fn b64_encode(data: &[u8]) -> String {
    STANDARD.encode(data)
}

pub fn b64_decode(s: &str) -> Option<Vec<u8>> {
    B64_STANDARD_LENIENT
        .decode(s)
        .or_else(|_| B64_URL_LENIENT.decode(s))
        .ok()
}

/// What every envd client of one backend shares: the HTTP agent, the limits, and how
/// repeatable calls are repeated.
pub struct EnvdLink {
    pub agent: Agent,
    /// Bound on a unary call (and the health check).
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// envd's keepalive interval on process streams.
    pub keepalive: Duration,
    /// The longest a file transfer may send or receive nothing.
    pub transfer_idle: Duration,
    pub retry: RetryPolicy,
    pub clock: Arc<dyn Clock>,
    /// Shared with the control plane; envd's repeats count in `envd`.
    pub retries: Arc<Retries>,
}

/// How one sandbox's envd is reached.
#[derive(Clone)]
pub struct Envd {
    link: Arc<EnvdLink>,
    base: String,
    sandbox_id: String,
    token: Option<String>,
    version: Option<EnvdVersion>,
}

impl Envd {
    pub fn new(
        link: Arc<EnvdLink>,
        base: String,
        sandbox_id: String,
        token: Option<String>,
        version: Option<EnvdVersion>,
    ) -> Envd {
        Envd {
            link,
            base,
            sandbox_id,
            token: token.filter(|t| !t.is_empty()),
            version,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether this envd has what `since` brought; an envd that named no version is taken as
    /// current.
    pub fn supports(&self, since: EnvdVersion) -> bool {
        self.version.is_none_or(|v| v >= since)
    }

    /// How long a stream may be silent: two keepalive intervals and some slack.
    pub fn stream_silence(&self) -> Duration {
        let k = self.link.keepalive;
        k * 2 + k.min(Duration::from_secs(5))
    }

    fn unary_limits(&self) -> Limits {
        Limits {
            total: Some(self.link.request_timeout),
            connect: self.link.connect_timeout,
            silence: None,
        }
    }

    /// The `Authorization` header naming the user a process runs as (empty password).
    fn as_user<B>(req: RequestBuilder<B>, user: &str) -> RequestBuilder<B> {
        req.header(
            "Authorization",
            format!("Basic {}", b64_encode(format!("{user}:").as_bytes())),
        )
    }

    fn headers<B>(&self, req: RequestBuilder<B>) -> RequestBuilder<B> {
        let req = req
            .header("E2b-Sandbox-Id", &self.sandbox_id)
            .header("E2b-Sandbox-Port", ENVD_PORT.to_string())
            // envd may gzip; we never ask for it.
            .header("Accept-Encoding", "identity");
        match &self.token {
            Some(token) => req.header("X-Access-Token", token),
            None => req,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends a request (`send` builds it afresh for each attempt) and reads a 2xx body of at
    /// most `max` bytes. A `repeatable` request is repeated on the server's hints and after
    /// a lost answer; the edge's word that the sandbox is gone is final either way.
    fn exchange(
        &self,
        limits: &Limits,
        max: u64,
        repeatable: bool,
        send: impl Fn() -> Result<Response<Body>, ureq::Error>,
    ) -> Result<Vec<u8>, EnvdFailure> {
        let link = &self.link;
        link.retry.run(link.clock.as_ref(), &link.retries.envd, || {
            let failed = |failure: CallFailure| {
                let again = repeatable && failure.class == ErrorClass::Transport;
                let failure = EnvdFailure::Call(failure);
                if again {
                    Attempt::Again(Err(failure), None)
                } else {
                    Attempt::Final(Err(failure))
                }
            };
            let resp = match send() {
                Ok(resp) => resp,
                Err(e) => return failed(call_failure(e, limits)),
            };
            if resp.status().is_success() {
                return match read_body(resp, max) {
                    Ok(bytes) => Attempt::Final(Ok(bytes)),
                    // The same answer again would be as large.
                    Err(e @ ureq::Error::BodyExceedsLimit(_)) => {
                        Attempt::Final(Err(EnvdFailure::Call(call_failure(e, limits))))
                    }
                    Err(e) => failed(call_failure(e, limits)),
                };
            }
            let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
            let hint = retry_hint(
                resp.status().as_u16(),
                header("should-retry"),
                header("retry-after"),
            );
            let failure = error_answer(resp);
            match hint {
                RetryHint::After(asked)
                    if repeatable && !matches!(failure, EnvdFailure::SandboxGone) =>
                {
                    Attempt::Again(Err(failure), asked)
                }
                _ => Attempt::Final(Err(failure)),
            }
        })
    }

    /// A unary Connect call, sent once; the answer's JSON (`{}` when empty).
    pub fn unary(&self, rpc: &str, request: &Value) -> Result<Value, EnvdFailure> {
        self.unary_call(rpc, request, false)
    }

    /// As [`Envd::unary`], for a call that only reads (a process list): repeated as the
    /// server allows.
    pub fn unary_repeatable(&self, rpc: &str, request: &Value) -> Result<Value, EnvdFailure> {
        self.unary_call(rpc, request, true)
    }

    fn unary_call(
        &self,
        rpc: &str,
        request: &Value,
        repeatable: bool,
    ) -> Result<Value, EnvdFailure> {
        let limits = self.unary_limits();
        let body = serde_json::to_vec(request).expect("a JSON value serializes");
        let bytes = self.exchange(&limits, MAX_UNARY_BODY, repeatable, || {
            self.headers(self.link.agent.post(self.url(&format!("/{rpc}"))))
                .header("Content-Type", "application/json")
                .header("Connect-Protocol-Version", "1")
                .header(
                    "Connect-Timeout-Ms",
                    self.link.request_timeout.as_millis().max(1).to_string(),
                )
                .send(&body[..])
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Object(Default::default()));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| events::garbled("the answer is not JSON", Some(Box::new(e))))
    }

    /// Opens a server-streaming call. `lifetime` is sent as `Connect-Timeout-Ms` (envd kills a
    /// started process when it passes) and bounds the whole exchange with some grace; without
    /// it the stream lives as long as the process. Either way silence past
    /// [`Envd::stream_silence`] fails the stream. Never repeated: the process may have started.
    pub fn stream(
        &self,
        rpc: &str,
        request: &Value,
        lifetime: Option<Duration>,
        user: Option<&str>,
    ) -> Result<EventStream, EnvdFailure> {
        let silence = self.stream_silence();
        let limits = Limits {
            total: lifetime.map(|l| l + RUN_GRACE),
            connect: self.link.connect_timeout,
            silence: Some(silence),
        };
        let payload = serde_json::to_vec(request).expect("a JSON value serializes");
        let mut req = self
            .headers(self.link.agent.post(self.url(&format!("/{rpc}"))))
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Accept-Encoding", "identity")
            .header(
                "Keepalive-Ping-Interval",
                self.link.keepalive.as_secs().max(1).to_string(),
            );
        if let Some(l) = lifetime {
            req = req.header("Connect-Timeout-Ms", l.as_millis().max(1).to_string());
        }
        if let Some(user) = user {
            req = Self::as_user(req, user);
        }
        let resp = req
            .config()
            .timeout_global(limits.total)
            .timeout_per_read(Some(silence))
            .build()
            .send(&envelope::encode(0, &payload)[..])
            .map_err(|e| EnvdFailure::Call(call_failure(e, &limits)))?;
        if resp.status().as_u16() != 200 {
            return Err(error_answer(resp));
        }
        Ok(EventStream::new(resp.into_body().into_reader(), limits))
    }

    /// `GET /health`: true when envd answers, false when the edge says the sandbox is gone.
    /// Repeated as the server allows.
    pub fn health(&self) -> Result<bool, EnvdFailure> {
        self.health_within(self.link.request_timeout, true)
    }

    fn health_within(&self, total: Duration, repeatable: bool) -> Result<bool, EnvdFailure> {
        let limits = Limits {
            total: Some(total),
            connect: self.link.connect_timeout.min(total),
            silence: None,
        };
        let answered = self.exchange(&limits, MAX_ERROR_BODY, repeatable, || {
            self.headers(self.link.agent.get(self.url("/health")))
                .config()
                .timeout_global(Some(total))
                .timeout_connect(Some(limits.connect))
                .build()
                .call()
        });
        match answered {
            Ok(_) => Ok(true),
            Err(EnvdFailure::SandboxGone) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A connection that broke or went silent may mean the sandbox died: as the SDK does, ask
    /// `/health` (briefly, once) and report the sandbox gone if the edge says so. Any other
    /// answer, or none, leaves the failure as it was.
    pub fn confirm(&self, failure: EnvdFailure) -> EnvdFailure {
        match &failure {
            EnvdFailure::Call(call) if call.class == ErrorClass::Transport => {
                match self.health_within(HEALTH_PROBE.min(self.link.request_timeout), false) {
                    Ok(false) => EnvdFailure::SandboxGone,
                    _ => failure,
                }
            }
            _ => failure,
        }
    }

    /// Whether the failure was a stream's own time limit (not silence) running out.
    pub fn is_lifetime_expiry(failure: &EnvdFailure) -> bool {
        matches!(
            failure,
            EnvdFailure::Call(CallFailure {
                timeout: Some(ureq::Timeout::Global),
                ..
            })
        ) || failure.code() == Some(Code::DeadlineExceeded)
    }
}

/// A 2xx answer's body, at most `max` bytes.
fn read_body(resp: Response<Body>, max: u64) -> Result<Vec<u8>, ureq::Error> {
    resp.into_body().into_with_config().limit(max).read_to_vec()
}

fn error_answer(resp: Response<Body>) -> EnvdFailure {
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .into_with_config()
        .limit(MAX_ERROR_BODY)
        .read_to_vec()
        .unwrap_or_default();
    envd_status_failure(status, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_read_leniently() {
        assert_eq!(b64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(b64_decode("aGk").unwrap(), b"hi");
        assert_eq!(b64_decode("-_8").unwrap(), [0xfb, 0xff]);
        assert_eq!(b64_decode("+/8=").unwrap(), [0xfb, 0xff]);
        assert!(b64_decode("*").is_none());
        assert_eq!(b64_encode(b"hi"), "aGk=");
    }
}
