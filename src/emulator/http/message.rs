//! A request as the handlers see it, and a complete response.

use std::fs::File;

use serde_json::json;

/// One parsed request, its body read in full.
pub(in crate::emulator) struct Request {
    pub method: String,
    /// The request target as sent (path and query, not decoded), for a relay to pass on.
    pub target: String,
    /// The percent-decoded path, without the query.
    pub path: String,
    /// Query pairs in order, decoded (`+` is a space).
    pub query: Vec<(String, String)>,
    /// Header names are lowercase.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first header called `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        first(&self.headers, name)
    }

    /// The `Content-Type` without its parameters, lowercase (empty when there is none).
    pub fn media_type(&self) -> String {
        self.header("content-type")
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    }

    pub fn query(&self, name: &str) -> Option<&str> {
        first(&self.query, name)
    }

    /// The body as a JSON object (an empty body is the empty object), or the 400 to answer.
    pub fn json_object(&self) -> Result<serde_json::Map<String, serde_json::Value>, Response> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(serde_json::Map::new());
        }
        match serde_json::from_slice(&self.body) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(_) => Err(Response::error(
                400,
                "the request body must be a JSON object",
            )),
            Err(e) => Err(Response::error(
                400,
                format!("the request body is not JSON: {e}"),
            )),
        }
    }
}

fn first<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[derive(Debug)]
pub(in crate::emulator) enum Body {
    Empty,
    Bytes(Vec<u8>),
    /// Sent from the file with this length, never loaded whole.
    File(File, u64),
}

/// A complete (non-streamed) response.
#[derive(Debug)]
pub(in crate::emulator) struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Response {
    pub fn empty(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Body::Empty,
        }
    }

    pub fn bytes(status: u16, content_type: &str, body: Vec<u8>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: Body::Bytes(body),
        }
    }

    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response::bytes(status, "application/json", value.to_string().into_bytes())
    }

    /// `{"code": <status>, "message": "..."}`: the error body of E2B's API and of envd's own
    /// errors (auth, files; not the Connect ones). The SDK's parsers require both keys.
    pub fn error(status: u16, message: impl Into<String>) -> Response {
        Response::json(status, &json!({"code": status, "message": message.into()}))
    }

    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.to_string(), value.into()));
        self
    }
}

/// `HTTP/1.1 <status> <reason>` and its CRLF.
pub(super) fn status_line(status: u16) -> String {
    format!("HTTP/1.1 {status} {}\r\n", reason(status))
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        507 => "Insufficient Storage",
        _ => "Status",
    }
}
