//! The client of one sandbox's envd: Connect RPCs with the JSON codec (unary and
//! server-streaming), and the plain `/files` and `/health` endpoints. Every request carries the
//! routing headers and, when the sandbox has one, its access token.

use std::time::Duration;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use serde_json::Value;
use ureq::http::Response;
use ureq::{Agent, Body, BodyReader, RequestBuilder};

use super::config::ENVD_PORT;
use super::envelope::{self, EnvelopeError, MAX_MESSAGE};
use super::error::{
    call_failure, end_of_stream_failure, envd_status_failure, CallFailure, Code, EnvdFailure,
    Limits,
};
use crate::sandbox::ErrorClass;

/// Largest unary answer we read.
const MAX_UNARY_BODY: u64 = 16 << 20;
/// Largest error body kept for the message.
const MAX_ERROR_BODY: u64 = 64 << 10;
/// Largest file `read_file` returns (the same bound as the local backend).
pub const MAX_FILE_BYTES: u64 = 1 << 30;
/// How much longer than a command's own timeout a foreground run may take end to end: envd
/// kills the command at its timeout, and the end of the stream follows shortly after.
pub const RUN_GRACE: Duration = Duration::from_secs(10);
/// Bound on the health probe that tells a dead sandbox from a network problem.
const HEALTH_PROBE: Duration = Duration::from_secs(5);
/// The first envd version that accepts raw `application/octet-stream` uploads.
const OCTET_STREAM_UPLOADS: (u32, u32, u32) = (0, 5, 7);
/// Multipart boundary for uploads to envd older than 0.5.7. A multipart part ends at the first
/// boundary, so data that contains it is refused rather than cut.
const BOUNDARY: &str = "wmo-e2b-upload-7f3c9a1d5b";

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

/// How one sandbox's envd is reached.
#[derive(Clone)]
pub struct Envd {
    agent: Agent,
    base: String,
    sandbox_id: String,
    token: Option<String>,
    envd_version: Option<(u32, u32, u32)>,
    request_timeout: Duration,
    connect_timeout: Duration,
    keepalive: Duration,
}

/// One event of a process stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    Start(u32),
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The process ended; `None` means killed by a signal.
    End(Option<i32>),
    Keepalive,
    /// Anything else (PTY data, events newer than this client): skipped.
    Other,
}

/// An open server stream of process events.
pub struct EventStream {
    reader: BodyReader<'static>,
    limits: Limits,
}

impl EventStream {
    /// The next event; `Ok(None)` after a successful end of stream. An end-of-stream error, a
    /// garbled envelope or silence past the limit is an error.
    pub fn next_event(&mut self) -> Result<Option<StreamEvent>, EnvdFailure> {
        let envelope = match envelope::read_envelope(&mut self.reader, MAX_MESSAGE) {
            Ok(Some(e)) => e,
            Ok(None) => {
                return Err(garbled(
                    "the stream ended without an end-of-stream message",
                    None,
                ))
            }
            Err(EnvelopeError::Io(e)) => {
                return Err(EnvdFailure::Call(call_failure(
                    ureq::Error::from(e),
                    &self.limits,
                )))
            }
            Err(e) => return Err(garbled("the stream is malformed", Some(Box::new(e)))),
        };
        if envelope.is_end_stream() {
            // Read the body to its end (nothing should follow the end-of-stream message):
            // ureq returns a connection to its pool only after a complete body, and without
            // this every command would open a fresh connection (and, on E2B, a TLS handshake).
            let mut rest = [0u8; 512];
            let mut budget = 64 * 1024;
            while budget > 0 {
                match std::io::Read::read(&mut self.reader, &mut rest) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => budget -= n.min(budget),
                }
            }
            return match end_of_stream_failure(&envelope.payload) {
                Ok(None) => Ok(None),
                Ok(Some(status)) => Err(EnvdFailure::Rpc(status)),
                Err(e) => Err(garbled(
                    "the end-of-stream message is not JSON",
                    Some(Box::new(e)),
                )),
            };
        }
        let json: Value = serde_json::from_slice(&envelope.payload)
            .map_err(|e| garbled("a stream message is not JSON", Some(Box::new(e))))?;
        parse_event(&json).map(Some)
    }
}

fn garbled(detail: &str, source: Option<Box<dyn std::error::Error + Send + Sync>>) -> EnvdFailure {
    EnvdFailure::protocol(detail, source)
}

/// Reads `{"event": {...}}` (ProtoJSON: zero values omitted, int fields as numbers or strings).
fn parse_event(json: &Value) -> Result<StreamEvent, EnvdFailure> {
    let Some(event) = json.get("event") else {
        return Ok(StreamEvent::Other);
    };
    if let Some(start) = event.get("start") {
        let pid = start
            .get("pid")
            .and_then(as_i64)
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| garbled("a start event has no valid pid", None))?;
        return Ok(StreamEvent::Start(pid));
    }
    if let Some(data) = event.get("data") {
        let chunk = |key: &str| -> Result<Option<Vec<u8>>, EnvdFailure> {
            match data.get(key).and_then(Value::as_str) {
                Some(s) => b64_decode(s)
                    .map(Some)
                    .ok_or_else(|| garbled("process output is not base64", None)),
                None => Ok(None),
            }
        };
        if let Some(bytes) = chunk("stdout")? {
            return Ok(StreamEvent::Stdout(bytes));
        }
        if let Some(bytes) = chunk("stderr")? {
            return Ok(StreamEvent::Stderr(bytes));
        }
        return Ok(StreamEvent::Other);
    }
    if let Some(end) = event.get("end") {
        return Ok(StreamEvent::End(exit_code(end)));
    }
    if event.get("keepalive").is_some() {
        return Ok(StreamEvent::Keepalive);
    }
    Ok(StreamEvent::Other)
}

/// The exit code of an `end` event: a missing `exitCode` is 0; a process that did not exit
/// normally (`exited` false, code -1) was killed by a signal.
fn exit_code(end: &Value) -> Option<i32> {
    let code = end.get("exitCode").and_then(as_i64).unwrap_or(0);
    let exited = end.get("exited").and_then(Value::as_bool);
    match (exited, i32::try_from(code)) {
        (Some(true), Ok(code)) => Some(code),
        (_, Ok(code)) if code >= 0 => Some(code),
        _ => None,
    }
}

/// An integer sent as a JSON number or (int64 style) a string.
fn as_i64(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// `major.minor.patch` of an envd version string.
pub fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.trim().trim_start_matches('v').splitn(3, '.');
    let mut next = || -> Option<u32> {
        let part = parts.next()?;
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    Some((next()?, next()?, next().unwrap_or(0)))
}

impl Envd {
    #[expect(
        clippy::too_many_arguments,
        reason = "a plain constructor of a plain struct"
    )]
    pub fn new(
        agent: Agent,
        base: String,
        sandbox_id: String,
        token: Option<String>,
        envd_version: Option<&str>,
        request_timeout: Duration,
        connect_timeout: Duration,
        keepalive: Duration,
    ) -> Envd {
        Envd {
            agent,
            base,
            sandbox_id,
            token: token.filter(|t| !t.is_empty()),
            envd_version: envd_version.and_then(parse_version),
            request_timeout,
            connect_timeout,
            keepalive,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// How long a stream may be silent: two keepalive intervals and some slack.
    pub fn stream_silence(&self) -> Duration {
        self.keepalive * 2 + self.keepalive.min(Duration::from_secs(5))
    }

    fn unary_limits(&self) -> Limits {
        Limits {
            total: Some(self.request_timeout),
            connect: self.connect_timeout,
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

    /// A unary Connect call; the answer's JSON (`{}` when empty).
    pub fn unary(&self, rpc: &str, request: &Value) -> Result<Value, EnvdFailure> {
        let limits = self.unary_limits();
        let body = serde_json::to_vec(request).expect("a JSON value serializes");
        let resp = self
            .headers(self.agent.post(self.url(&format!("/{rpc}"))))
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .header(
                "Connect-Timeout-Ms",
                self.request_timeout.as_millis().max(1).to_string(),
            )
            .send(&body[..])
            .map_err(|e| EnvdFailure::Call(call_failure(e, &limits)))?;
        let bytes = read_ok(resp, MAX_UNARY_BODY, &limits)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Object(Default::default()));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| garbled("the answer is not JSON", Some(Box::new(e))))
    }

    /// Opens a server-streaming call. `lifetime` is sent as `Connect-Timeout-Ms` (envd kills a
    /// started process when it passes) and bounds the whole exchange with some grace; without
    /// it the stream lives as long as the process. Either way silence past
    /// [`Envd::stream_silence`] fails the stream.
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
            connect: self.connect_timeout,
            silence: Some(silence),
        };
        let payload = serde_json::to_vec(request).expect("a JSON value serializes");
        let mut req = self
            .headers(self.agent.post(self.url(&format!("/{rpc}"))))
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Accept-Encoding", "identity")
            .header(
                "Keepalive-Ping-Interval",
                self.keepalive.as_secs().max(1).to_string(),
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
        Ok(EventStream {
            reader: resp.into_body().into_reader(),
            limits,
        })
    }

    /// `GET /files?path=&username=`: the whole file, read as `user`.
    pub fn read_file(&self, path: &str, user: &str) -> Result<Vec<u8>, EnvdFailure> {
        let limits = self.unary_limits();
        let resp = self
            .headers(self.agent.get(self.url("/files")))
            .query("path", path)
            .query("username", user)
            .call()
            .map_err(|e| EnvdFailure::Call(call_failure(e, &limits)))?;
        read_ok(resp, MAX_FILE_BYTES, &limits).map_err(|f| match f {
            EnvdFailure::Call(CallFailure {
                source: Some(source),
                ..
            }) if matches!(
                source.downcast_ref::<ureq::Error>(),
                Some(ureq::Error::BodyExceedsLimit(_))
            ) =>
            {
                EnvdFailure::Call(CallFailure::new(
                    ErrorClass::BadRequest,
                    format!("{path} is larger than {MAX_FILE_BYTES} bytes"),
                    Some(source),
                ))
            }
            other => other,
        })
    }

    /// `POST /files?path=&username=`: creates or replaces the file as `user` (who then owns
    /// it); envd creates its parents.
    pub fn write_file(&self, path: &str, data: &[u8], user: &str) -> Result<(), EnvdFailure> {
        let limits = self.unary_limits();
        let old = self.envd_version.is_some_and(|v| v < OCTET_STREAM_UPLOADS);
        let req = self
            .headers(self.agent.post(self.url("/files")))
            .query("path", path)
            .query("username", user);
        let sent = if old {
            let body = multipart(path, data)?;
            req.header(
                "Content-Type",
                format!("multipart/form-data; boundary={BOUNDARY}"),
            )
            .send(&body[..])
        } else {
            req.header("Content-Type", "application/octet-stream")
                .send(data)
        };
        let resp = sent.map_err(|e| EnvdFailure::Call(call_failure(e, &limits)))?;
        read_ok(resp, MAX_UNARY_BODY, &limits).map(drop)
    }

    /// `GET /health`: true when envd answers, false when the edge says the sandbox is gone.
    pub fn health(&self) -> Result<bool, EnvdFailure> {
        self.health_within(self.request_timeout)
    }

    fn health_within(&self, total: Duration) -> Result<bool, EnvdFailure> {
        let limits = Limits {
            total: Some(total),
            connect: self.connect_timeout.min(total),
            silence: None,
        };
        let resp = self
            .headers(self.agent.get(self.url("/health")))
            .config()
            .timeout_global(Some(total))
            .timeout_connect(Some(limits.connect))
            .build()
            .call()
            .map_err(|e| EnvdFailure::Call(call_failure(e, &limits)))?;
        match read_ok(resp, MAX_ERROR_BODY, &limits) {
            Ok(_) => Ok(true),
            Err(EnvdFailure::SandboxGone) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A connection that broke or went silent may mean the sandbox died: as the SDK does, ask
    /// `/health` (briefly) and report the sandbox gone if the edge says so. Any other answer,
    /// or none, leaves the failure as it was.
    pub fn confirm(&self, failure: EnvdFailure) -> EnvdFailure {
        match &failure {
            EnvdFailure::Call(call) if call.class == ErrorClass::Transport => {
                match self.health_within(HEALTH_PROBE.min(self.request_timeout)) {
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

/// The body of a 2xx answer, or the failure a non-2xx one stands for.
fn read_ok(resp: Response<Body>, max: u64, limits: &Limits) -> Result<Vec<u8>, EnvdFailure> {
    if !resp.status().is_success() {
        return Err(error_answer(resp));
    }
    resp.into_body()
        .into_with_config()
        .limit(max)
        .read_to_vec()
        .map_err(|e| EnvdFailure::Call(call_failure(e, limits)))
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

/// One `file` part whose filename is the full target path, as the SDK sends it.
fn multipart(path: &str, data: &[u8]) -> Result<Vec<u8>, EnvdFailure> {
    let marker = format!("--{BOUNDARY}");
    if memchr::memmem::find(data, marker.as_bytes()).is_some() {
        return Err(EnvdFailure::Call(CallFailure::new(
            ErrorClass::Unsupported,
            "the file contains the multipart boundary this old envd needs",
            None,
        )));
    }
    let name = path.replace('"', "%22");
    let mut body = format!(
        "{marker}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n{marker}--\r\n").as_bytes());
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_decode_with_protojson_defaults() {
        let ev = |v: Value| parse_event(&v).unwrap();
        assert_eq!(
            ev(json!({"event":{"start":{"pid":412}}})),
            StreamEvent::Start(412)
        );
        assert_eq!(
            ev(json!({"event":{"start":{"pid":"9"}}})),
            StreamEvent::Start(9)
        );
        assert_eq!(
            ev(json!({"event":{"data":{"stdout":"aGkK"}}})),
            StreamEvent::Stdout(b"hi\n".to_vec())
        );
        assert_eq!(
            ev(json!({"event":{"data":{"stderr":"aGk"}}})),
            StreamEvent::Stderr(b"hi".to_vec())
        );
        assert_eq!(
            ev(json!({"event":{"data":{"pty":"aGk="}}})),
            StreamEvent::Other
        );
        assert_eq!(
            ev(json!({"event":{"keepalive":{}}})),
            StreamEvent::Keepalive
        );
        assert_eq!(ev(json!({"event":{"novel":{}}})), StreamEvent::Other);
        assert_eq!(ev(json!({})), StreamEvent::Other);
        assert!(parse_event(&json!({"event":{"start":{}}})).is_err());
        assert!(parse_event(&json!({"event":{"data":{"stdout":"!!"}}})).is_err());
    }

    #[test]
    fn exit_codes_follow_envd() {
        let end = |v: Value| exit_code(&v);
        assert_eq!(
            end(json!({"exited":true,"status":"exit status 0"})),
            Some(0)
        );
        assert_eq!(end(json!({})), Some(0));
        assert_eq!(end(json!({"exitCode":3,"exited":true})), Some(3));
        assert_eq!(end(json!({"exitCode":"3","exited":true})), Some(3));
        assert_eq!(end(json!({"exitCode":-1,"status":"signal: killed"})), None);
        assert_eq!(end(json!({"exitCode":-1,"exited":false})), None);
    }

    #[test]
    fn base64_is_read_leniently() {
        assert_eq!(b64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(b64_decode("aGk").unwrap(), b"hi");
        assert_eq!(b64_decode("-_8").unwrap(), [0xfb, 0xff]);
        assert_eq!(b64_decode("+/8=").unwrap(), [0xfb, 0xff]);
        assert!(b64_decode("*").is_none());
        assert_eq!(b64_encode(b"hi"), "aGk=");
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("0.6.13"), Some((0, 6, 13)));
        assert_eq!(parse_version("v0.5.7-rc1"), Some((0, 5, 7)));
        assert_eq!(parse_version("1.2"), Some((1, 2, 0)));
        assert_eq!(parse_version("x"), None);
        assert!(parse_version("0.5.6").unwrap() < OCTET_STREAM_UPLOADS);
    }

    #[test]
    fn multipart_bodies_carry_the_path_as_filename() {
        let body = multipart("/home/user/a\"b.txt", b"data").unwrap();
        let text = String::from_utf8(body).unwrap();
        assert!(text.contains("name=\"file\"; filename=\"/home/user/a%22b.txt\""));
        assert!(text.contains("\r\n\r\ndata\r\n--wmo-e2b-upload-7f3c9a1d5b--\r\n"));
        assert!(multipart("/p", format!("x--{BOUNDARY}").as_bytes()).is_err());
    }
}
