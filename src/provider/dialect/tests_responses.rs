//! OpenAI Responses both ways.

use serde_json::{json, Value};

use super::tests::{events, json_reply, refused, usage};
use super::*;

fn chat(body: Value) -> Inbound {
    to_chat(Api::OpenAiResponses, &body).unwrap()
}

fn messages(input: Value) -> Value {
    chat(json!({"model": "m", "input": input})).chat_body["messages"].clone()
}

fn completion(message: Value, finish_reason: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "provider-model",
           "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]})
}

fn reply(completion: &Value, stream: bool) -> Result<Reply, DialectError> {
    from_completion(
        Api::OpenAiResponses,
        completion,
        &usage(1000, 50, 800, 20),
        "gpt-x",
        stream,
        "s1",
    )
}

#[test]
fn a_codex_request_becomes_a_chat_body() {
    let shell_params = json!({"type": "object", "properties": {"command": {"type": "array"}},
                              "required": ["command"], "additionalProperties": false});
    let inbound = chat(json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "<env/>"}, {"type": "input_text", "text": "fix it"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "message", "role": "assistant", "id": "msg_0",
             "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell",
             "arguments": "{\"command\":[\"ls\"]}"},
            {"type": "function_call", "call_id": "call_2", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "/repo"}, {"type": "input_text", "text": "ok"}]},
            {"type": "custom_tool_call", "call_id": "call_3", "name": "apply_patch",
             "input": "*** Begin Patch\n*** End Patch"},
            {"type": "custom_tool_call_output", "call_id": "call_3", "output": "Done!"},
            {"type": "local_shell_call", "id": "ls_1", "call_id": "call_4", "status": "completed",
             "action": {"type": "exec", "command": ["pwd"]}},
            {"type": "local_shell_call_output", "id": "call_4", "output": "/repo"},
            {"role": "user", "content": "thanks"}
        ],
        "tools": [
            {"type": "function", "name": "shell", "description": "Runs a command", "strict": false,
             "parameters": shell_params},
            {"type": "custom", "name": "apply_patch", "description": "Edit files",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}},
            {"type": "web_search"},
            {"type": "namespace", "name": "mcp", "tools": []},
            {"type": "local_shell"},
            {"type": "file_search", "vector_store_ids": []},
            {"type": "mcp", "server_label": "x"}
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "max_output_tokens": 4096,
        "temperature": 0.5,
        "top_p": 1,
        "stream": true,
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
        "reasoning": {"effort": "high", "summary": "auto"},
        "text": {"verbosity": "low"},
        "client_metadata": {"a": "b"},
        "truncation": "auto",
        "metadata": {}
    }));
    assert!(inbound.stream);
    assert_eq!(inbound.model, "gpt-5-codex");
    let mut body = inbound.chat_body;
    // Key order inside the action's JSON text is serde's business; compare it parsed.
    let local_shell = body["messages"][8]["tool_calls"][0]["function"]["arguments"].take();
    assert_eq!(
        serde_json::from_str::<Value>(local_shell.as_str().unwrap_or("")).unwrap(),
        json!({"type": "exec", "command": ["pwd"]})
    );
    assert_eq!(
        body,
        json!({
            "model": "gpt-5-codex",
            "messages": [
                {"role": "system", "content": "You are Codex."},
                {"role": "system", "content": "<permissions/>"},
                {"role": "user", "content": [{"type": "text", "text": "<env/>"}, {"type": "text", "text": "fix it"}]},
                {"role": "assistant", "content": "Looking.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":[\"ls\"]}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                {"role": "tool", "tool_call_id": "call_2", "content": "/repo\nok"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_3", "type": "function", "function": {"name": "apply_patch",
                     "arguments": "{\"input\":\"*** Begin Patch\\n*** End Patch\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_3", "content": "Done!"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_4", "type": "function", "function": {"name": "local_shell", "arguments": null}}
                ]},
                {"role": "tool", "tool_call_id": "call_4", "content": "/repo"},
                {"role": "user", "content": "thanks"}
            ],
            "max_tokens": 4096,
            "tools": [
                {"type": "function", "function": {"name": "shell", "description": "Runs a command",
                    "parameters": shell_params, "strict": false}},
                {"type": "function", "function": {"name": "apply_patch", "description": "Edit files",
                    "parameters": {"type": "object", "properties": {"input": {"type": "string"}},
                                   "required": ["input"]}}}
            ],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "temperature": 0.5,
            "top_p": 1
        })
    );
}

#[test]
fn a_string_input_is_one_user_message() {
    let inbound = chat(json!({"model": "m", "input": "hello"}));
    assert!(!inbound.stream);
    assert_eq!(
        inbound.chat_body,
        json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]})
    );
    // Empty instructions add no system message.
    let body = chat(json!({"model": "m", "instructions": "", "input": "x"})).chat_body;
    assert_eq!(body["messages"], json!([{"role": "user", "content": "x"}]));
}

#[test]
fn function_calls_merge_only_into_the_assistant_message_before_them() {
    let call =
        |id: &str| json!({"type": "function_call", "call_id": id, "name": "f", "arguments": "{}"});
    let chat_call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}});
    assert_eq!(
        messages(json!([
            {"role": "user", "content": "go"},
            call("a"),
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            call("b"),
            {"role": "assistant", "content": "after"},
            {"role": "assistant", "content": "again"}
        ])),
        json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": null, "tool_calls": [chat_call("a")]},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "assistant", "content": null, "tool_calls": [chat_call("b")]},
            {"role": "assistant", "content": "after"},
            {"role": "assistant", "content": "again"}
        ])
    );
}

#[test]
fn images_go_where_chat_takes_them() {
    let image =
        json!({"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "high"});
    assert_eq!(
        messages(json!([
            {"role": "user", "content": [{"type": "input_text", "text": "see"}, image]},
            {"type": "function_call", "call_id": "a", "name": "view", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "view", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a",
             "output": [{"type": "input_text", "text": "here"}, {"type": "input_image", "image_url": "https://x/1.png"}]},
            {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_image", "image_url": "https://x/2.png"}]},
            {"role": "user", "content": "next"},
            {"type": "function_call", "call_id": "c", "name": "view", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "https://x/3.png"}]}
        ])),
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "high"}}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "view", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "view", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "here"},
            {"role": "tool", "tool_call_id": "b", "content": ""},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://x/1.png"}},
                {"type": "image_url", "image_url": {"url": "https://x/2.png"}}]},
            {"role": "user", "content": "next"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "view", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": ""},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/3.png"}}]}
        ])
    );
}

#[test]
fn message_roles_and_parts_translate() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "system", "content": "sys"},
            {"role": "developer", "content": [{"type": "input_text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "x"}, {"type": "output_text", "text": "y"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "only"}]},
            {"role": "user", "content": []}
        ])),
        json!([
            {"role": "system", "content": "sys"},
            {"role": "system", "content": "a\n\nb"},
            {"role": "assistant", "content": "x\n\ny"},
            {"role": "user", "content": "only"},
            {"role": "user", "content": []}
        ])
    );
}

#[test]
fn tool_choice_maps_to_chat() {
    let tools = json!([{"type": "function", "name": "f"}, {"type": "custom", "name": "g"}]);
    for (choice, expected) in [
        (json!("auto"), json!("auto")),
        (json!("none"), json!("none")),
        (json!("required"), json!("required")),
        (
            json!({"type": "function", "name": "f"}),
            json!({"type": "function", "function": {"name": "f"}}),
        ),
        (
            json!({"type": "custom", "name": "g"}),
            json!({"type": "function", "function": {"name": "g"}}),
        ),
    ] {
        let body = chat(
            json!({"model": "m", "input": "x", "tools": tools, "tool_choice": choice,
                               "parallel_tool_calls": true}),
        )
        .chat_body;
        assert_eq!(body["tool_choice"], expected, "{choice}");
        assert_eq!(body["parallel_tool_calls"], true);
        assert_eq!(
            body["tools"][0],
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}})
        );
    }
    // With only hosted tools, chat would refuse the choice fields: all three go.
    let body = chat(
        json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}],
                           "tool_choice": "required", "parallel_tool_calls": false}),
    )
    .chat_body;
    assert_eq!(
        body,
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    );
}

#[test]
fn hostile_requests_are_refused_by_field() {
    let with = |patch: Value| {
        let mut body = json!({"model": "m", "input": "x"});
        if let (Some(body), Value::Object(patch)) = (body.as_object_mut(), patch) {
            body.extend(patch);
        }
        body
    };
    let item = |item: Value| with(json!({"input": [{"role": "user", "content": "x"}, item]}));
    let part = |part: Value| item(json!({"role": "user", "content": [part]}));
    for (body, expected) in [
        (json!(null), "body: must be a JSON object"),
        (json!([1]), "body: must be a JSON object"),
        (json!({"input": "x"}), "model: must be a string"),
        (with(json!({"model": ["m"]})), "model: must be a string"),
        (json!({"model": "m"}), "input: must be a string or an array of items"),
        (with(json!({"input": 5})), "input: must be a string or an array of items"),
        (with(json!({"input": [5]})), "input[0]: must be a JSON object"),
        (item(json!({})), "input[1].type: must be a string"),
        (item(json!({"type": 3})), "input[1].type: must be a string"),
        (item(json!({"type": "foo"})), "input[1]: unknown item type \"foo\""),
        (item(json!({"type": "item_reference", "id": "x"})), "input[1]: unknown item type \"item_reference\""),
        (item(json!({"type": "message", "content": "x"})), "input[1].role: must be a string"),
        (
            item(json!({"role": "tool", "content": "x"})),
            "input[1].role: must be user, assistant, system or developer, not \"tool\"",
        ),
        (item(json!({"role": "user", "content": 5})), "input[1].content: must be a string or an array of content parts"),
        (item(json!({"role": "user"})), "input[1].content: must be a string or an array of content parts"),
        (part(json!("x")), "input[1].content[0]: must be a JSON object"),
        (part(json!({"type": "input_file", "file_id": "f"})), "input[1].content[0]: unknown content part type \"input_file\""),
        (part(json!({"type": "input_text"})), "input[1].content[0].text: must be a string"),
        (
            part(json!({"type": "input_image", "file_id": "f"})),
            "input[1].content[0].image_url: must be a string (images by file_id are not supported)",
        ),
        (part(json!({"type": "input_image", "image_url": "u", "detail": 1})), "input[1].content[0].detail: must be a string"),
        (
            item(json!({"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]})),
            "input[1].content[0]: \"input_image\" parts cannot go in assistant messages",
        ),
        (item(json!({"type": "function_call", "name": "f", "arguments": "{}"})), "input[1].call_id: must be a string"),
        (item(json!({"type": "function_call", "call_id": "c", "arguments": "{}"})), "input[1].name: must be a string"),
        (item(json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": {}})), "input[1].arguments: must be a string"),
        (item(json!({"type": "function_call_output", "call_id": "c"})), "input[1].output: must be a string or an array of content parts"),
        (item(json!({"type": "function_call_output", "output": "x"})), "input[1].call_id: must be a string"),
        (
            item(json!({"type": "function_call_output", "call_id": "c", "output": [{"type": "bogus"}]})),
            "input[1].output[0]: unknown content part type \"bogus\"",
        ),
        (item(json!({"type": "custom_tool_call", "call_id": "c", "name": "f"})), "input[1].input: must be a string"),
        (item(json!({"type": "local_shell_call", "call_id": "c", "action": "ls"})), "input[1].action: must be a JSON object"),
        (item(json!({"type": "local_shell_call_output", "output": "x"})), "input[1].id: must be a string"),
        (
            with(json!({"previous_response_id": "resp_1"})),
            "previous_response_id: is not supported: send the whole conversation in `input` (store: false)",
        ),
        (with(json!({"instructions": 5})), "instructions: must be a string"),
        (with(json!({"stream": 1})), "stream: must be true or false"),
        (with(json!({"max_output_tokens": 0})), "max_output_tokens: must be a positive integer"),
        (with(json!({"max_output_tokens": "9"})), "max_output_tokens: must be a positive integer"),
        (with(json!({"parallel_tool_calls": "yes"})), "parallel_tool_calls: must be true or false"),
        (with(json!({"temperature": "x"})), "temperature: must be a number"),
        (with(json!({"tools": "x"})), "tools: must be an array"),
        (with(json!({"tools": [{"name": "f"}]})), "tools[0].type: must be a string"),
        (with(json!({"tools": [{"type": "function"}]})), "tools[0].name: must be a string"),
        (with(json!({"tools": [{"type": "custom"}]})), "tools[0].name: must be a string"),
        (with(json!({"tools": [{"type": "function", "name": "f", "parameters": "x"}]})), "tools[0].parameters: must be a JSON object"),
        (with(json!({"tools": [{"type": "function", "name": "f", "strict": "yes"}]})), "tools[0].strict: must be true or false"),
        (
            with(json!({"tool_choice": "sometimes"})),
            "tool_choice: must be auto, none, required or {type: function, name}",
        ),
        (with(json!({"tool_choice": {"type": "function"}})), "tool_choice.name: must be a string"),
        (
            with(json!({"tool_choice": {"type": "web_search"}})),
            "tool_choice.type: \"web_search\" is not supported; use function or custom",
        ),
    ] {
        assert_eq!(refused(to_chat(Api::OpenAiResponses, &body)), expected, "{body}");
    }
}

fn final_response(status: &str, details: Value, output: Value) -> Value {
    json!({
        "id": "resp_s1", "object": "response", "created_at": 7, "status": status, "error": null,
        "incomplete_details": details, "model": "gpt-x", "output": output,
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 800},
                  "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 20},
                  "total_tokens": 1050}
    })
}

fn message_item(status: &str, content: Value) -> Value {
    json!({"type": "message", "id": "msg_s1", "status": status, "role": "assistant", "content": content})
}

fn call_item(i: usize, call_id: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_s1_{i}"), "call_id": call_id, "name": "shell",
           "arguments": arguments, "status": status})
}

#[test]
fn a_completion_becomes_a_response() {
    let c = completion(
        json!({"content": "Running.", "tool_calls": [
            {"id": "call_a", "function": {"name": "shell", "arguments": "{\"command\":[\"ls\"]}"}},
            {"function": {"name": "shell", "arguments": "not json is passed as is"}}]}),
        json!("tool_calls"),
    );
    assert_eq!(
        json_reply(reply(&c, false)),
        final_response(
            "completed",
            Value::Null,
            json!([
                message_item(
                    "completed",
                    json!([{"type": "output_text", "text": "Running.", "annotations": []}])
                ),
                call_item(0, "call_a", "{\"command\":[\"ls\"]}", "completed"),
                call_item(1, "call_s1_1", "not json is passed as is", "completed")
            ])
        )
    );
}

#[test]
fn a_cut_off_answer_is_incomplete() {
    for (finish, reason) in [
        ("length", "max_output_tokens"),
        ("content_filter", "content_filter"),
    ] {
        let c = completion(json!({"content": "par"}), json!(finish));
        let body = json_reply(reply(&c, false));
        assert_eq!(body["status"], "incomplete", "{finish}");
        assert_eq!(
            body["incomplete_details"],
            json!({"reason": reason}),
            "{finish}"
        );
        let got = events(reply(&c, true));
        let (last_name, last) = &got[got.len() - 1];
        assert_eq!(last_name.as_deref(), Some("response.incomplete"));
        assert_eq!(last["response"], body);
    }
    for finish in [json!("stop"), json!("tool_calls"), Value::Null] {
        let body = json_reply(reply(
            &completion(json!({"content": "x"}), finish.clone()),
            false,
        ));
        assert_eq!(body["status"], "completed", "{finish}");
        assert_eq!(body["incomplete_details"], Value::Null);
    }
}

#[test]
fn no_text_means_no_message_item() {
    let mut c = completion(
        json!({"content": null, "tool_calls": [{"id": "c", "function": {"name": "shell", "arguments": "{}"}}]}),
        json!("tool_calls"),
    );
    if let Some(c) = c.as_object_mut() {
        c.remove("created");
    }
    let body = json_reply(reply(&c, false));
    assert_eq!(
        body["output"],
        json!([call_item(0, "c", "{}", "completed")])
    );
    assert_eq!(body["created_at"], 0);
    let empty = json_reply(reply(
        &completion(json!({"content": ""}), json!("stop")),
        false,
    ));
    assert_eq!(empty["output"], json!([]));
}

#[test]
fn a_streamed_response_follows_the_documented_events() {
    let c = completion(
        json!({"content": "Hi.", "tool_calls": [{"id": "call_a", "function": {"name": "shell", "arguments": "{}"}}]}),
        json!("tool_calls"),
    );
    let got = events(reply(&c, true));
    for (n, (name, data)) in got.iter().enumerate() {
        assert_eq!(name.as_deref(), data["type"].as_str());
        assert_eq!(data["sequence_number"], n, "{data}");
    }
    let started = json!({
        "id": "resp_s1", "object": "response", "created_at": 7, "status": "in_progress", "error": null,
        "incomplete_details": null, "model": "gpt-x", "output": [],
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "usage": null
    });
    let text_part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
    let done_message = message_item("completed", json!([text_part("Hi.")]));
    let expected = [
        ("response.created", json!({"response": started})),
        ("response.in_progress", json!({"response": started})),
        (
            "response.output_item.added",
            json!({"output_index": 0, "item": message_item("in_progress", json!([]))}),
        ),
        (
            "response.content_part.added",
            json!({"item_id": "msg_s1", "output_index": 0, "content_index": 0, "part": text_part("")}),
        ),
        (
            "response.output_text.delta",
            json!({"item_id": "msg_s1", "output_index": 0, "content_index": 0, "delta": "Hi.", "logprobs": []}),
        ),
        (
            "response.output_text.done",
            json!({"item_id": "msg_s1", "output_index": 0, "content_index": 0, "text": "Hi.", "logprobs": []}),
        ),
        (
            "response.content_part.done",
            json!({"item_id": "msg_s1", "output_index": 0, "content_index": 0, "part": text_part("Hi.")}),
        ),
        (
            "response.output_item.done",
            json!({"output_index": 0, "item": done_message}),
        ),
        (
            "response.output_item.added",
            json!({"output_index": 1, "item": call_item(0, "call_a", "", "in_progress")}),
        ),
        (
            "response.function_call_arguments.delta",
            json!({"item_id": "fc_s1_0", "output_index": 1, "delta": "{}"}),
        ),
        (
            "response.function_call_arguments.done",
            json!({"item_id": "fc_s1_0", "output_index": 1, "arguments": "{}"}),
        ),
        (
            "response.output_item.done",
            json!({"output_index": 1, "item": call_item(0, "call_a", "{}", "completed")}),
        ),
        (
            "response.completed",
            json!({"response": final_response("completed", Value::Null,
                json!([done_message, call_item(0, "call_a", "{}", "completed")]))}),
        ),
    ];
    let expected: Vec<Value> = expected
        .into_iter()
        .enumerate()
        .map(|(n, (kind, mut data))| {
            data["type"] = kind.into();
            data["sequence_number"] = n.into();
            data
        })
        .collect();
    let data: Vec<Value> = got.into_iter().map(|(_, d)| d).collect();
    assert_eq!(data, expected);
}

#[test]
fn an_empty_streamed_response_is_created_then_completed() {
    let got = events(reply(&completion(json!({}), json!("stop")), true));
    let kinds: Vec<&str> = got.iter().filter_map(|(n, _)| n.as_deref()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.completed"
        ]
    );
    assert_eq!(got[2].1["sequence_number"], 2);
    assert_eq!(got[2].1["response"]["output"], json!([]));
}

#[test]
fn a_reply_round_trips_into_the_next_request() {
    // Codex sends the output items back as input; they must become what the provider said.
    let c = completion(
        json!({"content": "ok", "tool_calls": [{"id": "call_z", "function": {"name": "shell", "arguments": "{\"a\":1}"}}]}),
        json!("tool_calls"),
    );
    let response = json_reply(reply(&c, false));
    let mut input = vec![json!({"role": "user", "content": "go"})];
    input.extend(response["output"].as_array().cloned().unwrap_or_default());
    input.push(json!({"type": "function_call_output", "call_id": "call_z", "output": "done"}));
    assert_eq!(
        messages(Value::Array(input)),
        json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "ok", "tool_calls": [
                {"id": "call_z", "type": "function", "function": {"name": "shell", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "call_z", "content": "done"}
        ])
    );
}
