//! Where a background process's output goes: to its current subscriber, whom a later
//! `connect` may replace while output is still flowing.

use std::sync::Mutex;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, SendTimeoutError, Sender};

use crate::sandbox::ProcessEvent;
use crate::sync::lock;

/// Chunks buffered per subscriber before the reader blocks (backpressure, never loss).
const EVENT_BUFFER: usize = 64;
/// How often a delivery blocked on a slow subscriber checks whether `connect` replaced it.
const RETARGET_POLL: Duration = Duration::from_millis(100);

/// The events of one background process, for whoever subscribed last.
pub(super) struct Outlet {
    sub: Mutex<Subscriber>,
    /// Held for each delivery, so the final event (delivered under it) follows every chunk.
    turn: Mutex<()>,
}

struct Subscriber {
    tx: Option<Sender<ProcessEvent>>,
    generation: u64,
    finished: bool,
}

impl Outlet {
    /// An outlet and its first subscriber's stream.
    pub fn new() -> (Outlet, Receiver<ProcessEvent>) {
        let (tx, rx) = bounded(EVENT_BUFFER);
        let outlet = Outlet {
            sub: Mutex::new(Subscriber {
                tx: Some(tx),
                generation: 0,
                finished: false,
            }),
            turn: Mutex::new(()),
        };
        (outlet, rx)
    }

    /// A new stream; the previous subscriber's disconnects. `None` once the process finished.
    pub fn subscribe(&self) -> Option<Receiver<ProcessEvent>> {
        let mut sub = lock(&self.sub);
        if sub.finished {
            return None;
        }
        let (tx, rx) = bounded(EVENT_BUFFER);
        sub.tx = Some(tx);
        sub.generation += 1;
        Some(rx)
    }

    pub fn deliver(&self, event: ProcessEvent) {
        let _turn = lock(&self.turn);
        self.send(event);
    }

    /// Delivers the last event; everything after it is dropped.
    pub fn finish(&self, event: ProcessEvent) {
        let _turn = lock(&self.turn);
        self.send(event);
        let mut sub = lock(&self.sub);
        sub.finished = true;
        sub.tx = None;
    }

    fn send(&self, mut event: ProcessEvent) {
        loop {
            let (tx, generation) = {
                let sub = lock(&self.sub);
                match (&sub.tx, sub.finished) {
                    (Some(tx), false) => (tx.clone(), sub.generation),
                    // Nobody listens: drain the pipe anyway so the process never stalls.
                    _ => return,
                }
            };
            // A bounded send, re-checked, rather than a blocking one: a subscriber that was
            // abandoned but not dropped must not wedge delivery to the one `connect` made.
            match tx.send_timeout(event, RETARGET_POLL) {
                Ok(()) => return,
                Err(SendTimeoutError::Timeout(back)) => event = back,
                Err(SendTimeoutError::Disconnected(_)) => {
                    let mut sub = lock(&self.sub);
                    if sub.generation == generation {
                        sub.tx = None;
                    }
                    return;
                }
            }
        }
    }
}
