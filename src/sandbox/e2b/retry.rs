//! How E2B calls are repeated: the bounded policy and its one loop (shared by the control
//! plane and envd's idempotent calls), the counts of repeats made, and the form an
//! idempotency key must have to make a create safe to repeat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::gate::Clock;
use crate::backoff::Backoff;

/// Whether `key` has the form E2B accepts for `Idempotency-Key`.
pub fn is_idempotency_key(key: &str) -> bool {
    (1..=255).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// How often and how long a call is repeated. The waits are the server's `Retry-After` (at
/// most `max_retry_after`) or else [`crate::backoff::Backoff::doubling`] from `base` to
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

/// What one attempt of a call came to.
pub enum Attempt<T> {
    /// The outcome stands: a success, or a failure no repeat can change.
    Final(T),
    /// Worth repeating, after the server's `Retry-After` when it named one; the outcome
    /// stands when no repeat is left.
    Again(T, Option<Duration>),
}

impl RetryPolicy {
    /// Runs `attempt` until its outcome is final or the schedule runs out, sleeping on `clock`
    /// between attempts and counting each repeat in `repeats`.
    pub fn run<T>(
        &self,
        clock: &dyn Clock,
        repeats: &AtomicU64,
        mut attempt: impl FnMut() -> Attempt<T>,
    ) -> T {
        let mut schedule = Backoff::doubling(self.base, self.cap, self.retries);
        loop {
            let (outcome, asked) = match attempt() {
                Attempt::Final(outcome) => return outcome,
                Attempt::Again(outcome, asked) => (outcome, asked),
            };
            let Some(backoff) = schedule.next() else {
                return outcome;
            };
            drop(outcome);
            repeats.fetch_add(1, Ordering::Relaxed);
            clock.sleep(asked.map_or(backoff, |a| a.min(self.max_retry_after)));
        }
    }
}

/// Repeats made so far, by the kind of call.
#[derive(Debug, Default)]
pub struct Retries {
    pub create: AtomicU64,
    pub kill: AtomicU64,
    pub other: AtomicU64,
    /// envd's idempotent calls (file reads, process lists, health).
    pub envd: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Instant;

    #[derive(Default)]
    struct Recorded(Mutex<Vec<Duration>>);

    impl Clock for Recorded {
        fn now(&self) -> Instant {
            Instant::now()
        }
        fn sleep(&self, d: Duration) {
            self.0.lock().unwrap().push(d);
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            retries: 2,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(10),
            max_retry_after: Duration::from_secs(5),
        }
    }

    #[test]
    fn repeats_until_final_waiting_the_servers_hint_capped() {
        let clock = Recorded::default();
        let repeats = AtomicU64::new(0);
        let mut n = 0;
        let out = policy().run(&clock, &repeats, || {
            n += 1;
            match n {
                1 => Attempt::Again(n, Some(Duration::from_secs(60))),
                2 => Attempt::Again(n, None),
                _ => Attempt::Final(n),
            }
        });
        assert_eq!(out, 3);
        assert_eq!(repeats.load(Ordering::Relaxed), 2);
        let slept = clock.0.lock().unwrap().clone();
        assert_eq!(slept[0], Duration::from_secs(5), "Retry-After is capped");
        assert!(slept[1] <= Duration::from_millis(10));
    }

    #[test]
    fn the_last_outcome_stands_when_the_schedule_runs_out() {
        let clock = Recorded::default();
        let repeats = AtomicU64::new(0);
        let mut n = 0;
        let out = policy().run(&clock, &repeats, || {
            n += 1;
            Attempt::Again(n, None)
        });
        assert_eq!((out, repeats.load(Ordering::Relaxed)), (3, 2));
    }
}
