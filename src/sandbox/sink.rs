//! Where a background process's output goes: a sink the backend calls on the thread that
//! reads the output, so a consumer that only wants frames can cut them there (no thread of
//! its own, no hand-off per chunk), while [`EventSink`] keeps the plain stream of
//! [`ProcessEvent`]s that `spawn` and `connect` return.

use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, SendTimeoutError, Sender};

use super::ProcessEvent;

/// Events buffered per subscriber before the backend stops reading the process's output
/// (and the process, in turn, blocks on a full pipe): backpressure, never loss.
pub const EVENT_BUFFER: usize = 64;
/// How long one offer may wait for a slow consumer before the backend looks again whether a
/// newer subscriber replaced this one.
pub const OFFER_WAIT: Duration = Duration::from_millis(100);

/// What became of an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Handed on.
    Done,
    /// Kept: the consumer is slow. [`OutputSink::retry`] hands it on later.
    Waiting,
    /// The consumer is gone; nothing more is wanted.
    Gone,
}

/// The consumer of one background process's output, in order: chunks of stdout and stderr,
/// then `Exit` or `Failed`, then nothing.
pub trait OutputSink: Send {
    /// Takes `event`, waiting at most `within` for the consumer to make room.
    fn offer(&mut self, event: ProcessEvent, within: Duration) -> Delivery;
    /// Tries again to hand on what the last offer kept.
    fn retry(&mut self, within: Duration) -> Delivery;
}

/// Offers `event` until it is handed on or the consumer is gone. Each [`OFFER_WAIT`] of
/// waiting, `still_wanted` says whether to go on (false once a newer subscriber took over);
/// it is also the backend's chance to do its own work meanwhile. Whether the sink still
/// wants output.
pub fn deliver(
    sink: &mut dyn OutputSink,
    event: ProcessEvent,
    still_wanted: &mut dyn FnMut() -> bool,
) -> bool {
    let mut delivery = sink.offer(event, OFFER_WAIT);
    while delivery == Delivery::Waiting {
        if !still_wanted() {
            return false;
        }
        delivery = sink.retry(OFFER_WAIT);
    }
    delivery == Delivery::Done
}

/// The sending end of a bounded channel that keeps what the consumer had no room for and
/// hands it on at the next try: what a sink's `offer` and `retry` come down to.
pub struct Forward<T> {
    tx: Sender<T>,
    kept: Option<T>,
}

impl<T> Forward<T> {
    pub fn new(tx: Sender<T>) -> Forward<T> {
        Forward { tx, kept: None }
    }

    /// Sends `item` within `within`; kept when the consumer has no room.
    pub fn send(&mut self, item: T, within: Duration) -> Delivery {
        match self.tx.send_timeout(item, within) {
            Ok(()) => Delivery::Done,
            Err(SendTimeoutError::Timeout(back)) => {
                self.kept = Some(back);
                Delivery::Waiting
            }
            Err(SendTimeoutError::Disconnected(_)) => Delivery::Gone,
        }
    }

    /// Tries again to send what the last send kept.
    pub fn retry(&mut self, within: Duration) -> Delivery {
        match self.kept.take() {
            Some(item) => self.send(item, within),
            None => Delivery::Done,
        }
    }
}

/// A sink that forwards every event to a bounded channel.
pub struct EventSink(Forward<ProcessEvent>);

impl EventSink {
    /// A sink and the stream its events arrive on.
    pub fn new() -> (EventSink, Receiver<ProcessEvent>) {
        let (tx, rx) = bounded(EVENT_BUFFER);
        (EventSink(Forward::new(tx)), rx)
    }
}

impl OutputSink for EventSink {
    fn offer(&mut self, event: ProcessEvent, within: Duration) -> Delivery {
        self.0.send(event, within)
    }

    fn retry(&mut self, within: Duration) -> Delivery {
        self.0.retry(within)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_consumer_is_waited_for_and_a_replaced_one_is_given_up() {
        let (mut sink, rx) = EventSink::new();
        for _ in 0..EVENT_BUFFER {
            assert!(deliver(&mut sink, ProcessEvent::Exit(None), &mut || true));
        }
        // Full: the next delivery waits, asking each time whether it is still wanted.
        let mut asked = 0;
        let wanted = deliver(&mut sink, ProcessEvent::Exit(Some(1)), &mut || {
            asked += 1;
            asked < 3
        });
        assert!(!wanted);
        assert_eq!(asked, 3);
        // Room again: what waits goes through, in order.
        rx.recv().unwrap();
        assert!(deliver(&mut sink, ProcessEvent::Exit(Some(2)), &mut || {
            true
        }));
        assert_eq!(rx.len(), EVENT_BUFFER);
        drop(rx);
        assert!(!deliver(&mut sink, ProcessEvent::Exit(None), &mut || true));
    }
}
