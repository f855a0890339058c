//! What a run's threads share: cancellation, why the run stopped, and the one outlet for
//! what happens (the reporter's channel).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crossbeam_channel::Sender;

use super::EvalEvent;
use crate::cancel::CancelToken;
use crate::sync::lock;

pub struct RunControl {
    cancel: CancelToken,
    interrupted: AtomicBool,
    fatal: OnceLock<String>,
    /// Dropped when the run ends, which is how the reporter learns it has everything.
    events: Mutex<Option<Sender<EvalEvent>>>,
}

impl RunControl {
    pub fn new(events: Sender<EvalEvent>) -> RunControl {
        RunControl {
            cancel: CancelToken::new(),
            interrupted: AtomicBool::new(false),
            fatal: OnceLock::new(),
            events: Mutex::new(Some(events)),
        }
    }

    pub fn cancel_token(&self) -> &CancelToken {
        &self.cancel
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The user's first Ctrl-C: no task starts any more, running episodes are cancelled, and
    /// the reporter says so. What finished stays on disk.
    pub fn interrupt(&self) {
        if !self.interrupted.swap(true, Ordering::SeqCst) {
            self.cancel.cancel();
            self.emit(EvalEvent::Interrupted);
        }
    }

    pub fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
    }

    /// A hard spend cap was reached: running episodes are cancelled (their tasks end
    /// `cancelled`), and no task starts.
    pub fn cancel_running(&self) {
        self.cancel.cancel();
    }

    /// Stops the run for a reason that would fail every task the same way (the first reason
    /// given is the one kept).
    pub fn stop(&self, why: String) {
        let _ = self.fatal.set(why);
        self.cancel.cancel();
    }

    /// Records why the run failed without stopping it (a problem found after the last task).
    pub fn fail(&self, why: String) {
        let _ = self.fatal.set(why);
    }

    pub fn fatal(&self) -> Option<String> {
        self.fatal.get().cloned()
    }

    pub fn emit(&self, event: EvalEvent) {
        if let Some(tx) = lock(&self.events).as_ref() {
            // A reporter that is gone has nobody left to tell.
            let _ = tx.send(event);
        }
    }

    /// The last event has been sent: the reporter drains what is left and ends.
    pub fn close_events(&self) {
        lock(&self.events).take();
    }
}
