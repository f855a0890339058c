//! What every HTTP model API shares: one pooled agent per provider, bounded reads, the
//! classification of a failed attempt, `Retry-After`, and the retry loop over
//! `crate::backoff`'s schedule that observes the run's cancel token.

use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use ureq::http::HeaderMap;

use super::ProviderError;
use crate::backoff::Backoff;
use crate::cancel::CancelToken;

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

/// Where a provider sends its requests, with the key it sends: its `Debug` never shows
/// the key, so no log line can.
pub(crate) struct Endpoint {
    pub url: String,
    pub key: String,
    pub agent: ureq::Agent,
}

impl Endpoint {
    pub fn new(url: String, key: String, timeout: Duration) -> Endpoint {
        Endpoint {
            url,
            key,
            agent: agent(timeout),
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .field("key", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The agent one provider shares between its worker threads; `timeout` bounds one whole
/// request (connect, send, read the response).
pub(crate) fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        // Statuses are classified by each provider (retry, fail, decode), not turned into
        // errors here.
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .timeout_connect(Some(timeout.min(MAX_CONNECT_TIMEOUT)))
        // A redirected POST would be replayed as a bodyless GET without the key; an API that
        // redirects is misconfigured, and the 3xx is reported as a status error.
        .max_redirects(0)
        .max_idle_connections(IDLE_CONNECTIONS_PER_HOST)
        .max_idle_connections_per_host(IDLE_CONNECTIONS_PER_HOST)
        .user_agent(concat!("wmo-e2b/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent()
}

/// How one attempt failed, decided where the failure is seen.
pub(crate) enum Failure {
    /// Worth another attempt; `after` is the server's `Retry-After`, when it sent one.
    Retry {
        error: ProviderError,
        after: Option<Duration>,
    },
    Fatal(ProviderError),
}

impl Failure {
    /// A retryable status answer, waiting as long as its `Retry-After` asks.
    pub(crate) fn retry_status(response: &mut ureq::http::Response<ureq::Body>) -> Failure {
        Failure::Retry {
            after: retry_after(response.headers()),
            error: ProviderError::Status {
                status: response.status().as_u16(),
                body: error_text(response.body_mut()),
            },
        }
    }
}

/// Runs `attempt` until it answers, fails for good, or `backoff` runs out; a retry waits as
/// long as the server's `Retry-After` asked, else the schedule's next delay. Returns the
/// answer and the retries it took.
pub(crate) fn with_retries(
    cancel: &CancelToken,
    mut backoff: Backoff,
    mut attempt: impl FnMut() -> Result<Value, Failure>,
) -> Result<(Value, u32), ProviderError> {
    loop {
        // An HTTP request in flight cannot be interrupted (it is bounded by the timeout), but
        // a cancelled run starts no new one.
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        match attempt() {
            Ok(body) => return Ok((body, backoff.taken())),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Retry { error, after }) => {
                // The schedule holds exactly `max_retries` waits; when it runs out, so do
                // the retries.
                let Some(delay) = backoff.next() else {
                    return Err(ProviderError::RetriesExhausted {
                        attempts: backoff.taken() + 1,
                        last: Box::new(error),
                    });
                };
                if !cancel.sleep(after.unwrap_or(delay)) {
                    return Err(ProviderError::Cancelled);
                }
            }
        }
    }
}

/// A transport error, retryable when a later attempt can get past it.
pub(crate) fn transport_failure(url: &str, e: ureq::Error) -> Failure {
    let transient = is_transient(&e);
    let error = ProviderError::Transport {
        url: url.to_string(),
        source: Box::new(e),
    };
    if transient {
        Failure::Retry { error, after: None }
    } else {
        Failure::Fatal(error)
    }
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

/// A success body as JSON, at most `limit` bytes of it.
pub(crate) fn read_json(
    url: &str,
    response: &mut ureq::http::Response<ureq::Body>,
    limit: u64,
) -> Result<Value, Failure> {
    let bytes = response
        .body_mut()
        .with_config()
        .limit(limit)
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(limit) => Failure::Fatal(ProviderError::Decode {
                detail: format!("the response body is larger than {limit} bytes"),
            }),
            other => transport_failure(url, other),
        })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Failure::Fatal(ProviderError::Decode {
            detail: format!("invalid JSON: {e}"),
        })
    })
}

/// The start of an error body, for the message. A read failure just shortens the text: the
/// status is the error, the body only explains it.
pub(crate) fn error_text(body: &mut ureq::Body) -> String {
    let mut bytes = Vec::new();
    let _ = body
        .as_reader()
        .take(MAX_ERROR_BODY_BYTES)
        .read_to_end(&mut bytes);
    truncate_chars(String::from_utf8_lossy(&bytes).trim(), MAX_ERROR_BODY_CHARS)
}

pub(crate) fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// `Retry-After` as seconds (integer or decimal) or an HTTP-date, capped at
/// `MAX_RETRY_AFTER`; anything unparsable is ignored and the backoff applies.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
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

/// A JSON count at `path` below `value`, 0 when absent: servers that omit a usage figure
/// report none, which is not an error.
pub(crate) fn count_at(value: &Value, path: &[&str]) -> u64 {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_never_shows_its_key() {
        let e = Endpoint::new(
            "https://api.test/v1".into(),
            "sk-secret".into(),
            Duration::from_secs(1),
        );
        let shown = format!("{e:?}");
        assert!(
            shown.contains("api.test") && !shown.contains("sk-secret"),
            "{shown}"
        );
    }

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
    fn truncation_counts_chars() {
        assert_eq!(truncate_chars("héllo", 10), "héllo");
        assert_eq!(truncate_chars("héllo", 2), "hé…");
    }

    #[test]
    fn counts_default_to_zero() {
        let v = serde_json::json!({"usage": {"a": 3, "d": {"b": 4}, "s": "5"}});
        assert_eq!(count_at(&v, &["usage", "a"]), 3);
        assert_eq!(count_at(&v, &["usage", "d", "b"]), 4);
        assert_eq!(count_at(&v, &["usage", "s"]), 0);
        assert_eq!(count_at(&v, &["usage", "x", "b"]), 0);
    }
}
