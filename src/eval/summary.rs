//! What a finished run adds up to: the tally of verdicts, the totals, the run's verdict.

use std::path::Path;

use serde::Serialize;

use super::provenance::Provenance;
use super::results::{Status, TaskRecord};
use super::spend::{Cap, Caps, Spend};
use crate::episode::TokenMeter;
use crate::pool::PoolUsage;

/// Tasks by status: counted once, here, for the progress line, the table and `summary.json`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
    pub errors: usize,
    pub cancelled: usize,
    /// Tasks a spend cap kept from starting (status `skipped`).
    pub over_budget: usize,
}

impl Tally {
    pub fn add(&mut self, status: Status) {
        match status {
            Status::Passed => self.passed += 1,
            Status::Failed => self.failed += 1,
            Status::Error => self.errors += 1,
            Status::Cancelled => self.cancelled += 1,
            Status::Skipped => self.over_budget += 1,
        }
    }

    pub fn done(&self) -> usize {
        self.passed + self.failed + self.errors + self.cancelled + self.over_budget
    }
}

/// Totals of a finished run (`summary.json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EvalSummary {
    /// Attempts this run was to make (tasks, with one attempt each).
    pub total: usize,
    /// Tasks with an attempt to make.
    pub tasks: usize,
    /// Attempts of each task (`--attempts`).
    pub attempts: u32,
    /// Attempts an earlier run finished (`--resume`).
    pub skipped: usize,
    #[serde(flatten)]
    pub tally: Tally,
    /// Tasks never started (Ctrl-C or a fatal problem stopped scheduling).
    pub not_run: usize,
    pub tokens: TokenMeter,
    pub transport_retries: u32,
    pub provider_retries: u32,
    pub sandboxes: PoolUsage,
    pub wall_seconds: f64,
    /// Kills the pool could not prove at close.
    pub cleanup_error: Option<String>,
    /// Why the run stopped early, when a problem made every task fail the same way (a
    /// runner that cannot start, a refused model key) or made going on pointless (results
    /// that cannot be written).
    pub fatal: Option<String>,
    /// The user interrupted the run (Ctrl-C).
    pub interrupted: bool,
    /// What the run spent, per dimension (`cost_usd` with prices only).
    pub spend: Spend,
    /// The caps it ran under.
    pub caps: Caps,
    /// The cap that kept tasks from starting (or, with `--max-cost-hard`, cancelled them).
    pub stopped_by: Option<Cap>,
    /// What produced the run's results.
    pub provenance: Option<Provenance>,
}

impl EvalSummary {
    pub fn add(&mut self, r: &TaskRecord) {
        self.tally.add(r.status);
        self.tokens += r.tokens;
        self.transport_retries += r.retries.transport;
        self.provider_retries += r.retries.provider;
    }

    /// What the run as a whole comes to: the worst thing that happened.
    pub fn verdict(&self) -> Verdict {
        if self.interrupted {
            Verdict::Interrupted
        } else if self.cleanup_error.is_some() || self.fatal.is_some() {
            Verdict::Infrastructure
        } else if self.stopped_by.is_some() {
            Verdict::BudgetStopped
        } else if self.tally.failed + self.tally.errors + self.tally.cancelled > 0 {
            Verdict::TasksFailed
        } else {
            Verdict::Passed
        }
    }

    /// Writes `summary.json` into `out_dir`.
    pub fn write(&self, out_dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::from)?;
        std::fs::write(out_dir.join("summary.json"), text + "\n")
    }
}

/// A run's end, from best to worst: the verdict is the worst that applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Every task passed.
    Passed,
    /// Some task failed, errored or was cancelled.
    TasksFailed,
    /// A spend cap stopped the run before every task ran.
    BudgetStopped,
    /// The run could not do its job: it stopped early, or left sandboxes it could not prove
    /// killed.
    Infrastructure,
    /// The user stopped it.
    Interrupted,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_is_the_worst_that_applies() {
        let mut s = EvalSummary::default();
        assert_eq!(s.verdict(), Verdict::Passed);
        s.tally.add(Status::Failed);
        assert_eq!(s.verdict(), Verdict::TasksFailed);
        s.stopped_by = Some(Cap::Tokens);
        assert_eq!(s.verdict(), Verdict::BudgetStopped);
        s.cleanup_error = Some("x".into());
        assert_eq!(s.verdict(), Verdict::Infrastructure);
        s.interrupted = true;
        assert_eq!(s.verdict(), Verdict::Interrupted);
        assert!(Verdict::Passed < Verdict::TasksFailed);
    }

    #[test]
    fn the_summary_keeps_its_flat_json_shape() {
        let mut s = EvalSummary::default();
        s.tally.add(Status::Passed);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["passed"], 1);
        assert_eq!(v["errors"], 0);
        assert!(v.get("tally").is_none());
    }
}
