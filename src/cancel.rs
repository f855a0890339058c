//! A cancellation flag shared by a run's workers and polled at every bounded wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Cheap to clone; every clone sees the same flag.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

/// The longest a cancellable wait sleeps before looking at the flag again.
pub const POLL: Duration = Duration::from_millis(100);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
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
}
