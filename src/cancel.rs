//! A cancellation flag shared by a run's workers and polled at every bounded wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Cheap to clone; every clone sees the same flag. A token made by [`CancelToken::until`]
/// also reads as cancelled once its deadline passes.
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    flag: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

/// The longest a cancellable wait sleeps before looking at the flag again.
pub const POLL: Duration = Duration::from_millis(100);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    /// A token that is cancelled when this one is and, besides, from `deadline` on: what
    /// bounds the calls an episode makes by the episode's own deadline, so that every wait
    /// polling it (a tool call's, a model call's retries) ends there. It shares this one's
    /// flag: cancelling it cancels this one too.
    pub fn until(&self, deadline: Instant) -> CancelToken {
        CancelToken {
            flag: self.flag.clone(),
            deadline: Some(self.deadline.map_or(deadline, |d| d.min(deadline))),
        }
    }

    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Sleeps for `d` unless cancelled first; returns false when cancelled.
    pub fn sleep(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        loop {
            if self.is_cancelled() {
                return false;
            }
            let now = Instant::now();
            if now >= end {
                return true;
            }
            std::thread::sleep((end - now).min(POLL));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancelled_sleep_returns_false() {
        let t = CancelToken::new();
        let t2 = t.clone();
        t2.cancel();
        assert!(!t.sleep(Duration::from_secs(10)));
        assert!(CancelToken::new().sleep(Duration::from_millis(1)));
    }

    #[test]
    fn a_token_until_a_deadline_is_cancelled_there_and_by_its_parent() {
        let parent = CancelToken::new();
        let past = parent.until(Instant::now());
        assert!(past.is_cancelled() && !past.sleep(Duration::from_secs(10)));
        assert!(!parent.is_cancelled(), "the deadline cancelled the parent");
        let later = parent.until(Instant::now() + Duration::from_secs(3600));
        assert!(!later.is_cancelled());
        parent.cancel();
        assert!(later.is_cancelled());
    }
}
