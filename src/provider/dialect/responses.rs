//! OpenAI Responses, as Codex CLI speaks it.
//!
//! Request: `instructions` becomes a leading system message and each `input` item a chat
//! message: messages by role (`developer` is chat's `system`), a run of `function_call`
//! items one assistant message with `tool_calls` (merged into the assistant message before
//! them, as chat completions records one turn), outputs `tool` messages. Custom (freeform)
//! tools become function tools taking `{"input": <text>}`, which is how Codex reads a
//! function call to a tool it declared custom. Hosted tools are dropped: only OpenAI runs them.
//!
//! Reply: the chat message as a `response` object, or the documented event sequence, each
//! event numbered by `sequence_number` from 0.

use serde_json::{json, Map, Value};

use super::{
    copy_numbers, event, field, insert_tools, invalid, join, model_of, object, opt_array, opt_bool,
    opt_cap, opt_str, req_str, Answer, DialectError, Inbound, Out, Reply,
};

pub(super) fn to_chat(body: &Value) -> Result<Inbound, DialectError> {
    let body = object(body, "body")?;
    let model = model_of(body)?;
    let stream = opt_bool(body, "stream", "")?.unwrap_or(false);
    // The conversation would live in OpenAI's store, which no provider here can read.
    for key in ["previous_response_id", "conversation"] {
        if field(body, key).is_some() {
            return Err(invalid(
                key,
                "is not supported: send the whole conversation in `input` (store: false)",
            ));
        }
    }
    let mut chat = Conversation::default();
    if let Some(instructions) = opt_str(body, "instructions", "")? {
        if !instructions.is_empty() {
            chat.push(json!({"role": "system", "content": instructions}));
        }
    }
    match field(body, "input") {
        Some(Value::String(text)) => chat.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                push_item(&mut chat, item, &format!("input[{i}]"))?;
            }
        }
        _ => return Err(invalid("input", "must be a string or an array of items")),
    }

    let mut out = Map::new();
    out.insert("model".into(), model.clone().into());
    out.insert("messages".into(), chat.finish().into());
    if let Some(cap) = opt_cap(body, "max_output_tokens")? {
        out.insert("max_tokens".into(), cap.into());
    }
    let tools = tools(body)?;
    let choice = tool_choice(body)?;
    let parallel = opt_bool(body, "parallel_tool_calls", "")?;
    insert_tools(&mut out, tools, choice, parallel);
    copy_numbers(body, &mut out, &["temperature", "top_p"])?;
    Ok(Inbound {
        chat_body: Value::Object(out),
        stream,
        model,
    })
}

/// The chat messages being built. Images in tool outputs wait in `images` for the end of
/// the run of tool messages: chat completions takes only text in a tool message, and a user
/// message between the answers to one turn's calls would break that turn.
#[derive(Default)]
struct Conversation {
    messages: Vec<Value>,
    images: Vec<Value>,
}

impl Conversation {
    fn push(&mut self, message: Value) {
        if message["role"] != "tool" {
            self.flush();
        }
        self.messages.push(message);
    }

    fn push_call(&mut self, call: Value) {
        self.flush();
        if let Some(last) = self
            .messages
            .last_mut()
            .filter(|m| m["role"] == "assistant")
        {
            match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                Some(calls) => calls.push(call),
                None => last["tool_calls"] = json!([call]),
            }
            return;
        }
        self.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    }

    fn flush(&mut self) {
        if !self.images.is_empty() {
            let images = std::mem::take(&mut self.images);
            self.messages
                .push(json!({"role": "user", "content": images}));
        }
    }

    fn finish(mut self) -> Vec<Value> {
        self.flush();
        self.messages
    }
}

fn push_item(chat: &mut Conversation, item: &Value, at: &str) -> Result<(), DialectError> {
    let item = object(item, at)?;
    let kind = match opt_str(item, "type", at)? {
        Some(kind) => kind,
        // The short form `{role, content}` is a message.
        None if item.contains_key("role") => "message",
        None => return Err(invalid(&join(at, "type"), "must be a string")),
    };
    let call = |name: &str, arguments: String| -> Result<Value, DialectError> {
        Ok(json!({
            "id": call_id(item, at)?, "type": "function",
            "function": {"name": name, "arguments": arguments},
        }))
    };
    match kind {
        "message" => chat.push(message(item, at)?),
        "function_call" => {
            let arguments = req_str(item, "arguments", at)?.to_string();
            chat.push_call(call(req_str(item, "name", at)?, arguments)?);
        }
        "custom_tool_call" => {
            let arguments = json!({"input": req_str(item, "input", at)?}).to_string();
            chat.push_call(call(req_str(item, "name", at)?, arguments)?);
        }
        "local_shell_call" => {
            let action = field(item, "action")
                .filter(|a| a.is_object())
                .ok_or_else(|| invalid(&join(at, "action"), "must be a JSON object"))?;
            chat.push_call(call("local_shell", action.to_string())?);
        }
        "function_call_output" | "custom_tool_call_output" | "local_shell_call_output" => {
            let text = output_text(item, at, &mut chat.images)?;
            chat.push(json!({"role": "tool", "tool_call_id": call_id(item, at)?, "content": text}));
        }
        // Hidden reasoning of an earlier turn: no chat model can take it back.
        "reasoning" => {}
        other => return Err(invalid(at, format!("unknown item type {other:?}"))),
    }
    Ok(())
}

/// The call an item makes or answers; local shell items may name it `id` alone.
fn call_id<'a>(item: &'a Map<String, Value>, at: &str) -> Result<&'a str, DialectError> {
    match opt_str(item, "call_id", at)? {
        Some(id) => Ok(id),
        None if item
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.starts_with("local_shell")) =>
        {
            req_str(item, "id", at)
        }
        None => Err(invalid(&join(at, "call_id"), "must be a string")),
    }
}

fn message(item: &Map<String, Value>, at: &str) -> Result<Value, DialectError> {
    let role = match req_str(item, "role", at)? {
        "developer" | "system" => "system",
        role @ ("user" | "assistant") => role,
        other => {
            return Err(invalid(
                &join(at, "role"),
                format!("must be user, assistant, system or developer, not {other:?}"),
            ))
        }
    };
    let content_at = join(at, "content");
    let parts = match field(item, "content") {
        Some(Value::String(text)) => return Ok(json!({"role": role, "content": text})),
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(invalid(
                &content_at,
                "must be a string or an array of content parts",
            ))
        }
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{content_at}[{j}]");
        let part = object(part, &at)?;
        match req_str(part, "type", &at)? {
            "input_text" | "output_text" | "text" => {
                out.push(json!({"type": "text", "text": req_str(part, "text", &at)?}));
            }
            "input_image" if role == "user" => out.push(image(part, &at)?),
            kind @ "input_image" => {
                return Err(invalid(
                    &at,
                    format!("{kind:?} parts cannot go in {role} messages"),
                ))
            }
            other => return Err(invalid(&at, format!("unknown content part type {other:?}"))),
        }
    }
    let content = match out.as_slice() {
        [only] if only["type"] == "text" => only["text"].clone(),
        _ if role == "user" => Value::Array(out),
        // System and assistant turns hold text only, and a plain string is what every
        // chat-completions server takes there.
        _ => Value::String(
            out.iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n\n"),
        ),
    };
    Ok(json!({"role": role, "content": content}))
}

fn image(part: &Map<String, Value>, at: &str) -> Result<Value, DialectError> {
    let Some(url) = opt_str(part, "image_url", at)? else {
        return Err(invalid(
            &join(at, "image_url"),
            "must be a string (images by file_id are not supported)",
        ));
    };
    let mut image_url = json!({"url": url});
    if let Some(detail) = opt_str(part, "detail", at)? {
        image_url["detail"] = detail.into();
    }
    Ok(json!({"type": "image_url", "image_url": image_url}))
}

/// A tool output's text; its images go to `images`, for the user message after the run of
/// tool messages.
fn output_text(
    item: &Map<String, Value>,
    at: &str,
    images: &mut Vec<Value>,
) -> Result<String, DialectError> {
    let output_at = join(at, "output");
    match field(item, "output") {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (k, part) in parts.iter().enumerate() {
                let at = format!("{output_at}[{k}]");
                let part = object(part, &at)?;
                match req_str(part, "type", &at)? {
                    "input_text" | "output_text" | "text" => {
                        texts.push(req_str(part, "text", &at)?)
                    }
                    "input_image" => images.push(image(part, &at)?),
                    other => {
                        return Err(invalid(&at, format!("unknown content part type {other:?}")))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(invalid(
            &output_at,
            "must be a string or an array of content parts",
        )),
    }
}

fn tools(body: &Map<String, Value>) -> Result<Vec<Value>, DialectError> {
    let Some(list) = opt_array(body, "tools", "")? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let tool = object(tool, &at)?;
        let parameters = match req_str(tool, "type", &at)? {
            "function" => match field(tool, "parameters") {
                Some(p @ Value::Object(_)) => p.clone(),
                None => json!({"type": "object", "properties": {}}),
                Some(_) => return Err(invalid(&join(&at, "parameters"), "must be a JSON object")),
            },
            "custom" => json!({
                "type": "object",
                "properties": {"input": {"type": "string"}},
                "required": ["input"],
            }),
            // Hosted tools (web_search, file_search, mcp, namespace, local_shell, ...).
            _ => continue,
        };
        let mut function = json!({"name": req_str(tool, "name", &at)?});
        if let Some(description) = opt_str(tool, "description", &at)? {
            function["description"] = description.into();
        }
        function["parameters"] = parameters;
        if let Some(strict) = opt_bool(tool, "strict", &at)? {
            function["strict"] = strict.into();
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

fn tool_choice(body: &Map<String, Value>) -> Result<Option<Value>, DialectError> {
    match field(body, "tool_choice") {
        None => Ok(None),
        Some(Value::String(s)) if matches!(s.as_str(), "auto" | "none" | "required") => {
            Ok(Some(s.as_str().into()))
        }
        Some(Value::Object(choice)) => match req_str(choice, "type", "tool_choice")? {
            // A custom tool is a function tool once translated.
            "function" | "custom" => {
                let name = req_str(choice, "name", "tool_choice")?;
                Ok(Some(
                    json!({"type": "function", "function": {"name": name}}),
                ))
            }
            other => Err(invalid(
                "tool_choice.type",
                format!("{other:?} is not supported; use function or custom"),
            )),
        },
        Some(_) => Err(invalid(
            "tool_choice",
            "must be auto, none, required or {type: function, name}",
        )),
    }
}

pub(super) fn reply(answer: &Answer, out: &Out<'_>, stream: bool) -> Reply {
    let seed = &out.seed;
    let incomplete = match answer.finish_reason.as_deref() {
        Some("length") => Some("max_output_tokens"),
        Some("content_filter") => Some("content_filter"),
        _ => None,
    };
    // Each item as it is once done, and as `output_item.added` announces it.
    let mut items: Vec<(Value, Value)> = Vec::new();
    if !answer.text.is_empty() {
        let item = |status: &str, content: Value| {
            json!({"type": "message", "id": format!("msg_{seed}"), "status": status,
                   "role": "assistant", "content": content})
        };
        let part = json!({"type": "output_text", "text": answer.text, "annotations": []});
        items.push((
            item("completed", json!([part])),
            item("in_progress", json!([])),
        ));
    }
    for (i, call) in answer.calls.iter().enumerate() {
        let call_id = match &call.id {
            Some(id) => id.clone(),
            None => format!("call_{seed}_{i}"),
        };
        let item = |status: &str, arguments: &str| {
            json!({"type": "function_call", "id": format!("fc_{seed}_{i}"), "call_id": call_id,
                   "name": call.name, "arguments": arguments, "status": status})
        };
        items.push((item("completed", &call.arguments), item("in_progress", "")));
    }
    let u = out.usage;
    let usage = json!({
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_input_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.input_tokens.saturating_add(u.output_tokens),
    });
    let response = |status: &str, details: Value, output: Value, usage: Value| {
        json!({
            "id": format!("resp_{seed}"), "object": "response", "created_at": answer.created,
            "status": status, "error": null, "incomplete_details": details,
            "model": out.model, "output": output,
            "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "usage": usage,
        })
    };
    let (status, details) = match incomplete {
        Some(reason) => ("incomplete", json!({"reason": reason})),
        None => ("completed", Value::Null),
    };
    let done: Vec<Value> = items.iter().map(|(done, _)| done.clone()).collect();
    let final_response = response(status, details, done.into(), usage);
    if !stream {
        return Reply::Json(final_response);
    }

    let mut events = Vec::new();
    let mut send = |kind: &str, mut data: Value| {
        data["type"] = kind.into();
        data["sequence_number"] = events.len().into();
        events.push(event(Some(kind), &data));
    };
    let started = response("in_progress", Value::Null, json!([]), Value::Null);
    send("response.created", json!({"response": started}));
    send("response.in_progress", json!({"response": started}));
    for (index, (done, added)) in items.into_iter().enumerate() {
        send(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        let item_id = done["id"].clone();
        let at = json!({"item_id": item_id, "output_index": index});
        let with = |extra: Value| {
            let mut data = at.clone();
            if let (Some(data), Value::Object(extra)) = (data.as_object_mut(), extra) {
                data.extend(extra);
            }
            data
        };
        if done["type"] == "message" {
            let text = &answer.text;
            let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
            send(
                "response.content_part.added",
                with(json!({"content_index": 0, "part": part("")})),
            );
            send(
                "response.output_text.delta",
                with(json!({"content_index": 0, "delta": text, "logprobs": []})),
            );
            send(
                "response.output_text.done",
                with(json!({"content_index": 0, "text": text, "logprobs": []})),
            );
            send(
                "response.content_part.done",
                with(json!({"content_index": 0, "part": part(text)})),
            );
        } else {
            let arguments = done["arguments"].clone();
            send(
                "response.function_call_arguments.delta",
                with(json!({"delta": arguments})),
            );
            send(
                "response.function_call_arguments.done",
                with(json!({"arguments": arguments})),
            );
        }
        send(
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        );
    }
    let last = if incomplete.is_some() {
        "response.incomplete"
    } else {
        "response.completed"
    };
    send(last, json!({"response": final_response}));
    Reply::Events(events)
}
