//! How control-plane calls are repeated: the bounded policy, the counts of repeats made, and
//! the form an idempotency key must have to make a create safe to repeat.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// Whether `key` has the form E2B accepts for `Idempotency-Key`.
pub fn is_idempotency_key(key: &str) -> bool {
    (1..=255).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// How often and how long a control-plane call is repeated. The waits are the server's
/// `Retry-After` (at most `max_retry_after`) or else [`crate::backoff::Backoff::doubling`] from `base` to
/// `cap`; `retries` bounds the repeats of one call either way.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub retries: u32,
    pub base: Duration,
    pub cap: Duration,
    /// The longest `Retry-After` honoured; a longer one is cut to this.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 3,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

/// Repeats made so far, by the kind of call.
#[derive(Debug, Default)]
pub struct Retries {
    pub create: AtomicU64,
    pub kill: AtomicU64,
    pub other: AtomicU64,
}
