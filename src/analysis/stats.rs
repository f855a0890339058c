//! The figures of a run: pass rate with its 95% Wilson interval, counts by status and stop
//! reason, tokens, sandbox-seconds, cost, time percentiles, and the failing tasks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::load::{first_attempt, is_first_attempt, Record};
use super::merge::Run;
use super::pass_at_k::{pass_at_k, PassAtK};
use crate::episode::TokenMeter;

/// z for a two-sided 95% interval.
const Z95: f64 = 1.959_963_984_540_054;
/// Verify output lines shown for a failing task.
pub const TAIL_LINES: usize = 5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Tasks with a result.
    pub tasks: usize,
    /// Tasks with a verdict (passed, failed, or an error of the task's own: not cancelled,
    /// skipped, or unserved by the model API): the pass rate's denominator.
    pub judged: usize,
    pub passed: usize,
    pub pass_rate: Option<f64>,
    /// 95% Wilson score interval of the pass rate.
    pub pass_rate_ci95: Option<[f64; 2]>,
    pub by_status: BTreeMap<String, usize>,
    pub by_stop_reason: BTreeMap<String, usize>,
    pub tokens: TokenMeter,
    /// Seconds tasks held sandboxes (their records' `sandbox.seconds`).
    pub sandbox_seconds: f64,
    /// Seconds the runs' sandboxes lived, idle ones included (`summary.json`), when known.
    pub run_sandbox_seconds: Option<f64>,
    /// Dollars, summed over the records that have a cost.
    pub cost_usd: Option<f64>,
    pub costed_tasks: usize,
    /// Tasks that took more than one attempt (transport failures replayed).
    pub retried_tasks: usize,
    /// The longest shard's wall-clock seconds (`summary.json`), when known.
    pub wall_seconds: Option<f64>,
    /// Per task, sandbox request to verdict (acquire + episode + verify).
    pub task_seconds: Option<Percentiles>,
    pub episode_seconds: Option<Percentiles>,
    /// pass@1 … pass@K, for a run of several attempts per task (`tasks` and the figures
    /// above then count attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_at_k: Option<PassAtK>,
}

/// Nearest-rank percentiles.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// A task that did not pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub id: String,
    /// Which attempt (left out for the first, as before attempts existed).
    #[serde(default = "first_attempt", skip_serializing_if = "is_first_attempt")]
    pub attempt: u32,
    pub status: String,
    pub stop_reason: String,
    pub shard: String,
    pub error: Option<String>,
    pub verify_exit_code: Option<i32>,
    pub verify_timed_out: bool,
    /// The last lines of the verify output.
    pub verify_tail: Vec<String>,
}

/// The 95% Wilson score interval of `passed` out of `n`.
pub fn wilson(passed: usize, n: usize) -> Option<[f64; 2]> {
    if n == 0 {
        return None;
    }
    let n = n as f64;
    let p = passed as f64 / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    Some([(center - half).max(0.0), (center + half).min(1.0)])
}

/// Nearest-rank percentiles of `values` (none when empty).
pub fn percentiles(mut values: Vec<f64>) -> Option<Percentiles> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = |q: f64| {
        let k = (q * values.len() as f64).ceil() as usize;
        values[k.clamp(1, values.len()) - 1]
    };
    Some(Percentiles {
        p50: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        max: values[values.len() - 1],
    })
}

pub fn summarize(run: &Run) -> Summary {
    let records = &run.records;
    let judged = records.iter().filter(|r| r.judged()).count();
    let passed = records.iter().filter(|r| r.passed()).count();
    let mut by_status = BTreeMap::new();
    let mut by_stop_reason = BTreeMap::new();
    let mut tokens = TokenMeter::default();
    let mut cost = None::<f64>;
    let mut costed = 0;
    for r in records {
        *by_status.entry(r.status.clone()).or_insert(0) += 1;
        *by_stop_reason.entry(r.stop_reason.clone()).or_insert(0) += 1;
        tokens += r.tokens;
        if let Some(c) = &r.cost {
            *cost.get_or_insert(0.0) += c.usd;
            costed += 1;
        }
    }
    let summary_f64 = |f: &dyn Fn(&Value) -> Option<f64>| -> Vec<f64> {
        run.shards
            .iter()
            .filter_map(|s| s.summary.as_ref().and_then(f))
            .collect()
    };
    let walls = summary_f64(&|s| s["wall_seconds"].as_f64());
    let pools = summary_f64(&|s| s["sandboxes"]["seconds"].as_f64());
    Summary {
        tasks: records.len(),
        judged,
        passed,
        pass_rate: (judged > 0).then(|| passed as f64 / judged as f64),
        pass_rate_ci95: wilson(passed, judged),
        by_status,
        by_stop_reason,
        tokens,
        sandbox_seconds: records.iter().map(|r| r.sandbox.seconds).sum(),
        run_sandbox_seconds: (!pools.is_empty()).then(|| pools.iter().sum()),
        cost_usd: cost,
        costed_tasks: costed,
        retried_tasks: records.iter().filter(|r| r.attempts > 1).count(),
        wall_seconds: walls.into_iter().reduce(f64::max),
        task_seconds: percentiles(records.iter().map(Record::task_seconds).collect()),
        episode_seconds: percentiles(records.iter().map(|r| r.timings.episode).collect()),
        pass_at_k: pass_at_k(records),
    }
}

/// Every task that did not pass, in record order.
pub fn failures(run: &Run) -> Vec<Failure> {
    run.records
        .iter()
        .zip(&run.shard_of)
        .filter(|(r, _)| !r.passed())
        .map(|(r, &s)| Failure {
            id: r.id.clone(),
            attempt: r.attempt,
            status: r.status.clone(),
            stop_reason: r.stop_reason.clone(),
            shard: run.shards[s].label.clone(),
            error: r.error.clone(),
            verify_exit_code: r.verify.as_ref().and_then(|v| v.exit_code),
            verify_timed_out: r.verify.as_ref().is_some_and(|v| v.timed_out),
            verify_tail: r
                .verify
                .as_ref()
                .map(|v| last_lines(&v.output_tail, TAIL_LINES))
                .unwrap_or_default(),
        })
        .collect()
}

fn last_lines(text: &str, n: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_the_textbook_values() {
        // 8 of 10: the Wilson 95% interval is [0.4902, 0.9433].
        let [lo, hi] = wilson(8, 10).unwrap();
        assert!(
            (lo - 0.4902).abs() < 1e-4 && (hi - 0.9433).abs() < 1e-4,
            "{lo} {hi}"
        );
        let [lo, hi] = wilson(0, 5).unwrap();
        assert!(lo == 0.0 && (hi - 0.4345).abs() < 1e-4, "{lo} {hi}");
        assert_eq!(wilson(0, 0), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let p = percentiles((1..=100).map(f64::from).collect()).unwrap();
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        let p = percentiles(vec![3.0]).unwrap();
        assert_eq!((p.p50, p.p99), (3.0, 3.0));
        assert_eq!(percentiles(vec![]), None);
    }

    #[test]
    fn the_tail_is_the_last_non_blank_lines() {
        assert_eq!(last_lines("a\nb\n\nc\nd\ne\nf\n", 3), ["d", "e", "f"]);
        assert!(last_lines("", 3).is_empty());
    }
}
