//! What the three APIs share: paths and names, error replies, reading the completion, and
//! the helpers the per-API tests use.

use serde_json::{json, Value};

use super::*;

pub(super) fn usage(input: u64, output: u64, cached: u64, reasoning: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
        reasoning_tokens: reasoning,
    }
}

/// The detail of the InvalidRequest a call must give.
pub(super) fn refused<T: std::fmt::Debug>(result: Result<T, DialectError>) -> String {
    match result {
        Err(DialectError::InvalidRequest { detail }) => detail,
        Ok(v) => panic!("expected InvalidRequest, got {v:?}"),
    }
}

pub(super) fn json_reply(reply: Result<Reply, DialectError>) -> Value {
    match reply {
        Ok(Reply::Json(v)) => v,
        other => panic!("expected a JSON reply, got {other:?}"),
    }
}

/// Each event's `event:` name and parsed data.
pub(super) fn events(reply: Result<Reply, DialectError>) -> Vec<(Option<String>, Value)> {
    match reply {
        Ok(Reply::Events(events)) => events
            .into_iter()
            .map(|e| {
                let data = if e.data == "[DONE]" {
                    Value::String(e.data)
                } else {
                    serde_json::from_str(&e.data).unwrap()
                };
                (e.event, data)
            })
            .collect(),
        other => panic!("expected events, got {other:?}"),
    }
}

#[test]
fn names_round_trip() {
    for (api, name) in [
        (Api::OpenAiChat, "openai_chat"),
        (Api::OpenAiResponses, "openai_responses"),
        (Api::AnthropicMessages, "anthropic_messages"),
    ] {
        assert_eq!(api.name(), name);
        assert_eq!(Api::from_name(name), Some(api));
    }
    for name in ["", "openai", "Anthropic_Messages", "anthropic_messages "] {
        assert_eq!(Api::from_name(name), None, "{name:?}");
    }
}

#[test]
fn openai_errors_are_shaped_as_openai_sends_them() {
    for (kind, status, kind_name, code) in [
        (
            ErrorKind::InvalidRequest,
            400,
            "invalid_request_error",
            Value::Null,
        ),
        (
            ErrorKind::NotFound,
            404,
            "invalid_request_error",
            Value::Null,
        ),
        (
            ErrorKind::RateLimited,
            429,
            "requests",
            json!("rate_limit_exceeded"),
        ),
        (
            ErrorKind::QuotaExhausted,
            429,
            "insufficient_quota",
            json!("insufficient_quota"),
        ),
        (ErrorKind::ServerError, 500, "server_error", Value::Null),
        (ErrorKind::Timeout, 504, "server_error", Value::Null),
    ] {
        for api in [Api::OpenAiChat, Api::OpenAiResponses] {
            let (got_status, body) = error_reply(api, kind, "it broke");
            assert_eq!(got_status, status, "{api:?} {kind:?}");
            assert_eq!(
                body,
                json!({"error": {"message": "it broke", "type": kind_name, "param": null, "code": code}}),
                "{api:?} {kind:?}"
            );
        }
    }
}

#[test]
fn anthropic_errors_are_shaped_as_anthropic_sends_them() {
    for (kind, status, kind_name) in [
        (ErrorKind::InvalidRequest, 400, "invalid_request_error"),
        (ErrorKind::NotFound, 404, "not_found_error"),
        (ErrorKind::RateLimited, 429, "rate_limit_error"),
        (ErrorKind::ServerError, 500, "api_error"),
        (ErrorKind::Timeout, 504, "timeout_error"),
    ] {
        let (got_status, body) = error_reply(Api::AnthropicMessages, kind, "it broke");
        assert_eq!(got_status, status, "{kind:?}");
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": kind_name, "message": "it broke"}}),
            "{kind:?}"
        );
    }
}

#[test]
fn a_spent_budget_is_a_400_that_says_so_to_anthropic_clients() {
    // A 429 or 5xx would be retried by Claude Code; a spent budget never comes back.
    let (status, body) = error_reply(
        Api::AnthropicMessages,
        ErrorKind::QuotaExhausted,
        "100000 tokens used",
    );
    assert_eq!(status, 400);
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "Your credit balance is too low: the model budget for this run is spent: 100000 tokens used"}})
    );
    let (_, body) = error_reply(Api::AnthropicMessages, ErrorKind::QuotaExhausted, "");
    assert_eq!(
        body["error"]["message"],
        "Your credit balance is too low: the model budget for this run is spent"
    );
}

#[test]
fn a_completion_without_a_message_is_refused_by_name_for_every_api() {
    let u = usage(1, 1, 0, 0);
    for completion in [
        json!(null),
        json!([]),
        json!("text"),
        json!({}),
        json!({"choices": []}),
        json!({"choices": {}}),
        json!({"choices": [{}]}),
        json!({"choices": [{"message": "hi"}]}),
        json!({"choices": [{"message": null}]}),
    ] {
        for api in [
            Api::OpenAiChat,
            Api::OpenAiResponses,
            Api::AnthropicMessages,
        ] {
            for stream in [false, true] {
                let detail = refused(from_completion(api, &completion, &u, "m", stream, "s"));
                assert_eq!(
                    detail, "choices[0].message: missing from the completion",
                    "{api:?} {completion}"
                );
            }
        }
    }
}

#[test]
fn a_malformed_message_is_refused_by_field() {
    let u = usage(1, 1, 0, 0);
    let message = |m: Value| json!({"choices": [{"message": m}]});
    for (completion, expected) in [
        (
            message(json!({"content": 5})),
            "choices[0].message.content: must be a string or null",
        ),
        (
            message(json!({"content": [{"type": "text"}]})),
            "choices[0].message.content[0].text: must be a string",
        ),
        (
            message(json!({"content": ["x"]})),
            "choices[0].message.content[0]: must be a JSON object",
        ),
        (
            message(json!({"tool_calls": {}})),
            "choices[0].message.tool_calls: must be an array",
        ),
        (
            message(json!({"tool_calls": [7]})),
            "choices[0].message.tool_calls[0]: must be a JSON object",
        ),
        (
            message(json!({"tool_calls": [{"id": "c"}]})),
            "choices[0].message.tool_calls[0].function: must be a JSON object",
        ),
        (
            message(json!({"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]})),
            "choices[0].message.tool_calls[0].function.name: must be a string",
        ),
        (
            message(json!({"tool_calls": [{"id": 3, "function": {"name": "f"}}]})),
            "choices[0].message.tool_calls[0].id: must be a string",
        ),
        (
            message(json!({"tool_calls": [{"function": {"name": "f", "arguments": 3}}]})),
            "choices[0].message.tool_calls[0].function.arguments: must be a string of JSON",
        ),
    ] {
        for api in [
            Api::OpenAiChat,
            Api::OpenAiResponses,
            Api::AnthropicMessages,
        ] {
            let detail = refused(from_completion(api, &completion, &u, "m", false, "s"));
            assert_eq!(detail, expected, "{api:?}");
        }
    }
}

#[test]
fn a_completion_read_leniently_where_providers_differ() {
    let completion = json!({"choices": [{"message": {
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "tool_calls": [{"function": {"name": "f", "arguments": {"k": 1}}}],
    }}]});
    let answer = Answer::parse(&completion).unwrap();
    assert_eq!(answer.text, "ab");
    assert_eq!(answer.calls.len(), 1);
    assert_eq!(answer.calls[0].arguments, r#"{"k":1}"#);
    assert_eq!(answer.calls[0].id, None);
    assert_eq!(answer.finish_reason, None);
    assert_eq!(answer.created, 0);
    assert_eq!(answer.id, None);
}

#[test]
fn seeds_are_made_safe_for_ids() {
    assert_eq!(id_part("ep1-3_x"), "ep1-3_x");
    assert_eq!(id_part("a b/c\"d\né"), "a_b_c_d__");
    let completion = json!({"choices": [{"message": {"content": "hi"}}]});
    let reply = json_reply(from_completion(
        Api::AnthropicMessages,
        &completion,
        &usage(1, 1, 0, 0),
        "m",
        false,
        "ep 1/2",
    ));
    assert_eq!(reply["id"], "msg_ep_1_2");
}

#[test]
fn the_error_text_is_the_detail() {
    let err = DialectError::InvalidRequest {
        detail: "model: must be a string".into(),
    };
    assert_eq!(err.to_string(), "model: must be a string");
}
