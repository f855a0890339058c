//! What a create must pass before it reaches E2B: a process-wide rate gate (E2B allows about
//! 5 creates/s per team; we default to 4) and a cap on live sandboxes. Both wait a bounded
//! time and then refuse with a typed error instead of queueing without end.

use crate::sync::lock;
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// Why a create was refused before any request was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CreateRejected {
    #[error(
        "sandbox create could not be admitted within {max_wait:?} ({queued:?} of creates are \
         queued ahead); reduce concurrent sandbox creation or raise the create rate"
    )]
    RateWait {
        max_wait: Duration,
        queued: Duration,
    },
    #[error("all {max} sandbox slots stayed in use for {waited:?}")]
    NoSlot { max: usize, waited: Duration },
}

/// Time as the gate sees it, so tests can run it without sleeping.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
    fn sleep(&self, d: Duration);
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// Admits creates at most once per `interval`, in arrival order.
pub struct CreateGate {
    interval: Duration,
    max_wait: Duration,
    /// When the next create may go; `None` before the first.
    next: Mutex<Option<Instant>>,
}

impl CreateGate {
    pub fn new(interval: Duration, max_wait: Duration) -> CreateGate {
        CreateGate {
            interval,
            max_wait,
            next: Mutex::new(None),
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Reserves the next admission and sleeps until it; returns how long it waited. When the
    /// reservation would lie more than `max_wait` ahead it fails at once, reserving nothing.
    /// The lock is held only to reserve, never while sleeping.
    pub fn admit(&self, clock: &dyn Clock) -> Result<Duration, CreateRejected> {
        let now = clock.now();
        let target = {
            let mut next = lock(&self.next);
            let target = next.filter(|&n| n > now).unwrap_or(now);
            let queued = target - now;
            if queued > self.max_wait {
                return Err(CreateRejected::RateWait {
                    max_wait: self.max_wait,
                    queued,
                });
            }
            *next = Some(target + self.interval);
            target
        };
        let wait = target - now;
        if !wait.is_zero() {
            clock.sleep(wait);
        }
        Ok(wait)
    }
}

/// The gate of each E2B account in use in this process, so that every backend on one account
/// shares one rate (E2B limits creates per team, not per client).
static SHARED_GATES: Mutex<Vec<(String, Weak<CreateGate>)>> = Mutex::new(Vec::new());

/// The process-wide gate of `account` (e.g. API base and key). The first backend of an account
/// sets its rate and bound; later ones share it as it is, until every user has dropped it.
pub fn shared_gate(account: &str, interval: Duration, max_wait: Duration) -> Arc<CreateGate> {
    let mut gates = lock(&SHARED_GATES);
    gates.retain(|(_, gate)| gate.strong_count() > 0);
    if let Some(gate) = gates
        .iter()
        .find(|(key, _)| key == account)
        .and_then(|(_, gate)| gate.upgrade())
    {
        return gate;
    }
    let gate = Arc::new(CreateGate::new(interval, max_wait));
    gates.push((account.to_string(), Arc::downgrade(&gate)));
    gate
}

/// A counting semaphore over live sandboxes.
pub struct Slots {
    max: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    pub fn new(max: usize) -> Slots {
        Slots {
            max,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn in_use(&self) -> usize {
        *lock(&self.used)
    }

    /// Takes a slot, waiting up to `wait` for one to be released.
    pub fn acquire(&self, wait: Duration) -> Result<Permit<'_>, CreateRejected> {
        let deadline = Instant::now() + wait;
        let mut used = lock(&self.used);
        while *used >= self.max {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CreateRejected::NoSlot {
                    max: self.max,
                    waited: wait,
                });
            }
            used = self
                .freed
                .wait_timeout(used, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *used += 1;
        Ok(Permit {
            slots: self,
            held: true,
        })
    }

    /// Gives back a slot a kept permit held.
    pub fn release(&self) {
        let mut used = lock(&self.used);
        *used = used.saturating_sub(1);
        self.freed.notify_one();
    }
}

/// A slot being used by a create; released on drop unless kept.
pub struct Permit<'a> {
    slots: &'a Slots,
    held: bool,
}

impl Permit<'_> {
    /// The create succeeded: the slot now belongs to the sandbox until it is killed.
    pub fn keep(mut self) {
        self.held = false;
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.held {
            self.slots.release();
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A clock that moves only when told to, and records the sleeps asked of it.
    pub struct FakeClock {
        start: Instant,
        offset: Mutex<Duration>,
        pub slept: Mutex<Vec<Duration>>,
        /// Whether a sleep moves the clock forward.
        advance_on_sleep: bool,
    }

    impl FakeClock {
        pub fn new(advance_on_sleep: bool) -> FakeClock {
            FakeClock {
                start: Instant::now(),
                offset: Mutex::new(Duration::ZERO),
                slept: Mutex::new(Vec::new()),
                advance_on_sleep,
            }
        }

        pub fn advance(&self, d: Duration) {
            *lock(&self.offset) += d;
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            self.start + *lock(&self.offset)
        }

        fn sleep(&self, d: Duration) {
            lock(&self.slept).push(d);
            if self.advance_on_sleep {
                self.advance(d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::FakeClock;
    use super::*;
    use std::sync::Arc;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn creates_are_spaced_by_the_interval() {
        let clock = FakeClock::new(true);
        let gate = CreateGate::new(250 * MS, Duration::from_secs(60));
        assert_eq!(gate.admit(&clock), Ok(Duration::ZERO));
        assert_eq!(gate.admit(&clock), Ok(250 * MS));
        assert_eq!(gate.admit(&clock), Ok(250 * MS));
        // A quiet spell resets the gate: nobody waits for admissions nobody used.
        clock.advance(Duration::from_secs(5));
        assert_eq!(gate.admit(&clock), Ok(Duration::ZERO));
    }

    #[test]
    fn a_queue_longer_than_the_bound_fails_at_once() {
        // Concurrent callers all arrive at the same instant.
        let clock = FakeClock::new(false);
        let gate = CreateGate::new(250 * MS, Duration::from_secs(1));
        let waits: Vec<_> = (0..5).map(|_| gate.admit(&clock).unwrap()).collect();
        assert_eq!(waits, [0, 250, 500, 750, 1000].map(|ms| ms * MS));
        let err = gate.admit(&clock).unwrap_err();
        assert_eq!(
            err,
            CreateRejected::RateWait {
                max_wait: Duration::from_secs(1),
                queued: 1250 * MS
            }
        );
        assert!(err.to_string().contains("could not be admitted"));
        // The refusal reserved nothing: the next caller a tick later sees the same queue.
        clock.advance(250 * MS);
        assert_eq!(gate.admit(&clock), Ok(1000 * MS));
    }

    #[test]
    fn backends_of_one_account_share_a_gate() {
        let a = shared_gate("test-account-a", 250 * MS, Duration::from_secs(60));
        let again = shared_gate("test-account-a", 10 * MS, Duration::ZERO);
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!(again.interval(), 250 * MS, "the first settings stay");
        let other = shared_gate("test-account-b", 10 * MS, Duration::ZERO);
        assert!(!Arc::ptr_eq(&a, &other));
        drop((a, again));
        let fresh = shared_gate("test-account-a", 10 * MS, Duration::ZERO);
        assert_eq!(
            fresh.interval(),
            10 * MS,
            "a gate nobody holds is not reused"
        );
    }

    #[test]
    fn slots_cap_live_sandboxes_and_wait_a_bounded_time() {
        let slots = Slots::new(2);
        let a = slots.acquire(Duration::ZERO).unwrap();
        slots.acquire(Duration::ZERO).unwrap().keep();
        assert_eq!(slots.in_use(), 2);
        let err = slots.acquire(20 * MS).err().unwrap();
        assert_eq!(
            err,
            CreateRejected::NoSlot {
                max: 2,
                waited: 20 * MS
            }
        );
        drop(a);
        assert_eq!(slots.in_use(), 1, "a dropped permit is released");
        slots.acquire(Duration::ZERO).unwrap().keep();
        slots.release();
        slots.release();
        assert_eq!(slots.in_use(), 0);
    }

    #[test]
    fn a_release_wakes_a_waiting_create() {
        let slots = Arc::new(Slots::new(1));
        slots.acquire(Duration::ZERO).unwrap().keep();
        let releaser = {
            let slots = Arc::clone(&slots);
            std::thread::spawn(move || {
                std::thread::sleep(20 * MS);
                slots.release();
            })
        };
        let permit = slots.acquire(Duration::from_secs(10));
        assert!(permit.is_ok());
        releaser.join().unwrap();
    }
}
