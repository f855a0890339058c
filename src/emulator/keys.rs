//! Idempotent creates: one `Idempotency-Key`, one sandbox. A create repeating a key whose
//! sandbox lives answers that sandbox; one that arrives while the first create with its key
//! is still running waits for it (bounded: past the bound it is answered 409, as the v2 API
//! documents) instead of making a second.

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// How often a waiting create looks at the emulator's stop signal.
const WAIT_SLICE: Duration = Duration::from_millis(100);

#[derive(Default)]
pub(super) struct Keys {
    state: Mutex<KeyState>,
    ended: Condvar,
}

#[derive(Default)]
struct KeyState {
    /// Key → the id of the sandbox the create with that key made.
    made: HashMap<String, String>,
    /// Keys whose create is running now.
    running: HashSet<String>,
}

/// What a create carrying a key is to do.
pub(super) enum Claim<'a> {
    /// Answer the sandbox this key made.
    Made(String),
    /// Create; the guard lets the next create with the key go once this one ends.
    First(KeyGuard<'a>),
    /// The first create with this key is still running after the wait (or the emulator is
    /// stopping): answer 409.
    Busy,
}

/// Held while a create with its key runs.
pub(super) struct KeyGuard<'a> {
    keys: &'a Keys,
    key: String,
}

impl KeyGuard<'_> {
    /// Records the sandbox this create made. `live` keeps only the keys whose sandbox lives
    /// (so the map stays bounded by the sandboxes alive).
    pub fn made(&self, id: &str, live: impl Fn(&str) -> bool) {
        let mut state = lock(&self.keys.state);
        state.made.retain(|_, id| live(id));
        state.made.insert(self.key.clone(), id.to_string());
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        lock(&self.keys.state).running.remove(&self.key);
        self.keys.ended.notify_all();
    }
}

impl Keys {
    /// Claims `key` for a create: the sandbox it made if `alive` says it lives, else the
    /// right to create, waiting at most `wait` (and only while `stopping` says no) for a
    /// running create with the same key to end.
    pub fn claim(
        &self,
        key: &str,
        alive: impl Fn(&str) -> bool,
        wait: Duration,
        stopping: impl Fn() -> bool,
    ) -> Claim<'_> {
        let deadline = Instant::now() + wait;
        let mut state = lock(&self.state);
        loop {
            if let Some(id) = state.made.get(key).cloned() {
                // Whether it lives asks the backend: not under the lock.
                drop(state);
                if alive(&id) {
                    return Claim::Made(id);
                }
                state = lock(&self.state);
                if state.made.get(key) == Some(&id) {
                    state.made.remove(key);
                }
                continue;
            }
            if state.running.insert(key.to_string()) {
                return Claim::First(KeyGuard {
                    keys: self,
                    key: key.to_string(),
                });
            }
            let now = Instant::now();
            if now >= deadline || stopping() {
                return Claim::Busy;
            }
            let slice = WAIT_SLICE.min(deadline - now);
            state = self
                .ended
                .wait_timeout(state, slice)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_created_once_and_then_answered() {
        let keys = Keys::default();
        let Claim::First(guard) = keys.claim("k", |_| true, Duration::ZERO, || false) else {
            panic!("the first claim creates");
        };
        assert!(matches!(
            keys.claim("k", |_| true, Duration::from_millis(20), || false),
            Claim::Busy
        ));
        guard.made("isb1", |_| true);
        drop(guard);
        assert!(matches!(
            keys.claim("k", |_| true, Duration::ZERO, || false),
            Claim::Made(id) if id == "isb1"
        ));
        // A dead sandbox's key creates afresh.
        assert!(matches!(
            keys.claim("k", |_| false, Duration::ZERO, || false),
            Claim::First(_)
        ));
    }

    #[test]
    fn a_waiting_claim_gets_what_the_running_create_made() {
        let keys = Keys::default();
        let Claim::First(guard) = keys.claim("k", |_| true, Duration::ZERO, || false) else {
            panic!("the first claim creates");
        };
        std::thread::scope(|s| {
            let waiter = s.spawn(|| keys.claim("k", |_| true, Duration::from_secs(10), || false));
            std::thread::sleep(Duration::from_millis(50));
            guard.made("isb1", |_| true);
            drop(guard);
            assert!(matches!(waiter.join().unwrap(), Claim::Made(id) if id == "isb1"));
        });
    }

    #[test]
    fn a_create_that_made_nothing_lets_the_next_one_try() {
        let keys = Keys::default();
        let first = keys.claim("k", |_| true, Duration::ZERO, || false);
        drop(first);
        assert!(matches!(
            keys.claim("k", |_| true, Duration::ZERO, || false),
            Claim::First(_)
        ));
    }
}
