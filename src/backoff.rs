//! The one retry schedule: the waits between the attempts of one operation. The loops that
//! run it live with their calls (E2B's in `sandbox::e2b::retry`, the model APIs' in
//! `provider::http`), each repeating on what its own answers say.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
