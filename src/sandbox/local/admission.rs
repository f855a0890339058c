//! How many namespace holders start at once, machine-wide for this process.
//!
//! A holder's start is a burst of forks, execs, mounts and a `pivot_root`, which takes a
//! kernel lock every other start and exit on the machine waits for. Unbounded, `-j` workers
//! that all start at once make every start slower than its deadline on a busy host, and
//! each failure is retried into more load. Bounded to the CPUs this process may use, starts
//! queue instead: each is quick, and none fails for want of CPU.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use crate::sync::lock;

/// Starts in flight at once; 0 until set, which means "the CPUs this process may use".
static LIMIT: AtomicUsize = AtomicUsize::new(0);
static GATE: Gate = Gate {
    in_flight: Mutex::new(0),
    freed: Condvar::new(),
};

/// Sets how many holder starts may be in flight at once (`--create-concurrency`); `None`
/// leaves it at the CPUs this process may use (cgroup quotas counted).
pub fn set_create_concurrency(n: Option<usize>) {
    LIMIT.store(n.unwrap_or(0), Ordering::SeqCst);
}

/// The bound in force.
pub fn create_concurrency() -> usize {
    match LIMIT.load(Ordering::SeqCst) {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    }
}

struct Gate {
    in_flight: Mutex<usize>,
    freed: Condvar,
}

/// A place among the starts in flight, given back when dropped.
pub(super) struct Pass(());

/// Waits for a place among the starts in flight. The wait is bounded by theirs: each start
/// ends, in success or failure, within its own deadline.
pub(super) fn admit() -> Pass {
    let limit = create_concurrency().max(1);
    let mut in_flight = lock(&GATE.in_flight);
    while *in_flight >= limit {
        in_flight = GATE
            .freed
            .wait(in_flight)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
    *in_flight += 1;
    Pass(())
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut in_flight = lock(&GATE.in_flight);
        *in_flight = in_flight.saturating_sub(1);
        GATE.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn no_more_than_the_bound_are_in_flight_and_every_one_gets_through() {
        set_create_concurrency(Some(3));
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..24)
            .map(|_| {
                let (now, most) = (now.clone(), most.clone());
                std::thread::spawn(move || {
                    let _pass = admit();
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 3);
        assert_eq!(*lock(&GATE.in_flight), 0);
        set_create_concurrency(None);
        assert!(create_concurrency() >= 1);
    }
}
