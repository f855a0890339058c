//! Where a background process's output goes: to its current subscriber's sink, which a
//! later `connect` may replace while output is still flowing.

use std::sync::Mutex;

use crossbeam_channel::Receiver;

use crate::sandbox::sink::{self, EventSink, OutputSink};
use crate::sandbox::ProcessEvent;
use crate::sync::lock;

/// The output of one background process, for whoever subscribed last.
pub(super) struct Outlet {
    sub: Mutex<Subscriber>,
    /// Held for each delivery, so the final event (delivered under it) follows every chunk.
    turn: Mutex<()>,
}

struct Subscriber {
    /// `None` while a delivery has it, and once nobody listens.
    sink: Option<Box<dyn OutputSink>>,
    generation: u64,
    finished: bool,
}

impl Outlet {
    /// An outlet whose first subscriber is `sink`.
    pub fn new(sink: Box<dyn OutputSink>) -> Outlet {
        Outlet {
            sub: Mutex::new(Subscriber {
                sink: Some(sink),
                generation: 0,
                finished: false,
            }),
            turn: Mutex::new(()),
        }
    }

    /// A new stream; the previous subscriber is given up. `None` once the process finished.
    pub fn subscribe(&self) -> Option<Receiver<ProcessEvent>> {
        let mut sub = lock(&self.sub);
        if sub.finished {
            return None;
        }
        let (sink, events) = EventSink::new();
        sub.sink = Some(Box::new(sink));
        sub.generation += 1;
        Some(events)
    }

    /// Hands `event` to the subscriber, waiting while it is slow; `while_blocked` runs at
    /// each look during such a wait, so the one thread that watches the process can still
    /// reap it meanwhile.
    pub fn deliver(&self, event: ProcessEvent, while_blocked: &mut dyn FnMut()) {
        let _turn = lock(&self.turn);
        self.send(event, while_blocked);
    }

    /// Delivers the last event; everything after it is dropped.
    pub fn finish(&self, event: ProcessEvent) {
        let _turn = lock(&self.turn);
        self.send(event, &mut || {});
        let mut sub = lock(&self.sub);
        sub.finished = true;
        sub.sink = None;
    }

    fn send(&self, event: ProcessEvent, while_blocked: &mut dyn FnMut()) {
        // Out of the lock while it is used, so a `connect` meanwhile is not held up by a
        // slow consumer: it installs its own sink, and this one is then dropped.
        let (mut sink, generation) = {
            let mut sub = lock(&self.sub);
            match (sub.sink.take(), sub.finished) {
                (Some(sink), false) => (sink, sub.generation),
                // Nobody listens: drain the pipe anyway so the process never stalls.
                _ => return,
            }
        };
        let current = || lock(&self.sub).generation == generation;
        let wanted = sink::deliver(sink.as_mut(), event, &mut || {
            while_blocked();
            current()
        });
        let mut sub = lock(&self.sub);
        if wanted && sub.generation == generation {
            sub.sink = Some(sink);
        }
    }
}
