//! The OpenAI provider against a real local HTTP server that speaks the chat-completions
//! schema: success, retries on 429/5xx/refused connections, fatal statuses, bad bodies,
//! cancellation and the missing-key check.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wmo_e2b::cancel::CancelToken;
use wmo_e2b::provider::openai::{OpenAiConfig, OpenAiProvider};
use wmo_e2b::provider::{Completion, FailureScope, ModelCall, Provider, ProviderError};

const KEY: &str = "sk-test-key";

/// What the server answers to one request.
struct Reply {
    status: u16,
    body: String,
    headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn completion() -> Self {
        Self::completion_saying(Value::Null)
    }

    /// A completion whose message says `content` beside its tool call.
    fn completion_saying(content: Value) -> Self {
        let body = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "test-model",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [{
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "run", "arguments": "{\"cmd\":\"ls\"}"}
                    }]
                },
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22}
        });
        Self::status(200, &body.to_string())
    }

    fn status(status: u16, body: &str) -> Self {
        Self {
            status,
            body: body.to_string(),
            headers: Vec::new(),
        }
    }

    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }
}

/// A chat-completions server on 127.0.0.1 answering request `n` (0-based) with `reply(n)`,
/// after checking the request the way the real API would.
struct TestServer {
    base_url: String,
    hits: Arc<AtomicUsize>,
    /// When each request reached the server, in order.
    arrivals: Arc<Mutex<Vec<Instant>>>,
    bodies: Arc<Mutex<Vec<Value>>>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    fn start(reply: impl Fn(usize) -> Reply + Send + 'static) -> Self {
        Self::start_with(reply, || {})
    }

    /// `after_reply` runs on the server thread once each reply has been sent.
    fn start_with(
        reply: impl Fn(usize) -> Reply + Send + 'static,
        after_reply: impl Fn() + Send + 'static,
    ) -> Self {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let port = server.server_addr().to_ip().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (server, hits, bodies) = (server.clone(), hits.clone(), bodies.clone());
            let arrivals = arrivals.clone();
            std::thread::spawn(move || {
                for mut request in server.incoming_requests() {
                    arrivals.lock().unwrap().push(Instant::now());
                    let n = hits.fetch_add(1, Ordering::SeqCst);
                    let mut text = String::new();
                    let answer = match request.as_reader().read_to_string(&mut text) {
                        Err(e) => Reply::status(400, &format!("unreadable body: {e}")),
                        Ok(_) => match check(&request, &text) {
                            Err(refusal) => refusal,
                            Ok(body) => {
                                bodies.lock().unwrap().push(body);
                                reply(n)
                            }
                        },
                    };
                    respond(request, answer);
                    after_reply();
                }
            })
        };
        Self {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            hits,
            arrivals,
            bodies,
            server,
            thread: Some(thread),
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn config(&self, max_retries: u32) -> OpenAiConfig {
        config(&self.base_url, max_retries)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn respond(request: tiny_http::Request, answer: Reply) {
    let mut response =
        tiny_http::Response::from_string(answer.body).with_status_code(answer.status);
    for (name, value) in answer.headers {
        let header = tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).unwrap();
        response = response.with_header(header);
    }
    let _ = request.respond(response);
}

/// What the real API insists on: the route, the key, and a body with `model` and `messages`.
/// A request that fails a check gets the refusal the real API would give.
fn check(request: &tiny_http::Request, text: &str) -> Result<Value, Reply> {
    if *request.method() != tiny_http::Method::Post || request.url() != "/v1/chat/completions" {
        let why = format!("wrong route {} {}", request.method(), request.url());
        return Err(Reply::status(404, &why));
    }
    let auth = request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .map(|h| h.value.as_str().to_string());
    if auth.as_deref() != Some(&format!("Bearer {KEY}")) {
        return Err(Reply::status(401, &format!("bad authorization {auth:?}")));
    }
    let body: Value = serde_json::from_str(text)
        .map_err(|e| Reply::status(400, &format!("body is not JSON: {e}")))?;
    if !body["model"].is_string() || !body["messages"].is_array() {
        let why = format!("body lacks model or messages: {body}");
        return Err(Reply::status(400, &why));
    }
    Ok(body)
}

fn config(base_url: &str, max_retries: u32) -> OpenAiConfig {
    OpenAiConfig {
        base_url: base_url.to_string(),
        model: "test-model".to_string(),
        timeout: Duration::from_secs(10),
        max_retries,
        backoff_base: Duration::from_millis(1),
        ..OpenAiConfig::default()
    }
}

fn request_body() -> Value {
    json!({
        "model": "whatever-the-runner-said",
        "stream": true,
        "messages": [{"role": "user", "content": "list files"}],
        "tools": [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}],
        "max_tokens": 256
    })
}

fn complete(provider: &OpenAiProvider, cancel: &CancelToken) -> Result<Completion, ProviderError> {
    let body = request_body();
    provider.complete(&ModelCall {
        label: "t1",
        script: None,
        index: 0,
        body: &body,
        cancel,
    })
}

fn run(server: &TestServer, max_retries: u32) -> Result<Completion, ProviderError> {
    let provider = OpenAiProvider::with_key(server.config(max_retries), KEY);
    complete(&provider, &CancelToken::new())
}

#[test]
fn success_forwards_the_body_and_counts_usage() {
    let server = TestServer::start(|_| Reply::completion());
    let c = run(&server, 2).unwrap();

    assert_eq!(c.retries, 0);
    assert_eq!(c.usage.input_tokens, 17);
    assert_eq!(c.usage.output_tokens, 5);
    let call = &c.body["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "run");
    assert_eq!(call["function"]["arguments"], "{\"cmd\":\"ls\"}");
    assert_eq!(c.body["id"], "chatcmpl-1");

    assert_eq!(server.hits(), 1);
    let sent = server.bodies.lock().unwrap()[0].clone();
    let mut expected = request_body();
    expected["model"] = json!("test-model");
    expected.as_object_mut().unwrap().remove("stream");
    assert_eq!(sent, expected);
}

#[test]
fn rate_limits_are_retried_after_retry_after() {
    // Far beyond the 1 ms backoff of the test config: only the header explains such a wait.
    const RETRY_AFTER: Duration = Duration::from_secs(1);
    let server = TestServer::start(|n| {
        if n < 2 {
            Reply::status(429, r#"{"error":{"message":"slow down"}}"#)
                .header("Retry-After", &RETRY_AFTER.as_secs().to_string())
        } else {
            Reply::completion()
        }
    });
    let c = run(&server, 4).unwrap();
    assert_eq!(c.retries, 2);
    assert_eq!(server.hits(), 3);
    let arrivals = server.arrivals.lock().unwrap().clone();
    for (i, pair) in arrivals.windows(2).enumerate() {
        let waited = pair[1] - pair[0];
        assert!(
            waited >= RETRY_AFTER,
            "retry {} came {waited:?} after its 429, which asked for {RETRY_AFTER:?}",
            i + 1
        );
    }
}

#[test]
fn a_server_error_is_retried() {
    let server = TestServer::start(|n| {
        if n == 0 {
            Reply::status(500, "internal error")
        } else {
            Reply::completion()
        }
    });
    let c = run(&server, 4).unwrap();
    assert_eq!(c.retries, 1);
    assert_eq!(server.hits(), 2);
}

#[test]
fn persistent_server_errors_exhaust_the_retries() {
    let server = TestServer::start(|_| Reply::status(500, "still broken"));
    match run(&server, 2) {
        Err(ProviderError::RetriesExhausted { attempts, last }) => {
            assert_eq!(attempts, 3);
            match *last {
                ProviderError::Status { status, body } => {
                    assert_eq!(status, 500);
                    assert_eq!(body, "still broken");
                }
                other => panic!("expected the last status, got {other:?}"),
            }
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert_eq!(server.hits(), 3);
}

#[test]
fn an_auth_failure_is_not_retried() {
    let long = "x".repeat(5_000);
    let server = TestServer::start(move |_| Reply::status(401, &long));
    match run(&server, 4) {
        Err(ProviderError::KeyRefused { status, body, .. }) => {
            assert_eq!(status, 401);
            // Truncated to 2,000 characters plus the ellipsis.
            assert_eq!(body.chars().count(), 2_001);
        }
        other => panic!("expected KeyRefused 401, got {other:?}"),
    }
    assert_eq!(server.hits(), 1);
}

#[test]
fn a_wrong_key_is_refused_without_retry() {
    let server = TestServer::start(|_| Reply::completion());
    // The server's own check refuses the key, so this is the key the provider really sent.
    let provider = OpenAiProvider::with_key(server.config(4), "sk-wrong");
    match complete(&provider, &CancelToken::new()) {
        Err(ProviderError::KeyRefused { status, body, .. }) => {
            assert_eq!(status, 401);
            assert!(body.contains("Bearer sk-wrong"), "{body}");
        }
        other => panic!("expected a refused key, got {other:?}"),
    }
    assert_eq!(server.hits(), 1);
}

#[test]
fn refused_keys_and_unknown_models_stop_the_run_and_say_which_option() {
    for status in [401, 403] {
        let server = TestServer::start(move |_| Reply::status(status, "no such key"));
        let e = run(&server, 4).unwrap_err();
        assert!(
            matches!(&e, ProviderError::KeyRefused { status: s, var, .. } if *s == status && var == "OPENAI_API_KEY"),
            "{e:?}"
        );
        assert_eq!(e.scope(), FailureScope::Run);
        let msg = e.to_string();
        assert!(
            msg.contains("--api-key-env") && msg.contains("OPENAI_API_KEY"),
            "{msg}"
        );
        assert_eq!(server.hits(), 1);
    }
    let server = TestServer::start(|_| Reply::status(404, "model_not_found"));
    let e = run(&server, 4).unwrap_err();
    assert!(
        matches!(&e, ProviderError::ModelNotFound { model, body } if model == "test-model" && body == "model_not_found"),
        "{e:?}"
    );
    assert_eq!(e.scope(), FailureScope::Run);
    assert!(e.to_string().contains("--model"), "{e}");
    assert_eq!(server.hits(), 1);
    // Other refusals are the episode's to deal with.
    let server = TestServer::start(|_| Reply::status(400, "context too long"));
    let e = run(&server, 4).unwrap_err();
    assert!(
        matches!(e, ProviderError::Status { status: 400, .. }),
        "{e:?}"
    );
    assert_eq!(e.scope(), FailureScope::Episode);
}

#[test]
fn a_non_json_200_is_a_decode_error() {
    let server = TestServer::start(|_| Reply::status(200, "<html>hello</html>"));
    assert!(matches!(run(&server, 4), Err(ProviderError::Decode { .. })));
    assert_eq!(server.hits(), 1);

    let server = TestServer::start(|_| Reply::status(200, r#"{"choices":[]}"#));
    assert!(matches!(run(&server, 4), Err(ProviderError::Decode { .. })));
}

#[test]
fn an_oversized_200_is_a_decode_error() {
    let server = TestServer::start(|_| Reply::completion());
    let provider = OpenAiProvider::with_key(
        OpenAiConfig {
            max_body_bytes: 64,
            ..server.config(4)
        },
        KEY,
    );
    match complete(&provider, &CancelToken::new()) {
        Err(ProviderError::Decode { detail }) => assert!(detail.contains("64"), "{detail}"),
        other => panic!("expected Decode, got {other:?}"),
    }
    assert_eq!(server.hits(), 1);
}

#[test]
fn a_refused_connection_is_retried_then_reported() {
    // Bind and drop to find a port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let provider = OpenAiProvider::with_key(config(&format!("http://127.0.0.1:{port}/v1"), 2), KEY);
    match complete(&provider, &CancelToken::new()) {
        Err(e @ ProviderError::RetriesExhausted { .. }) => {
            // Gave up after 3 attempts: 2 retries, and a failure of the task, not the run.
            assert_eq!(e.retries(), 2);
            assert_eq!(e.scope(), FailureScope::Task);
            let ProviderError::RetriesExhausted { attempts, last } = e else {
                unreachable!()
            };
            assert_eq!(attempts, 3);
            assert!(
                matches!(*last, ProviderError::Transport { .. }),
                "expected a transport cause, got {last:?}"
            );
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
}

#[test]
fn cancelling_during_a_backoff_wait_returns_promptly() {
    let cancel = CancelToken::new();
    let canceller = cancel.clone();
    // The server thread cancels once it has told the client to wait 30 s.
    let server = TestServer::start_with(
        |_| Reply::status(429, "busy").header("Retry-After", "30"),
        move || canceller.cancel(),
    );
    let provider = OpenAiProvider::with_key(server.config(4), KEY);
    let started = Instant::now();
    let result = complete(&provider, &cancel);
    assert!(
        matches!(result, Err(ProviderError::Cancelled)),
        "expected Cancelled, got {result:?}"
    );
    // Far below the 30 s asked for; the exact figure depends on the cancel poll interval.
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(server.hits(), 1);
}

#[test]
fn a_missing_key_names_the_variable() {
    let var = "WMO_E2B_TEST_KEY_THAT_IS_NEVER_SET";
    let result = OpenAiProvider::new(OpenAiConfig {
        api_key_env: var.to_string(),
        ..OpenAiConfig::default()
    });
    match result {
        Err(ProviderError::MissingKey { var: named }) => assert_eq!(named, var),
        other => panic!("expected MissingKey, got {other:?}"),
    }
}

/// Workers share one provider, so it must be `Send + Sync`; checked at compile time.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<OpenAiProvider>();
};

#[test]
fn one_provider_serves_calls_from_several_threads_at_once() {
    const CALLS: usize = 4;
    // Answers nobody until every call is in (or the deadline passes), then answers each
    // request with its own message: the calls pass only if the provider had them in flight
    // together, and each caller must get its own answer back.
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let base_url = format!(
        "http://127.0.0.1:{}/v1",
        server.server_addr().to_ip().unwrap().port()
    );
    let gatherer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut held = Vec::new();
        while held.len() < CALLS {
            let left = deadline.saturating_duration_since(Instant::now());
            match server.recv_timeout(left) {
                Ok(Some(request)) => held.push(request),
                _ => break,
            }
        }
        let in_flight = held.len();
        for mut request in held {
            let mut text = String::new();
            request.as_reader().read_to_string(&mut text).unwrap();
            let answer = match check(&request, &text) {
                Ok(body) => Reply::completion_saying(body["messages"][0]["content"].clone()),
                Err(refusal) => refusal,
            };
            respond(request, answer);
        }
        in_flight
    });
    // A call outlives the gatherer's deadline: a provider that made callers take turns
    // would still be waiting for its first answer when the gatherer gives up.
    let provider = Arc::new(OpenAiProvider::with_key(
        OpenAiConfig {
            timeout: Duration::from_secs(30),
            ..config(&base_url, 0)
        },
        KEY,
    ));
    let callers: Vec<JoinHandle<Result<Value, String>>> = (0..CALLS)
        .map(|i| {
            let provider = provider.clone();
            std::thread::spawn(move || {
                let mut body = request_body();
                body["messages"][0]["content"] = json!(format!("from caller {i}"));
                let call = ModelCall {
                    label: "t1",
                    script: None,
                    index: 0,
                    body: &body,
                    cancel: &CancelToken::new(),
                };
                provider
                    .complete(&call)
                    .map(|c| c.body["choices"][0]["message"]["content"].clone())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    let answers: Vec<Result<Value, String>> =
        callers.into_iter().map(|c| c.join().unwrap()).collect();
    assert_eq!(
        gatherer.join().unwrap(),
        CALLS,
        "the calls were never all in flight together: {answers:?}"
    );
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer, Ok(json!(format!("from caller {i}"))));
    }
}
