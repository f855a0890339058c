//! The Connect protocol as envd speaks it with the JSON codec: error codes, envelopes, and
//! lenient ProtoJSON reading (camelCase or snake_case names, int64 as string or number,
//! enums by name or number, base64 with or without padding, unknown fields ignored).

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use serde_json::{json, Value};

use super::http::Response;

/// Connect error codes (the subset envd uses, and a few more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    ResourceExhausted,
    Aborted,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Aborted => "aborted",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status connect-go (>= 1.16) gives a unary error with this code.
    pub fn http_status(self) -> u16 {
        match self {
            Code::InvalidArgument => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Internal => 500,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }
}

/// An RPC failure, sent as a unary error body or an end-of-stream error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"code": self.code.name(), "message": self.message})
    }

    pub fn into_response(self) -> Response {
        Response::json(self.code.http_status(), &self.to_json())
    }
}

pub(super) type RpcResult<T> = Result<T, RpcError>;

/// The exact content type of a JSON stream; the Python client rejects any parameter.
pub(super) const STREAM_CONTENT_TYPE: &str = "application/connect+json";

const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END_STREAM: u8 = 0x02;

/// One envelope: flag byte, big-endian u32 length, message.
pub(super) fn envelope(flag: u8, message: &[u8]) -> Vec<u8> {
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(flag);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    out
}

pub(super) fn message_envelope(value: &Value) -> Vec<u8> {
    envelope(0, value.to_string().as_bytes())
}

/// The last envelope of a stream: `{}` on success, never `{"error": null}` (old clients treat
/// the key's presence as an error).
pub(super) fn end_of_stream(error: Option<&RpcError>) -> Vec<u8> {
    let body = match error {
        None => json!({}),
        Some(e) => json!({"error": e.to_json()}),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Every message of a client-streaming request body, in order.
pub(super) fn request_messages(body: &[u8]) -> RpcResult<Vec<Value>> {
    let mut rest = body;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = envelope_len(rest)?;
        out.push(request_message(&rest[..5 + len])?);
        rest = &rest[5 + len..];
    }
    Ok(out)
}

/// The message length of the envelope at the start of `body`, checked against its size.
fn envelope_len(body: &[u8]) -> RpcResult<usize> {
    if body.len() < 5 {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "the request body is not a Connect envelope",
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() - 5 < len {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "the request envelope is truncated",
        ));
    }
    Ok(len)
}

/// The one message of a server-streaming request body.
pub(super) fn request_message(body: &[u8]) -> RpcResult<Value> {
    let len = envelope_len(body)?;
    if body[0] & FLAG_COMPRESSED != 0 {
        return Err(RpcError::new(
            Code::Internal,
            "compressed request envelopes were not negotiated",
        ));
    }
    parse_message(&body[5..5 + len])
}

/// A JSON message; an empty body is the empty message.
pub(super) fn parse_message(bytes: &[u8]) -> RpcResult<Value> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        RpcError::new(
            Code::InvalidArgument,
            format!("the request is not valid JSON: {e}"),
        )
    })?;
    if v.is_object() {
        Ok(v)
    } else {
        Err(RpcError::new(
            Code::InvalidArgument,
            "the request is not a JSON object",
        ))
    }
}

/// A field by its JSON (camelCase) or proto (snake_case) name; `null` counts as absent.
pub(super) fn field<'a>(msg: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    msg.get(camel)
        .or_else(|| msg.get(snake))
        .filter(|v| !v.is_null())
}

fn type_error(name: &str, want: &str) -> RpcError {
    RpcError::new(
        Code::InvalidArgument,
        format!("field {name}: expected {want}"),
    )
}

pub(super) fn string_field(msg: &Value, camel: &str, snake: &str) -> RpcResult<Option<String>> {
    match field(msg, camel, snake) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(type_error(camel, "a string")),
    }
}

pub(super) fn bool_field(msg: &Value, camel: &str, snake: &str) -> RpcResult<Option<bool>> {
    match field(msg, camel, snake) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(type_error(camel, "a boolean")),
    }
}

/// An integer given as a JSON number or a decimal string (ProtoJSON allows both).
pub(super) fn int_field(msg: &Value, camel: &str, snake: &str) -> RpcResult<Option<i64>> {
    match field(msg, camel, snake) {
        None => Ok(None),
        Some(v) => int_value(v)
            .map(Some)
            .ok_or_else(|| type_error(camel, "an integer")),
    }
}

pub(super) fn int_value(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            // 3.0 is a valid integer in ProtoJSON.
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A string→string map (`envs`); `{}` when absent.
pub(super) fn string_map(
    msg: &Value,
    camel: &str,
    snake: &str,
) -> RpcResult<Vec<(String, String)>> {
    match field(msg, camel, snake) {
        None => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(type_error(camel, "a map of strings")),
            })
            .collect(),
        Some(_) => Err(type_error(camel, "a map of strings")),
    }
}

pub(super) fn string_list(msg: &Value, camel: &str, snake: &str) -> RpcResult<Vec<String>> {
    match field(msg, camel, snake) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(type_error(camel, "a list of strings")),
            })
            .collect(),
        Some(_) => Err(type_error(camel, "a list of strings")),
    }
}

/// An enum given by name or number; `names` maps each name to its number.
pub(super) fn enum_value(v: &Value, names: &[(&str, i64)]) -> Option<i64> {
    match v {
        Value::String(s) => names.iter().find(|(n, _)| n == s).map(|(_, i)| *i),
        other => int_value(other),
    }
}

/// Standard or URL-safe base64, padded or not.
pub(super) fn decode_bytes(s: &str) -> Option<Vec<u8>> {
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let normalized: String = s
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    LENIENT.decode(normalized).ok()
}

pub(super) fn encode_bytes(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip() {
        let env = message_envelope(&json!({"a": 1}));
        assert_eq!(env[0], 0);
        assert_eq!(u32::from_be_bytes([env[1], env[2], env[3], env[4]]), 7);
        assert_eq!(request_message(&env).unwrap(), json!({"a": 1}));
        assert_eq!(&end_of_stream(None)[5..], b"{}");
        assert_eq!(end_of_stream(None)[0], 2);
        assert!(request_message(&env[..6]).is_err());
        assert!(request_message(b"{}").is_err());
        let mut two = env.clone();
        two.extend(message_envelope(&json!({"b": 2})));
        assert_eq!(
            request_messages(&two).unwrap(),
            vec![json!({"a": 1}), json!({"b": 2})]
        );
        assert!(request_messages(&two[..two.len() - 1]).is_err());
    }

    #[test]
    fn lenient_protojson() {
        let m = json!({"exit_code": "3", "pid": 7.0, "keepAlive": null, "s": "SIGNAL_SIGKILL"});
        assert_eq!(int_field(&m, "exitCode", "exit_code").unwrap(), Some(3));
        assert_eq!(int_field(&m, "pid", "pid").unwrap(), Some(7));
        assert_eq!(bool_field(&m, "keepAlive", "keep_alive").unwrap(), None);
        let names = [("SIGNAL_SIGTERM", 15), ("SIGNAL_SIGKILL", 9)];
        assert_eq!(enum_value(&m["s"], &names), Some(9));
        assert_eq!(enum_value(&json!(15), &names), Some(15));
        assert_eq!(decode_bytes("aGk").unwrap(), b"hi");
        assert_eq!(decode_bytes("aGk=").unwrap(), b"hi");
        assert_eq!(decode_bytes("-_8").unwrap(), decode_bytes("+/8=").unwrap());
        assert!(decode_bytes("*").is_none());
    }
}
