//! Anthropic's Messages API (`POST {base_url}/v1/messages`), spoken natively: the runner's
//! chat-completions body is translated into a Messages request (`request`), and the answer
//! back into a chat completion (`response`), so the runner, the broker and the records see
//! what they see with the OpenAI provider.
//!
//! Bounded like the OpenAI provider (one pooled agent, a timeout per request, a response-size
//! limit, a fixed number of retries), and failures are classified the same way: 429 and 529
//! (overloaded), 500 and gateway errors are retried, honouring `retry-after`; 401 and 403 are
//! a refused key, 404 an unknown model (or endpoint), both stopping the run; any other
//! refusal (400 `invalid_request_error`, 413) ends the episode `provider_error`.

mod request;
mod response;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::http::{self, Failure};
use super::{Completion, ModelCall, Provider, ProviderError};
use crate::backoff::Backoff;

/// The API version every request names (`anthropic-version`).
pub const API_VERSION: &str = "2023-06-01";
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_API_KEY_ENV: &str = "ANTHROPIC_API_KEY";

#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicConfig {
    /// The API root, without the `/v1/messages` suffix.
    pub base_url: String,
    pub model: String,
    /// The environment variable holding the API key, read once at construction.
    pub api_key_env: String,
    /// The whole of one HTTP request: connect, send, and read the full response.
    pub timeout: Duration,
    /// Retries after the first attempt, for 429, 529, 500, 502/503/504 and transport failures.
    pub max_retries: u32,
    /// The largest response body accepted (after decompression).
    pub max_body_bytes: u64,
    /// The first backoff wait; each further retry doubles it (tests make it tiny).
    pub backoff_base: Duration,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_string(),
            model: "claude-sonnet-4-5".to_string(),
            api_key_env: DEFAULT_API_KEY_ENV.to_string(),
            timeout: Duration::from_secs(120),
            max_retries: 4,
            max_body_bytes: 32 * 1024 * 1024,
            backoff_base: Duration::from_millis(500),
        }
    }
}

#[derive(Debug)]
pub struct AnthropicProvider {
    config: AnthropicConfig,
    endpoint: http::Endpoint,
}

impl AnthropicProvider {
    /// Reads the key from `config.api_key_env` now.
    pub fn new(config: AnthropicConfig) -> Result<Self, ProviderError> {
        let key = super::key_from_env(&config.api_key_env)?;
        Ok(Self::with_key(config, key))
    }

    /// Uses `key` as given, without looking at the environment.
    pub fn with_key(config: AnthropicConfig, key: impl Into<String>) -> Self {
        let url = format!("{}/v1/messages", config.base_url.trim_end_matches('/'));
        let endpoint = http::Endpoint::new(url, key.into(), config.timeout);
        Self { config, endpoint }
    }

    /// The full Messages URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint.url
    }

    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }

    /// One HTTP exchange, with every failure classified as retryable or not where it occurs.
    fn attempt(&self, body: &Value) -> Result<Value, Failure> {
        let mut response = self
            .endpoint
            .agent
            .post(&self.endpoint.url)
            .header("x-api-key", &self.endpoint.key)
            .header("anthropic-version", API_VERSION)
            .send_json(body)
            .map_err(|e| http::transport_failure(&self.endpoint.url, e))?;
        let status = response.status().as_u16();
        match status {
            200 => http::read_json(
                &self.endpoint.url,
                &mut response,
                self.config.max_body_bytes,
            ),
            // 529 is Anthropic's "overloaded": everyone's, and passing.
            429 | 500 | 502 | 503 | 504 | 529 => Err(Failure::retry_status(&mut response)),
            401 | 403 => Err(Failure::Fatal(ProviderError::KeyRefused {
                status,
                var: self.config.api_key_env.clone(),
                body: api_error(response.body_mut()),
            })),
            404 => Err(Failure::Fatal(ProviderError::ModelNotFound {
                model: self.config.model.clone(),
                body: api_error(response.body_mut()),
            })),
            _ => Err(Failure::Fatal(ProviderError::Status {
                status,
                body: api_error(response.body_mut()),
            })),
        }
    }
}

impl Provider for AnthropicProvider {
    fn complete(&self, call: &ModelCall<'_>) -> Result<Completion, ProviderError> {
        let body = request::messages_request(call.body, &self.config.model)?;
        let backoff = Backoff::doubling(
            self.config.backoff_base,
            http::MAX_BACKOFF,
            self.config.max_retries,
        );
        let (message, retries) = http::with_retries(call.cancel, backoff, || self.attempt(&body))?;
        // A clock before 1970 is not worth failing a call over.
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (body, usage) = response::chat_completion(&message, created)?;
        Ok(Completion {
            body,
            usage,
            retries,
        })
    }
}

/// An error body as `type: message` when it has Anthropic's shape
/// (`{"type": "error", "error": {"type": ..., "message": ...}}`), else its start as sent.
fn api_error(body: &mut ureq::Body) -> String {
    let text = http::error_text(body);
    let parsed: Option<Value> = serde_json::from_str(&text).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let field = |name| error.and_then(|e| e.get(name)).and_then(Value::as_str);
    match (field("type"), field("message")) {
        (Some(kind), Some(message)) => format!("{kind}: {message}"),
        _ => text,
    }
}
