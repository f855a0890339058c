//! The frame codec: one base64(JSON object) per line, in both directions.
//!
//! Base64 keeps every frame on one line whatever its content (newlines in file bodies, raw
//! control bytes), so a line splitter is the whole parser.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{Map, Value};

/// A decoded frame: a JSON object with a string `type`.
pub type Frame = Map<String, Value>;

/// The frame's `type`, or "" when it has none.
pub fn frame_type(frame: &Frame) -> &str {
    frame.get("type").and_then(Value::as_str).unwrap_or("")
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("line is not base64")]
    Base64,
    #[error("decoded line is not JSON: {0}")]
    Json(String),
    #[error("decoded JSON is not an object")]
    NotObject,
}

/// Encodes one frame as a line, newline included.
pub fn encode(frame: &Value) -> Vec<u8> {
    // serde_json never fails on a Value whose keys are strings.
    let json = serde_json::to_vec(frame).unwrap_or_default();
    let mut line = Vec::with_capacity(json.len().div_ceil(3) * 4 + 1);
    line.resize(json.len().div_ceil(3) * 4, 0);
    let n = STANDARD.encode_slice(&json, &mut line).unwrap_or_default();
    line.truncate(n);
    line.push(b'\n');
    line
}

/// Decodes one line (without its newline). Surrounding whitespace is ignored; anything
/// outside the base64 alphabet is an error, so a stray log line cannot pass as a frame.
pub fn decode(line: &[u8]) -> Result<Frame, FrameError> {
    let line = line.trim_ascii();
    let bytes = STANDARD.decode(line).map_err(|_| FrameError::Base64)?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(FrameError::NotObject),
        Err(e) => Err(FrameError::Json(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_keeps_non_ascii() {
        let f = json!({"type": "tool_response", "content": "café ☕ \n line2", "req_id": 3});
        let line = encode(&f);
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(*line.last().unwrap(), b'\n');
        let back = decode(&line[..line.len() - 1]).unwrap();
        assert_eq!(Value::Object(back), f);
    }

    #[test]
    fn rejects_garbage_and_non_objects() {
        assert_eq!(decode(b"hello world"), Err(FrameError::Base64));
        let arr = STANDARD.encode(b"[1,2]");
        assert_eq!(decode(arr.as_bytes()), Err(FrameError::NotObject));
        let bad = STANDARD.encode(b"{nope");
        assert!(matches!(decode(bad.as_bytes()), Err(FrameError::Json(_))));
        // Accepts surrounding whitespace and CRLF.
        let ok = format!("  {}\r", STANDARD.encode(br#"{"type":"hello"}"#));
        assert_eq!(frame_type(&decode(ok.as_bytes()).unwrap()), "hello");
    }
}
