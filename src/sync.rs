//! Locks that outlive a panicking holder, and file locks waited for within a bound.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Between two tries of a file lock another process holds.
const FLOCK_POLL: Duration = Duration::from_millis(20);

/// Locks `m` even if a thread panicked while holding it: every lock here guards state that
/// stays consistent between statements, so the data is still good, and one panicked worker
/// must not take the whole run down with it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The value of a mutex no one else holds any more, even if a holder panicked (see [`lock`]).
pub fn into_inner<T>(m: Mutex<T>) -> T {
    m.into_inner().unwrap_or_else(PoisonError::into_inner)
}

/// An `flock` of `path` (made when missing; `how` is `LOCK_SH` or `LOCK_EX`), held while the
/// returned file is open; `None` when another holder kept it past `wait`.
pub fn flock_within(path: &Path, how: i32, wait: Duration) -> std::io::Result<Option<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let deadline = Instant::now() + wait;
    loop {
        // SAFETY: flock on a descriptor we own; the lock goes with it.
        if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } == 0 {
            return Ok(Some(file));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(err);
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(FLOCK_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_file_lock_is_waited_for_within_the_bound_and_free_once_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let held = flock_within(&path, libc::LOCK_EX, Duration::ZERO).unwrap();
        assert!(held.is_some());
        let started = Instant::now();
        let second = flock_within(&path, libc::LOCK_EX, Duration::from_millis(200)).unwrap();
        assert!(second.is_none());
        assert!(started.elapsed() >= Duration::from_millis(200));
        drop(held);
        assert!(flock_within(&path, libc::LOCK_EX, Duration::ZERO)
            .unwrap()
            .is_some());
    }
}
