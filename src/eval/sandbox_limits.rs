//! An episode under its sandbox's limits: watched while it runs, and stopped as soon as the
//! sandbox runs into one (a fork bomb, a memory hog, a disk filler), so the task ends with
//! the limit as its stop reason instead of running on in a sandbox that no longer works.

use std::time::Duration;

use crossbeam_channel::{bounded, RecvTimeoutError};

use crate::cancel::{CancelToken, POLL};
use crate::sandbox::{LimitHit, Sandbox};

/// How often the sandbox's limits are looked at while an episode runs: what a task may write
/// past its `disk_mb` is what it writes in about this long.
pub const LIMIT_POLL: Duration = Duration::from_secs(1);

/// Runs `episode` with a cancel token of its own, cancelled when `run` is or when `sandbox`
/// runs into a limit; returns its result and the limit hit, if any (looked at once more
/// when it returns).
pub(super) fn within_limits<T>(
    sandbox: &dyn Sandbox,
    run: &CancelToken,
    episode: impl FnOnce(&CancelToken) -> T,
) -> (T, Option<LimitHit>) {
    let token = CancelToken::new();
    let (done, finished) = bounded::<()>(0);
    let (result, watched) = std::thread::scope(|scope| {
        let token = &token;
        let watcher = scope.spawn(move || {
            let ticks_per_look = (LIMIT_POLL.as_millis() / POLL.as_millis()).max(1);
            let mut tick = 0u128;
            loop {
                match finished.recv_timeout(POLL) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return None,
                }
                if run.is_cancelled() {
                    token.cancel();
                }
                tick += 1;
                if tick % ticks_per_look == 0 {
                    if let Some(hit) = sandbox.limit_reached() {
                        token.cancel();
                        return Some(hit);
                    }
                }
            }
        });
        let result = episode(token);
        drop(done);
        (result, watcher.join().ok().flatten())
    });
    let hit = watched.or_else(|| sandbox.limit_reached());
    (result, hit)
}
