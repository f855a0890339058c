//! A stand-in for Anthropic's Messages API on 127.0.0.1 that enforces the API's documented
//! request rules (headers, top-level fields, `system` outside the messages, alternating roles,
//! non-empty text, `tool_result` blocks first in the turn right after the `tool_use` blocks
//! they answer, every `tool_use` answered, tool definitions with an object `input_schema`)
//! and refuses a request that breaks one with the API's error body. Test files include it
//! with `#[path]`; each uses a subset.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const VERSION: &str = "2023-06-01";

/// What the server answers to one request.
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    /// A 200 with a Messages response of `content` blocks.
    pub fn message(content: Value, stop_reason: &str, usage: Value) -> Reply {
        let body = json!({
            "id": "msg_test", "type": "message", "role": "assistant", "model": "claude-test",
            "content": content, "stop_reason": stop_reason, "stop_sequence": null,
            "usage": usage,
        });
        Reply {
            status: 200,
            body: body.to_string(),
            headers: Vec::new(),
        }
    }

    /// The API's error shape.
    pub fn error(status: u16, kind: &str, message: &str) -> Reply {
        let body = json!({"type": "error", "error": {"type": kind, "message": message}});
        Reply {
            status,
            body: body.to_string(),
            headers: Vec::new(),
        }
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_string()));
        self
    }
}

/// The server. `reply(n, body)` answers the `n`th valid request (0-based); invalid ones are
/// refused before it is asked and do not count.
pub struct MessagesServer {
    pub base_url: String,
    /// Every request that reached the server, valid or not.
    hits: Arc<AtomicUsize>,
    /// When each request arrived.
    pub arrivals: Arc<Mutex<Vec<Instant>>>,
    /// The bodies of the valid requests.
    pub bodies: Arc<Mutex<Vec<Value>>>,
    /// Why each refused request was refused.
    pub refusals: Arc<Mutex<Vec<String>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MessagesServer {
    pub fn start(
        key: &'static str,
        reply: impl Fn(usize, &Value) -> Reply + Send + 'static,
    ) -> Self {
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let refusals = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (hits, arrivals, bodies) = (hits.clone(), arrivals.clone(), bodies.clone());
            let (refusals, stop) = (refusals.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut valid = 0;
                while !stop.load(Ordering::SeqCst) {
                    let Ok(Some(mut request)) = server.recv_timeout(Duration::from_millis(50))
                    else {
                        continue;
                    };
                    arrivals.lock().unwrap().push(Instant::now());
                    hits.fetch_add(1, Ordering::SeqCst);
                    let mut text = String::new();
                    let _ = request.as_reader().read_to_string(&mut text);
                    let answer = match check(&request, &text, key) {
                        Err(refusal) => {
                            refusals.lock().unwrap().push(refusal.body.clone());
                            refusal
                        }
                        Ok(body) => {
                            let answer = reply(valid, &body);
                            bodies.lock().unwrap().push(body);
                            valid += 1;
                            answer
                        }
                    };
                    respond(request, answer);
                }
            })
        };
        MessagesServer {
            base_url: format!("http://127.0.0.1:{port}"),
            hits,
            arrivals,
            bodies,
            refusals,
            stop,
            thread: Some(thread),
        }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for MessagesServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn respond(request: tiny_http::Request, answer: Reply) {
    let mut response =
        tiny_http::Response::from_string(answer.body).with_status_code(answer.status);
    for (name, value) in answer.headers {
        let header = tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).unwrap();
        response = response.with_header(header);
    }
    let _ = request.respond(response);
}

fn header<'a>(request: &'a tiny_http::Request, name: &'static str) -> Option<&'a str> {
    request
        .headers()
        .iter()
        .find(|h| h.field.equiv(name))
        .map(|h| h.value.as_str())
}

fn bad(message: String) -> Reply {
    Reply::error(400, "invalid_request_error", &message)
}

/// The request as the API would take it, or the API's refusal.
pub fn check(request: &tiny_http::Request, text: &str, key: &str) -> Result<Value, Reply> {
    if *request.method() != tiny_http::Method::Post || request.url() != "/v1/messages" {
        let why = format!("no route {} {}", request.method(), request.url());
        return Err(Reply::error(404, "not_found_error", &why));
    }
    if header(request, "x-api-key") != Some(key) {
        return Err(Reply::error(
            401,
            "authentication_error",
            "invalid x-api-key",
        ));
    }
    if header(request, "anthropic-version") != Some(VERSION) {
        let got = header(request, "anthropic-version");
        return Err(bad(format!(
            "anthropic-version: expected {VERSION}, got {got:?}"
        )));
    }
    if !header(request, "content-type").is_some_and(|c| c.starts_with("application/json")) {
        return Err(bad("content-type must be application/json".into()));
    }
    let body: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    check_body(&body).map_err(bad)?;
    Ok(body)
}

const TOP_LEVEL: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "metadata",
    "stream",
    "thinking",
];

fn check_body(body: &Value) -> Result<(), String> {
    let top = body.as_object().ok_or("the body must be an object")?;
    if let Some(extra) = top.keys().find(|k| !TOP_LEVEL.contains(&k.as_str())) {
        return Err(format!("{extra}: Extra inputs are not permitted"));
    }
    if body["model"].as_str().is_none_or(str::is_empty) {
        return Err("model: Field required".into());
    }
    if body["max_tokens"].as_u64().is_none_or(|n| n < 1) {
        return Err("max_tokens: Field required (an integer of at least 1)".into());
    }
    match &body["system"] {
        Value::Null => {}
        Value::String(s) if !s.is_empty() => {}
        _ => return Err("system: must be a non-empty string".into()),
    }
    if let Some(t) = body.get("temperature") {
        if !t.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)) {
            return Err("temperature: must be between 0 and 1".into());
        }
    }
    check_tools(body)?;
    check_messages(body)
}

fn valid_id(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_tools(body: &Value) -> Result<(), String> {
    let Some(tools) = body.get("tools") else {
        return Ok(());
    };
    for (i, tool) in tools
        .as_array()
        .ok_or("tools: must be a list")?
        .iter()
        .enumerate()
    {
        let fields = tool
            .as_object()
            .ok_or(format!("tools.{i}: must be an object"))?;
        if let Some(extra) = fields.keys().find(|k| {
            !["name", "description", "input_schema", "cache_control"].contains(&k.as_str())
        }) {
            return Err(format!("tools.{i}.{extra}: Extra inputs are not permitted"));
        }
        if !tool["name"].as_str().is_some_and(|n| valid_id(n, 64)) {
            return Err(format!(
                "tools.{i}.name: must match ^[a-zA-Z0-9_-]{{1,64}}$"
            ));
        }
        if tool["input_schema"]["type"] != "object" {
            return Err(format!("tools.{i}.input_schema: must be an object schema"));
        }
    }
    if let Some(choice) = body.get("tool_choice") {
        if !["auto", "any", "tool", "none"].contains(&choice["type"].as_str().unwrap_or("")) {
            return Err("tool_choice.type: must be auto, any, tool or none".into());
        }
    }
    Ok(())
}

fn check_messages(body: &Value) -> Result<(), String> {
    let messages = body["messages"]
        .as_array()
        .ok_or("messages: Field required")?;
    if messages.is_empty() {
        return Err("messages: at least one message is required".into());
    }
    // The ids the previous assistant turn asked for, which this turn must answer.
    let mut asked: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let fields = m
            .as_object()
            .ok_or(format!("messages.{i}: must be an object"))?;
        if let Some(extra) = fields
            .keys()
            .find(|k| !["role", "content"].contains(&k.as_str()))
        {
            return Err(format!(
                "messages.{i}.{extra}: Extra inputs are not permitted"
            ));
        }
        let role = m["role"].as_str().unwrap_or("");
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            return Err(format!(
                "messages.{i}.role: roles must alternate, starting with user; got {role:?} where {expected} was due"
            ));
        }
        let blocks = match &m["content"] {
            Value::String(s) if !s.is_empty() => vec![json!({"type": "text", "text": s})],
            Value::Array(b) if !b.is_empty() => b.clone(),
            _ => {
                return Err(format!(
                    "messages.{i}: all messages must have non-empty content"
                ))
            }
        };
        let mut answered = Vec::new();
        let mut tool_uses = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("messages.{i}.content.{j}");
            match (role, b["type"].as_str().unwrap_or("")) {
                (_, "text") => {
                    if b["text"].as_str().is_none_or(str::is_empty) {
                        return Err(format!("{at}: text content blocks must be non-empty"));
                    }
                }
                ("user", "image") => {}
                ("assistant", "tool_use") => {
                    if !b["id"].as_str().is_some_and(|id| valid_id(id, 200))
                        || !b["name"].is_string()
                        || !b["input"].is_object()
                    {
                        return Err(format!(
                            "{at}: a tool_use needs an id, a name and an object input"
                        ));
                    }
                    tool_uses.push(b["id"].as_str().unwrap_or("").to_string());
                }
                ("user", "tool_result") => {
                    if answered.len() != j {
                        return Err(format!(
                            "{at}: tool_result blocks must come first in the content, before any text"
                        ));
                    }
                    let id = b["tool_use_id"].as_str().unwrap_or("").to_string();
                    if !asked.contains(&id) {
                        return Err(format!(
                            "{at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                        ));
                    }
                    answered.push(id);
                }
                (_, other) => {
                    return Err(format!("{at}: a {role} turn cannot hold a {other:?} block"))
                }
            }
        }
        if let Some(missing) = asked.iter().find(|id| !answered.contains(id)) {
            return Err(format!(
                "messages.{}: `tool_use` ids were found without `tool_result` blocks immediately after: {missing}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                i - 1
            ));
        }
        asked = tool_uses;
    }
    if let Some(id) = asked.first() {
        return Err(format!(
            "messages.{}: `tool_use` ids were found without `tool_result` blocks immediately after: {id}",
            messages.len() - 1
        ));
    }
    Ok(())
}
