//! An OpenAI-compatible chat-completions API (OpenAI itself, or any server that speaks the
//! same schema at `{base_url}/chat/completions`).
//!
//! One provider is shared by every worker thread, so it owns a single connection-pooling
//! `ureq::Agent`. Every call is bounded: a per-request timeout, a response-size limit, a fixed
//! number of retries and capped waits that observe the run's cancel token. The runner writes
//! one body for every model; `reasoning` fits it to OpenAI's reasoning models.

pub mod reasoning;

use std::time::Duration;

use serde_json::Value;

use super::http::{self, Failure};
use super::{Completion, ModelCall, Provider, ProviderError, Usage};
use crate::backoff::Backoff;
pub use reasoning::{is_reasoning_model, ReasoningEffort, TokenParam};

#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiConfig {
    /// The API root, without the `/chat/completions` suffix.
    pub base_url: String,
    /// Replaces whatever `model` the runner's request named.
    pub model: String,
    /// The environment variable holding the API key, read once at construction.
    pub api_key_env: String,
    /// The whole of one HTTP request: connect, send, and read the full response.
    pub timeout: Duration,
    /// Retries after the first attempt, for 429, 502/503/504, 500 and transport failures.
    pub max_retries: u32,
    /// The largest response body accepted (after decompression).
    pub max_body_bytes: u64,
    /// The first backoff wait; each further retry doubles it (tests make it tiny).
    pub backoff_base: Duration,
    /// The name the output-token cap is sent under.
    pub token_param: TokenParam,
    /// Sent as `reasoning_effort`, to reasoning models only.
    pub reasoning_effort: Option<ReasoningEffort>,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".to_string(),
            model: "gpt-4o-mini".to_string(),
            api_key_env: "OPENAI_API_KEY".to_string(),
            timeout: Duration::from_secs(120),
            max_retries: 4,
            max_body_bytes: 32 * 1024 * 1024,
            backoff_base: Duration::from_millis(500),
            token_param: TokenParam::Auto,
            reasoning_effort: None,
        }
    }
}

#[derive(Debug)]
pub struct OpenAiProvider {
    config: OpenAiConfig,
    endpoint: http::Endpoint,
}

impl OpenAiProvider {
    /// Reads the key from `config.api_key_env` now.
    pub fn new(config: OpenAiConfig) -> Result<Self, ProviderError> {
        let key = super::key_from_env(&config.api_key_env)?;
        Ok(Self::with_key(config, key))
    }

    /// Uses `key` as given, without looking at the environment.
    pub fn with_key(config: OpenAiConfig, key: impl Into<String>) -> Self {
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        let endpoint = http::Endpoint::new(url, key.into(), config.timeout);
        Self { config, endpoint }
    }

    /// The model every request is sent with.
    pub fn model(&self) -> &str {
        &self.config.model
    }

    /// The full chat-completions URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint.url
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The runner's body with our model, fitted to it, and without streaming: we read one
    /// JSON response.
    fn request_body(&self, body: &Value) -> Result<Value, ProviderError> {
        let Value::Object(map) = body else {
            return Err(ProviderError::InvalidRequest {
                detail: "the request body must be a JSON object".to_string(),
            });
        };
        let mut map = map.clone();
        map.insert("model".into(), Value::String(self.config.model.clone()));
        map.remove("stream");
        // The API rejects `stream_options` unless streaming, so it goes with `stream`.
        map.remove("stream_options");
        reasoning::fit_body(
            &mut map,
            &self.config.model,
            self.config.token_param,
            self.config.reasoning_effort,
        );
        Ok(Value::Object(map))
    }

    /// One HTTP exchange, with every failure classified as retryable or not where it occurs.
    fn attempt(&self, body: &Value) -> Result<Value, Failure> {
        let mut response = self
            .endpoint
            .agent
            .post(&self.endpoint.url)
            .header("Authorization", format!("Bearer {}", self.endpoint.key))
            .send_json(body)
            .map_err(|e| http::transport_failure(&self.endpoint.url, e))?;
        let status = response.status().as_u16();
        match status {
            200 => {
                let body = http::read_json(
                    &self.endpoint.url,
                    &mut response,
                    self.config.max_body_bytes,
                )?;
                decode_completion(body).map_err(Failure::Fatal)
            }
            // Rate limits, overload and gateway trouble pass; a 500 is usually transient at
            // these providers too.
            429 | 500 | 502 | 503 | 504 => Err(Failure::retry_status(&mut response)),
            401 | 403 => Err(Failure::Fatal(ProviderError::KeyRefused {
                status,
                var: self.config.api_key_env.clone(),
                body: http::error_text(response.body_mut()),
            })),
            404 => Err(Failure::Fatal(ProviderError::ModelNotFound {
                model: self.config.model.clone(),
                body: http::error_text(response.body_mut()),
            })),
            _ => Err(Failure::Fatal(ProviderError::Status {
                status,
                body: http::error_text(response.body_mut()),
            })),
        }
    }
}

impl Provider for OpenAiProvider {
    fn complete(&self, call: &ModelCall<'_>) -> Result<Completion, ProviderError> {
        let body = self.request_body(call.body)?;
        let backoff = Backoff::doubling(
            self.config.backoff_base,
            http::MAX_BACKOFF,
            self.config.max_retries,
        );
        let (body, retries) = http::with_retries(call.cancel, backoff, || self.attempt(&body))?;
        let usage = usage_of(&body);
        Ok(Completion {
            body,
            usage,
            retries,
        })
    }
}

/// A 200 body must be a chat completion: an object with at least one choice.
fn decode_completion(body: Value) -> Result<Value, ProviderError> {
    let has_choices = body
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(|choices| !choices.is_empty());
    if !body.is_object() || !has_choices {
        return Err(ProviderError::Decode {
            detail: format!(
                "expected an object with a non-empty `choices` array, got: {}",
                http::truncate_chars(&body.to_string(), 200)
            ),
        });
    }
    Ok(body)
}

/// Tokens as the API reported them. Cached prompt tokens are part of `prompt_tokens`, and
/// reasoning tokens part of `completion_tokens`, as OpenAI counts them.
fn usage_of(body: &Value) -> Usage {
    let count = |path: &[&str]| http::count_at(body, path);
    Usage {
        input_tokens: count(&["usage", "prompt_tokens"]),
        output_tokens: count(&["usage", "completion_tokens"]),
        cached_input_tokens: count(&["usage", "prompt_tokens_details", "cached_tokens"]),
        reasoning_tokens: count(&["usage", "completion_tokens_details", "reasoning_tokens"]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decode_requires_choices() {
        assert!(decode_completion(json!({"choices":[{"index":0}]})).is_ok());
        for bad in [json!([]), json!({"choices":[]}), json!({"error":{}})] {
            assert!(
                matches!(
                    decode_completion(bad.clone()),
                    Err(ProviderError::Decode { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn usage_reads_the_details_and_defaults_to_zero() {
        let u = usage_of(&json!({"usage":{"prompt_tokens":3}}));
        assert_eq!(
            u,
            Usage {
                input_tokens: 3,
                ..Usage::default()
            }
        );
        let u = usage_of(&json!({"usage":{
            "prompt_tokens": 30, "completion_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 20, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 7}
        }}));
        assert_eq!(
            u,
            Usage {
                input_tokens: 30,
                output_tokens: 9,
                cached_input_tokens: 20,
                reasoning_tokens: 7,
            }
        );
    }

    #[test]
    fn request_body_sets_model_and_drops_streaming() {
        let p = OpenAiProvider::with_key(
            OpenAiConfig {
                model: "m1".into(),
                ..OpenAiConfig::default()
            },
            "k",
        );
        let b = p
            .request_body(&json!({
                "model": "other", "stream": true, "stream_options": {}, "messages": []
            }))
            .unwrap();
        assert_eq!(b, json!({"model": "m1", "messages": []}));
        assert!(matches!(
            p.request_body(&json!([])),
            Err(ProviderError::InvalidRequest { .. })
        ));
        assert!(!format!("{p:?}").contains("\"k\""));
        assert_eq!(p.endpoint(), "https://api.openai.com/v1/chat/completions");
    }
}
