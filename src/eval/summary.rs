//! What a finished run adds up to: the tally of verdicts, the totals, the run's verdict.

use std::path::Path;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::provenance::Provenance;
use super::results::{self, ResultsError, Status, TaskRecord};
use super::spend::{Cap, Caps, Spend};
use crate::episode::TokenMeter;
use crate::pool::PoolUsage;

/// Tasks by status: counted once, here, for the progress line, the table and `summary.json`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
    /// Attempts of the whole run: those this invocation was to make and those it found
    /// finished (`already_finished`).
    pub total: usize,
    /// Tasks with an attempt to make.
    pub tasks: usize,
    /// Attempts of each task (`--attempts`).
    pub attempts: u32,
    /// Attempts an earlier invocation finished (`--resume`), which this one did not run.
    pub already_finished: usize,
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
    /// Each invocation of the run (`eval`, then each `--resume` into its directory), the
    /// last one this. The fields above describe the whole run: the tally, tokens and
    /// retries of every record in `results.jsonl` (the last one of each task's attempt), and
    /// the sums of the invocations' wall, sandboxes and spend; the stop, interruption and
    /// problems are the last invocation's.
    pub invocations: Vec<Invocation>,
}

/// One invocation of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Invocation {
    /// When it started (RFC 3339, UTC); empty for one recorded before invocations were.
    pub started: String,
    /// Attempts it was to make, and those it found finished by an earlier one (not run).
    pub total: usize,
    pub already_finished: usize,
    pub wall_seconds: f64,
    /// The attempts it ran to a record.
    #[serde(flatten)]
    pub tally: Tally,
    pub sandboxes: PoolUsage,
    pub spend: Spend,
    pub stopped_by: Option<Cap>,
    pub interrupted: bool,
    pub fatal: Option<String>,
}

/// The most earlier invocations kept (a run resumed more often keeps the first and the
/// latest ones; the sums count them all).
const MAX_INVOCATIONS: usize = 1000;

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

    /// Makes this invocation's summary the whole run's in `out_dir`: the earlier
    /// invocations from its `summary.json` (one written before invocations were counts as
    /// one), the verdicts from its `results.jsonl`.
    pub fn span_run(&mut self, out_dir: &Path, started: String) -> Result<(), ResultsError> {
        let mut invocations = earlier_invocations(&out_dir.join("summary.json"));
        invocations.push(Invocation {
            started,
            total: self.total,
            already_finished: self.already_finished,
            wall_seconds: self.wall_seconds,
            tally: self.tally,
            sandboxes: self.sandboxes.clone(),
            spend: self.spend,
            stopped_by: self.stopped_by,
            interrupted: self.interrupted,
            fatal: self.fatal.clone(),
        });
        let whole = WholeRun::read(&out_dir.join("results.jsonl"))?;
        self.total += self.already_finished;
        self.tally = whole.tally;
        self.tokens = whole.tokens;
        self.transport_retries = whole.transport_retries;
        self.provider_retries = whole.provider_retries;
        self.wall_seconds = invocations.iter().map(|i| i.wall_seconds).sum();
        self.sandboxes = invocations
            .iter()
            .fold(PoolUsage::default(), |a, i| add_usage(a, &i.sandboxes));
        self.spend = invocations
            .iter()
            .fold(Spend::default(), |a, i| add_spend(a, i.spend));
        if invocations.len() > MAX_INVOCATIONS {
            invocations.drain(1..invocations.len() - MAX_INVOCATIONS + 1);
        }
        self.invocations = invocations;
        Ok(())
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

/// The invocations an earlier `summary.json` records; one written before invocations were
/// is one itself (its fields have the same names); none when there is none or it is not
/// readable (what it said is then lost from the sums, not from the records).
fn earlier_invocations(path: &Path) -> Vec<Invocation> {
    let Some(text) = std::fs::read(path)
        .ok()
        .filter(|t| t.len() <= MAX_SUMMARY_BYTES)
    else {
        return Vec::new();
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    match value.get("invocations") {
        Some(list) => serde_json::from_value(list.clone()).unwrap_or_default(),
        None => serde_json::from_value(value)
            .map(|i| vec![i])
            .unwrap_or_default(),
    }
}

/// The largest `summary.json` read back (a thousand invocations are well under it).
const MAX_SUMMARY_BYTES: usize = 16 << 20;

fn add_usage(mut a: PoolUsage, b: &PoolUsage) -> PoolUsage {
    a.count += b.count;
    a.seconds += b.seconds;
    a.resets += b.resets;
    a.unclean += b.unclean;
    a.reset_seconds += b.reset_seconds;
    if a.unclean_reason.is_none() {
        a.unclean_reason = b.unclean_reason.clone();
    }
    a
}

fn add_spend(a: Spend, b: Spend) -> Spend {
    Spend {
        tokens: a.tokens + b.tokens,
        sandbox_seconds: a.sandbox_seconds + b.sandbox_seconds,
        cost_usd: match (a.cost_usd, b.cost_usd) {
            (Some(x), Some(y)) => Some(x + y),
            (x, y) => x.or(y),
        },
    }
}

/// What every record of a run's `results.jsonl` adds up to, the last record of each
/// task's attempt counting (a resume records again what it runs again).
#[derive(Default)]
struct WholeRun {
    tally: Tally,
    tokens: TokenMeter,
    transport_retries: u32,
    provider_retries: u32,
}

impl WholeRun {
    fn read(path: &Path) -> Result<WholeRun, ResultsError> {
        let mut last: HashMap<(String, u32), serde_json::Value> = HashMap::new();
        results::each_line(path, |line, overlong| {
            if overlong {
                return;
            }
            let Ok(record) = serde_json::from_slice::<serde_json::Value>(line) else {
                return;
            };
            let key = record["id"]
                .as_str()
                .zip(results::attempt_of(&record))
                .map(|(id, attempt)| (id.to_string(), attempt));
            if let Some(key) = key {
                last.insert(key, record);
            }
        })?;
        let mut whole = WholeRun::default();
        for record in last.values() {
            if let Some(status) = record["status"].as_str().and_then(Status::parse) {
                whole.tally.add(status);
            }
            if let Ok(tokens) = serde_json::from_value::<TokenMeter>(record["tokens"].clone()) {
                whole.tokens += tokens;
            }
            let retries = |kind: &str| {
                let n = record["retries"][kind].as_u64().unwrap_or(0);
                u32::try_from(n).unwrap_or(u32::MAX)
            };
            whole.transport_retries = whole.transport_retries.saturating_add(retries("transport"));
            whole.provider_retries = whole.provider_retries.saturating_add(retries("provider"));
        }
        Ok(whole)
    }
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

    #[test]
    fn an_earlier_summary_is_its_invocations_or_one_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        assert!(earlier_invocations(&path).is_empty());
        // Written before invocations were: the summary of one.
        std::fs::write(
            &path,
            r#"{"total": 3, "passed": 2, "failed": 1, "wall_seconds": 4.5,
                "sandboxes": {"count": 2, "seconds": 9.0}}"#,
        )
        .unwrap();
        let one = earlier_invocations(&path);
        assert_eq!(one.len(), 1);
        assert_eq!(
            (one[0].total, one[0].tally.passed, one[0].tally.failed),
            (3, 2, 1)
        );
        assert_eq!((one[0].wall_seconds, one[0].sandboxes.count), (4.5, 2));
        let summary = EvalSummary {
            invocations: vec![one[0].clone(), one[0].clone()],
            ..EvalSummary::default()
        };
        summary.write(dir.path()).unwrap();
        assert_eq!(earlier_invocations(&path).len(), 2);
        std::fs::write(&path, "not json").unwrap();
        assert!(earlier_invocations(&path).is_empty());
    }
}
