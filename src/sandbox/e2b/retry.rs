//! The one retry schedule: fixed delays between attempts, driven by one loop.

use std::time::Duration;

/// Waits between a create's capacity retries: 4 attempts in all.
pub const CREATE_RETRY_DELAYS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(3),
    Duration::from_secs(9),
];
/// Waits between kill attempts: 3 attempts in all.
pub const KILL_RETRY_DELAYS: [Duration; 2] =
    [Duration::from_millis(100), Duration::from_millis(500)];

/// The delays before the second, third, ... attempt of one operation. The first attempt runs at
/// once, so an operation makes one attempt more than there are delays.
#[derive(Debug, Clone)]
pub struct Backoff {
    delays: Vec<Duration>,
    next: usize,
}

impl Backoff {
    pub fn fixed(delays: &[Duration]) -> Backoff {
        Backoff {
            delays: delays.to_vec(),
            next: 0,
        }
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.delays.get(self.next).copied();
        self.next += 1;
        d
    }
}

/// Runs `attempt` until it succeeds, fails with an error `retryable` refuses, or the schedule
/// runs out; the last error is returned. `on_retry` hears of each retry before its wait.
pub fn with_retries<T, E>(
    schedule: Backoff,
    sleep: &dyn Fn(Duration),
    mut attempt: impl FnMut() -> Result<T, E>,
    retryable: impl Fn(&E) -> bool,
    mut on_retry: impl FnMut(&E, Duration),
) -> Result<T, E> {
    let mut schedule = schedule;
    loop {
        let err = match attempt() {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if !retryable(&err) {
            return Err(err);
        }
        let Some(delay) = schedule.next() else {
            return Err(err);
        };
        on_retry(&err, delay);
        sleep(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn the_schedule_yields_its_delays_then_stops() {
        let got: Vec<_> = Backoff::fixed(&CREATE_RETRY_DELAYS).collect();
        assert_eq!(got, CREATE_RETRY_DELAYS);
        assert_eq!(Backoff::fixed(&[]).next(), None);
    }

    #[test]
    fn retryable_errors_use_every_attempt_and_sleep_between() {
        let slept = RefCell::new(Vec::new());
        let mut calls = 0;
        let mut retries = 0;
        let out: Result<(), u32> = with_retries(
            Backoff::fixed(&CREATE_RETRY_DELAYS),
            &|d| slept.borrow_mut().push(d),
            || {
                calls += 1;
                Err(calls)
            },
            |_| true,
            |_, _| retries += 1,
        );
        assert_eq!(out, Err(4), "the last error is returned");
        assert_eq!(calls, 4);
        assert_eq!(retries, 3);
        assert_eq!(*slept.borrow(), CREATE_RETRY_DELAYS);
    }

    #[test]
    fn a_fatal_error_stops_at_once() {
        let mut calls = 0;
        let out: Result<(), &str> = with_retries(
            Backoff::fixed(&KILL_RETRY_DELAYS),
            &|_| panic!("no sleep before a fatal error"),
            || {
                calls += 1;
                Err("fatal")
            },
            |_| false,
            |_, _| {},
        );
        assert_eq!(out, Err("fatal"));
        assert_eq!(calls, 1);
    }

    #[test]
    fn success_after_a_retry_is_returned() {
        let mut calls = 0;
        let out: Result<u32, ()> = with_retries(
            Backoff::fixed(&KILL_RETRY_DELAYS),
            &|_| {},
            || {
                calls += 1;
                if calls < 2 {
                    Err(())
                } else {
                    Ok(calls)
                }
            },
            |_| true,
            |_, _| {},
        );
        assert_eq!(out, Ok(2));
    }
}
