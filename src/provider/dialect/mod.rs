//! The three model APIs agents speak, served on top of chat completions.
//!
//! An agent in a sandbox calls a local endpoint in OpenAI chat completions, OpenAI Responses
//! or Anthropic Messages. `to_chat` turns its request into the chat-completions body a
//! provider answers; `from_completion` turns the provider's chat completion back into what
//! that API returns, a JSON object or the server-sent events of a stream; `error_reply`
//! shapes a failure as that API shapes it, so the agent's own retry logic sees what it
//! expects. Nothing here does I/O, and the ids it makes come from a caller-given seed, so a
//! reply is a pure function of its inputs.
//!
//! Requests come from an untrusted sandbox: whatever cannot be translated faithfully is
//! refused with `DialectError::InvalidRequest` naming the field, never guessed at.

mod anthropic;
mod chat;
mod responses;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_anthropic;
#[cfg(test)]
mod tests_chat;
#[cfg(test)]
mod tests_responses;

use std::fmt::Display;

use serde_json::{json, Map, Value};

use crate::provider::Usage;

/// The API a request speaks; the runner names it by the path the request came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    OpenAiChat,
    OpenAiResponses,
    AnthropicMessages,
}

impl Api {
    /// The frame name: "openai_chat", "openai_responses", "anthropic_messages".
    pub fn name(self) -> &'static str {
        match self {
            Api::OpenAiChat => "openai_chat",
            Api::OpenAiResponses => "openai_responses",
            Api::AnthropicMessages => "anthropic_messages",
        }
    }

    pub fn from_name(name: &str) -> Option<Api> {
        [
            Api::OpenAiChat,
            Api::OpenAiResponses,
            Api::AnthropicMessages,
        ]
        .into_iter()
        .find(|api| api.name() == name)
    }
}

/// A request translated to chat completions.
#[derive(Debug, Clone)]
pub struct Inbound {
    pub chat_body: Value,
    pub stream: bool,
    pub model: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DialectError {
    #[error("{detail}")]
    InvalidRequest { detail: String },
}

pub fn to_chat(api: Api, body: &Value) -> Result<Inbound, DialectError> {
    match api {
        Api::OpenAiChat => chat::to_chat(body),
        Api::OpenAiResponses => responses::to_chat(body),
        Api::AnthropicMessages => anthropic::to_chat(body),
    }
}

/// One server-sent event: the `event:` line (None for chat, which sends none) and the
/// `data:` JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Json(Value),
    Events(Vec<SseEvent>),
}

/// `completion` is the chat-completion object the provider returned; `usage` its token
/// counts (`input_tokens` counts every prompt token, cached ones included); `model` the model
/// name the agent asked for (echoed back); `id_seed` a unique string to derive ids from
/// (e.g. "ep1-3"), so the output is deterministic.
pub fn from_completion(
    api: Api,
    completion: &Value,
    usage: &Usage,
    model: &str,
    stream: bool,
    id_seed: &str,
) -> Result<Reply, DialectError> {
    let answer = Answer::parse(completion)?;
    let out = Out {
        usage,
        model,
        seed: id_part(id_seed),
    };
    match api {
        Api::OpenAiChat => chat::reply(completion, &answer, &out, stream),
        Api::OpenAiResponses => Ok(responses::reply(&answer, &out, stream)),
        Api::AnthropicMessages => anthropic::reply(&answer, &out, stream),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    NotFound,
    RateLimited,
    QuotaExhausted,
    ServerError,
    Timeout,
}

/// The HTTP status and JSON body that `api` sends for this kind of failure, shaped as the
/// real APIs shape them, since agents decide on retries from the status and error type.
pub fn error_reply(api: Api, kind: ErrorKind, message: &str) -> (u16, Value) {
    match api {
        Api::OpenAiChat | Api::OpenAiResponses => {
            let (status, kind, code) = match kind {
                ErrorKind::InvalidRequest => (400, "invalid_request_error", None),
                ErrorKind::NotFound => (404, "invalid_request_error", None),
                ErrorKind::RateLimited => (429, "requests", Some("rate_limit_exceeded")),
                ErrorKind::QuotaExhausted => {
                    (429, "insufficient_quota", Some("insufficient_quota"))
                }
                ErrorKind::ServerError => (500, "server_error", None),
                // The host's model call ran out of time: a gateway timeout, which OpenAI's
                // SDKs retry like any 5xx.
                ErrorKind::Timeout => (504, "server_error", None),
            };
            let body = json!({"error": {
                "message": message, "type": kind, "param": null, "code": code,
            }});
            (status, body)
        }
        Api::AnthropicMessages => {
            let (status, kind, message) = match kind {
                ErrorKind::InvalidRequest => (400, "invalid_request_error", message.to_string()),
                ErrorKind::NotFound => (404, "not_found_error", message.to_string()),
                ErrorKind::RateLimited => (429, "rate_limit_error", message.to_string()),
                // Anthropic reports a spent balance as a 400, which its clients do not
                // retry (a spent budget does not come back by waiting); the wording is
                // theirs, so a client that recognises it says the right thing.
                ErrorKind::QuotaExhausted => (
                    400,
                    "invalid_request_error",
                    if message.is_empty() {
                        QUOTA_MESSAGE.to_string()
                    } else {
                        format!("{QUOTA_MESSAGE}: {message}")
                    },
                ),
                ErrorKind::ServerError => (500, "api_error", message.to_string()),
                ErrorKind::Timeout => (504, "timeout_error", message.to_string()),
            };
            (
                status,
                json!({"type": "error", "error": {"type": kind, "message": message}}),
            )
        }
    }
}

const QUOTA_MESSAGE: &str =
    "Your credit balance is too low: the model budget for this run is spent";

/// What the reply builders share besides the answer itself.
struct Out<'a> {
    usage: &'a Usage,
    model: &'a str,
    /// `id_seed` made safe to stand inside an id.
    seed: String,
}

/// The part of a chat completion every API's reply is built from.
#[derive(Debug)]
struct Answer {
    id: Option<String>,
    created: u64,
    text: String,
    calls: Vec<Call>,
    finish_reason: Option<String>,
}

#[derive(Debug)]
struct Call {
    id: Option<String>,
    name: String,
    /// The JSON text of the arguments, as the model wrote it.
    arguments: String,
}

impl Answer {
    /// Reads `choices[0]`. Providers (a scripted one included) may leave out what OpenAI
    /// always sends, so only the message itself and a name per tool call are required.
    fn parse(completion: &Value) -> Result<Answer, DialectError> {
        let choice = completion.get("choices").and_then(|c| c.get(0));
        let message = choice
            .and_then(|c| c.get("message"))
            .filter(|m| m.is_object())
            .ok_or_else(|| invalid("choices[0].message", "missing from the completion"))?;
        let text = match message.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            // Some OpenAI-compatible servers answer with content parts.
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    let at = format!("choices[0].message.content[{j}]");
                    text.push_str(req_str(object(part, &at)?, "text", &at)?);
                }
                text
            }
            Some(_) => {
                return Err(invalid(
                    "choices[0].message.content",
                    "must be a string or null",
                ))
            }
        };
        let calls = match message.get("tool_calls") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(calls)) => {
                let mut out = Vec::with_capacity(calls.len());
                for (i, call) in calls.iter().enumerate() {
                    let at = format!("choices[0].message.tool_calls[{i}]");
                    let call = object(call, &at)?;
                    let f_at = join(&at, "function");
                    let function = object(call.get("function").unwrap_or(&Value::Null), &f_at)?;
                    let arguments = match function.get("arguments") {
                        None | Some(Value::Null) => String::new(),
                        Some(Value::String(s)) => s.clone(),
                        Some(v @ Value::Object(_)) => v.to_string(),
                        Some(_) => {
                            return Err(invalid(
                                &join(&f_at, "arguments"),
                                "must be a string of JSON",
                            ))
                        }
                    };
                    out.push(Call {
                        id: opt_str(call, "id", &at)?.map(str::to_string),
                        name: req_str(function, "name", &f_at)?.to_string(),
                        arguments,
                    });
                }
                out
            }
            Some(_) => return Err(invalid("choices[0].message.tool_calls", "must be an array")),
        };
        let finish_reason = choice
            .and_then(|c| c.get("finish_reason"))
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Answer {
            id: completion
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_string),
            created: completion
                .get("created")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            text,
            calls,
            finish_reason,
        })
    }
}

/// `seed` with every character that does not belong in an id (ids end up in URLs, logs and
/// client-side maps) replaced by `_`.
fn id_part(seed: &str) -> String {
    seed.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn invalid(at: &str, what: impl Display) -> DialectError {
    DialectError::InvalidRequest {
        detail: format!("{at}: {what}"),
    }
}

/// The path of `key` inside the value at `at` ("" is the body itself).
fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, DialectError> {
    v.as_object()
        .ok_or_else(|| invalid(at, "must be a JSON object"))
}

/// A present, non-null field of `obj`; an explicit null reads as absent, as the APIs treat it.
fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn req_str<'a>(obj: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, DialectError> {
    opt_str(obj, key, at)?.ok_or_else(|| invalid(&join(at, key), "must be a string"))
}

fn opt_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<&'a str>, DialectError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(invalid(&join(at, key), "must be a string")),
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &str, at: &str) -> Result<Option<bool>, DialectError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(invalid(&join(at, key), "must be true or false")),
    }
}

fn opt_array<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<&'a Vec<Value>>, DialectError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Array(list)) => Ok(Some(list)),
        Some(_) => Err(invalid(&join(at, key), "must be an array")),
    }
}

/// `model`, which every API requires and which a provider needs to name.
fn model_of(obj: &Map<String, Value>) -> Result<String, DialectError> {
    match req_str(obj, "model", "")? {
        "" => Err(invalid("model", "must not be empty")),
        model => Ok(model.to_string()),
    }
}

/// A positive integer token cap, absent allowed.
fn opt_cap(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, DialectError> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(invalid(key, "must be a positive integer")),
        },
    }
}

/// Puts the translated tools in `to`, with how to choose among them. Chat completions
/// refuses `tool_choice` and `parallel_tool_calls` without tools, and with every tool
/// dropped (hosted or server tools) there is nothing for them to steer.
fn insert_tools(
    to: &mut Map<String, Value>,
    tools: Vec<Value>,
    choice: Option<Value>,
    parallel: Option<bool>,
) {
    if tools.is_empty() {
        return;
    }
    to.insert("tools".into(), tools.into());
    if let Some(choice) = choice {
        to.insert("tool_choice".into(), choice);
    }
    if let Some(parallel) = parallel {
        to.insert("parallel_tool_calls".into(), parallel.into());
    }
}

/// Copies the sampling knobs both translated APIs share with chat completions.
fn copy_numbers(
    from: &Map<String, Value>,
    to: &mut Map<String, Value>,
    keys: &[&str],
) -> Result<(), DialectError> {
    for key in keys {
        match field(from, key) {
            None => {}
            Some(v @ Value::Number(_)) => {
                to.insert(key.to_string(), v.clone());
            }
            Some(_) => return Err(invalid(key, "must be a number")),
        }
    }
    Ok(())
}

/// The text of a server-sent event's data: a JSON value always serialises.
fn event(kind: Option<&str>, data: &Value) -> SseEvent {
    SseEvent {
        event: kind.map(str::to_string),
        data: data.to_string(),
    }
}
