//! `results.jsonl`: one line per finished task, appended and flushed as each task ends, so a
//! crash loses nothing that finished.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use crate::episode::TokenMeter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed,
    Error,
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Error => "error",
            Status::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VerifyRecord {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub output_tail: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SandboxRecord {
    pub id: Option<String>,
    pub reused: bool,
    /// Seconds this task held the sandbox.
    pub seconds: f64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Timings {
    pub acquire: f64,
    pub episode: f64,
    pub verify: f64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Retries {
    /// Episode replays on a fresh sandbox after a transport failure.
    pub transport: u32,
    /// Model calls retried by the provider (429, 5xx, dropped connections).
    pub provider: u32,
}

/// One line of `results.jsonl`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TaskRecord {
    pub id: String,
    pub status: Status,
    pub stop_reason: String,
    pub answer: String,
    pub verify: Option<VerifyRecord>,
    pub turns: u32,
    pub tool_calls: u32,
    pub tokens: TokenMeter,
    pub sandbox: SandboxRecord,
    pub timings: Timings,
    pub attempts: u32,
    pub retries: Retries,
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("cannot open results file {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot append to results file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Appends records; safe to share between worker threads.
pub struct ResultsWriter {
    path: PathBuf,
    file: Mutex<File>,
}

impl ResultsWriter {
    pub fn open(path: &Path) -> Result<ResultsWriter, ResultsError> {
        let open_err = |source| ResultsError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(open_err)?;
        // A crash mid-write leaves a torn last line; start ours on a fresh one so it stays
        // the only casualty.
        if ends_without_newline(&mut file).map_err(open_err)? {
            file.write_all(b"\n").map_err(open_err)?;
        }
        Ok(ResultsWriter {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        })
    }

    /// Writes one line with a single `write` so concurrent appends never interleave.
    pub fn append(&self, record: &TaskRecord) -> Result<(), ResultsError> {
        let mut line = serde_json::to_vec(record).map_err(|e| ResultsError::Write {
            path: self.path.clone(),
            source: e.into(),
        })?;
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(&line)
            .and_then(|()| file.flush())
            .map_err(|source| ResultsError::Write {
                path: self.path.clone(),
                source,
            })
    }

    /// Forces everything to stable storage.
    pub fn sync(&self) -> Result<(), ResultsError> {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.sync_all().map_err(|source| ResultsError::Write {
            path: self.path.clone(),
            source,
        })
    }
}

fn ends_without_newline(file: &mut File) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(false);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    Ok(last[0] != b'\n')
}

/// Ids already finished in an earlier run (see [`is_finished`]). A torn last line (the crash
/// happened mid-write) is ignored.
pub fn finished_ids(path: &Path) -> Result<HashSet<String>, ResultsError> {
    let mut ids = HashSet::new();
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ids),
        Err(source) => {
            return Err(ResultsError::Open {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    for line in BufReader::new(file).lines() {
        let line = line.map_err(|source| ResultsError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if !is_finished(&v) {
            continue;
        }
        if let Some(id) = v["id"].as_str() {
            ids.insert(id.to_string());
        }
    }
    Ok(ids)
}

/// Whether a recorded task needs no rerun: a cancelled task never finished, and one whose
/// model API could not serve it (`error` with `provider_error`) was never judged.
fn is_finished(record: &serde_json::Value) -> bool {
    !matches!(
        (record["status"].as_str(), record["stop_reason"].as_str()),
        (Some("cancelled"), _) | (Some("error"), Some("provider_error"))
    )
}
