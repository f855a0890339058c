//! The frame codec: one base64(JSON object) per line, in both directions.
//!
//! Base64 keeps every frame on one line whatever its content (newlines in file bodies, raw
//! control bytes), so a line splitter is the whole parser.
//!
//! A frame from a runner is read in two steps: its `type` and `req_id` when it arrives
//! (enough to route it, and most frames need nothing more), and the rest only when someone
//! asks for a field. Its JSON text is kept, so a transcript copies it instead of encoding
//! it again.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

/// A decoded frame: a JSON object, routed by its `type` (a string) and `req_id`.
pub struct Frame {
    json: Vec<u8>,
    kind: Box<str>,
    req_id: Option<u64>,
    body: OnceCell<Map<String, Value>>,
}

impl Frame {
    /// A frame that is already a JSON object in memory (read back from a file, say).
    pub fn from_map(map: Map<String, Value>) -> Frame {
        let kind = map.get("type").and_then(Value::as_str).unwrap_or("").into();
        let req_id = map.get("req_id").and_then(Value::as_u64);
        // serde_json never fails on a map whose keys are strings.
        let json = serde_json::to_vec(&map).unwrap_or_default();
        Frame {
            json,
            kind,
            req_id,
            body: OnceCell::from(map),
        }
    }

    /// The frame's `type`, or "" when it has none (or it is not a string).
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The frame's `req_id`, when it is an unsigned integer.
    pub fn req_id(&self) -> Option<u64> {
        self.req_id
    }

    /// The whole object, parsed at the first call.
    pub fn body(&self) -> &Map<String, Value> {
        // The text parsed as an object when the frame was decoded, so it parses again.
        self.body
            .get_or_init(|| match serde_json::from_slice(&self.json) {
                Ok(Value::Object(map)) => map,
                _ => Map::new(),
            })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.body().get(key)
    }

    /// The object as JSON text (lone surrogate escapes already read as U+FFFD).
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    pub fn into_body(self) -> Map<String, Value> {
        self.body();
        self.body.into_inner().unwrap_or_default()
    }
}

impl std::ops::Index<&str> for Frame {
    type Output = Value;
    /// `Null` for a field the frame does not have, as indexing a `Value` gives.
    fn index(&self, key: &str) -> &Value {
        static NULL: Value = Value::Null;
        self.get(key).unwrap_or(&NULL)
    }
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("json", &String::from_utf8_lossy(&self.json))
            .finish()
    }
}

/// The frame's `type`, or "" when it has none.
pub fn frame_type(frame: &Frame) -> &str {
    frame.kind()
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
/// outside the base64 alphabet is an error, so a stray log line cannot pass as a frame. The
/// JSON is checked whole, but only `type` and `req_id` are kept from it now.
pub fn decode(line: &[u8]) -> Result<Frame, FrameError> {
    let line = line.trim_ascii();
    let mut json = STANDARD.decode(line).map_err(|_| FrameError::Base64)?;
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        // Not an object; say what it is, as the full parse would.
        return match serde_json::from_slice::<IgnoredAny>(&json) {
            Ok(_) => Err(FrameError::NotObject),
            Err(e) => Err(FrameError::Json(e.to_string())),
        };
    }
    // Skipping a string does not check its escapes, so a lone surrogate would only fail
    // the later full parse: repair first, wherever an escape could be one.
    if has_surrogate_escape(&json) {
        replace_lone_surrogates(&mut json);
    }
    let (kind, req_id) = serde_json::from_slice::<Head>(&json)
        .map(Head::owned)
        .map_err(|e| FrameError::Json(e.to_string()))?;
    Ok(Frame {
        json,
        kind,
        req_id,
        body: OnceCell::new(),
    })
}

/// The fields a frame is routed by, each kept only when it has the type routing needs; the
/// rest of the object is checked and skipped without being built.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Loose<'a>,
    #[serde(default)]
    req_id: Loose<'a>,
}

impl Head<'_> {
    fn owned(self) -> (Box<str>, Option<u64>) {
        let kind = match self.kind {
            Loose::Str(s) => s.into(),
            _ => "".into(),
        };
        let req_id = match self.req_id {
            Loose::U64(n) => Some(n),
            _ => None,
        };
        (kind, req_id)
    }
}

/// Any JSON value, kept only when it is a string or an unsigned integer.
#[derive(Default)]
enum Loose<'a> {
    Str(Cow<'a, str>),
    U64(u64),
    #[default]
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Loose<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v.to_string())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Loose::U64(v))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
        }
        d.deserialize_any(V)
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

/// Whether `json` holds a `\\uD...` escape, the only form a surrogate takes in JSON text.
fn has_surrogate_escape(json: &[u8]) -> bool {
    memchr::memmem::find_iter(json, b"\\u").any(|i| matches!(json.get(i + 2), Some(b'd' | b'D')))
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
        assert_eq!((back.kind(), back.req_id()), ("tool_response", Some(3)));
        assert_eq!(Value::Object(back.into_body()), f);
    }

    #[test]
    fn the_head_keeps_only_a_string_type_and_an_unsigned_req_id() {
        let head = |json: &str| {
            let f = decode(STANDARD.encode(json).as_bytes()).unwrap();
            (f.kind().to_string(), f.req_id())
        };
        assert_eq!(
            head(r#"{"req_id":7,"type":"llm_request"}"#),
            ("llm_request".into(), Some(7))
        );
        assert_eq!(head(r#"{"type":3,"req_id":"7"}"#), (String::new(), None));
        assert_eq!(head(r#"{"type":null,"req_id":-1}"#), (String::new(), None));
        assert_eq!(
            head(r#"{"x":{"type":"nested"},"y":[1,{"a":2}]}"#),
            (String::new(), None)
        );
        // An escaped type is read as the string it spells.
        assert_eq!(head(r#"{"type":"do\u006ee"}"#), ("done".into(), None));
        // The rest is still checked whole: a frame broken past its head is refused.
        let bad = STANDARD.encode(br#"{"type":"done","x":[1,}"#);
        assert!(matches!(decode(bad.as_bytes()), Err(FrameError::Json(_))));
        // Its JSON text is the object as sent, for a transcript to copy.
        let f = decode(STANDARD.encode(br#"{"type":"state","n":1}"#).as_bytes()).unwrap();
        assert_eq!(f.json(), br#"{"type":"state","n":1}"#);
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
        assert!(matches!(decode(b"hello world"), Err(FrameError::Base64)));
        let arr = STANDARD.encode(b"[1,2]");
        assert!(matches!(decode(arr.as_bytes()), Err(FrameError::NotObject)));
        let num = STANDARD.encode(b" 42");
        assert!(matches!(decode(num.as_bytes()), Err(FrameError::NotObject)));
        let bad = STANDARD.encode(b"{nope");
        assert!(matches!(decode(bad.as_bytes()), Err(FrameError::Json(_))));
        // Accepts surrounding whitespace and CRLF.
        let ok = format!("  {}\r", STANDARD.encode(br#"{"type":"hello"}"#));
        assert_eq!(frame_type(&decode(ok.as_bytes()).unwrap()), "hello");
    }
}
