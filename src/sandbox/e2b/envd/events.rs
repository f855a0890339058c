//! Process streams as envd sends them: enveloped ProtoJSON events, read one at a time.

use serde_json::Value;
use ureq::BodyReader;

use super::b64_decode;
use crate::sandbox::e2b::envelope::{self, EnvelopeError, MAX_MESSAGE};
use crate::sandbox::e2b::error::{call_failure, end_of_stream_failure, EnvdFailure, Limits};

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
    pub(super) fn new(reader: BodyReader<'static>, limits: Limits) -> EventStream {
        EventStream { reader, limits }
    }

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

pub(super) fn garbled(
    detail: &str,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
) -> EnvdFailure {
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
}
