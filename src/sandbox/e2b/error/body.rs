//! The body of an error answer, as the control plane and envd send them: JSON with a
//! `message` (and perhaps a code), or anything else, kept as a short printable excerpt.

use serde_json::Value;

/// Longest excerpt of a body that is not JSON.
const MAX_EXCERPT: usize = 300;

pub(super) struct ErrorBody<'a> {
    raw: &'a [u8],
    json: Option<Value>,
}

impl<'a> ErrorBody<'a> {
    pub fn parse(raw: &'a [u8]) -> ErrorBody<'a> {
        ErrorBody {
            raw,
            json: serde_json::from_slice(raw).ok(),
        }
    }

    /// A string field of a JSON body.
    pub fn text_field(&self, key: &str) -> Option<&str> {
        self.json.as_ref()?.get(key)?.as_str()
    }

    /// An integer field of a JSON body.
    pub fn int_field(&self, key: &str) -> Option<i64> {
        self.json.as_ref()?.get(key)?.as_i64()
    }

    /// Whether a JSON body has `key` at all.
    pub fn has_field(&self, key: &str) -> bool {
        self.json.as_ref().is_some_and(|j| j.get(key).is_some())
    }

    /// The body's `message`, or a short, printable excerpt of a body without one.
    pub fn message(&self) -> String {
        match self.text_field("message") {
            Some(m) => m.to_string(),
            None => {
                let text = String::from_utf8_lossy(&self.raw[..self.raw.len().min(MAX_EXCERPT)]);
                let text = text.trim();
                if text.is_empty() {
                    "(empty body)".to_string()
                } else {
                    text.to_string()
                }
            }
        }
    }
}
