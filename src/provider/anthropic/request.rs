//! The runner's OpenAI chat-completions body as an Anthropic Messages request.
//!
//! - `system` and `developer` messages become the top-level `system` (joined by a blank
//!   line, wherever they stood: the Messages API has no system turns);
//! - user messages become `text` and `image` blocks; assistant messages `text` blocks then a
//!   `tool_use` block per tool call (arguments parsed back into `input`); `tool` messages
//!   `tool_result` blocks in a user turn, ahead of any text in that turn, as the API wants;
//! - consecutive turns of one role are merged into one, since roles must alternate; empty
//!   text is dropped (the API refuses empty text blocks), and so is a turn left empty;
//! - `tools` become `{name, description, input_schema}`, `tool_choice` and
//!   `parallel_tool_calls` the Messages `tool_choice`, `stop` `stop_sequences`;
//!   `temperature` and `top_p` pass as they are; `max_tokens` (or `max_completion_tokens`)
//!   is required. Other OpenAI fields (`stream`, `n`, `seed`, ...) are not sent.

use serde_json::{json, Map, Value};

use crate::provider::ProviderError;

fn invalid(detail: impl Into<String>) -> ProviderError {
    ProviderError::InvalidRequest {
        detail: detail.into(),
    }
}

/// One turn of the Messages conversation, being built.
struct Turn {
    role: &'static str,
    blocks: Vec<Value>,
}

pub(super) fn messages_request(body: &Value, model: &str) -> Result<Value, ProviderError> {
    let Value::Object(body) = body else {
        return Err(invalid("the request body must be a JSON object"));
    };
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("the request body has no `messages` array"))?;
    let mut system = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        let content = message.get("content").unwrap_or(&Value::Null);
        match role {
            "system" | "developer" => {
                let text = text_of(content, &at)?;
                if !text.is_empty() {
                    system.push(text);
                }
            }
            "user" => push(&mut turns, "user", user_blocks(content, &at)?),
            "assistant" => push(&mut turns, "assistant", assistant_blocks(message, &at)?),
            "tool" => push(&mut turns, "user", vec![tool_result(message, &at)?]),
            other => {
                return Err(invalid(format!(
                    "{at} has role {other:?}; expected system, developer, user, assistant or tool"
                )))
            }
        }
    }
    if turns.is_empty() {
        return Err(invalid(
            "the request has no user or assistant message with content",
        ));
    }
    let mut out = Map::new();
    out.insert("model".into(), model.into());
    out.insert("max_tokens".into(), max_tokens(body)?.into());
    if !system.is_empty() {
        out.insert("system".into(), system.join("\n\n").into());
    }
    let turns: Vec<Value> = turns
        .into_iter()
        .map(|t| json!({"role": t.role, "content": t.blocks}))
        .collect();
    out.insert("messages".into(), turns.into());
    let tools = tools(body)?;
    if !tools.is_empty() {
        out.insert("tools".into(), tools.into());
        if let Some(choice) = tool_choice(body)? {
            out.insert("tool_choice".into(), choice);
        }
    }
    for key in ["temperature", "top_p"] {
        if let Some(v) = body.get(key).filter(|v| v.is_number()) {
            out.insert(key.into(), v.clone());
        }
    }
    match body.get("stop") {
        Some(Value::String(s)) => {
            out.insert("stop_sequences".into(), json!([s]));
        }
        Some(Value::Array(list)) if !list.is_empty() => {
            out.insert("stop_sequences".into(), Value::Array(list.clone()));
        }
        _ => {}
    }
    Ok(Value::Object(out))
}

/// Adds `blocks` as a turn of `role`, merged into the last turn when it has the same role.
/// A `tool_result` goes after the turn's other tool results but before its text: the API
/// wants a turn's tool results first.
fn push(turns: &mut Vec<Turn>, role: &'static str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => {
            for block in blocks {
                if is_tool_result(&block) {
                    let at = last.blocks.iter().take_while(|b| is_tool_result(b)).count();
                    last.blocks.insert(at, block);
                } else {
                    last.blocks.push(block);
                }
            }
        }
        _ => turns.push(Turn { role, blocks }),
    }
}

fn is_tool_result(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_result")
}

/// The text of a content that may only hold text: a string, null, or text parts.
fn text_of(content: &Value, at: &str) -> Result<String, ProviderError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, part) in parts.iter().enumerate() {
                match part_type(part) {
                    "text" => out.push_str(part_text(part, &format!("{at}.content[{j}]"))?),
                    // OpenAI's record of a refused answer; it has no Messages counterpart.
                    "refusal" => {}
                    other => {
                        return Err(invalid(format!(
                            "{at}.content[{j}] is a {other:?} part; only text can go here"
                        )))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(invalid(format!(
            "{at}.content must be a string, null or a list of parts"
        ))),
    }
}

fn part_type(part: &Value) -> &str {
    part.get("type").and_then(Value::as_str).unwrap_or("text")
}

fn part_text<'a>(part: &'a Value, at: &str) -> Result<&'a str, ProviderError> {
    part.get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{at} is a text part without a string `text`")))
}

fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

fn user_blocks(content: &Value, at: &str) -> Result<Vec<Value>, ProviderError> {
    let Value::Array(parts) = content else {
        return Ok(text_block(&text_of(content, at)?).into_iter().collect());
    };
    let mut blocks = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        match part_type(part) {
            "text" => blocks.extend(text_block(part_text(part, &here)?)),
            "image_url" => blocks.push(image_block(part, &here)?),
            other => {
                return Err(invalid(format!(
                    "{here} is a {other:?} part; text and image_url parts can be sent"
                )))
            }
        }
    }
    Ok(blocks)
}

/// An `image_url` part: a `data:` URL becomes a base64 source, anything else a URL source.
fn image_block(part: &Value, at: &str) -> Result<Value, ProviderError> {
    let url = part
        .get("image_url")
        .and_then(|i| i.get("url"))
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{at} is an image_url part without a url")))?;
    let source = match url.strip_prefix("data:") {
        Some(rest) => {
            let (media_type, data) = rest
                .split_once(";base64,")
                .ok_or_else(|| invalid(format!("{at} has a data URL that is not base64")))?;
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
        None => json!({"type": "url", "url": url}),
    };
    Ok(json!({"type": "image", "source": source}))
}

fn assistant_blocks(message: &Value, at: &str) -> Result<Vec<Value>, ProviderError> {
    let content = message.get("content").unwrap_or(&Value::Null);
    let mut blocks: Vec<Value> = text_block(&text_of(content, at)?).into_iter().collect();
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(calls)) => calls.as_slice(),
        Some(_) => return Err(invalid(format!("{at}.tool_calls must be a list"))),
    };
    for (j, call) in calls.iter().enumerate() {
        let here = format!("{at}.tool_calls[{j}]");
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("{here} has no id")))?;
        let function = call.get("function").unwrap_or(&Value::Null);
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("{here} has no function name")))?;
        blocks.push(json!({
            "type": "tool_use", "id": id, "name": name,
            "input": tool_input(function.get("arguments")),
        }));
    }
    Ok(blocks)
}

/// A tool call's arguments as the object `input` must be. Arguments that are no JSON object
/// (the runner answered the call with a parse error) are sent as `{}`: the call must still
/// appear for its tool result to answer it.
fn tool_input(arguments: Option<&Value>) -> Value {
    let parsed = match arguments {
        Some(Value::String(s)) => serde_json::from_str(s).ok(),
        Some(v) => Some(v.clone()),
        None => None,
    };
    match parsed {
        Some(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

fn tool_result(message: &Value, at: &str) -> Result<Value, ProviderError> {
    let id = message
        .get("tool_call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{at} is a tool message without a tool_call_id")))?;
    let text = text_of(message.get("content").unwrap_or(&Value::Null), at)?;
    let mut block = json!({"type": "tool_result", "tool_use_id": id});
    // `content` is optional, and an empty text would be refused.
    if !text.is_empty() {
        block["content"] = text.into();
    }
    Ok(block)
}

fn max_tokens(body: &Map<String, Value>) -> Result<u64, ProviderError> {
    let cap = body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"));
    match cap.and_then(Value::as_u64) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(invalid(
            "the request has no positive max_tokens, which the Messages API requires",
        )),
    }
}

/// `tools` in either of the shapes the runner accepts: OpenAI's
/// `{type: "function", function: {...}}` or the flat `{name, description, parameters}`.
fn tools(body: &Map<String, Value>) -> Result<Vec<Value>, ProviderError> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(invalid("tools must be a list")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, spec) in list.iter().enumerate() {
        let f = spec.get("function").unwrap_or(spec);
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("tools[{i}] has no name")))?;
        let schema = match f.get("parameters") {
            Some(p @ Value::Object(_)) => p.clone(),
            // A tool without parameters takes none; the API insists on an object schema.
            _ => json!({"type": "object", "properties": {}}),
        };
        let mut tool = json!({"name": name, "input_schema": schema});
        if let Some(d) = f.get("description").and_then(Value::as_str) {
            if !d.is_empty() {
                tool["description"] = d.into();
            }
        }
        out.push(tool);
    }
    Ok(out)
}

fn tool_choice(body: &Map<String, Value>) -> Result<Option<Value>, ProviderError> {
    let mut choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => json!({"type": "auto"}),
            "none" => json!({"type": "none"}),
            "required" => json!({"type": "any"}),
            other => {
                return Err(invalid(format!(
                    "tool_choice {other:?} is not auto, none or required"
                )))
            }
        }),
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice names no function"))?;
            Some(json!({"type": "tool", "name": name}))
        }
    };
    if body.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
        let c = choice.get_or_insert_with(|| json!({"type": "auto"}));
        if c["type"] != "none" {
            c["disable_parallel_tool_use"] = true.into();
        }
    }
    Ok(choice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: Value) -> Value {
        messages_request(&body, "claude-test").unwrap()
    }

    #[test]
    fn a_tool_conversation_becomes_alternating_turns() {
        let out = req(json!({
            "max_tokens": 100,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "toolu_1", "type": "function",
                     "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}},
                    {"id": "toolu_2", "type": "function",
                     "function": {"name": "bash", "arguments": "not json"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": ""},
                {"role": "user", "content": "now submit"},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": [{"type": "text", "text": "please"}]}
            ],
            "tools": [{"type": "function", "function": {"name": "bash", "description": "run",
                       "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
                      {"name": "submit"}],
            "temperature": 0.5,
            "stream": true,
            "stop": "END"
        }));
        assert_eq!(
            out,
            json!({
                "model": "claude-test",
                "max_tokens": 100,
                "system": "be brief",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "list files"}]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                        {"type": "tool_result", "tool_use_id": "toolu_2"},
                        {"type": "text", "text": "now submit"},
                        {"type": "text", "text": "please"}]}
                ],
                "tools": [
                    {"name": "bash", "description": "run", "input_schema":
                        {"type": "object", "properties": {"command": {"type": "string"}}}},
                    {"name": "submit", "input_schema": {"type": "object", "properties": {}}}
                ],
                "temperature": 0.5,
                "stop_sequences": ["END"]
            })
        );
    }

    #[test]
    fn tool_results_go_ahead_of_text_in_their_turn() {
        let mut turns = vec![Turn {
            role: "user",
            blocks: vec![json!({"type": "text", "text": "hi"})],
        }];
        push(
            &mut turns,
            "user",
            vec![json!({"type": "tool_result", "tool_use_id": "a"})],
        );
        push(
            &mut turns,
            "user",
            vec![json!({"type": "tool_result", "tool_use_id": "b"})],
        );
        let ids: Vec<&str> = turns[0]
            .blocks
            .iter()
            .map(|b| b["tool_use_id"].as_str().unwrap_or("text"))
            .collect();
        assert_eq!(ids, ["a", "b", "text"]);
    }

    #[test]
    fn images_and_choices_translate() {
        let out = req(json!({
            "max_completion_tokens": 5,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required",
            "parallel_tool_calls": false
        }));
        assert_eq!(out["max_tokens"], 5);
        assert_eq!(
            out["messages"][0]["content"],
            json!([
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
            ])
        );
        assert_eq!(
            out["tool_choice"],
            json!({"type": "any", "disable_parallel_tool_use": true})
        );
        let named = req(json!({
            "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}
        }));
        assert_eq!(named["tool_choice"], json!({"type": "tool", "name": "f"}));
    }

    #[test]
    fn what_cannot_be_sent_is_refused_by_name() {
        let user = json!([{"role": "user", "content": "x"}]);
        for (body, needle) in [
            (json!([]), "JSON object"),
            (json!({"max_tokens": 5}), "messages"),
            (json!({"messages": user}), "max_tokens"),
            (json!({"max_tokens": 0, "messages": user}), "max_tokens"),
            (
                json!({"max_tokens": 5, "messages": [{"role": "function", "content": "x"}]}),
                "messages[0] has role \"function\"",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}),
                "tool_call_id",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
                "no user or assistant message",
            ),
        ] {
            match messages_request(&body, "m") {
                Err(ProviderError::InvalidRequest { detail }) => {
                    assert!(detail.contains(needle), "{detail} lacks {needle}")
                }
                other => panic!("{body}: expected InvalidRequest, got {other:?}"),
            }
        }
    }
}
