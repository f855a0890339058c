//! OpenAI chat completions, the providers' own API: the request passes as it is (checked,
//! and without the streaming fields, since the provider always answers whole), and a
//! streamed reply is the answer replayed as `chat.completion.chunk` objects.

use serde_json::{json, Value};

use super::{
    event, model_of, object, opt_array, opt_bool, Answer, DialectError, Inbound, Out, Reply,
};

pub(super) fn to_chat(body: &Value) -> Result<Inbound, DialectError> {
    let fields = object(body, "body")?;
    let model = model_of(fields)?;
    if opt_array(fields, "messages", "")?.is_none() {
        return Err(super::invalid("messages", "must be an array"));
    }
    let stream = opt_bool(fields, "stream", "")?.unwrap_or(false);
    let mut chat = fields.clone();
    chat.remove("stream");
    chat.remove("stream_options");
    Ok(Inbound {
        chat_body: Value::Object(chat),
        stream,
        model,
    })
}

pub(super) fn reply(
    completion: &Value,
    answer: &Answer,
    out: &Out<'_>,
    stream: bool,
) -> Result<Reply, DialectError> {
    if !stream {
        let mut body = object(completion, "completion")?.clone();
        body.insert("model".into(), out.model.into());
        // Agents track their context from `usage`; a provider that left it out (a scripted
        // one) still counted the tokens.
        if !body.get("usage").is_some_and(Value::is_object) {
            body.insert("usage".into(), usage(out));
        }
        return Ok(Reply::Json(Value::Object(body)));
    }
    let id = match &answer.id {
        Some(id) => id.clone(),
        None => format!("chatcmpl-{}", out.seed),
    };
    let chunk = |choices: Value| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": answer.created,
            "model": out.model,
            "choices": choices,
        })
    };
    let delta = |delta: Value, finish_reason: Value| {
        let choice =
            json!({"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": null});
        chunk(json!([choice]))
    };
    let mut chunks = vec![delta(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if !answer.text.is_empty() {
        chunks.push(delta(json!({"content": answer.text}), Value::Null));
    }
    for (i, call) in answer.calls.iter().enumerate() {
        let id = match &call.id {
            Some(id) => id.clone(),
            None => format!("call_{}_{i}", out.seed),
        };
        let call = json!({
            "index": i, "id": id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        });
        chunks.push(delta(json!({"tool_calls": [call]}), Value::Null));
    }
    let finish_reason = match &answer.finish_reason {
        Some(reason) => reason.as_str(),
        None if answer.calls.is_empty() => "stop",
        None => "tool_calls",
    };
    chunks.push(delta(json!({}), finish_reason.into()));
    let mut last = chunk(json!([]));
    last["usage"] = usage(out);
    chunks.push(last);
    let mut events: Vec<_> = chunks.iter().map(|c| event(None, c)).collect();
    events.push(super::SseEvent {
        event: None,
        data: "[DONE]".to_string(),
    });
    Ok(Reply::Events(events))
}

fn usage(out: &Out<'_>) -> Value {
    let u = out.usage;
    json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens.saturating_add(u.output_tokens),
        "prompt_tokens_details": {"cached_tokens": u.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    })
}
