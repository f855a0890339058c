//! Lease renewal on runner keepalives.
//!
//! While an episode is live the runner sends `transport_keepalive` every 30 s; each may renew
//! the sandbox's timeout, at most every [`REFRESH_INTERVAL`], and never past a hard lifetime
//! cap counted from `episode_start`. The last renewal is shortened so the sandbox dies exactly
//! at the cap. A host that dies therefore leaves sandboxes that expire within one lease.
//!
//! Pure state with an explicit clock so every rule is testable without sleeping.

use std::time::{Duration, Instant};

pub const REFRESH_INTERVAL: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub struct LeaseRenewal {
    /// The lease a renewal asks for.
    lease: Duration,
    /// The hard cap on an episode's lifetime.
    lifetime: Duration,
    /// Absolute end of the current episode's lifetime; `None` when no episode is live.
    deadline: Option<Instant>,
    next_refresh: Instant,
}

impl LeaseRenewal {
    pub fn new(lease: Duration, lifetime: Duration) -> Self {
        LeaseRenewal {
            lease,
            lifetime,
            deadline: None,
            next_refresh: Instant::now(),
        }
    }

    /// An episode started now; the caller has just given the sandbox a full lease.
    pub fn episode_started(&mut self, now: Instant) {
        self.deadline = Some(now + self.lifetime);
        self.next_refresh = now + REFRESH_INTERVAL;
    }

    pub fn episode_ended(&mut self) {
        self.deadline = None;
    }

    /// The timeout (seconds) to set for a keepalive seen at `now`, if one is due.
    pub fn due(&self, now: Instant) -> Option<u64> {
        let deadline = self.deadline?;
        if now < self.next_refresh || now >= deadline {
            return None;
        }
        let left = (deadline - now).as_secs_f64().ceil().max(1.0) as u64;
        Some(self.lease.as_secs().min(left))
    }

    /// Records a successful renewal. A failed one is not recorded, so the next keepalive
    /// (30 s later) tries again.
    pub fn renewed(&mut self, now: Instant) {
        self.next_refresh = now + REFRESH_INTERVAL;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Simulates keepalives every 30 s for `span` and returns the renewals made.
    fn simulate(lease: u64, lifetime: u64, span: u64, fail_first: usize) -> Vec<u64> {
        let t0 = Instant::now();
        let mut r = LeaseRenewal::new(secs(lease), secs(lifetime));
        r.episode_started(t0);
        let mut out = Vec::new();
        let mut failures = fail_first;
        let mut t = 30;
        while t <= span {
            let now = t0 + secs(t);
            if let Some(v) = r.due(now) {
                if failures > 0 {
                    failures -= 1;
                } else {
                    out.push(v);
                    r.renewed(now);
                }
            }
            t += 30;
        }
        out
    }

    #[test]
    fn no_renewal_before_the_interval_and_throttled_after() {
        assert_eq!(simulate(900, 3600, 299, 0), Vec::<u64>::new());
        assert_eq!(simulate(900, 3600, 330, 0), vec![900]);
    }

    #[test]
    fn last_lease_is_shortened_to_the_cap() {
        assert_eq!(simulate(900, 600, 3600, 0), vec![300]);
        assert_eq!(simulate(12900, 12900, 330, 0), vec![12600]);
        // Over a whole lifetime every renewal ends at or before the cap, the last exactly on it.
        let renewals = simulate(900, 3600, 7200, 0);
        let ends: Vec<u64> = renewals
            .iter()
            .enumerate()
            .map(|(i, v)| 300 * (i as u64 + 1) + v)
            .collect();
        assert!(ends.iter().all(|&e| e <= 3600), "{renewals:?}");
        assert_eq!(ends.last(), Some(&3600), "{renewals:?}");
    }

    #[test]
    fn failed_renewal_is_retried_on_the_next_keepalive() {
        assert_eq!(simulate(900, 3600, 330, 1), vec![900]);
    }

    #[test]
    fn nothing_renews_between_episodes() {
        let t0 = Instant::now();
        let mut r = LeaseRenewal::new(secs(900), secs(3600));
        r.episode_started(t0);
        r.episode_ended();
        assert_eq!(r.due(t0 + secs(600)), None);
    }
}
