//! The [`Report`]: everything `wmo-e2b report` says about a run, as one value. The terminal
//! text, `--json`, and any other rendering (an HTML page) are made from it alone.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::compare::{compare, Comparison};
use super::health::{health, DatasetHealth};
use super::merge::{open_run, Run};
use super::stats::{failures, summarize, Failure, Summary};
use super::{AnalysisError, Note};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The directories given.
    pub runs: Vec<String>,
    /// The run directories read (shards included).
    pub shards: Vec<String>,
    pub summary: Summary,
    pub failures: Vec<Failure>,
    pub notes: Vec<Note>,
    /// With a baseline: what changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compare: Option<Comparison>,
    /// What reading the baseline found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline_notes: Vec<Note>,
    /// With a baseline, when one run is `--harness oracle`'s and the other `nop`'s: whether
    /// the dataset is sound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetHealth>,
}

/// The inputs of a report.
pub struct ReportInput<'a> {
    pub dirs: &'a [PathBuf],
    pub baseline: &'a [PathBuf],
    pub tasks: Option<&'a Path>,
}

/// Reads the run (and the baseline) and builds the report; also hands back the run, for
/// trajectories.
pub fn build(input: &ReportInput<'_>) -> Result<(Report, Run), AnalysisError> {
    let run = open_run(input.dirs, input.tasks)?;
    let summary = summarize(&run);
    let (compare, baseline_notes, dataset) = if input.baseline.is_empty() {
        (None, Vec::new(), None)
    } else {
        let base_run = open_run(input.baseline, input.tasks)?;
        let base = summarize(&base_run);
        let c = compare(&run, &summary, &base_run, &base, names(input.baseline));
        let dataset = health(&run, &base_run);
        (Some(c), base_run.notes, dataset)
    };
    let report = Report {
        runs: names(input.dirs),
        shards: run.shards.iter().map(|s| s.label.clone()).collect(),
        failures: failures(&run),
        summary,
        notes: run.notes.clone(),
        compare,
        baseline_notes,
        dataset,
    };
    Ok((report, run))
}

fn names(dirs: &[PathBuf]) -> Vec<String> {
    dirs.iter().map(|d| d.display().to_string()).collect()
}
