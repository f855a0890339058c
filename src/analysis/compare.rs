//! A run against a baseline: the tasks whose verdict flipped, those only one side has, and
//! how the pass rate, tokens and time moved.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::load::Record;
use super::merge::Run;
use super::stats::Summary;
use crate::eval::schedule::FIRST_ATTEMPT;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The baseline's directories as given.
    pub baseline: Vec<String>,
    pub baseline_summary: Summary,
    /// Passed in the baseline, judged and not passed now.
    pub now_failing: Vec<Flip>,
    /// Judged and not passed in the baseline, passed now.
    pub now_passing: Vec<Flip>,
    /// Ids only this run has.
    pub new: Vec<String>,
    /// Ids only the baseline has.
    pub missing: Vec<String>,
    pub pass_rate: Delta,
    /// Input + output tokens.
    pub tokens: Delta,
    pub sandbox_seconds: Delta,
    /// Median per-task seconds.
    pub task_seconds_p50: Delta,
    pub wall_seconds: Delta,
    /// pass@1 … pass@k for k up to the smaller K of the two, when both made several
    /// attempts per task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_at_k: Vec<PassAtDelta>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PassAtDelta {
    pub k: u32,
    #[serde(flatten)]
    pub delta: Delta,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flip {
    pub id: String,
    /// Status and stop reason in the baseline, then now (`failed/max_turns`).
    pub before: String,
    pub after: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    pub baseline: Option<f64>,
    pub current: Option<f64>,
    pub change: Option<f64>,
}

impl Delta {
    fn of(baseline: Option<f64>, current: Option<f64>) -> Delta {
        let change = match (baseline, current) {
            (Some(b), Some(c)) => Some(c - b),
            _ => None,
        };
        Delta {
            baseline,
            current,
            change,
        }
    }
}

fn verdict(r: &Record) -> String {
    format!("{}/{}", r.status, r.stop_reason)
}

pub fn compare<'a>(
    current: &'a Run,
    now: &Summary,
    baseline: &'a Run,
    base: &Summary,
    baseline_dirs: Vec<String>,
) -> Comparison {
    // Verdicts flip between first attempts; pass@k compares all of them.
    let firsts = |run: &'a Run| -> BTreeMap<&'a str, &'a Record> {
        run.records
            .iter()
            .filter(|r| r.attempt == FIRST_ATTEMPT)
            .map(|r| (r.id.as_str(), r))
            .collect()
    };
    let before = firsts(baseline);
    let after = firsts(current);
    let mut now_failing = Vec::new();
    let mut now_passing = Vec::new();
    for (id, a) in &after {
        let Some(b) = before.get(id) else { continue };
        if !(a.judged() && b.judged()) || a.passed() == b.passed() {
            continue;
        }
        let flip = Flip {
            id: id.to_string(),
            before: verdict(b),
            after: verdict(a),
        };
        if a.passed() {
            now_passing.push(flip);
        } else {
            now_failing.push(flip);
        }
    }
    let only = |a: &BTreeMap<&str, &Record>, b: &BTreeMap<&str, &Record>| -> Vec<String> {
        a.keys()
            .filter(|id| !b.contains_key(*id))
            .map(|id| id.to_string())
            .collect()
    };
    let tokens = |s: &Summary| Some((s.tokens.input + s.tokens.output) as f64);
    Comparison {
        baseline: baseline_dirs,
        baseline_summary: base.clone(),
        now_failing,
        now_passing,
        new: only(&after, &before),
        missing: only(&before, &after),
        pass_rate: Delta::of(base.pass_rate, now.pass_rate),
        tokens: Delta::of(tokens(base), tokens(now)),
        sandbox_seconds: Delta::of(Some(base.sandbox_seconds), Some(now.sandbox_seconds)),
        task_seconds_p50: Delta::of(
            base.task_seconds.map(|p| p.p50),
            now.task_seconds.map(|p| p.p50),
        ),
        wall_seconds: Delta::of(base.wall_seconds, now.wall_seconds),
        pass_at_k: pass_at_deltas(base, now),
    }
}

/// pass@k of both runs for k up to the smaller K; none unless both have several attempts.
fn pass_at_deltas(base: &Summary, now: &Summary) -> Vec<PassAtDelta> {
    let (Some(b), Some(n)) = (&base.pass_at_k, &now.pass_at_k) else {
        return Vec::new();
    };
    (1..=b.k.min(n.k))
        .map(|k| PassAtDelta {
            k,
            delta: Delta::of(b.at(k), n.at(k)),
        })
        .collect()
}
