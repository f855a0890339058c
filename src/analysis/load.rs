//! One directory an eval wrote (`--out`, or one `shard-I-of-N/` of it): its records, its
//! `summary.json`, and which transcripts it holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::lines::{each_line, read_small, Line};
use super::{AnalysisError, Note, MAX_RESULTS_BYTES, MAX_SUMMARY_BYTES};
use crate::episode::TokenMeter;
use crate::eval::schedule::{FIRST_ATTEMPT, MAX_ATTEMPTS};

/// A `results.jsonl` record as read back: every field but `id` may be missing (records of
/// older builds), and unknown statuses are kept as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    /// Which of the task's attempts (from 1; records of older builds have none: the first).
    /// Left out when 1, so a run of one attempt reads as before attempts existed.
    #[serde(default = "first_attempt", skip_serializing_if = "is_first_attempt")]
    pub attempt: u32,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub stop_reason: String,
    #[serde(default)]
    pub answer: String,
    #[serde(default)]
    pub verify: Option<Verify>,
    #[serde(default)]
    pub turns: u32,
    #[serde(default)]
    pub tool_calls: u32,
    #[serde(default)]
    pub tokens: TokenMeter,
    #[serde(default)]
    pub sandbox: SandboxSeconds,
    #[serde(default)]
    pub timings: Timings,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub cost: Option<Cost>,
    #[serde(default)]
    pub provenance: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verify {
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub output_tail: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxSeconds {
    #[serde(default)]
    pub seconds: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    #[serde(default)]
    pub acquire: f64,
    #[serde(default)]
    pub episode: f64,
    #[serde(default)]
    pub verify: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    pub usd: f64,
}

pub(super) fn first_attempt() -> u32 {
    FIRST_ATTEMPT
}

pub(super) fn is_first_attempt(attempt: &u32) -> bool {
    *attempt == FIRST_ATTEMPT
}

impl Record {
    /// Seconds from asking for a sandbox to the verdict.
    pub fn task_seconds(&self) -> f64 {
        self.timings.acquire + self.timings.episode + self.timings.verify
    }

    pub fn passed(&self) -> bool {
        self.status == "passed"
    }

    /// Whether the task has a verdict: it ran and was scored. Cancelled and skipped tasks,
    /// and those the model API could not serve, were not.
    pub fn judged(&self) -> bool {
        match self.status.as_str() {
            "passed" | "failed" => true,
            "error" => self.stop_reason != "provider_error",
            _ => false,
        }
    }
}

/// One directory's contents.
#[derive(Debug, Clone)]
pub struct Shard {
    pub dir: PathBuf,
    /// How the shard is named to the user: the directory as given.
    pub label: String,
    /// Records in file order, one per id and attempt (an attempt `--resume` ran again keeps
    /// its last line).
    pub records: Vec<Record>,
    pub summary: Option<Value>,
    /// Transcript files of first attempts, by task id.
    pub transcripts: BTreeMap<String, PathBuf>,
    /// Transcript files of later attempts (`transcripts/attempt-N/`), by task id and attempt.
    pub later_transcripts: BTreeMap<(String, u32), PathBuf>,
}

impl Shard {
    /// What made the shard: its summary's provenance, else its first record's.
    pub fn provenance(&self) -> Option<&Value> {
        self.summary
            .as_ref()
            .and_then(|s| s.get("provenance"))
            .filter(|p| p.is_object())
            .or_else(|| self.records.iter().find_map(|r| r.provenance.as_ref()))
    }

    /// The transcript of `id`'s attempt `attempt`, when the shard holds one.
    pub fn transcript(&self, id: &str, attempt: u32) -> Option<&PathBuf> {
        if attempt == FIRST_ATTEMPT {
            self.transcripts.get(id)
        } else {
            self.later_transcripts.get(&(id.to_string(), attempt))
        }
    }
}

/// Reads `dir` (which holds `results.jsonl`), adding what does not add up to `notes`.
pub fn load_shard(
    dir: &Path,
    label: String,
    notes: &mut Vec<Note>,
) -> Result<Shard, AnalysisError> {
    let results = dir.join("results.jsonl");
    let file = results.display().to_string();
    let mut by_id: BTreeMap<(String, u32), usize> = BTreeMap::new();
    let mut records: Vec<Record> = Vec::new();
    each_line(
        &results,
        MAX_RESULTS_BYTES,
        "results file",
        |line| match line {
            Line::Oversized { number, bytes } => notes.push(Note::UnreadableLine {
                file: file.clone(),
                line: number,
                why: format!("{bytes} bytes, over the line limit"),
            }),
            Line::Text {
                number,
                bytes,
                last_unterminated,
            } => match serde_json::from_slice::<Record>(bytes) {
                Ok(r) if !(1..=MAX_ATTEMPTS).contains(&r.attempt) => {
                    notes.push(Note::UnreadableLine {
                        file: file.clone(),
                        line: number,
                        why: format!("attempt {} is outside 1 to {MAX_ATTEMPTS}", r.attempt),
                    })
                }
                Ok(r) => match by_id.get(&(r.id.clone(), r.attempt)) {
                    Some(&i) => records[i] = r,
                    None => {
                        by_id.insert((r.id.clone(), r.attempt), records.len());
                        records.push(r);
                    }
                },
                Err(_) if last_unterminated => notes.push(Note::TornLastLine {
                    file: file.clone(),
                    line: number,
                }),
                Err(e) => notes.push(Note::UnreadableLine {
                    file: file.clone(),
                    line: number,
                    why: e.to_string(),
                }),
            },
        },
    )?;
    let summary = match read_small(&dir.join("summary.json"), MAX_SUMMARY_BYTES, "summary.json")? {
        None => {
            notes.push(Note::NoSummary {
                shard: label.clone(),
            });
            None
        }
        Some(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                notes.push(Note::UnreadableSummary {
                    shard: label.clone(),
                    why: e.to_string(),
                });
                None
            }
        },
    };
    let transcripts_dir = dir.join("transcripts");
    let transcripts = list_transcripts(&transcripts_dir)?;
    let mut later_transcripts = BTreeMap::new();
    for attempt in FIRST_ATTEMPT + 1..=MAX_ATTEMPTS {
        let later = transcripts_dir.join(format!("attempt-{attempt}"));
        for (id, path) in list_transcripts(&later)? {
            later_transcripts.insert((id, attempt), path);
        }
    }
    let shard = Shard {
        dir: dir.to_path_buf(),
        label,
        records,
        summary,
        transcripts,
        later_transcripts,
    };
    for r in &shard.records {
        if shard.transcript(&r.id, r.attempt).is_none() && r.status != "skipped" {
            notes.push(Note::NoTranscript {
                id: r.id.clone(),
                shard: shard.label.clone(),
            });
        }
    }
    let first = shard.transcripts.keys().map(|id| (id, FIRST_ATTEMPT));
    let later = shard.later_transcripts.keys().map(|(id, a)| (id, *a));
    for (id, attempt) in first.chain(later) {
        if !by_id.contains_key(&(id.clone(), attempt)) {
            notes.push(Note::OrphanTranscript {
                id: id.clone(),
                shard: shard.label.clone(),
            });
        }
    }
    Ok(shard)
}

/// `transcripts/<id>.jsonl` files by id; a missing directory holds none.
fn list_transcripts(dir: &Path) -> Result<BTreeMap<String, PathBuf>, AnalysisError> {
    let mut out = BTreeMap::new();
    super::each_entry(dir, |entry| {
        let entry = entry.map_err(|source| AnalysisError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        if let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) {
            out.insert(id.to_string(), entry.path());
        }
        Ok(())
    })?;
    Ok(out)
}
