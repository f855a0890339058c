//! From what the user asked to a plan the engine runs: which tasks (the file, its shard, what
//! an earlier run already finished), with what harness, into which locked directory, and on
//! what pool.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::results::{self, ResultsError};
use super::run_lock::{self, RunLock, RunLockError};
use super::{Harness, HarnessFiles};
use crate::pool::{self, PoolConfig};
use crate::runner::BootstrapOpts;
use crate::sandbox::{CreateSpec, Metadata};
use crate::task::{self, Task, TaskError};
use crate::tree::{self, TreeBounds};

/// What the user asked for, as the command line says it.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub tasks_file: PathBuf,
    /// Output directory; `None` picks `runs/<UTC timestamp>`.
    pub out: Option<PathBuf>,
    /// Skip tasks already finished in the output directory.
    pub resume: bool,
    /// `I/N`: only the tasks whose stable id hash falls in shard I of N.
    pub shard: Option<String>,
    /// `builtin`, `pi`, or a directory holding `agent.mjs`.
    pub harness: String,
}

/// A run, ready to start: its tasks, its harness, and its output directory, locked.
pub struct EvalPlan {
    pub tasks: Vec<Task>,
    /// Tasks left out because an earlier run finished them.
    pub skipped: usize,
    /// Lines of the earlier results that were unreadable (their tasks run again).
    pub unreadable_results: usize,
    /// What the results resumed were made with (the first kept record's `provenance`).
    pub resumed_provenance: Option<serde_json::Value>,
    pub out_dir: PathBuf,
    pub harness: Harness,
    /// Held for the whole run: a second run into the same directory is refused.
    pub lock: RunLock,
}

/// Why a run cannot start. All of them are the user's to fix except `Io`.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Tasks(#[from] TaskError),
    #[error(transparent)]
    Locked(RunLockError),
    #[error(transparent)]
    Results(#[from] ResultsError),
    #[error("cannot create the output directory {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl PlanError {
    /// Bad options or input files (exit 2), rather than a machine that cannot run the plan.
    pub fn is_usage(&self) -> bool {
        match self {
            PlanError::Usage(_) | PlanError::Tasks(_) => true,
            PlanError::Locked(e) => matches!(e, RunLockError::Held { .. }),
            PlanError::Results(_) | PlanError::Io { .. } => false,
        }
    }
}

/// Validates `opts`, loads and selects the tasks, and locks the output directory.
pub fn plan(opts: &EvalOptions) -> Result<EvalPlan, PlanError> {
    if opts.resume && opts.out.is_none() {
        return Err(PlanError::Usage(
            "--resume needs --out DIR: the run directory to resume".into(),
        ));
    }
    let shard = opts.shard.as_deref().map(parse_shard).transpose()?;
    let harness = harness(&opts.harness)?;
    let all = task::load_tasks(&opts.tasks_file)?;
    let out_dir = opts.out.clone().unwrap_or_else(default_out_dir);
    std::fs::create_dir_all(&out_dir).map_err(|source| PlanError::Io {
        path: out_dir.clone(),
        source,
    })?;
    // Held to the end of the run, before anything reads or writes the directory.
    let lock = run_lock::lock_out_dir(&out_dir).map_err(PlanError::Locked)?;
    let (done, unreadable_results, resumed_provenance) = if opts.resume {
        let finished = results::finished_ids(&out_dir.join("results.jsonl"))?;
        (finished.ids, finished.unreadable, finished.provenance)
    } else {
        (HashSet::new(), 0, None)
    };
    let mut skipped = 0;
    let tasks = all
        .into_iter()
        .filter(|t| shard.is_none_or(|(i, n)| task::shard_of(&t.id, n) == i))
        .filter(|t| {
            let keep = !done.contains(&t.id);
            skipped += usize::from(!keep);
            keep
        })
        .collect();
    Ok(EvalPlan {
        tasks,
        skipped,
        unreadable_results,
        resumed_provenance,
        out_dir,
        harness,
        lock,
    })
}

impl EvalPlan {
    /// The name the run's sandboxes are leased under: its output directory's.
    pub fn run_id(&self) -> String {
        self.out_dir
            .file_name()
            .map_or_else(|| "eval".to_string(), |n| n.to_string_lossy().into_owned())
    }

    /// The pool the tasks run on: leases long enough for the longest episode any task may
    /// run (`episode_timeout`, or a task's own `timeout_s`).
    pub fn pool_config(
        &self,
        template: Option<String>,
        episode_timeout: Duration,
        bootstrap: BootstrapOpts,
        reuse: bool,
    ) -> PoolConfig {
        let max_episode = self
            .tasks
            .iter()
            .filter_map(|t| t.timeout_s)
            .map(Duration::from_secs_f64)
            .fold(episode_timeout, Duration::max);
        PoolConfig {
            spec: CreateSpec {
                template,
                timeout_secs: 0,
                metadata: Metadata::new(),
                envs: Vec::new(),
                internet: true,
            },
            lease: pool::lease_for(max_episode),
            lifetime: pool::lifetime_for(max_episode),
            bootstrap,
            workspace_dir: "workspace".into(),
            reuse,
        }
    }
}

/// `builtin`, `pi`, or a directory of the user's harness (read and checked now).
fn harness(name: &str) -> Result<Harness, PlanError> {
    Ok(match name {
        "builtin" => Harness::Builtin,
        "pi" => Harness::Pi,
        dir => {
            let files = tree::read_harness(Path::new(dir), TreeBounds::default())
                .map_err(|e| PlanError::Usage(format!("--harness {dir}: {e}")))?;
            Harness::Files(HarnessFiles::new(
                files
                    .into_iter()
                    .map(|(k, v)| (k, serde_json::Value::String(v)))
                    .collect(),
            ))
        }
    })
}

fn parse_shard(s: &str) -> Result<(u32, u32), PlanError> {
    let bad = || {
        PlanError::Usage(format!(
            "--shard {s:?}: expected I/N with 0 <= I < N, e.g. 0/4"
        ))
    };
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let i: u32 = i.trim().parse().map_err(|_| bad())?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

fn default_out_dir() -> PathBuf {
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let compact: String = stamp
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect::<String>()
        .replace('T', "-");
    PathBuf::from("runs").join(compact)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_i_of_n() {
        assert_eq!(parse_shard("0/4").unwrap(), (0, 4));
        assert_eq!(parse_shard(" 3 / 4 ").unwrap(), (3, 4));
        for bad in ["4/4", "1/0", "x/2", "1", "-1/2"] {
            assert!(
                matches!(parse_shard(bad), Err(PlanError::Usage(_))),
                "{bad}"
            );
        }
    }
}
