//! Reading finished runs: what `wmo-e2b report` shows. A run is one `--out` directory, or
//! the `shard-I-of-N/` directories several hosts wrote into one, merged; reading is bounded
//! and tolerant of what a crash leaves (those become [`Note`]s, never errors).
//!
//! One job per file: [`lines`] (bounded JSON Lines), [`load`] (one directory's records,
//! summary and transcripts), [`merge`] (shards into one run, naming what does not add up),
//! [`stats`] (the figures, with [`pass_at_k`] for runs of several attempts), [`compare`] (a run against a baseline), [`document`] (the
//! [`Report`] value every output renders), [`text`] (the terminal rendering), [`atif`]
//! (trajectories in Harbor's ATIF), [`html`] (the HTML page, with [`conversation`],
//! [`plots`] and [`escape`]).

pub mod atif;
pub mod compare;
pub mod conversation;
pub mod document;
pub mod escape;
pub mod health;
pub mod html;
pub mod lines;
pub mod load;
pub mod merge;
pub mod notes;
pub mod pass_at_k;
pub mod plots;
pub mod stats;
pub mod text;

use std::path::PathBuf;

pub use document::Report;
pub use merge::Run;
pub use notes::Note;

/// Longest line read from a results file or a transcript; a longer one is noted and skipped.
pub const MAX_LINE_BYTES: usize = 16 << 20;
/// Largest results file read (about 400,000 typical records).
pub const MAX_RESULTS_BYTES: u64 = 1 << 30;
/// Largest `summary.json` read.
pub const MAX_SUMMARY_BYTES: u64 = 16 << 20;
/// Largest transcript turned into a trajectory.
pub const MAX_TRANSCRIPT_BYTES: u64 = 256 << 20;
/// Most shard directories, and most transcript files, one run directory may hold.
pub const MAX_ENTRIES: usize = 1_000_000;

/// Hands each entry of `dir` to `f`: none when `dir` does not exist, and an error past
/// [`MAX_ENTRIES`] rather than a walk without end.
fn each_entry(
    dir: &std::path::Path,
    mut f: impl FnMut(std::io::Result<std::fs::DirEntry>) -> Result<(), AnalysisError>,
) -> Result<(), AnalysisError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(AnalysisError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    for (n, entry) in entries.enumerate() {
        if n >= MAX_ENTRIES {
            return Err(AnalysisError::TooManyEntries {
                path: dir.to_path_buf(),
                limit: MAX_ENTRIES,
            });
        }
        f(entry)?;
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error(
        "{path}: no results.jsonl there nor in any shard-I-of-N/ directory under it; give the --out directory of an eval"
    )]
    NoResults { path: PathBuf },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes, over the {limit} bytes a {what} may have")]
    TooLarge {
        path: PathBuf,
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("{path} holds more than {limit} entries")]
    TooManyEntries { path: PathBuf, limit: usize },
    #[error("cannot read the tasks file")]
    Tasks(#[from] crate::task::TaskError),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl AnalysisError {
    /// Whether the input is at fault (exit 2), rather than this machine (a write that failed).
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, AnalysisError::Write { .. })
    }
}
