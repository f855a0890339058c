//! An Anthropic Messages response as the OpenAI chat completion the runner reads.
//!
//! `text` blocks become the message `content` (null when there are none, as OpenAI sends it
//! beside tool calls), `tool_use` blocks `tool_calls` with their `input` as a JSON-string
//! `arguments`, and `stop_reason` the `finish_reason`. Other blocks (`thinking`, server-tool
//! blocks) have no place in a chat completion and are left out.

use serde_json::{json, Value};

use crate::provider::http::{count_at, truncate_chars};
use crate::provider::{ProviderError, Usage};

/// The chat completion for `message`, and its usage; `created` stamps it (Unix seconds).
pub(super) fn chat_completion(
    message: &Value,
    created: u64,
) -> Result<(Value, Usage), ProviderError> {
    let Some(blocks) = message.get("content").and_then(Value::as_array) else {
        return Err(ProviderError::Decode {
            detail: format!(
                "expected a Messages response with a `content` array, got: {}",
                truncate_chars(&message.to_string(), 200)
            ),
        });
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => calls.push(tool_call(block)?),
            _ => {}
        }
    }
    let mut reply = json!({
        "role": "assistant",
        "content": if text.is_empty() { Value::Null } else { text.into() },
    });
    if !calls.is_empty() {
        reply["tool_calls"] = calls.into();
    }
    let stop_reason = message.get("stop_reason").and_then(Value::as_str);
    let usage = usage_of(message);
    let body = json!({
        "id": message.get("id").cloned().unwrap_or_else(|| "".into()),
        "object": "chat.completion",
        "created": created,
        "model": message.get("model").cloned().unwrap_or(Value::Null),
        "choices": [{
            "index": 0,
            "message": reply,
            "finish_reason": finish_reason(stop_reason),
        }],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens.saturating_add(usage.output_tokens),
            "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        },
    });
    Ok((body, usage))
}

fn tool_call(block: &Value) -> Result<Value, ProviderError> {
    let field = |name: &str| {
        block
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| ProviderError::Decode {
                detail: format!(
                    "a tool_use block without a string `{name}`: {}",
                    truncate_chars(&block.to_string(), 200)
                ),
            })
    };
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    Ok(json!({
        "id": field("id")?,
        "type": "function",
        "function": {"name": field("name")?, "arguments": input.to_string()},
    }))
}

/// `stop_reason` as a `finish_reason`: a turn ended by choice is `stop`, by the output cap
/// (or the context window) `length`, by a tool call `tool_calls`, by a refusal
/// `content_filter`; an unknown or missing reason reads as `stop`.
fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("tool_use") => "tool_calls",
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("refusal") => "content_filter",
        _ => "stop",
    }
}

/// The Messages usage counted as OpenAI counts it. Anthropic's `input_tokens` leaves out the
/// prompt tokens read from the cache (`cache_read_input_tokens`) and those written to it
/// (`cache_creation_input_tokens`); both were prompt tokens of this call, so both are
/// counted in the input, and the cache reads are also its cached part.
fn usage_of(message: &Value) -> Usage {
    let count = |field: &str| count_at(message, &["usage", field]);
    let cache_read = count("cache_read_input_tokens");
    Usage {
        input_tokens: count("input_tokens")
            .saturating_add(count("cache_creation_input_tokens"))
            .saturating_add(cache_read),
        output_tokens: count("output_tokens"),
        cached_input_tokens: cache_read,
        reasoning_tokens: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_tool_use_become_a_chat_completion() {
        let message = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 4,
                      "cache_creation_input_tokens": 100, "cache_read_input_tokens": 50}
        });
        let (body, usage) = chat_completion(&message, 7).unwrap();
        assert_eq!(
            body,
            json!({
                "id": "msg_1", "object": "chat.completion", "created": 7, "model": "claude-test",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "Listing.",
                    "tool_calls": [{"id": "toolu_1", "type": "function",
                                    "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]}}],
                "usage": {"prompt_tokens": 160, "completion_tokens": 4, "total_tokens": 164,
                          "prompt_tokens_details": {"cached_tokens": 50}}
            })
        );
        assert_eq!(
            usage,
            Usage {
                input_tokens: 160,
                output_tokens: 4,
                cached_input_tokens: 50,
                reasoning_tokens: 0
            }
        );
    }

    #[test]
    fn stop_reasons_map_to_finish_reasons() {
        for (stop, finish) in [
            (Some("end_turn"), "stop"),
            (Some("tool_use"), "tool_calls"),
            (Some("max_tokens"), "length"),
            (Some("stop_sequence"), "stop"),
            (Some("refusal"), "content_filter"),
            (None, "stop"),
        ] {
            assert_eq!(finish_reason(stop), finish, "{stop:?}");
        }
        let (body, _) =
            chat_completion(&json!({"content": [], "stop_reason": "max_tokens"}), 0).unwrap();
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        assert_eq!(body["choices"][0]["message"]["content"], Value::Null);
        assert!(body["choices"][0]["message"].get("tool_calls").is_none());
    }

    #[test]
    fn a_body_that_is_not_a_message_is_a_decode_error() {
        for bad in [
            json!({"type": "error"}),
            json!([]),
            json!({"content": [{"type": "tool_use", "name": "x"}]}),
        ] {
            assert!(
                matches!(chat_completion(&bad, 0), Err(ProviderError::Decode { .. })),
                "{bad}"
            );
        }
    }
}
