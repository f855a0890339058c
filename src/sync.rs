//! Locks that outlive a panicking holder.

use std::sync::{Mutex, MutexGuard, PoisonError};

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
