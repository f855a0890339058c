//! The Anthropic provider against a local server enforcing the Messages API's documented
//! rules: a tool-calling conversation translated both ways and accepted, a broken one
//! refused with the API's error, 429/529 retried after `retry-after`, refused keys and
//! unknown models stopping the run, and the cache figures reaching `Usage`.

use std::time::Duration;

use serde_json::{json, Value};
use wmo_e2b::cancel::CancelToken;
use wmo_e2b::provider::anthropic::{AnthropicConfig, AnthropicProvider};
use wmo_e2b::provider::{Completion, FailureScope, ModelCall, Provider, ProviderError, Usage};

#[path = "support/messages_api.rs"]
mod messages_api;

use messages_api::{MessagesServer, Reply};

const KEY: &str = "sk-ant-test-0b5d";

fn provider(server: &MessagesServer, key: &str) -> AnthropicProvider {
    AnthropicProvider::with_key(
        AnthropicConfig {
            base_url: server.base_url.clone(),
            model: "claude-test".into(),
            timeout: Duration::from_secs(10),
            max_retries: 3,
            backoff_base: Duration::from_millis(1),
            ..AnthropicConfig::default()
        },
        key,
    )
}

fn complete(p: &AnthropicProvider, body: &Value) -> Result<Completion, ProviderError> {
    p.complete(&ModelCall {
        label: "t1",
        script: None,
        index: 0,
        body,
        cancel: &CancelToken::new(),
    })
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "bash", "description": "Run a command",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                        "required": ["command"]}}},
        {"type": "function", "function": {"name": "submit", "description": "Finish",
         "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}}}}
    ])
}

/// The body the runner sends at the start of an episode.
fn opening() -> Value {
    json!({
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "list the files"}
        ],
        "tools": tools(),
        "max_tokens": 512
    })
}

fn bash_ls_reply() -> Reply {
    Reply::message(
        json!([
            {"type": "text", "text": "I'll look."},
            {"type": "tool_use", "id": "toolu_01A", "name": "bash", "input": {"command": "ls -la"}},
            {"type": "tool_use", "id": "toolu_01B", "name": "bash", "input": {"command": "pwd"}}
        ]),
        "tool_use",
        json!({"input_tokens": 20, "output_tokens": 9,
               "cache_creation_input_tokens": 300, "cache_read_input_tokens": 1000}),
    )
}

#[test]
fn a_tool_calling_round_trip_is_translated_both_ways() {
    let server = MessagesServer::start(KEY, |n, _| match n {
        0 => bash_ls_reply(),
        _ => Reply::message(
            json!([{"type": "text", "text": "Done."}]),
            "end_turn",
            json!({"input_tokens": 50, "output_tokens": 2}),
        ),
    });
    let p = provider(&server, KEY);
    let first = complete(&p, &opening()).unwrap();

    // The reply as the runner reads it.
    let choice = &first.body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "I'll look.");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["id"], "toolu_01A");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "bash");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"command": "ls -la"}));
    // Cache writes and reads were prompt tokens too; the reads are the cached part.
    assert_eq!(
        first.usage,
        Usage {
            input_tokens: 1_320,
            output_tokens: 9,
            cached_input_tokens: 1_000,
            reasoning_tokens: 0,
        }
    );
    assert_eq!(first.body["usage"]["prompt_tokens"], 1_320);

    // The request as the server took it: system outside the messages, tools in Messages shape.
    let sent = server.bodies.lock().unwrap()[0].clone();
    assert_eq!(sent["system"], "You are an agent.");
    assert_eq!(sent["model"], "claude-test");
    assert_eq!(sent["max_tokens"], 512);
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "list the files"}]}])
    );
    assert_eq!(sent["tools"][0]["name"], "bash");
    assert_eq!(
        sent["tools"][0]["input_schema"]["required"],
        json!(["command"])
    );

    // The runner appends the reply and the tool answers, then a nudge, and calls again: the
    // server only accepts this if each tool_use is answered first in the next user turn.
    let mut next = opening();
    let messages = next["messages"].as_array_mut().unwrap();
    messages.push(
        json!({"role": "assistant", "content": choice["message"]["content"], "tool_calls": calls}),
    );
    messages.push(json!({"role": "tool", "tool_call_id": "toolu_01A", "content": "a.txt\nb.txt"}));
    messages.push(json!({"role": "tool", "tool_call_id": "toolu_01B", "content": "/home/user"}));
    messages.push(json!({"role": "user", "content": "Continue."}));
    let second = complete(&p, &next).unwrap();
    assert_eq!(second.body["choices"][0]["finish_reason"], "stop");
    assert_eq!(second.body["choices"][0]["message"]["content"], "Done.");
    assert!(server.refusals.lock().unwrap().is_empty());

    let sent = server.bodies.lock().unwrap()[1].clone();
    let turns = sent["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 3, "{sent}");
    assert_eq!(
        turns[1]["content"][1],
        json!({"type": "tool_use", "id": "toolu_01A", "name": "bash", "input": {"command": "ls -la"}})
    );
    assert_eq!(
        turns[2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "a.txt\nb.txt"},
            {"type": "tool_result", "tool_use_id": "toolu_01B", "content": "/home/user"},
            {"type": "text", "text": "Continue."}
        ])
    );
}

#[test]
fn a_request_the_api_refuses_ends_the_episode_with_its_error() {
    let server = MessagesServer::start(KEY, |_, _| bash_ls_reply());
    let p = provider(&server, KEY);
    // A tool answer to a call the assistant never made: the API's 400 comes back as a status
    // error for the episode, with the API's error type and message, and is not retried.
    let mut body = opening();
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}));
    messages.push(json!({"role": "tool", "tool_call_id": "toolu_other", "content": "x"}));
    match complete(&p, &body) {
        Err(e @ ProviderError::Status { status: 400, .. }) => {
            assert_eq!(e.scope(), FailureScope::Episode);
            let text = e.to_string();
            assert!(text.contains("invalid_request_error: "), "{text}");
            assert!(text.contains("toolu_other"), "{text}");
        }
        other => panic!("expected a 400, got {other:?}"),
    }
    assert_eq!(server.hits(), 1);
    // A body the provider cannot translate is refused before anything is sent.
    let no_cap = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert!(matches!(
        complete(&p, &no_cap),
        Err(ProviderError::InvalidRequest { .. })
    ));
    assert_eq!(server.hits(), 1);
}

#[test]
fn overloaded_and_rate_limited_answers_are_retried_after_retry_after() {
    // Far beyond the 1 ms backoff of the test config: only the header explains such a wait.
    const RETRY_AFTER: Duration = Duration::from_secs(1);
    let server = MessagesServer::start(KEY, |n, _| match n {
        0 => Reply::error(529, "overloaded_error", "Overloaded").header("retry-after", "1"),
        1 => Reply::error(429, "rate_limit_error", "slow down").header("retry-after", "1"),
        _ => bash_ls_reply(),
    });
    let c = complete(&provider(&server, KEY), &opening()).unwrap();
    assert_eq!(c.retries, 2);
    assert_eq!(server.hits(), 3);
    let arrivals = server.arrivals.lock().unwrap().clone();
    for pair in arrivals.windows(2) {
        let waited = pair[1] - pair[0];
        assert!(
            waited >= RETRY_AFTER,
            "a retry came {waited:?} after its refusal"
        );
    }

    // Overload that never passes exhausts the retries: the task's failure, not the run's.
    let server = MessagesServer::start(KEY, |_, _| {
        Reply::error(529, "overloaded_error", "Overloaded").header("retry-after", "0")
    });
    match complete(&provider(&server, KEY), &opening()) {
        Err(e @ ProviderError::RetriesExhausted { .. }) => {
            assert_eq!(e.retries(), 3);
            assert_eq!(e.scope(), FailureScope::Task);
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert_eq!(server.hits(), 4);
}

#[test]
fn a_refused_key_names_its_variable_and_stops_the_run() {
    let server = MessagesServer::start(KEY, |_, _| bash_ls_reply());
    // The server's own check refuses the key, so this is the header the provider really sent.
    let e = complete(&provider(&server, "sk-ant-wrong"), &opening()).unwrap_err();
    match &e {
        ProviderError::KeyRefused { status, var, body } => {
            assert_eq!(*status, 401);
            assert_eq!(var, "ANTHROPIC_API_KEY");
            assert_eq!(body, "authentication_error: invalid x-api-key");
        }
        other => panic!("expected KeyRefused, got {other:?}"),
    }
    assert_eq!(e.scope(), FailureScope::Run);
    let msg = e.to_string();
    assert!(
        msg.contains("ANTHROPIC_API_KEY") && msg.contains("--api-key-env"),
        "{msg}"
    );
    assert_eq!(server.hits(), 1);

    let server = MessagesServer::start(KEY, |_, _| {
        Reply::error(403, "permission_error", "not allowed")
    });
    let e = complete(&provider(&server, KEY), &opening()).unwrap_err();
    assert!(
        matches!(e, ProviderError::KeyRefused { status: 403, .. }),
        "{e:?}"
    );
}

#[test]
fn an_unknown_model_stops_the_run() {
    let server = MessagesServer::start(KEY, |_, _| {
        Reply::error(404, "not_found_error", "model: claude-test")
    });
    let e = complete(&provider(&server, KEY), &opening()).unwrap_err();
    match &e {
        ProviderError::ModelNotFound { model, body } => {
            assert_eq!(model, "claude-test");
            assert_eq!(body, "not_found_error: model: claude-test");
        }
        other => panic!("expected ModelNotFound, got {other:?}"),
    }
    assert_eq!(e.scope(), FailureScope::Run);
    assert!(e.to_string().contains("--model"), "{e}");
    assert_eq!(server.hits(), 1);
}

#[test]
fn a_cut_off_reply_reads_as_length_and_a_missing_key_names_the_variable() {
    let server = MessagesServer::start(KEY, |_, _| {
        Reply::message(
            json!([{"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {}}]),
            "max_tokens",
            json!({"input_tokens": 5, "output_tokens": 512}),
        )
    });
    let c = complete(&provider(&server, KEY), &opening()).unwrap();
    // `length` is what makes the runner skip the (possibly cut) tool call.
    assert_eq!(c.body["choices"][0]["finish_reason"], "length");
    assert_eq!(c.body["choices"][0]["message"]["content"], Value::Null);

    let var = "WMO_E2B_TEST_ANTHROPIC_KEY_NEVER_SET";
    match AnthropicProvider::new(AnthropicConfig {
        api_key_env: var.into(),
        ..AnthropicConfig::default()
    }) {
        Err(ProviderError::MissingKey { var: named }) => assert_eq!(named, var),
        other => panic!("expected MissingKey, got {other:?}"),
    }
    let p = AnthropicProvider::with_key(AnthropicConfig::default(), "k");
    assert_eq!(p.endpoint(), "https://api.anthropic.com/v1/messages");
    assert!(!format!("{p:?}").contains("\"k\""));
}
