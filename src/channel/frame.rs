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
    match parse_json(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(FrameError::NotObject),
        Err(e) => Err(FrameError::Json(e.to_string())),
    }
}

/// Parses JSON text from a runner, reading a lone UTF-16 surrogate escape (`"\ud800"`) as
/// U+FFFD. Node's `JSON.stringify` writes those for any string holding half a pair (a
/// harness slicing text mid-emoji), and serde_json refuses them; refusing would drop the
/// whole frame and leave its episode waiting for an answer that never comes.
pub fn parse_json(mut bytes: Vec<u8>) -> Result<Value, serde_json::Error> {
    match serde_json::from_slice(&bytes) {
        Err(e) if replace_lone_surrogates(&mut bytes) => {
            serde_json::from_slice(&bytes).map_err(|_| e)
        }
        other => other,
    }
}

/// Rewrites every lone surrogate escape inside a JSON string as `\ufffd`, in place (both are
/// six bytes). Returns whether anything changed. Paired escapes, escaped backslashes
/// (`\\ud800` is text, not an escape) and everything outside strings are left alone.
fn replace_lone_surrogates(json: &mut [u8]) -> bool {
    fn hex4(b: &[u8]) -> Option<u16> {
        let digits = b.get(..4)?;
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    }
    // `\uXXXX` at `i`, as its code unit.
    fn unit_at(json: &[u8], i: usize) -> Option<u16> {
        match json.get(i..i + 2) {
            Some(b"\\u") => hex4(&json[i + 2..]),
            _ => None,
        }
    }
    let is_lead = |u: u16| (0xD800..=0xDBFF).contains(&u);
    let is_trail = |u: u16| (0xDC00..=0xDFFF).contains(&u);
    let mut changed = false;
    let mut in_string = false;
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'"' => {
                in_string = !in_string;
                i += 1;
            }
            b'\\' if in_string => match unit_at(json, i) {
                Some(u) if is_lead(u) && unit_at(json, i + 6).is_some_and(is_trail) => i += 12,
                Some(u) if is_lead(u) || is_trail(u) => {
                    json[i..i + 6].copy_from_slice(b"\\ufffd");
                    changed = true;
                    i += 6;
                }
                // Any other escape is two bytes, or six for `\u`; skipping two is enough,
                // since hex digits are never a quote or a backslash.
                _ => i += 2,
            },
            _ => i += 1,
        }
    }
    changed
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
    fn lone_surrogates_read_as_replacement_characters() {
        // What Node's JSON.stringify writes for "a\uD800b", "\uDC00" and half a pair
        // before a whole one.
        let json =
            br#"{"type":"done","answer":"a\ud800b","k\udc00":["\udc00"],"x":"\ud83d\ud83d\ude80"}"#;
        let line = STANDARD.encode(json);
        let f = decode(line.as_bytes()).unwrap();
        assert_eq!(f["answer"], "a\u{FFFD}b");
        assert_eq!(f["k\u{FFFD}"], json!(["\u{FFFD}"]));
        assert_eq!(f["x"], "\u{FFFD}🚀");
        // A lead surrogate at the very end of a string, and one before another escape.
        let f = decode(
            STANDARD
                .encode(br#"{"a":"\ud800","b":"\ud800\n"}"#)
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(f["a"], "\u{FFFD}");
        assert_eq!(f["b"], "\u{FFFD}\n");
    }

    #[test]
    fn surrogate_repair_leaves_everything_else_alone() {
        // An escaped backslash followed by "ud800" is text, not an escape.
        let f = decode(STANDARD.encode(br#"{"a":"\\ud800"}"#).as_bytes()).unwrap();
        assert_eq!(f["a"], "\\ud800");
        // Paired escapes decode as the character they spell.
        let f = decode(STANDARD.encode(br#"{"a":"\ud83d\ude80"}"#).as_bytes()).unwrap();
        assert_eq!(f["a"], "🚀");
        // JSON that is broken for another reason stays an error, with serde's own message.
        let bad = STANDARD.encode(br#"{"a":"\ud800",}"#);
        assert!(matches!(decode(bad.as_bytes()), Err(FrameError::Json(_))));
        let mut outside = br#"{"a":1} \ud800"#.to_vec();
        assert!(!replace_lone_surrogates(&mut outside));
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
