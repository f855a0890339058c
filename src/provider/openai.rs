//! An OpenAI-compatible chat-completions API (OpenAI itself, or any server that speaks the
//! same schema at `{base_url}/chat/completions`).
//!
//! One provider is shared by every worker thread, so it owns a single connection-pooling
//! `ureq::Agent`. Every call is bounded: a per-request timeout, a response-size limit, a fixed
//! number of retries and capped waits that observe the run's cancel token.

use std::fmt;
use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use ureq::http::HeaderMap;

use super::{Completion, ModelCall, Provider, ProviderError, Usage};
use crate::backoff::Backoff;

/// The longest a `Retry-After` header may make a call wait: a server asking for minutes is
/// better served by the episode failing visibly than by a worker silently parked.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The ceiling of the exponential backoff, before jitter.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Error bodies are only for the message, so only the start is kept.
pub const MAX_ERROR_BODY_CHARS: usize = 2_000;
/// Enough bytes to hold `MAX_ERROR_BODY_CHARS` of any UTF-8 text; the rest is never read.
const MAX_ERROR_BODY_BYTES: u64 = 4 * MAX_ERROR_BODY_CHARS as u64;
/// A slow handshake is a dead host for our purposes; the request timeout covers the rest.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Workers call concurrently; keeping this many connections warm avoids a TLS handshake per
/// call at typical worker counts.
const IDLE_CONNECTIONS_PER_HOST: usize = 64;

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
        }
    }
}

pub struct OpenAiProvider {
    config: OpenAiConfig,
    url: String,
    key: String,
    agent: ureq::Agent,
}

// By hand, so the key can never reach a log line through `{:?}`.
impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("url", &self.url)
            .field("model", &self.config.model)
            .field("key", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    /// Reads the key from `config.api_key_env` now, so a missing key stops the run before any
    /// sandbox is started rather than failing every episode.
    pub fn new(config: OpenAiConfig) -> Result<Self, ProviderError> {
        let key = std::env::var(&config.api_key_env).unwrap_or_default();
        // Keys pasted from files often carry a trailing newline, which is not a valid
        // header byte.
        let key = key.trim();
        if key.is_empty() {
            return Err(ProviderError::MissingKey {
                var: config.api_key_env.clone(),
            });
        }
        Ok(Self::with_key(config, key))
    }

    /// Uses `key` as given, without looking at the environment.
    pub fn with_key(config: OpenAiConfig, key: impl Into<String>) -> Self {
        let agent = ureq::Agent::config_builder()
            // Statuses are classified below (retry, fail, decode), not turned into errors.
            .http_status_as_error(false)
            .timeout_global(Some(config.timeout))
            .timeout_connect(Some(config.timeout.min(MAX_CONNECT_TIMEOUT)))
            // A redirected POST would be replayed as a bodyless GET without the key; an API
            // that redirects is misconfigured, and the 3xx is reported as a status error.
            .max_redirects(0)
            .max_idle_connections(IDLE_CONNECTIONS_PER_HOST)
            .max_idle_connections_per_host(IDLE_CONNECTIONS_PER_HOST)
            .user_agent(concat!("wmo-e2b/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        Self {
            config,
            url,
            key: key.into(),
            agent,
        }
    }

    /// The model every request is sent with.
    pub fn model(&self) -> &str {
        &self.config.model
    }

    /// The full chat-completions URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.url
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The runner's body with our model and without streaming: we read one JSON response.
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
        Ok(Value::Object(map))
    }

    /// One HTTP exchange, with every failure classified as retryable or not where it occurs.
    fn attempt(&self, body: &Value) -> Result<Value, Failure> {
        let mut response = self
            .agent
            .post(&self.url)
            .header("Authorization", format!("Bearer {}", self.key))
            .send_json(body)
            .map_err(|e| self.transport_failure(e))?;
        let status = response.status().as_u16();
        match status {
            200 => {
                let bytes = response
                    .body_mut()
                    .with_config()
                    .limit(self.config.max_body_bytes)
                    .read_to_vec()
                    .map_err(|e| match e {
                        ureq::Error::BodyExceedsLimit(limit) => {
                            Failure::Fatal(ProviderError::Decode {
                                detail: format!("the response body is larger than {limit} bytes"),
                            })
                        }
                        other => self.transport_failure(other),
                    })?;
                decode_completion(&bytes).map_err(Failure::Fatal)
            }
            // Rate limits, overload and gateway trouble pass; a 500 is usually transient at
            // these providers too.
            429 | 500 | 502 | 503 | 504 => Err(Failure::Retry {
                after: retry_after(response.headers()),
                error: ProviderError::Status {
                    status,
                    body: error_text(response.body_mut()),
                },
            }),
            401 | 403 => Err(Failure::Fatal(ProviderError::KeyRefused {
                status,
                var: self.config.api_key_env.clone(),
                body: error_text(response.body_mut()),
            })),
            404 => Err(Failure::Fatal(ProviderError::ModelNotFound {
                model: self.config.model.clone(),
                body: error_text(response.body_mut()),
            })),
            _ => Err(Failure::Fatal(ProviderError::Status {
                status,
                body: error_text(response.body_mut()),
            })),
        }
    }

    fn transport_failure(&self, e: ureq::Error) -> Failure {
        let transient = is_transient(&e);
        let error = ProviderError::Transport {
            url: self.url.clone(),
            source: Box::new(e),
        };
        if transient {
            Failure::Retry { error, after: None }
        } else {
            Failure::Fatal(error)
        }
    }
}

impl Provider for OpenAiProvider {
    fn complete(&self, call: &ModelCall<'_>) -> Result<Completion, ProviderError> {
        let body = self.request_body(call.body)?;
        let mut backoff = Backoff::doubling(
            self.config.backoff_base,
            MAX_BACKOFF,
            self.config.max_retries,
        );
        loop {
            // An HTTP request in flight cannot be interrupted (it is bounded by the timeout),
            // but a cancelled run starts no new one.
            if call.cancel.is_cancelled() {
                return Err(ProviderError::Cancelled);
            }
            match self.attempt(&body) {
                Ok(body) => {
                    let usage = usage_of(&body);
                    return Ok(Completion {
                        body,
                        usage,
                        retries: backoff.taken(),
                    });
                }
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry { error, after }) => {
                    // The backoff schedule holds exactly `max_retries` waits; when it runs
                    // out, so do the retries.
                    let Some(delay) = backoff.next() else {
                        return Err(ProviderError::RetriesExhausted {
                            attempts: backoff.taken() + 1,
                            last: Box::new(error),
                        });
                    };
                    if !call.cancel.sleep(after.unwrap_or(delay)) {
                        return Err(ProviderError::Cancelled);
                    }
                }
            }
        }
    }
}

/// How one attempt failed, decided where the failure is seen.
enum Failure {
    /// Worth another attempt; `after` is the server's `Retry-After`, when it sent one.
    Retry {
        error: ProviderError,
        after: Option<Duration>,
    },
    Fatal(ProviderError),
}

/// Failures of the network or the server's connection handling that a later attempt can
/// get past. Request-building, TLS-configuration and size-limit errors repeat identically.
fn is_transient(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::ConnectionFailed
            // DNS blips happen at scale; a wrong host name costs only the bounded retries.
            | ureq::Error::HostNotFound
            // A pooled connection closed under us surfaces as a protocol error mid-response.
            | ureq::Error::Protocol(_)
            | ureq::Error::BodyStalled
    )
}

/// A 200 body must be a chat completion: an object with at least one choice.
fn decode_completion(bytes: &[u8]) -> Result<Value, ProviderError> {
    let body: Value = serde_json::from_slice(bytes).map_err(|e| ProviderError::Decode {
        detail: format!("invalid JSON: {e}"),
    })?;
    let has_choices = body
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(|choices| !choices.is_empty());
    if !body.is_object() || !has_choices {
        return Err(ProviderError::Decode {
            detail: format!(
                "expected an object with a non-empty `choices` array, got: {}",
                truncate_chars(&body.to_string(), 200)
            ),
        });
    }
    Ok(body)
}

/// Tokens as the API reported them; a server that omits usage counts as zero, not an error.
fn usage_of(body: &Value) -> Usage {
    let count = |field: &str| {
        body.get("usage")
            .and_then(|u| u.get(field))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Usage {
        input_tokens: count("prompt_tokens"),
        output_tokens: count("completion_tokens"),
    }
}

/// The start of an error body, for the message. A read failure just shortens the text: the
/// status is the error, the body only explains it.
fn error_text(body: &mut ureq::Body) -> String {
    let mut bytes = Vec::new();
    let _ = body
        .as_reader()
        .take(MAX_ERROR_BODY_BYTES)
        .read_to_end(&mut bytes);
    truncate_chars(String::from_utf8_lossy(&bytes).trim(), MAX_ERROR_BODY_CHARS)
}

fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// `Retry-After` as seconds (integer or decimal) or an HTTP-date, capped at
/// `MAX_RETRY_AFTER`; anything unparsable is ignored and the backoff applies.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("retry-after")?.to_str().ok()?;
    parse_retry_after(value, SystemTime::now())
}

fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = if value.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // Only digits and a point reach `parse`, so "inf", "NaN" and "-1" cannot.
        let secs: f64 = value.parse().ok()?;
        Duration::try_from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64())).ok()?
    } else {
        let at = parse_http_date(value)?;
        // A date already past means "now".
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// The IMF-fixdate form of an HTTP-date ("Sun, 06 Nov 1994 08:49:37 GMT"), the only form
/// servers may send; the obsolete forms are treated as unparsable.
fn parse_http_date(s: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [_weekday, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: u32 = day.parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as u32
        + 1;
    let year: i64 = year.parse().ok()?;
    let hms: Vec<u64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, sec] = hms.as_slice() else {
        return None;
    };
    if !(1..=31).contains(&day) || *h > 23 || *m > 59 || *sec > 60 || year < 1970 {
        return None;
    }
    let days = u64::try_from(crate::civil::days_from_civil(
        year,
        i64::from(month),
        i64::from(day),
    ))
    .ok()?;
    let secs = days * 86_400 + h * 3_600 + m * 60 + sec;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        let p = |v: &str| parse_retry_after(v, now);
        assert_eq!(p("0"), Some(Duration::ZERO));
        assert_eq!(p(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(p("1.5"), Some(Duration::from_millis(1_500)));
        assert_eq!(p("3600"), Some(MAX_RETRY_AFTER));
        assert_eq!(p("99999999999999999999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(
            p("Sun, 06 Nov 1994 08:50:07 GMT"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(p("Sun, 06 Nov 1994 08:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(p("Mon, 07 Nov 1994 08:49:37 GMT"), Some(MAX_RETRY_AFTER));
        for bad in [
            "",
            "-1",
            "inf",
            "NaN",
            "1e3",
            "soon",
            "Sunday, 06-Nov-94 08:49:37 GMT",
        ] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn http_dates_match_the_calendar() {
        assert_eq!(
            parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"),
            Some(UNIX_EPOCH)
        );
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2000 12:00:00 GMT"),
            Some(UNIX_EPOCH + Duration::from_secs(951_825_600))
        );
        assert_eq!(parse_http_date("Tue, 29 Foo 2000 12:00:00 GMT"), None);
        assert_eq!(parse_http_date("Tue, 29 Feb 2000 25:00:00 GMT"), None);
    }

    #[test]
    fn decode_requires_choices() {
        assert!(decode_completion(br#"{"choices":[{"index":0}]}"#).is_ok());
        for bad in [
            &b"not json"[..],
            b"[]",
            br#"{"choices":[]}"#,
            br#"{"error":{}}"#,
        ] {
            assert!(
                matches!(decode_completion(bad), Err(ProviderError::Decode { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn usage_defaults_to_zero() {
        let u = usage_of(&serde_json::json!({"usage":{"prompt_tokens":3}}));
        assert_eq!(
            u,
            Usage {
                input_tokens: 3,
                output_tokens: 0
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
            .request_body(&serde_json::json!({
                "model": "other", "stream": true, "stream_options": {}, "messages": []
            }))
            .unwrap();
        assert_eq!(b, serde_json::json!({"model": "m1", "messages": []}));
        assert!(matches!(
            p.request_body(&serde_json::json!([])),
            Err(ProviderError::InvalidRequest { .. })
        ));
        assert!(!format!("{p:?}").contains("\"k\""));
        assert_eq!(p.endpoint(), "https://api.openai.com/v1/chat/completions");
    }

    #[test]
    fn truncation_counts_chars() {
        assert_eq!(truncate_chars("héllo", 10), "héllo");
        assert_eq!(truncate_chars("héllo", 2), "hé…");
    }
}
