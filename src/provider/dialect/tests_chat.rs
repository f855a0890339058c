//! Chat completions passthrough and its chunk stream.

use serde_json::{json, Value};

use super::tests::{events, json_reply, refused, usage};
use super::*;

fn reply(completion: &Value, stream: bool) -> Result<Reply, DialectError> {
    from_completion(
        Api::OpenAiChat,
        completion,
        &usage(1000, 50, 800, 20),
        "asked-model",
        stream,
        "s1",
    )
}

#[test]
fn a_chat_request_passes_without_its_stream_fields() {
    let body = json!({
        "model": "gpt-x",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": true,
        "stream_options": {"include_usage": true},
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "max_completion_tokens": 9,
        "reasoning_effort": "low",
        "n": 1
    });
    let inbound = to_chat(Api::OpenAiChat, &body).unwrap();
    assert!(inbound.stream);
    assert_eq!(inbound.model, "gpt-x");
    assert_eq!(
        inbound.chat_body,
        json!({
            "model": "gpt-x",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "max_completion_tokens": 9,
            "reasoning_effort": "low",
            "n": 1
        })
    );
    let plain = to_chat(
        Api::OpenAiChat,
        &json!({"model": "m", "messages": [], "stream": false}),
    )
    .unwrap();
    assert!(!plain.stream);
    assert_eq!(plain.chat_body, json!({"model": "m", "messages": []}));
}

#[test]
fn hostile_chat_requests_are_refused_by_field() {
    for (body, expected) in [
        (json!("x"), "body: must be a JSON object"),
        (json!([]), "body: must be a JSON object"),
        (json!({"messages": []}), "model: must be a string"),
        (
            json!({"model": 1, "messages": []}),
            "model: must be a string",
        ),
        (
            json!({"model": "", "messages": []}),
            "model: must not be empty",
        ),
        (json!({"model": "m"}), "messages: must be an array"),
        (
            json!({"model": "m", "messages": null}),
            "messages: must be an array",
        ),
        (
            json!({"model": "m", "messages": "hi"}),
            "messages: must be an array",
        ),
        (
            json!({"model": "m", "messages": [], "stream": "true"}),
            "stream: must be true or false",
        ),
    ] {
        assert_eq!(refused(to_chat(Api::OpenAiChat, &body)), expected, "{body}");
    }
}

#[test]
fn a_completion_is_returned_under_the_asked_model() {
    let completion = json!({
        "id": "chatcmpl-9", "object": "chat.completion", "created": 3, "model": "provider-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        "system_fingerprint": "fp"
    });
    let mut expected = completion.clone();
    expected["model"] = "asked-model".into();
    assert_eq!(json_reply(reply(&completion, false)), expected);
}

#[test]
fn a_completion_without_usage_gets_the_counted_usage() {
    let completion = json!({"choices": [{"message": {"content": "hi"}}]});
    assert_eq!(
        json_reply(reply(&completion, false)),
        json!({
            "choices": [{"message": {"content": "hi"}}],
            "model": "asked-model",
            "usage": {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
                      "prompt_tokens_details": {"cached_tokens": 800},
                      "completion_tokens_details": {"reasoning_tokens": 20}}
        })
    );
}

fn chunk(choices: Value) -> Value {
    json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 3,
           "model": "asked-model", "choices": choices})
}

fn delta(delta: Value, finish_reason: Value) -> Value {
    chunk(json!([{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": null}]))
}

#[test]
fn a_streamed_completion_is_a_chunk_sequence() {
    let completion = json!({
        "id": "chatcmpl-9", "created": 3,
        "choices": [{"message": {"content": "Hi.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
            {"function": {"name": "g"}}
        ]}, "finish_reason": "tool_calls"}]
    });
    let got = events(reply(&completion, true));
    assert!(got.iter().all(|(name, _)| name.is_none()));
    let data: Vec<Value> = got.into_iter().map(|(_, d)| d).collect();
    let mut last = chunk(json!([]));
    last["usage"] = json!({"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
                           "prompt_tokens_details": {"cached_tokens": 800},
                           "completion_tokens_details": {"reasoning_tokens": 20}});
    assert_eq!(
        data,
        vec![
            delta(json!({"role": "assistant", "content": ""}), Value::Null),
            delta(json!({"content": "Hi."}), Value::Null),
            delta(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                       "function": {"name": "f", "arguments": "{\"x\":1}"}}]}),
                Value::Null
            ),
            delta(
                json!({"tool_calls": [{"index": 1, "id": "call_s1_1", "type": "function",
                                       "function": {"name": "g", "arguments": ""}}]}),
                Value::Null
            ),
            delta(json!({}), json!("tool_calls")),
            last,
            json!("[DONE]"),
        ]
    );
}

#[test]
fn a_stream_without_text_or_reason_fills_them_in() {
    let plain = json!({"choices": [{"message": {"content": null}}]});
    let got = events(reply(&plain, true));
    let data: Vec<Value> = got.into_iter().map(|(_, d)| d).collect();
    assert_eq!(data.len(), 4);
    assert_eq!(data[0]["id"], "chatcmpl-s1");
    assert_eq!(data[0]["created"], 0);
    assert_eq!(
        data[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(data[1]["choices"][0]["delta"], json!({}));
    assert_eq!(data[1]["choices"][0]["finish_reason"], "stop");
    assert_eq!(data[2]["choices"], json!([]));
    assert_eq!(data[3], json!("[DONE]"));

    let called =
        json!({"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"name": "f"}}]}}]});
    let data: Vec<Value> = events(reply(&called, true))
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert_eq!(data[2]["choices"][0]["finish_reason"], "tool_calls");
    let cut = json!({"choices": [{"message": {"content": "x"}, "finish_reason": "length"}]});
    let data: Vec<Value> = events(reply(&cut, true))
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert_eq!(data[2]["choices"][0]["finish_reason"], "length");
}

#[test]
fn the_done_marker_is_raw_text() {
    let completion = json!({"choices": [{"message": {"content": "x"}}]});
    let Ok(Reply::Events(events)) = reply(&completion, true) else {
        panic!("expected events");
    };
    assert_eq!(
        events.last(),
        Some(&SseEvent {
            event: None,
            data: "[DONE]".to_string()
        })
    );
}
