//! What reading a run found that does not add up: told to the user, never fatal.

use serde::{Deserialize, Serialize};

/// One finding; `kind` names it in JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Note {
    /// The results file's last line has no newline and is no record: a crash mid-write.
    /// Its task counts as not run.
    TornLastLine { file: String, line: usize },
    /// A results line that is no record (not JSON, no `id`, or over the line limit).
    UnreadableLine {
        file: String,
        line: usize,
        why: String,
    },
    /// A task with a result but no transcript.
    NoTranscript { id: String, shard: String },
    /// A transcript with no result: the task started but its record was never written.
    OrphanTranscript { id: String, shard: String },
    /// One id in several shards; the first shard's record is the one counted.
    DuplicateId { id: String, shards: Vec<String> },
    /// Tasks of the tasks file no shard has a result for (the first 50 named).
    MissingTasks {
        count: usize,
        ids: Vec<String>,
        tasks_file: String,
    },
    /// Shards made by different builds, runners, harnesses, models or tasks files: their
    /// scores do not add up to one run's.
    ProvenanceMismatch {
        field: String,
        values: Vec<ShardValue>,
    },
    /// A `shard-I-of-N` directory the others imply is absent.
    MissingShard { dir: String },
    /// A shard directory without `summary.json` (its eval did not finish).
    NoSummary { shard: String },
    /// `summary.json` is there but is not JSON.
    UnreadableSummary { shard: String, why: String },
    /// A transcript that could not become a trajectory.
    NoTrajectory { id: String, why: String },
}

/// A provenance field's value in one shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardValue {
    pub shard: String,
    pub value: String,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Note::TornLastLine { file, line } => write!(
                f,
                "{file}:{line}: torn last line (a crash mid-write); its task counts as not run"
            ),
            Note::UnreadableLine { file, line, why } => {
                write!(f, "{file}:{line}: not a record ({why}); skipped")
            }
            Note::NoTranscript { id, shard } => write!(f, "{shard}: task {id:?} has no transcript"),
            Note::OrphanTranscript { id, shard } => write!(
                f,
                "{shard}: transcript {id:?} has no result (the task never finished)"
            ),
            Note::DuplicateId { id, shards } => write!(
                f,
                "task {id:?} is in {} shards ({}); the first is counted",
                shards.len(),
                shards.join(", ")
            ),
            Note::MissingTasks {
                count,
                ids,
                tasks_file,
            } => {
                write!(
                    f,
                    "{count} task(s) of {tasks_file} have no result: {}",
                    ids.join(", ")
                )?;
                if *count > ids.len() {
                    write!(f, ", ...")?;
                }
                Ok(())
            }
            Note::ProvenanceMismatch { field, values } => {
                write!(f, "shards differ in provenance `{field}`:")?;
                for v in values {
                    write!(f, " {}={}", v.shard, v.value)?;
                }
                Ok(())
            }
            Note::MissingShard { dir } => write!(f, "{dir}: no such shard directory"),
            Note::NoSummary { shard } => {
                write!(f, "{shard}: no summary.json (its eval did not finish)")
            }
            Note::UnreadableSummary { shard, why } => {
                write!(f, "{shard}: summary.json is not JSON ({why})")
            }
            Note::NoTrajectory { id, why } => write!(f, "no trajectory for {id:?}: {why}"),
        }
    }
}
