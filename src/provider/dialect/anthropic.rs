//! Anthropic Messages, as Claude Code and the Anthropic SDKs speak it.
//!
//! Request: `system` becomes one leading system message; a user turn's `tool_result`
//! blocks become `tool` messages ahead of the rest of the turn (chat completions wants a
//! tool call answered right after it); an assistant turn's `text` and `tool_use` blocks one
//! assistant message with `tool_calls`. Thinking blocks are dropped (a chat model cannot
//! take them back), and so are server tools, which only Anthropic can run.
//!
//! Reply: the chat message as a `message` object, or the event sequence Anthropic streams:
//! `message_start`, per block `content_block_start`/`_delta`/`_stop`, `message_delta`,
//! `message_stop`.

use serde_json::{json, Map, Value};

use super::{
    copy_numbers, event, field, insert_tools, invalid, join, model_of, object, opt_array, opt_bool,
    opt_cap, opt_str, req_str, Answer, DialectError, Inbound, Out, Reply,
};

pub(super) fn to_chat(body: &Value) -> Result<Inbound, DialectError> {
    let body = object(body, "body")?;
    let model = model_of(body)?;
    let max_tokens = opt_cap(body, "max_tokens")?
        .ok_or_else(|| invalid("max_tokens", "must be a positive integer"))?;
    let stream = opt_bool(body, "stream", "")?.unwrap_or(false);
    let mut messages = Vec::new();
    if let Some(system) = system_text(field(body, "system"), "system")? {
        messages.push(json!({"role": "system", "content": system}));
    }
    let turns = opt_array(body, "messages", "")?
        .filter(|list| !list.is_empty())
        .ok_or_else(|| invalid("messages", "must be a non-empty array"))?;
    for (i, turn) in turns.iter().enumerate() {
        push_turn(turn, &format!("messages[{i}]"), &mut messages)?;
    }

    let mut out = Map::new();
    out.insert("model".into(), model.clone().into());
    out.insert("messages".into(), messages.into());
    out.insert("max_tokens".into(), max_tokens.into());
    let tools = tools(body)?;
    let (choice, parallel) = tool_choice(body)?;
    insert_tools(&mut out, tools, choice, parallel);
    copy_numbers(body, &mut out, &["temperature", "top_p"])?;
    if let Some(stops) = opt_array(body, "stop_sequences", "")? {
        for (k, stop) in stops.iter().enumerate() {
            if !stop.is_string() {
                return Err(invalid(&format!("stop_sequences[{k}]"), "must be a string"));
            }
        }
        if !stops.is_empty() {
            out.insert("stop".into(), Value::Array(stops.clone()));
        }
    }
    Ok(Inbound {
        chat_body: Value::Object(out),
        stream,
        model,
    })
}

/// `system` as one text; blocks are joined by a blank line, as separate paragraphs of one
/// prompt. Their `cache_control` marks are the provider's business, not the model's.
fn system_text(system: Option<&Value>, at: &str) -> Result<Option<String>, DialectError> {
    let text = match system {
        None => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.iter().enumerate() {
                let at = format!("{at}[{j}]");
                let block = object(block, &at)?;
                match req_str(block, "type", &at)? {
                    "text" => texts.push(req_str(block, "text", &at)?),
                    other => {
                        return Err(invalid(
                            &at,
                            format!("block type {other:?} cannot go in a system prompt; only text"),
                        ))
                    }
                }
            }
            texts.join("\n\n")
        }
        Some(_) => return Err(invalid(at, "must be a string or an array of text blocks")),
    };
    Ok((!text.is_empty()).then_some(text))
}

fn push_turn(turn: &Value, at: &str, messages: &mut Vec<Value>) -> Result<(), DialectError> {
    let turn = object(turn, at)?;
    let role = req_str(turn, "role", at)?;
    if role == "system" {
        // Claude Code puts system turns between the others (its environment, reminders).
        let text = system_text(field(turn, "content"), &join(at, "content"))?;
        messages.push(json!({"role": "system", "content": text.unwrap_or_default()}));
        return Ok(());
    }
    if role != "user" && role != "assistant" {
        return Err(invalid(
            &join(at, "role"),
            format!("must be \"user\", \"assistant\" or \"system\", not {role:?}"),
        ));
    }
    let blocks = match field(turn, "content") {
        Some(Value::String(text)) => {
            messages.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(invalid(
                &join(at, "content"),
                "must be a string or an array of content blocks",
            ))
        }
    };
    if role == "user" {
        user_turn(blocks, at, messages)
    } else {
        messages.push(assistant_turn(blocks, at)?);
        Ok(())
    }
}

/// The type of the content block at `at`.
fn block_type<'a>(block: &'a Map<String, Value>, at: &str) -> Result<&'a str, DialectError> {
    req_str(block, "type", at)
}

fn unknown_block(at: &str, kind: &str) -> DialectError {
    invalid(at, format!("unknown block type {kind:?}"))
}

fn misplaced_block(at: &str, kind: &str, role: &str) -> DialectError {
    invalid(at, format!("{kind:?} blocks cannot go in {role} messages"))
}

fn user_turn(blocks: &[Value], at: &str, messages: &mut Vec<Value>) -> Result<(), DialectError> {
    let mut parts = Vec::new();
    // Chat completions takes only text in a tool message, so a tool result's images go to
    // the user message that follows the tool messages.
    let mut result_images = Vec::new();
    let mut answered = false;
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let block = object(block, &at)?;
        match block_type(block, &at)? {
            "text" => {
                parts.push(json!({"type": "text", "text": req_str(block, "text", &at)?}));
            }
            "image" => parts.push(image_part(block, &at)?),
            "tool_result" => {
                messages.push(tool_result(block, &at, &mut result_images)?);
                answered = true;
            }
            "thinking" | "redacted_thinking" => {}
            kind @ "tool_use" => return Err(misplaced_block(&at, kind, "user")),
            other => return Err(unknown_block(&at, other)),
        }
    }
    result_images.append(&mut parts);
    let parts = result_images;
    let content = match parts.as_slice() {
        // A turn of nothing but tool results needs no user message after them.
        [] if answered => return Ok(()),
        [] => Value::String(String::new()),
        [only] if only["type"] == "text" => only["text"].clone(),
        _ => Value::Array(parts),
    };
    messages.push(json!({"role": "user", "content": content}));
    Ok(())
}

fn image_part(block: &Map<String, Value>, at: &str) -> Result<Value, DialectError> {
    let source_at = join(at, "source");
    let source = object(block.get("source").unwrap_or(&Value::Null), &source_at)?;
    let url = match req_str(source, "type", &source_at)? {
        "base64" => format!(
            "data:{};base64,{}",
            req_str(source, "media_type", &source_at)?,
            req_str(source, "data", &source_at)?
        ),
        "url" => req_str(source, "url", &source_at)?.to_string(),
        other => {
            return Err(invalid(
                &join(&source_at, "type"),
                format!("image source {other:?} is not supported; send base64 or url"),
            ))
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn tool_result(
    block: &Map<String, Value>,
    at: &str,
    images: &mut Vec<Value>,
) -> Result<Value, DialectError> {
    let id = req_str(block, "tool_use_id", at)?;
    let content_at = join(at, "content");
    let mut text = match field(block, "content") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(inner)) => {
            let mut texts = Vec::new();
            for (k, part) in inner.iter().enumerate() {
                let at = format!("{content_at}[{k}]");
                let part = object(part, &at)?;
                match block_type(part, &at)? {
                    "text" => texts.push(req_str(part, "text", &at)?),
                    "image" => images.push(image_part(part, &at)?),
                    other => return Err(unknown_block(&at, other)),
                }
            }
            texts.join("\n")
        }
        Some(_) => {
            return Err(invalid(
                &content_at,
                "must be a string or an array of text and image blocks",
            ))
        }
    };
    if opt_bool(block, "is_error", at)? == Some(true) {
        text.insert_str(0, "Error: ");
    }
    Ok(json!({"role": "tool", "tool_call_id": id, "content": text}))
}

fn assistant_turn(blocks: &[Value], at: &str) -> Result<Value, DialectError> {
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let block = object(block, &at)?;
        match block_type(block, &at)? {
            "text" => {
                let text = req_str(block, "text", &at)?;
                if !text.is_empty() {
                    texts.push(text);
                }
            }
            "tool_use" => {
                let input = field(block, "input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({
                    "id": req_str(block, "id", &at)?,
                    "type": "function",
                    "function": {"name": req_str(block, "name", &at)?, "arguments": input.to_string()},
                }));
            }
            "thinking" | "redacted_thinking" => {}
            kind @ ("tool_result" | "image") => {
                return Err(misplaced_block(&at, kind, "assistant"))
            }
            other => return Err(unknown_block(&at, other)),
        }
    }
    let text = texts.join("\n\n");
    let mut message = json!({"role": "assistant"});
    // OpenAI's own assistant messages carry a null content beside tool calls.
    message["content"] = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        text.into()
    };
    if !calls.is_empty() {
        message["tool_calls"] = calls.into();
    }
    Ok(message)
}

fn tools(body: &Map<String, Value>) -> Result<Vec<Value>, DialectError> {
    let Some(list) = opt_array(body, "tools", "")? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let tool = object(tool, &at)?;
        let kind = opt_str(tool, "type", &at)?;
        let Some(schema) = field(tool, "input_schema") else {
            match kind {
                // A server tool (web_search_20250305, bash_20250124, ...) runs at Anthropic;
                // no chat model can call it, so it is left out rather than faked.
                Some(kind) if kind != "custom" => continue,
                _ => return Err(invalid(&join(&at, "input_schema"), "must be a JSON object")),
            }
        };
        if !schema.is_object() {
            return Err(invalid(&join(&at, "input_schema"), "must be a JSON object"));
        }
        let mut function = json!({"name": req_str(tool, "name", &at)?, "parameters": schema});
        if let Some(description) = opt_str(tool, "description", &at)? {
            function["description"] = description.into();
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

/// `tool_choice` as chat's `tool_choice` and `parallel_tool_calls`.
fn tool_choice(body: &Map<String, Value>) -> Result<(Option<Value>, Option<bool>), DialectError> {
    let Some(choice) = field(body, "tool_choice") else {
        return Ok((None, None));
    };
    let choice = object(choice, "tool_choice")?;
    let mapped = match req_str(choice, "type", "tool_choice")? {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            json!({"type": "function", "function": {"name": req_str(choice, "name", "tool_choice")?}})
        }
        other => {
            return Err(invalid(
                "tool_choice.type",
                format!("must be auto, any, tool or none, not {other:?}"),
            ))
        }
    };
    let parallel = match opt_bool(choice, "disable_parallel_tool_use", "tool_choice")? {
        Some(true) => Some(false),
        _ => None,
    };
    Ok((Some(mapped), parallel))
}

pub(super) fn reply(answer: &Answer, out: &Out<'_>, stream: bool) -> Result<Reply, DialectError> {
    let mut content = Vec::new();
    if !answer.text.is_empty() {
        content.push(json!({"type": "text", "text": answer.text}));
    }
    // The argument text each tool_use block streams as its `partial_json`.
    let mut partial = Vec::new();
    for (i, call) in answer.calls.iter().enumerate() {
        let (input, text) = input_of(&call.arguments, i)?;
        let id = match &call.id {
            Some(id) => id.clone(),
            None => format!("toolu_{}_{i}", out.seed),
        };
        content.push(json!({"type": "tool_use", "id": id, "name": call.name, "input": input}));
        partial.push(text);
    }
    // A message always has a block; Anthropic sends an empty text block for an empty answer.
    if content.is_empty() {
        content.push(json!({"type": "text", "text": ""}));
    }
    let stop_reason = stop_reason(answer);
    let usage = out.usage;
    let cached = usage.cached_input_tokens.min(usage.input_tokens);
    let message_usage = |output_tokens: u64| {
        // Anthropic's input_tokens leaves out cache reads, which it counts apart.
        json!({
            "input_tokens": usage.input_tokens - cached,
            "output_tokens": output_tokens,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
        })
    };
    let message = |content: Value, stop_reason: Value, usage: Value| {
        json!({
            "id": format!("msg_{}", out.seed),
            "type": "message",
            "role": "assistant",
            "model": out.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": usage,
        })
    };
    if !stream {
        return Ok(Reply::Json(message(
            content.into(),
            stop_reason.into(),
            message_usage(usage.output_tokens),
        )));
    }
    let mut events = Vec::new();
    let mut send = |data: Value| events.push(event(data["type"].as_str(), &data));
    send(json!({"type": "message_start", "message": message(
        json!([]),
        Value::Null,
        message_usage(usage.output_tokens.min(1)),
    )}));
    let mut calls = partial.into_iter();
    for (index, block) in content.iter().enumerate() {
        let (start, delta) = if block["type"] == "tool_use" {
            let start =
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}});
            let delta = calls
                .next()
                .map(|text| json!({"type": "input_json_delta", "partial_json": text}));
            (start, delta)
        } else {
            let delta = (!answer.text.is_empty())
                .then(|| json!({"type": "text_delta", "text": answer.text}));
            (json!({"type": "text", "text": ""}), delta)
        };
        send(json!({"type": "content_block_start", "index": index, "content_block": start}));
        if let Some(delta) = delta {
            send(json!({"type": "content_block_delta", "index": index, "delta": delta}));
        }
        send(json!({"type": "content_block_stop", "index": index}));
    }
    send(json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": {"output_tokens": usage.output_tokens},
    }));
    send(json!({"type": "message_stop"}));
    Ok(Reply::Events(events))
}

/// A tool call's arguments as the object `input` must be, and the JSON text to stream.
/// Empty arguments are a call without any; anything else that is no JSON object cannot be
/// shown to the agent as a tool_use, and is refused rather than invented.
fn input_of(arguments: &str, i: usize) -> Result<(Value, String), DialectError> {
    if arguments.trim().is_empty() {
        return Ok((json!({}), "{}".to_string()));
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(input @ Value::Object(_)) => Ok((input, arguments.to_string())),
        _ => Err(invalid(
            &format!("choices[0].message.tool_calls[{i}].function.arguments"),
            "is not a JSON object",
        )),
    }
}

/// `finish_reason` as a `stop_reason`. A turn that made tool calls is a `tool_use` stop
/// whatever the provider called it: Anthropic clients run tools on that stop reason.
fn stop_reason(answer: &Answer) -> &'static str {
    let calls = !answer.calls.is_empty();
    match answer.finish_reason.as_deref() {
        Some("length") => "max_tokens",
        Some("content_filter") => "refusal",
        Some("tool_calls" | "function_call") => "tool_use",
        _ if calls => "tool_use",
        _ => "end_turn",
    }
}
