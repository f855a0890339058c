//! The OpenAI provider against a local server that enforces what OpenAI documents for its
//! reasoning models: `max_tokens` and a non-default `temperature` are refused (400, as the
//! API words it), `reasoning_effort` is refused by other models; and the cached and
//! reasoning token details reaching `Usage`.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::{json, Value};
use wmo_e2b::cancel::CancelToken;
use wmo_e2b::provider::openai::{OpenAiConfig, OpenAiProvider, ReasoningEffort, TokenParam};
use wmo_e2b::provider::{Completion, ModelCall, Provider, ProviderError, Usage};

/// The server's own list, not the provider's rule: the names it treats as reasoning models.
/// `my-reasoner` stands for a deployment alias no name rule can recognise.
const REASONING: &[&str] = &[
    "o1",
    "o3",
    "o3-mini",
    "o4-mini",
    "gpt-5",
    "gpt-5-mini",
    "my-reasoner",
];

struct Server {
    base_url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start() -> Server {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let port = server.server_addr().to_ip().unwrap().port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (server, bodies) = (server.clone(), bodies.clone());
            std::thread::spawn(move || {
                for mut request in server.incoming_requests() {
                    let mut text = String::new();
                    let _ = request.as_reader().read_to_string(&mut text);
                    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    let (status, answer) = match refusal(&body) {
                        Some(error) => (400, json!({"error": error})),
                        None => (200, completion()),
                    };
                    bodies.lock().unwrap().push(body);
                    let reply = tiny_http::Response::from_string(answer.to_string())
                        .with_status_code(status);
                    let _ = request.respond(reply);
                }
            })
        };
        Server {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            bodies,
            server,
            thread: Some(thread),
        }
    }

    fn last_body(&self) -> Value {
        self.bodies.lock().unwrap().last().cloned().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// OpenAI's error object for a request the named model does not take, or None.
fn refusal(body: &Value) -> Option<Value> {
    let model = body["model"].as_str().unwrap_or("");
    let reasoning = REASONING.contains(&model);
    let error = |message: &str, param: &str, code: &str| {
        Some(
            json!({"message": message, "type": "invalid_request_error", "param": param, "code": code}),
        )
    };
    if reasoning && body.get("max_tokens").is_some() {
        return error(
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
            "max_tokens",
            "unsupported_parameter",
        );
    }
    if reasoning
        && body
            .get("temperature")
            .is_some_and(|t| t.as_f64() != Some(1.0))
    {
        return error(
            "Unsupported value: 'temperature' does not support 0.2 with this model. Only the default (1) value is supported.",
            "temperature",
            "unsupported_value",
        );
    }
    if !reasoning && body.get("reasoning_effort").is_some() {
        return error(
            "Unrecognized request argument supplied: reasoning_effort",
            "reasoning_effort",
            "unsupported_parameter",
        );
    }
    if let Some(effort) = body.get("reasoning_effort") {
        if !["low", "medium", "high"].contains(&effort.as_str().unwrap_or("")) {
            return error(
                "Invalid reasoning_effort",
                "reasoning_effort",
                "invalid_value",
            );
        }
    }
    None
}

fn completion() -> Value {
    json!({
        "id": "chatcmpl-r", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "usage": {
            "prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500,
            "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 256, "audio_tokens": 0}
        }
    })
}

/// What the runner sends; `temperature` only when the task sets one.
fn runner_body(temperature: Option<f64>) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [],
        "max_tokens": 4096
    });
    if let Some(t) = temperature {
        body["temperature"] = json!(t);
    }
    body
}

fn call(
    server: &Server,
    model: &str,
    token_param: TokenParam,
    effort: Option<ReasoningEffort>,
) -> Result<Completion, ProviderError> {
    call_with(server, model, token_param, effort, Some(0.2))
}

fn call_with(
    server: &Server,
    model: &str,
    token_param: TokenParam,
    effort: Option<ReasoningEffort>,
    temperature: Option<f64>,
) -> Result<Completion, ProviderError> {
    let provider = OpenAiProvider::with_key(
        OpenAiConfig {
            base_url: server.base_url.clone(),
            model: model.into(),
            max_retries: 0,
            token_param,
            reasoning_effort: effort,
            ..OpenAiConfig::default()
        },
        "sk-test",
    );
    let body = runner_body(temperature);
    provider.complete(&ModelCall {
        label: "t1",
        script: None,
        index: 0,
        body: &body,
        cancel: &CancelToken::new(),
    })
}

#[test]
fn reasoning_models_are_sent_what_they_accept() {
    let server = Server::start();
    for model in ["o1", "o3-mini", "o4-mini", "gpt-5", "gpt-5-mini"] {
        let c = call(
            &server,
            model,
            TokenParam::Auto,
            Some(ReasoningEffort::High),
        );
        assert!(c.is_ok(), "{model}: {c:?}");
        let sent = server.last_body();
        assert_eq!(sent["max_completion_tokens"], 4096, "{model}: {sent}");
        assert!(sent.get("max_tokens").is_none(), "{model}: {sent}");
        assert!(sent.get("temperature").is_none(), "{model}: {sent}");
        assert_eq!(sent["reasoning_effort"], "high", "{model}: {sent}");
    }
    // Without an effort none is sent: the model's default applies.
    call(&server, "o3", TokenParam::Auto, None).unwrap();
    assert!(server.last_body().get("reasoning_effort").is_none());
}

#[test]
fn other_models_keep_the_runners_body() {
    let server = Server::start();
    // The effort is never sent to a model that would refuse it (the command line refuses the
    // combination before this point; the provider holds the line too).
    call(
        &server,
        "gpt-4o",
        TokenParam::Auto,
        Some(ReasoningEffort::Low),
    )
    .unwrap();
    let sent = server.last_body();
    assert_eq!(sent["max_tokens"], 4096);
    assert_eq!(sent["temperature"], 0.2);
    assert!(sent.get("reasoning_effort").is_none(), "{sent}");
}

#[test]
fn the_token_parameter_can_be_forced_for_names_the_rule_cannot_see() {
    let server = Server::start();
    let alias = |p| call_with(&server, "my-reasoner", p, None, None);
    // A deployment alias looks like any other model to the rule, and the API refuses it...
    match alias(TokenParam::Auto) {
        Err(ProviderError::Status { status: 400, body }) => {
            assert!(body.contains("max_completion_tokens"), "{body}")
        }
        other => panic!("expected the API's 400, got {other:?}"),
    }
    // ...until the flag names the parameter.
    alias(TokenParam::MaxCompletionTokens).unwrap();
    assert_eq!(server.last_body()["max_completion_tokens"], 4096);
    // Forcing `max_tokens` on a reasoning model sends it, and the API refuses it.
    let e = call(&server, "o3", TokenParam::MaxTokens, None).unwrap_err();
    assert!(
        matches!(e, ProviderError::Status { status: 400, .. }),
        "{e:?}"
    );
    assert_eq!(server.last_body()["max_tokens"], 4096);
}

#[test]
fn cached_and_reasoning_tokens_reach_the_usage() {
    let server = Server::start();
    let c = call(&server, "o3", TokenParam::Auto, None).unwrap();
    assert_eq!(
        c.usage,
        Usage {
            input_tokens: 1200,
            output_tokens: 300,
            cached_input_tokens: 1024,
            reasoning_tokens: 256,
        }
    );
}
