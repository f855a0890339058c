//! `results.jsonl`: one line per finished task, appended and flushed as each task ends, so a
//! crash loses nothing that finished.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use super::provenance::Provenance;
use super::reward::{Reward, RewardError};
use super::schedule::{FinishedAttempts, FIRST_ATTEMPT, MAX_ATTEMPTS};
use super::spend::CostRecord;
use crate::episode::{StopReason, TokenMeter};
use crate::sync::lock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed,
    Error,
    Cancelled,
    /// Never started: a spend cap was reached first (`--resume` with a higher cap runs it).
    Skipped,
}

impl Status {
    /// The status a record names (`as_str`'s inverse).
    pub fn parse(name: &str) -> Option<Status> {
        [
            Status::Passed,
            Status::Failed,
            Status::Error,
            Status::Cancelled,
            Status::Skipped,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Error => "error",
            Status::Cancelled => "cancelled",
            Status::Skipped => "skipped",
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VerifyRecord {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub output_tail: String,
    /// The reward file the verifier left, parsed (moved to the record's `reward`).
    #[serde(skip)]
    pub reward: Option<Result<Reward, RewardError>>,
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
    /// Which of the task's `--attempts` this is, from 1 (records written before attempts
    /// existed have none: read as 1). Not `attempts`, the episode's transport replays.
    pub attempt: u32,
    pub status: Status,
    pub stop_reason: StopReason,
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
    /// What the verifier scored, as its reward file gave it (a number, or named metrics).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward: Option<Reward>,
    /// What the task cost, when prices are known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostRecord>,
    /// What produced it (the run's, with the task's line in the tasks file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
}

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("cannot open results file {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read results file {path}")]
    Read {
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
        let mut file = lock(&self.file);
        file.write_all(&line)
            .and_then(|()| file.flush())
            .map_err(|source| ResultsError::Write {
                path: self.path.clone(),
                source,
            })
    }

    /// Forces everything to stable storage.
    pub fn sync(&self) -> Result<(), ResultsError> {
        let file = lock(&self.file);
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

/// What `--resume` learns from an earlier run's results file.
#[derive(Debug, Default)]
pub struct Finished {
    /// Attempts that need not run again, by task.
    pub attempts: FinishedAttempts,
    /// Lines that are no record (torn by a crash mid-write, or not JSON): skipped, so
    /// their tasks run again.
    pub unreadable: usize,
    /// The `provenance` of the first record kept (what the results resumed were made with).
    pub provenance: Option<serde_json::Value>,
}

/// Longest results line read back; a longer one counts as unreadable rather than being
/// held whole.
const MAX_LINE_BYTES: usize = 16 << 20;

/// Reads the results file line by line as raw bytes: a line torn anywhere (even inside a
/// multibyte character) or otherwise unreadable is counted and skipped, never fatal.
pub fn finished_ids(path: &Path) -> Result<Finished, ResultsError> {
    let mut done = Finished::default();
    each_line(path, |line, overlong| done.take(line, overlong))?;
    Ok(done)
}

/// Calls `f` with every line of the results file at `path` (none when there is no file),
/// and whether it was longer than a record may be (then its bytes are not kept).
pub(super) fn each_line(path: &Path, mut f: impl FnMut(&[u8], bool)) -> Result<(), ResultsError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ResultsError::Open {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let read_err = |source| ResultsError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    let mut overlong = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_err(e)),
        };
        if buf.is_empty() {
            if overlong || !line.is_empty() {
                f(&line, overlong);
            }
            return Ok(());
        }
        let (chunk, used, ends) = match memchr::memchr(b'\n', buf) {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        if !overlong {
            if line.len() + chunk.len() > MAX_LINE_BYTES {
                overlong = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        reader.consume(used);
        if ends {
            f(&line, overlong);
            line.clear();
            overlong = false;
        }
    }
}

impl Finished {
    fn take(&mut self, line: &[u8], overlong: bool) {
        if !overlong && line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let record = if overlong {
            None
        } else {
            serde_json::from_slice::<serde_json::Value>(line).ok()
        };
        match record
            .as_ref()
            .and_then(|r| Some((r["id"].as_str()?, attempt_of(r)?, r)))
        {
            Some((id, attempt, r)) if is_finished(r) => {
                self.attempts
                    .entry(id.to_string())
                    .or_default()
                    .insert(attempt);
                if self.provenance.is_none() {
                    self.provenance = r.get("provenance").cloned();
                }
            }
            Some(_) => {}
            None => self.unreadable += 1,
        }
    }
}

/// The record's attempt: absent (written before attempts existed) is the first; a number
/// outside 1..=[`MAX_ATTEMPTS`] is no attempt any run makes, so the line is unreadable.
pub(super) fn attempt_of(record: &serde_json::Value) -> Option<u32> {
    match record.get("attempt") {
        None => Some(FIRST_ATTEMPT),
        Some(a) => a
            .as_u64()
            .filter(|a| (1..=u64::from(MAX_ATTEMPTS)).contains(a))
            .and_then(|a| u32::try_from(a).ok()),
    }
}

/// Whether a recorded task needs no rerun: a cancelled task never finished, a skipped one
/// never started (a spend cap), and one whose model API could not serve it (`error` with
/// `provider_error`) was never judged.
fn is_finished(record: &serde_json::Value) -> bool {
    !matches!(
        (record["status"].as_str(), record["stop_reason"].as_str()),
        (Some("cancelled" | "skipped"), _) | (Some("error"), Some("provider_error"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_skips_torn_and_unreadable_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"{\"id\":\"a\",\"status\":\"passed\"}\n");
        bytes.extend_from_slice(b"{\"id\":\"b\",\"status\":\"cancelled\"}\n");
        bytes.extend_from_slice(b"{\"id\":\"e\",\"status\":\"skipped\"}\n");
        bytes.extend_from_slice(b"not json\n\n");
        bytes.extend_from_slice(b"{\"id\":\"c\",\"status\":\"failed\"}\n");
        // Torn inside the two-byte "\u{e9}": a crash mid-write.
        let torn = "{\"id\":\"d\",\"answer\":\"caf\u{e9}\"}".as_bytes();
        let cut = torn.iter().position(|&b| b >= 0x80).unwrap() + 1;
        bytes.extend_from_slice(&torn[..cut]);
        std::fs::write(&path, &bytes).unwrap();

        let done = finished_ids(&path).unwrap();
        let mut ids: Vec<&str> = done.attempts.keys().map(String::as_str).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["a", "c"]);
        assert_eq!(done.unreadable, 2);

        // The writer starts a fresh line after the torn one; resume still reads the rest.
        let writer = ResultsWriter::open(&path).unwrap();
        drop(writer);
        let mut more = std::fs::read(&path).unwrap();
        more.extend_from_slice(b"{\"id\":\"d\",\"status\":\"passed\"}\n");
        std::fs::write(&path, &more).unwrap();
        let done = finished_ids(&path).unwrap();
        assert!(done.attempts.contains_key("d"), "{:?}", done.attempts);
        assert_eq!(done.unreadable, 2);
    }

    #[test]
    fn resume_knows_each_finished_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        let lines = [
            r#"{"id":"old","status":"passed"}"#,
            r#"{"id":"a","attempt":1,"status":"failed"}"#,
            r#"{"id":"a","attempt":2,"status":"cancelled"}"#,
            r#"{"id":"a","attempt":3,"status":"passed"}"#,
            r#"{"id":"bad","attempt":0,"status":"passed"}"#,
            r#"{"id":"bad","attempt":101,"status":"passed"}"#,
            r#"{"id":"bad","attempt":"2","status":"passed"}"#,
        ];
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let done = finished_ids(&path).unwrap();
        let of = |id: &str| {
            done.attempts
                .get(id)
                .map(|a| a.iter().copied().collect::<Vec<_>>())
        };
        assert_eq!(of("old"), Some(vec![1]));
        assert_eq!(of("a"), Some(vec![1, 3]));
        assert_eq!(of("bad"), None);
        assert_eq!(done.unreadable, 3);
    }

    #[test]
    fn a_missing_results_file_has_nothing_finished() {
        let dir = tempfile::tempdir().unwrap();
        let done = finished_ids(&dir.path().join("results.jsonl")).unwrap();
        assert!(done.attempts.is_empty());
        assert_eq!(done.unreadable, 0);
    }
}
