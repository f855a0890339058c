//! The one retry schedule: the waits between the attempts of one operation, and the loop
//! that runs them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The delays before the second, third, ... attempt of one operation. The first attempt runs
/// at once, so an operation makes one attempt more than there are delays.
#[derive(Debug, Clone)]
pub struct Backoff {
    shape: Shape,
    retries: u32,
    taken: u32,
}

#[derive(Debug, Clone)]
enum Shape {
    Fixed(Vec<Duration>),
    Doubling { base: Duration, cap: Duration },
}

impl Backoff {
    /// Exactly these delays, in order.
    pub fn fixed(delays: &[Duration]) -> Backoff {
        Backoff {
            retries: u32::try_from(delays.len()).unwrap_or(u32::MAX),
            shape: Shape::Fixed(delays.to_vec()),
            taken: 0,
        }
    }

    /// `retries` delays: `base`, `2·base`, `4·base`… capped at `cap`, each scaled by a jitter
    /// factor in (0.5, 1.0] so workers throttled together do not retry in lockstep.
    pub fn doubling(base: Duration, cap: Duration, retries: u32) -> Backoff {
        Backoff {
            shape: Shape::Doubling { base, cap },
            retries,
            taken: 0,
        }
    }

    /// Delays handed out so far, i.e. retries made.
    pub fn taken(&self) -> u32 {
        self.taken
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.taken >= self.retries {
            return None;
        }
        let delay = match &self.shape {
            Shape::Fixed(delays) => *delays.get(self.taken as usize)?,
            Shape::Doubling { base, cap } => {
                doubling_delay(*base, *cap, self.taken, jitter_factor())
            }
        };
        self.taken += 1;
        Some(delay)
    }
}

/// The wait before retry number `retry` (0-based) of a doubling schedule, given a jitter
/// factor.
pub fn doubling_delay(base: Duration, cap: Duration, retry: u32, jitter: f64) -> Duration {
    // 2^30 * base passes any sane cap; the `min` keeps the shift in range.
    let doubled = base.saturating_mul(1u32 << retry.min(30));
    doubled.min(cap).mul_f64(jitter.clamp(0.0, 1.0))
}

/// A factor in (0.5, 1.0]. Jitter only needs to differ between threads and moments, not to be
/// unpredictable: clock nanoseconds plus a shared counter, mixed by splitmix64.
fn jitter_factor() -> f64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = clock ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    // 53 random bits as a float in [0, 1), mapped onto (0.5, 1.0].
    let unit = (x >> 11) as f64 / (1u64 << 53) as f64;
    1.0 - 0.5 * unit
}

/// Runs `attempt` until it succeeds, fails with an error `retryable` refuses, or the schedule
/// runs out; the last error is returned. `on_retry` hears of each retry before its wait.
pub fn with_retries<T, E>(
    mut schedule: Backoff,
    sleep: &dyn Fn(Duration),
    mut attempt: impl FnMut() -> Result<T, E>,
    retryable: impl Fn(&E) -> bool,
    mut on_retry: impl FnMut(&E, Duration),
) -> Result<T, E> {
    loop {
        let err = match attempt() {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if !retryable(&err) {
            return Err(err);
        }
        let Some(delay) = schedule.next() else {
            return Err(err);
        };
        on_retry(&err, delay);
        sleep(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    const DELAYS: [Duration; 3] = [
        Duration::from_secs(1),
        Duration::from_secs(3),
        Duration::from_secs(9),
    ];

    #[test]
    fn a_fixed_schedule_yields_its_delays_then_stops() {
        let got: Vec<_> = Backoff::fixed(&DELAYS).collect();
        assert_eq!(got, DELAYS);
        assert_eq!(Backoff::fixed(&[]).next(), None);
    }

    #[test]
    fn a_doubling_schedule_doubles_caps_and_stops() {
        let base = Duration::from_millis(500);
        let cap = Duration::from_secs(30);
        let full: Vec<Duration> = (0..8).map(|n| doubling_delay(base, cap, n, 1.0)).collect();
        assert_eq!(
            full[..4],
            [
                Duration::from_millis(500),
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_secs(4)
            ]
        );
        assert_eq!(full[7], cap);
        assert_eq!(doubling_delay(base, cap, u32::MAX, 1.0), cap);
        assert_eq!(
            doubling_delay(base, cap, 1, 0.5),
            Duration::from_millis(500)
        );
        let mut b = Backoff::doubling(base, cap, 3);
        for n in 0..3 {
            let d = b.next().unwrap();
            let full = doubling_delay(base, cap, n, 1.0);
            assert!(d > full / 2 && d <= full, "{d:?} for retry {n}");
        }
        assert_eq!(b.next(), None);
        assert_eq!(b.taken(), 3);
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1_000 {
            let j = jitter_factor();
            assert!(j > 0.5 && j <= 1.0, "{j}");
        }
    }

    #[test]
    fn retryable_errors_use_every_attempt_and_sleep_between() {
        let slept = RefCell::new(Vec::new());
        let mut calls = 0;
        let mut retries = 0;
        let out: Result<(), u32> = with_retries(
            Backoff::fixed(&DELAYS),
            &|d| slept.borrow_mut().push(d),
            || {
                calls += 1;
                Err(calls)
            },
            |_| true,
            |_, _| retries += 1,
        );
        assert_eq!(out, Err(4), "the last error is returned");
        assert_eq!(calls, 4);
        assert_eq!(retries, 3);
        assert_eq!(*slept.borrow(), DELAYS);
    }

    #[test]
    fn a_fatal_error_stops_at_once() {
        let mut calls = 0;
        let out: Result<(), &str> = with_retries(
            Backoff::fixed(&DELAYS),
            &|_| panic!("no sleep before a fatal error"),
            || {
                calls += 1;
                Err("fatal")
            },
            |_| false,
            |_, _| {},
        );
        assert_eq!(out, Err("fatal"));
        assert_eq!(calls, 1);
    }

    #[test]
    fn success_after_a_retry_is_returned() {
        let mut calls = 0;
        let out: Result<u32, ()> = with_retries(
            Backoff::fixed(&DELAYS),
            &|_| {},
            || {
                calls += 1;
                if calls < 2 {
                    Err(())
                } else {
                    Ok(calls)
                }
            },
            |_| true,
            |_, _| {},
        );
        assert_eq!(out, Ok(2));
    }
}
