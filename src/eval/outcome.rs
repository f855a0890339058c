//! What an attempt hands back, and what a task's attempts carry from one to the next: the
//! types the attempt loop, the workspace and the verdict share.

use super::results::TaskRecord;
use crate::episode::Counters;

/// What one attempt produced.
pub(super) enum Attempt {
    /// The task reached an end worth recording (any status).
    Done(Box<TaskRecord>),
    /// A transport failure a fresh sandbox may not have.
    Transport { reason: String, partial: Progress },
}

/// What a task's attempts have done so far, carried from one to the next.
#[derive(Default, Clone)]
pub(super) struct Progress {
    pub counters: Counters,
    /// Seconds spent getting a sandbox, and in episodes.
    pub acquire: f64,
    pub episode: f64,
}
