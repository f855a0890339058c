//! `wmo-e2b eval --provider anthropic` end to end: the builtin runner's episode driven by a
//! local server that enforces the Messages API's rules, the record's tokens filled from its
//! usage, and the key kept on the host; and the model options checked before any sandbox.

use serde_json::{json, Value};

#[path = "support/messages_api.rs"]
mod messages_api;
mod support;

use messages_api::{MessagesServer, Reply};
use support::{task, text, Env, SUBMIT};

const KEY: &str = "sk-ant-test-e2e-7d41c09a";

/// The agent runs `env` until a tool result comes back, then submits; the first request is
/// answered "overloaded" once.
fn agent_reply(n: usize, body: &Value) -> Reply {
    if n == 0 {
        return Reply::error(529, "overloaded_error", "Overloaded").header("retry-after", "0");
    }
    let answered = body["messages"].as_array().unwrap().iter().any(|m| {
        m["content"]
            .as_array()
            .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
    });
    let (name, input) = if answered {
        ("submit", json!({"answer": "done"}))
    } else {
        ("bash", json!({"command": "env"}))
    };
    Reply::message(
        json!([
            {"type": "text", "text": "Working on it."},
            {"type": "tool_use", "id": format!("toolu_{n}"), "name": name, "input": input}
        ]),
        "tool_use",
        json!({"input_tokens": 100, "output_tokens": 20,
               "cache_creation_input_tokens": 10, "cache_read_input_tokens": 400}),
    )
}

#[test]
fn an_anthropic_model_drives_the_episode_and_its_key_stays_on_the_host() {
    let env = Env::new();
    let server = MessagesServer::start(KEY, agent_reply);
    let tasks = env.write_tasks(&[task("claude", r#""verify": "true""#)]);
    let o = env
        .eval_cmd(
            &tasks,
            &[
                "--provider",
                "anthropic",
                "--model",
                "claude-test",
                "--base-url",
                &server.base_url,
            ],
        )
        .env("ANTHROPIC_API_KEY", KEY)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        server.refusals.lock().unwrap().is_empty(),
        "the server refused requests: {:?}",
        server.refusals.lock().unwrap()
    );
    let r = env.result("claude");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["stop_reason"], "submit", "{r}");
    assert_eq!(r["answer"], "done", "{r}");
    assert_eq!(r["retries"]["provider"], 1, "{r}");
    // Two answered calls, each 100 + 10 (cache write) + 400 (cache read) prompt tokens.
    assert_eq!(
        r["tokens"],
        json!({"input": 1020, "output": 40, "cached_input": 800, "reasoning": 0, "calls": 2}),
        "{r}"
    );
    let transcript = std::fs::read_to_string(env.out().join("transcripts/claude.jsonl")).unwrap();
    assert!(transcript.contains("HOME="), "the env tool call ran");
    assert!(!transcript.contains(KEY), "the API key reached the sandbox");

    let bodies = server.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    for b in &bodies {
        assert_eq!(b["model"], "claude-test");
        assert!(b["system"].as_str().is_some_and(|s| !s.is_empty()), "{b}");
        assert!(b["tools"].as_array().unwrap().len() >= 4, "{b}");
    }
    // The last request answered the bash call with its output.
    let last = bodies[2]["messages"].as_array().unwrap();
    let result = &last[last.len() - 1]["content"][0];
    assert_eq!(result["tool_use_id"], "toolu_1", "{result}");
    assert!(result["content"].as_str().unwrap().contains("HOME="));
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn model_options_that_do_not_fit_are_usage_errors_before_any_sandbox() {
    let env = Env::new();
    let tasks = env.write_tasks(&[task("t", &format!(r#""model_script": [{SUBMIT}]"#))]);
    let anthropic = ["--provider", "anthropic", "--model", "claude-test"];
    let cases: [(Vec<&str>, &str); 5] = [
        // The default key variable follows the provider.
        (anthropic.to_vec(), "ANTHROPIC_API_KEY"),
        (
            [&anthropic[..], &["--reasoning-effort", "low"]].concat(),
            "--reasoning-effort",
        ),
        (
            [&anthropic[..], &["--token-param", "max_tokens"]].concat(),
            "--token-param",
        ),
        (
            vec!["--model", "gpt-4o", "--reasoning-effort", "high"],
            "gpt-4o",
        ),
        // The scripted model has no API to send it to.
        (vec!["--reasoning-effort", "high"], "scripted model"),
    ];
    for (i, (args, needle)) in cases.into_iter().enumerate() {
        let mut cmd = env.eval_cmd(&tasks, &args);
        cmd.env("OPENAI_API_KEY", "sk-test");
        if i == 0 {
            cmd.env_remove("ANTHROPIC_API_KEY");
        } else {
            cmd.env("ANTHROPIC_API_KEY", "sk-ant-test");
        }
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(env.live_sandboxes().is_empty());
    }
}
