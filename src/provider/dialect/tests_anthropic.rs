//! Anthropic Messages both ways.

use serde_json::{json, Value};

use super::tests::{events, json_reply, refused, usage};
use super::*;

fn chat(body: Value) -> Inbound {
    to_chat(Api::AnthropicMessages, &body).unwrap()
}

fn completion(message: Value, finish_reason: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "provider-model",
           "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]})
}

fn reply(completion: &Value, stream: bool) -> Result<Reply, DialectError> {
    from_completion(
        Api::AnthropicMessages,
        completion,
        &usage(1000, 50, 800, 0),
        "claude-x",
        stream,
        "ep1-3",
    )
}

#[test]
fn a_claude_code_request_becomes_a_chat_body() {
    let inbound = chat(json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be terse."}
        ],
        "messages": [
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"path": "a b"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\nb.txt"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true, "content": [
                    {"type": "text", "text": "no such file"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}},
                    {"type": "text", "text": "see above"}
                ]},
                {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}
            ]},
            {"role": "assistant", "content": [
                {"type": "redacted_thinking", "data": "x"},
                {"type": "tool_use", "id": "toolu_3", "name": "Done", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_3", "is_error": false}
            ]}
        ],
        "tools": [
            {"name": "Bash", "description": "Run a command", "input_schema":
                {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
             "cache_control": {"type": "ephemeral"}},
            {"type": "custom", "name": "Done", "input_schema": {"type": "object", "properties": {}}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
            {"type": "bash_20250124", "name": "bash"}
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
        "temperature": 1,
        "top_p": 0.9,
        "top_k": 5,
        "stop_sequences": ["</done>"],
        "metadata": {"user_id": "u"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": []},
        "output_config": {"effort": "high"}
    }));
    assert!(inbound.stream);
    assert_eq!(inbound.model, "claude-sonnet-4-5");
    assert_eq!(
        inbound.chat_body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 32000,
            "messages": [
                {"role": "system", "content": "You are Claude Code.\n\nBe terse."},
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": "Looking.", "tool_calls": [
                    {"id": "toolu_1", "type": "function",
                     "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}},
                    {"id": "toolu_2", "type": "function",
                     "function": {"name": "Read", "arguments": "{\"path\":\"a b\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt\nb.txt"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such file\nsee above"},
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                    {"type": "text", "text": "go on"}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "toolu_3", "type": "function", "function": {"name": "Done", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "toolu_3", "content": ""}
            ],
            "tools": [
                {"type": "function", "function": {"name": "Bash", "description": "Run a command",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                   "required": ["command"]}}},
                {"type": "function", "function": {"name": "Done",
                    "parameters": {"type": "object", "properties": {}}}}
            ],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "temperature": 1,
            "top_p": 0.9,
            "stop": ["</done>"]
        })
    );
}

#[test]
fn user_content_takes_every_documented_form() {
    let body = |content: Value| {
        chat(json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": content}]}))
            .chat_body["messages"][0]
            .clone()
    };
    assert_eq!(body(json!("hi")), json!({"role": "user", "content": "hi"}));
    assert_eq!(
        body(json!([{"type": "text", "text": "hi"}])),
        json!({"role": "user", "content": "hi"})
    );
    assert_eq!(
        body(json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])),
        json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    );
    assert_eq!(
        body(json!([
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}}
        ])),
        json!({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}}
        ]})
    );
    assert_eq!(body(json!([])), json!({"role": "user", "content": ""}));
    let assistant = chat(json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "plain"},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": ""},
                                          {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}
    ]}));
    assert_eq!(
        assistant.chat_body["messages"],
        json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "plain"},
            {"role": "assistant", "content": "a\n\nb"},
            {"role": "assistant", "content": ""}
        ])
    );
    assert!(!assistant.stream);
    assert!(assistant.chat_body.get("stream").is_none());
}

#[test]
fn tool_use_without_input_sends_empty_arguments() {
    let inbound = chat(json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]}));
    assert_eq!(
        inbound.chat_body["messages"][0]["tool_calls"][0]["function"]["arguments"],
        "{}"
    );
}

#[test]
fn tool_choice_maps_to_chat() {
    let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    for (choice, expected, parallel) in [
        (json!({"type": "auto"}), json!("auto"), None),
        (json!({"type": "any"}), json!("required"), None),
        (json!({"type": "none"}), json!("none"), None),
        (
            json!({"type": "tool", "name": "f", "disable_parallel_tool_use": true}),
            json!({"type": "function", "function": {"name": "f"}}),
            Some(false),
        ),
        (
            json!({"type": "any", "disable_parallel_tool_use": false}),
            json!("required"),
            None,
        ),
    ] {
        let body = chat(
            json!({"model": "m", "max_tokens": 1, "tools": tools, "tool_choice": choice,
                               "messages": [{"role": "user", "content": "x"}]}),
        )
        .chat_body;
        assert_eq!(body["tool_choice"], expected, "{choice}");
        assert_eq!(
            body.get("parallel_tool_calls").and_then(Value::as_bool),
            parallel,
            "{choice}"
        );
    }
    // With only server tools there is nothing to choose among, and chat refuses the fields.
    let body = chat(json!({"model": "m", "max_tokens": 1,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "stop_sequences": [],
        "messages": [{"role": "user", "content": "x"}]}))
    .chat_body;
    assert_eq!(
        body,
        json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
    );
}

#[test]
fn hostile_requests_are_refused_by_field() {
    let ok = json!([{"role": "user", "content": "x"}]);
    let with = |patch: Value| {
        let mut body = json!({"model": "m", "max_tokens": 10, "messages": ok});
        if let (Some(body), Value::Object(patch)) = (body.as_object_mut(), patch) {
            body.extend(patch);
        }
        body
    };
    let turn = |content: Value| {
        with(json!({"messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": content}]}))
    };
    let said =
        |content: Value| with(json!({"messages": [{"role": "assistant", "content": content}]}));
    for (body, expected) in [
        (json!([]), "body: must be a JSON object"),
        (json!("x"), "body: must be a JSON object"),
        (json!({"max_tokens": 1, "messages": ok}), "model: must be a string"),
        (with(json!({"model": 3})), "model: must be a string"),
        (with(json!({"model": ""})), "model: must not be empty"),
        (json!({"model": "m", "messages": ok}), "max_tokens: must be a positive integer"),
        (with(json!({"max_tokens": 0})), "max_tokens: must be a positive integer"),
        (with(json!({"max_tokens": -1})), "max_tokens: must be a positive integer"),
        (with(json!({"max_tokens": 1.5})), "max_tokens: must be a positive integer"),
        (with(json!({"max_tokens": "10"})), "max_tokens: must be a positive integer"),
        (with(json!({"stream": "yes"})), "stream: must be true or false"),
        (with(json!({"system": 5})), "system: must be a string or an array of text blocks"),
        (with(json!({"system": ["x"]})), "system[0]: must be a JSON object"),
        (
            with(json!({"system": [{"type": "image"}]})),
            "system[0]: block type \"image\" cannot go in a system prompt; only text",
        ),
        (with(json!({"system": [{"type": "text"}]})), "system[0].text: must be a string"),
        (with(json!({"messages": null})), "messages: must be a non-empty array"),
        (with(json!({"messages": {}})), "messages: must be an array"),
        (with(json!({"messages": []})), "messages: must be a non-empty array"),
        (with(json!({"messages": [1]})), "messages[0]: must be a JSON object"),
        (with(json!({"messages": [{"content": "x"}]})), "messages[0].role: must be a string"),
        (
            with(json!({"messages": [{"role": "tool", "content": "x"}]})),
            "messages[0].role: must be \"user\", \"assistant\" or \"system\", not \"tool\"",
        ),
        (
            with(json!({"messages": [{"role": "user", "content": 5}]})),
            "messages[0].content: must be a string or an array of content blocks",
        ),
        (
            with(json!({"messages": [{"role": "user"}]})),
            "messages[0].content: must be a string or an array of content blocks",
        ),
        (turn(json!([{"type": "foo"}])), "messages[2].content[0]: unknown block type \"foo\""),
        (turn(json!([{"text": "x"}])), "messages[2].content[0].type: must be a string"),
        (turn(json!(["x"])), "messages[2].content[0]: must be a JSON object"),
        (turn(json!([{"type": "text", "text": 1}])), "messages[2].content[0].text: must be a string"),
        (
            turn(json!([{"type": "document", "source": {}}])),
            "messages[2].content[0]: unknown block type \"document\"",
        ),
        (
            turn(json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}])),
            "messages[2].content[0]: \"tool_use\" blocks cannot go in user messages",
        ),
        (
            turn(json!([{"type": "image"}])),
            "messages[2].content[0].source: must be a JSON object",
        ),
        (
            turn(json!([{"type": "image", "source": {"type": "file", "file_id": "f"}}])),
            "messages[2].content[0].source.type: image source \"file\" is not supported; send base64 or url",
        ),
        (
            turn(json!([{"type": "image", "source": {"type": "base64", "data": "x"}}])),
            "messages[2].content[0].source.media_type: must be a string",
        ),
        (
            turn(json!([{"type": "tool_result", "content": "x"}])),
            "messages[2].content[0].tool_use_id: must be a string",
        ),
        (
            turn(json!([{"type": "tool_result", "tool_use_id": "t", "content": 5}])),
            "messages[2].content[0].content: must be a string or an array of text and image blocks",
        ),
        (
            turn(json!([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}])),
            "messages[2].content[0].content[0]: unknown block type \"document\"",
        ),
        (
            turn(json!([{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}])),
            "messages[2].content[0].is_error: must be true or false",
        ),
        (
            said(json!([{"type": "tool_use", "name": "f"}])),
            "messages[0].content[0].id: must be a string",
        ),
        (
            said(json!([{"type": "tool_use", "id": "t"}])),
            "messages[0].content[0].name: must be a string",
        ),
        (
            said(json!([{"type": "text", "text": "a"}, {"type": "tool_result", "tool_use_id": "t"}])),
            "messages[0].content[1]: \"tool_result\" blocks cannot go in assistant messages",
        ),
        (
            said(json!([{"type": "server_tool_use"}])),
            "messages[0].content[0]: unknown block type \"server_tool_use\"",
        ),
        (with(json!({"tools": {}})), "tools: must be an array"),
        (with(json!({"tools": [1]})), "tools[0]: must be a JSON object"),
        (with(json!({"tools": [{"name": "f"}]})), "tools[0].input_schema: must be a JSON object"),
        (
            with(json!({"tools": [{"type": "custom", "name": "f"}]})),
            "tools[0].input_schema: must be a JSON object",
        ),
        (
            with(json!({"tools": [{"name": "f", "input_schema": "x"}]})),
            "tools[0].input_schema: must be a JSON object",
        ),
        (with(json!({"tools": [{"input_schema": {}}]})), "tools[0].name: must be a string"),
        (
            with(json!({"tools": [{"name": "f", "input_schema": {}, "description": 1}]})),
            "tools[0].description: must be a string",
        ),
        (with(json!({"tools": [{"type": 1, "name": "f"}]})), "tools[0].type: must be a string"),
        (with(json!({"tool_choice": "auto"})), "tool_choice: must be a JSON object"),
        (
            with(json!({"tool_choice": {"type": "bogus"}})),
            "tool_choice.type: must be auto, any, tool or none, not \"bogus\"",
        ),
        (with(json!({"tool_choice": {"type": "tool"}})), "tool_choice.name: must be a string"),
        (
            with(json!({"tool_choice": {"type": "auto", "disable_parallel_tool_use": 1}})),
            "tool_choice.disable_parallel_tool_use: must be true or false",
        ),
        (with(json!({"temperature": "hot"})), "temperature: must be a number"),
        (with(json!({"top_p": []})), "top_p: must be a number"),
        (with(json!({"stop_sequences": "x"})), "stop_sequences: must be an array"),
        (with(json!({"stop_sequences": ["a", 1]})), "stop_sequences[1]: must be a string"),
    ] {
        let detail = refused(to_chat(Api::AnthropicMessages, &body));
        assert_eq!(detail, expected, "{body}");
    }
}

#[test]
fn a_completion_becomes_a_message() {
    let completion = completion(
        json!({"role": "assistant", "content": "Running it.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\": \"ls\"}"}},
            {"type": "function", "function": {"name": "Done", "arguments": ""}}
        ]}),
        json!("tool_calls"),
    );
    assert_eq!(
        json_reply(reply(&completion, false)),
        json!({
            "id": "msg_ep1-3", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "text", "text": "Running it."},
                {"type": "tool_use", "id": "call_a", "name": "Bash", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "toolu_ep1-3_1", "name": "Done", "input": {}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 200, "output_tokens": 50,
                      "cache_read_input_tokens": 800, "cache_creation_input_tokens": 0}
        })
    );
}

#[test]
fn stop_reasons_map() {
    let call = json!([{"id": "c", "function": {"name": "f", "arguments": "{}"}}]);
    for (finish, calls, expected) in [
        (json!("stop"), Value::Null, "end_turn"),
        (json!("length"), Value::Null, "max_tokens"),
        (json!("tool_calls"), call.clone(), "tool_use"),
        (json!("function_call"), call.clone(), "tool_use"),
        (json!("content_filter"), Value::Null, "refusal"),
        (Value::Null, Value::Null, "end_turn"),
        (Value::Null, call.clone(), "tool_use"),
        (json!("eos"), Value::Null, "end_turn"),
        // Some servers say "stop" beside tool calls; the client must still run them.
        (json!("stop"), call.clone(), "tool_use"),
        (json!("length"), call.clone(), "max_tokens"),
    ] {
        let c = completion(json!({"content": "x", "tool_calls": calls}), finish.clone());
        assert_eq!(
            json_reply(reply(&c, false))["stop_reason"],
            expected,
            "{finish} {calls}"
        );
    }
}

#[test]
fn an_empty_answer_is_one_empty_text_block() {
    for message in [json!({"content": null}), json!({"content": ""}), json!({})] {
        let c = completion(message, json!("stop"));
        let body = json_reply(reply(&c, false));
        assert_eq!(body["content"], json!([{"type": "text", "text": ""}]));
        assert_eq!(body["stop_reason"], "end_turn");
    }
}

#[test]
fn arguments_that_are_no_object_are_refused() {
    for arguments in ["not json", "[1]", "\"s\"", "{\"a\":"] {
        let c = completion(
            json!({"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}},
                                  {"id": "b", "function": {"name": "g", "arguments": arguments}}]}),
            json!("tool_calls"),
        );
        for stream in [false, true] {
            assert_eq!(
                refused(reply(&c, stream)),
                "choices[0].message.tool_calls[1].function.arguments: is not a JSON object",
                "{arguments}"
            );
        }
    }
}

#[test]
fn a_streamed_message_follows_anthropics_event_order() {
    let c = completion(
        json!({"content": "Hi.", "tool_calls": [
            {"id": "call_a", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}},
            {"function": {"name": "Done", "arguments": ""}}
        ]}),
        json!("tool_calls"),
    );
    let got = events(reply(&c, true));
    for (name, data) in &got {
        assert_eq!(name.as_deref(), data["type"].as_str());
    }
    let data: Vec<Value> = got.into_iter().map(|(_, d)| d).collect();
    assert_eq!(
        data,
        vec![
            json!({"type": "message_start", "message": {
                "id": "msg_ep1-3", "type": "message", "role": "assistant", "model": "claude-x",
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 200, "output_tokens": 1,
                          "cache_read_input_tokens": 800, "cache_creation_input_tokens": 0}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi."}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block":
                {"type": "tool_use", "id": "call_a", "name": "Bash", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta":
                {"type": "input_json_delta", "partial_json": "{\"command\":\"ls\"}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "content_block_start", "index": 2, "content_block":
                {"type": "tool_use", "id": "toolu_ep1-3_1", "name": "Done", "input": {}}}),
            json!({"type": "content_block_delta", "index": 2, "delta":
                {"type": "input_json_delta", "partial_json": "{}"}}),
            json!({"type": "content_block_stop", "index": 2}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                   "usage": {"output_tokens": 50}}),
            json!({"type": "message_stop"}),
        ]
    );
}

#[test]
fn an_empty_streamed_answer_has_an_empty_text_block_and_no_delta() {
    let c = completion(json!({"content": null}), json!("length"));
    let got = events(from_completion(
        Api::AnthropicMessages,
        &c,
        &usage(10, 0, 0, 0),
        "m",
        true,
        "s",
    ));
    let kinds: Vec<&str> = got.iter().filter_map(|(n, _)| n.as_deref()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        got[0].1["message"]["usage"],
        json!({"input_tokens": 10, "output_tokens": 0,
               "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0})
    );
    assert_eq!(got[3].1["delta"]["stop_reason"], "max_tokens");
}

#[test]
fn cached_tokens_beyond_the_input_do_not_underflow() {
    let c = completion(json!({"content": "x"}), json!("stop"));
    let body = json_reply(from_completion(
        Api::AnthropicMessages,
        &c,
        &usage(5, 1, 9, 0),
        "m",
        false,
        "s",
    ));
    assert_eq!(
        body["usage"],
        json!({"input_tokens": 0, "output_tokens": 1,
               "cache_read_input_tokens": 5, "cache_creation_input_tokens": 0})
    );
}

#[test]
fn a_reply_round_trips_into_the_next_request() {
    // What Claude Code sends back after our reply must translate to what the provider said.
    let c = completion(
        json!({"content": "ok", "tool_calls": [
            {"id": "call_z", "function": {"name": "f", "arguments": "{\"x\":[1,2]}"}}]}),
        json!("tool_calls"),
    );
    let message = json_reply(reply(&c, false));
    let next = chat(json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": message["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_z", "content": "done"}]}
    ]}));
    assert_eq!(
        next.chat_body["messages"],
        json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "ok", "tool_calls": [
                {"id": "call_z", "type": "function", "function": {"name": "f", "arguments": "{\"x\":[1,2]}"}}]},
            {"role": "tool", "tool_call_id": "call_z", "content": "done"}
        ])
    );
}

#[test]
fn system_turns_between_messages_stay_where_they_are() {
    // Claude Code sends its environment as a system turn after the first user turn.
    let body = json!({
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "# Env"}, {"type": "text", "text": "cwd /w"}]},
            {"role": "user", "content": "go"},
        ],
    });
    let inbound = to_chat(Api::AnthropicMessages, &body).unwrap();
    assert_eq!(
        inbound.chat_body["messages"],
        json!([
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "# Env\n\ncwd /w"},
            {"role": "user", "content": "go"},
        ])
    );
    let bad = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "system", "content": [{"type": "image"}]}]});
    let err = to_chat(Api::AnthropicMessages, &bad)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "messages[0].content[0]: block type \"image\" cannot go in a system prompt; only text"
    );
}
