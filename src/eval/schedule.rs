//! Which attempts a run makes: `--attempts K` of every selected task, less those an earlier
//! run already finished (`--resume`), in file order with a task's attempts side by side.

use std::collections::{BTreeSet, HashMap};

use crate::task::{TaskEntry, TaskList};

/// Most attempts of one task a run may ask for: pass@k past this tells nothing more, and
/// every attempt is a sandbox and an episode.
pub const MAX_ATTEMPTS: u32 = 100;

/// The attempt a record written before attempts existed (no `attempt` field) stands for.
pub const FIRST_ATTEMPT: u32 = 1;

/// Attempt numbers (1-based) already finished, by task id.
pub type FinishedAttempts = HashMap<String, BTreeSet<u32>>;

/// How many attempts each task gets, and which of them are already finished.
#[derive(Debug, Clone)]
pub struct AttemptPlan {
    per_task: u32,
    finished: FinishedAttempts,
}

/// One attempt to run: the task's place in the tasks file and the attempt's number.
#[derive(Debug, Clone, Copy)]
pub struct Work<'a> {
    pub entry: &'a TaskEntry,
    pub attempt: u32,
}

impl Default for AttemptPlan {
    /// One attempt of each task, none finished: a run as it was before `--attempts`.
    fn default() -> Self {
        AttemptPlan::new(FIRST_ATTEMPT, FinishedAttempts::new())
    }
}

impl AttemptPlan {
    /// `per_task` is clamped to 1..=[`MAX_ATTEMPTS`] (the command line checks it first).
    pub fn new(per_task: u32, finished: FinishedAttempts) -> AttemptPlan {
        AttemptPlan {
            per_task: per_task.clamp(1, MAX_ATTEMPTS),
            finished,
        }
    }

    /// K: the attempts each task gets.
    pub fn per_task(&self) -> u32 {
        self.per_task
    }

    fn is_finished(&self, id: &str, attempt: u32) -> bool {
        self.finished.get(id).is_some_and(|a| a.contains(&attempt))
    }

    /// The attempts of `id` still to run, in order.
    pub fn missing<'a>(&'a self, id: &'a str) -> impl Iterator<Item = u32> + 'a {
        (1..=self.per_task).filter(move |&a| !self.is_finished(id, a))
    }

    /// Attempts of `id` within K already finished (attempts past K, from a run with more,
    /// are not this run's to count).
    pub fn finished_count(&self, id: &str) -> usize {
        self.finished
            .get(id)
            .map_or(0, |a| a.range(1..=self.per_task).count())
    }

    /// How many attempts of `tasks` are still to run.
    pub fn pending(&self, tasks: &TaskList) -> usize {
        tasks
            .entries()
            .iter()
            .map(|e| self.missing(&e.id).count())
            .sum()
    }

    /// Slot `i` of the run, task by task in the list's order with a task's K attempts side
    /// by side: `None` past the last, `Some(None)` for an attempt already finished. Workers
    /// count through the slots, so the schedule is never held whole (K times a tasks file
    /// of any size).
    pub fn slot<'a>(&self, tasks: &'a TaskList, i: usize) -> Option<Option<Work<'a>>> {
        let k = self.per_task as usize;
        let entry = tasks.entries().get(i / k)?;
        // `i % k` < K <= MAX_ATTEMPTS, so it fits.
        let attempt = (i % k) as u32 + 1;
        Some((!self.is_finished(&entry.id, attempt)).then_some(Work { entry, attempt }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(pairs: &[(&str, &[u32])]) -> FinishedAttempts {
        pairs
            .iter()
            .map(|(id, a)| (id.to_string(), a.iter().copied().collect()))
            .collect()
    }

    #[test]
    fn only_the_missing_attempts_within_k_run() {
        let plan = AttemptPlan::new(3, finished(&[("a", &[1, 3, 7]), ("b", &[1, 2, 3])]));
        assert_eq!(plan.missing("a").collect::<Vec<_>>(), [2]);
        assert!(plan.missing("b").next().is_none());
        assert_eq!(plan.missing("new").collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(plan.finished_count("a"), 2);
        assert_eq!(plan.finished_count("b"), 3);
    }

    #[test]
    fn slots_go_task_by_task_and_skip_what_is_finished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tasks.jsonl");
        let line = |id: &str| format!(r#"{{"id": "{id}", "instruction": "x"}}"#);
        std::fs::write(&path, [line("a"), line("b")].join("\n") + "\n").unwrap();
        let tasks = TaskList::index_where(&path, |_| true).unwrap();
        let plan = AttemptPlan::new(2, finished(&[("a", &[2])]));
        let slots: Vec<Option<(String, u32)>> = (0..)
            .map_while(|i| plan.slot(&tasks, i))
            .map(|w| w.map(|w| (w.entry.id.clone(), w.attempt)))
            .collect();
        let some = |id: &str, a| Some((id.to_string(), a));
        assert_eq!(slots, [some("a", 1), None, some("b", 1), some("b", 2)]);
        assert_eq!(plan.pending(&tasks), 3);
    }

    #[test]
    fn k_is_bounded() {
        assert_eq!(AttemptPlan::new(0, FinishedAttempts::new()).per_task(), 1);
        let huge = AttemptPlan::new(u32::MAX, FinishedAttempts::new());
        assert_eq!(huge.per_task(), MAX_ATTEMPTS);
    }
}
