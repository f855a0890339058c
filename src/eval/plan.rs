//! From what the user asked to a plan the engine runs: which tasks (the file, its shard, what
//! an earlier run already finished), with what harness, into which locked directory, and on
//! what pool.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::environments::Source;
use super::results::{self, ResultsError};
use super::run_lock::{self, RunLock, RunLockError};
use super::schedule::{AttemptPlan, FinishedAttempts, MAX_ATTEMPTS};
use super::shard::Shard;
use super::{AgentHarness, Harness, HarnessFiles};
use crate::image::build::DEFAULT_BUILD_TIMEOUT;
use crate::pool::{self, PoolConfig};
use crate::runner::BootstrapOpts;
use crate::sandbox::{CreateSpec, Metadata, OnTimeout};
use crate::task::{harbor, parse_shard_dir_name, EnvironmentSpec, Task, TaskError, TaskList};
use crate::tree::{self, TreeBounds};

/// What the user asked for, as the command line says it.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub tasks_file: PathBuf,
    /// Output directory; `None` picks `runs/<UTC timestamp>`. With a shard, the directory
    /// all shards share: this one writes its `shard-I-of-N/` inside it.
    pub out: Option<PathBuf>,
    /// Skip tasks already finished in the output directory (the shard's, with a shard).
    pub resume: bool,
    /// Only the tasks whose stable id hash falls in this shard (already resolved: `--shard
    /// auto` is the command's to read from the engine).
    pub shard: Option<Shard>,
    /// `builtin`, `pi`, `oracle`, `nop`, or a directory holding `agent.mjs`.
    pub harness: String,
    /// Attempts of each task (`--attempts`, 1..=[`MAX_ATTEMPTS`]).
    pub attempts: u32,
    /// The environment of every task that names none (`--image`).
    pub image: Option<String>,
}

/// A run, ready to start: its tasks, its harness, and its output directory, locked.
pub struct EvalPlan {
    /// Tasks with an attempt still to run.
    pub tasks: TaskList,
    /// Attempts left out because an earlier run finished them.
    pub already_finished: usize,
    /// How many attempts each task gets, and which an earlier run finished.
    pub attempts: AttemptPlan,
    /// Lines of the earlier results that were unreadable (their tasks run again).
    pub unreadable_results: usize,
    /// What the results resumed were made with (the first kept record's `provenance`).
    pub resumed_provenance: Option<serde_json::Value>,
    /// Where this run writes: `--out`, or with a shard its `shard-I-of-N/` inside it.
    pub out_dir: PathBuf,
    pub shard: Option<Shard>,
    pub harness: Harness,
    /// Held for the whole run: a second run into the same directory is refused.
    pub lock: RunLock,
    /// The environments the tasks run on (their images or Dockerfiles, or `--image`), each
    /// once, to be made before any sandbox starts (see `environments`).
    pub images: Vec<Source>,
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
    if !(1..=MAX_ATTEMPTS).contains(&opts.attempts) {
        return Err(PlanError::Usage(format!(
            "--attempts {}: must be 1 to {MAX_ATTEMPTS}",
            opts.attempts
        )));
    }
    let shard = opts.shard;
    let harness = harness(&opts.harness)?;
    if let Some(reference) = &opts.image {
        crate::task::check_reference(reference)
            .map_err(|why| PlanError::Usage(format!("--image: {why}")))?;
    }
    // Every task is checked; only this shard's are kept, as places in the tasks file (or
    // held whole, read from task directories).
    let mut images: Vec<Source> = Vec::new();
    // Dockerfiles are named relative to what the user named: the tasks file's directory, or
    // the task directory or dataset.
    let base = match opts.tasks_file.is_dir() {
        true => opts.tasks_file.clone(),
        false => opts
            .tasks_file
            .parent()
            .unwrap_or(Path::new(""))
            .to_path_buf(),
    };
    let mut keep = |t: &Task| {
        let kept = shard.is_none_or(|s| s.holds(&t.id));
        if kept {
            if let Some(source) = environment_of(t, opts.image.as_deref(), &base) {
                add_source(&mut images, source);
            }
        }
        kept
    };
    let mut tasks = if opts.tasks_file.is_dir() {
        let (all, digest) = harbor::load_dataset(&opts.tasks_file).map_err(TaskError::from)?;
        TaskList::held(&opts.tasks_file, all, digest, &mut keep)
    } else {
        TaskList::index_where(&opts.tasks_file, &mut keep)?
    };
    let base = opts.out.clone().unwrap_or_else(default_out_dir);
    let out_dir = match shard {
        Some(s) => {
            other_split(&base, s)?;
            base.join(s.dir_name())
        }
        None => base,
    };
    if out_dir.exists() && !out_dir.is_dir() {
        return Err(PlanError::Usage(format!(
            "--out {} is not a directory: name a directory (it is made when missing)",
            out_dir.display()
        )));
    }
    std::fs::create_dir_all(&out_dir).map_err(|source| PlanError::Io {
        path: out_dir.clone(),
        source,
    })?;
    // Held to the end of the run, before anything reads or writes the directory.
    let lock = run_lock::lock_out_dir(&out_dir).map_err(PlanError::Locked)?;
    let (done, unreadable_results, resumed_provenance) = if opts.resume {
        let finished = results::finished_ids(&out_dir.join("results.jsonl"))?;
        (finished.attempts, finished.unreadable, finished.provenance)
    } else {
        (FinishedAttempts::new(), 0, None)
    };
    let attempts = AttemptPlan::new(opts.attempts, done);
    let mut already_finished = 0;
    tasks.retain(|t| {
        already_finished += attempts.finished_count(&t.id);
        attempts.missing(&t.id).next().is_some()
    });
    Ok(EvalPlan {
        tasks,
        already_finished,
        attempts,
        unreadable_results,
        resumed_provenance,
        out_dir,
        shard,
        harness,
        lock,
        images,
    })
}

/// Entries of a shared directory looked at for shards of another split; a directory of runs
/// holds a handful, so past this many the rest go unchecked rather than unbounded.
const MAX_SHARED_ENTRIES: usize = 10_000;

/// Refuses a shared directory already holding shards of a split into another count: the
/// same task would sit in two shards (`shard_of` depends on N), and merging them would
/// count it twice.
fn other_split(base: &Path, shard: Shard) -> Result<(), PlanError> {
    let Ok(entries) = std::fs::read_dir(base) else {
        // Not there yet (created next), or unreadable: creating it says why.
        return Ok(());
    };
    for entry in entries.take(MAX_SHARED_ENTRIES).flatten() {
        let name = entry.file_name();
        let Some((_, count)) = name.to_str().and_then(parse_shard_dir_name) else {
            continue;
        };
        if count != shard.count {
            return Err(PlanError::Usage(format!(
                "{} already holds {} from a run split into {count} shards, and this one is split into {}: use another --out",
                base.display(),
                name.to_string_lossy(),
                shard.count
            )));
        }
    }
    Ok(())
}

impl EvalPlan {
    /// The name the run's sandboxes are leased under: its output directory's, and for a
    /// shard the shared directory's with it (every run has a `shard-0-of-4`).
    pub fn run_id(&self) -> String {
        let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
        let own = name(&self.out_dir).unwrap_or_else(|| "eval".to_string());
        match (self.shard, self.out_dir.parent().and_then(name)) {
            (Some(_), Some(shared)) => format!("{shared}-{own}"),
            _ => own,
        }
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
            .max_timeout_s()
            .map(Duration::from_secs_f64)
            .map_or(episode_timeout, |t| t.max(episode_timeout));
        PoolConfig {
            spec: CreateSpec {
                template,
                timeout_secs: 0,
                metadata: Metadata::new(),
                envs: Vec::new(),
                internet: true,
                on_timeout: OnTimeout::Kill,
                limits: crate::sandbox::Limits::default(),
                network: Default::default(),
                image: None,
            },
            lease: pool::lease_for(max_episode),
            lifetime: pool::lifetime_for(max_episode),
            bootstrap,
            workspace_dir: "workspace".into(),
            reuse,
        }
    }
}

/// What a task runs on: its own image or Dockerfile, else `--image`, else none.
fn environment_of(task: &Task, default_image: Option<&str>, base: &Path) -> Option<Source> {
    match &task.environment {
        Some(EnvironmentSpec::Image(r)) => Some(Source::Image(r.clone())),
        Some(EnvironmentSpec::Dockerfile { path, context }) => Some(Source::Dockerfile {
            path: path.clone(),
            context: context.clone(),
            label: path
                .strip_prefix(base)
                .unwrap_or(path)
                .display()
                .to_string(),
            timeout: task
                .build_timeout_s
                .map_or(DEFAULT_BUILD_TIMEOUT, Duration::from_secs_f64),
        }),
        None => default_image.map(|r| Source::Image(r.to_string())),
    }
}

/// Adds `source` unless it is there; a Dockerfile named twice gets the longer timeout.
fn add_source(sources: &mut Vec<Source>, source: Source) {
    match sources.iter_mut().find(|s| s.same_as(&source)) {
        Some(Source::Dockerfile { timeout, .. }) => {
            if let Source::Dockerfile { timeout: t, .. } = source {
                *timeout = (*timeout).max(t);
            }
        }
        Some(_) => {}
        None => sources.push(source),
    }
}

/// `builtin`, `pi`, `oracle`, `nop`, or a directory of the user's harness (read and
/// checked now).
fn harness(name: &str) -> Result<Harness, PlanError> {
    Ok(match name {
        "builtin" => Harness::Builtin,
        "pi" => Harness::Pi,
        "oracle" => Harness::Oracle,
        "nop" => Harness::Nop,
        _ if name.starts_with("agent:") => {
            let wanted = &name["agent:".len()..];
            let recipe = crate::runner::agents::recipe(wanted).ok_or_else(|| {
                PlanError::Usage(format!(
                    "--harness {name}: no such agent (known: {}); run any other with --harness cmd:'COMMAND'",
                    crate::runner::agents::known()
                ))
            })?;
            Harness::Agent(AgentHarness {
                name: recipe.name.to_string(),
                command: recipe.command.to_string(),
                envs: recipe
                    .envs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                recipe: Some(recipe),
                digest: None,
                model: String::new(),
            })
        }
        _ if name.starts_with("cmd:") => {
            let command = name["cmd:".len()..].trim();
            if command.is_empty() {
                return Err(PlanError::Usage(
                    "--harness cmd: names no command (--harness cmd:'COMMAND')".into(),
                ));
            }
            Harness::Agent(AgentHarness {
                name: "cmd".into(),
                command: command.to_string(),
                envs: Vec::new(),
                recipe: None,
                digest: None,
                model: String::new(),
            })
        }
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
    fn a_shared_directory_of_another_split_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let shard = |index, count| Shard { index, count };
        other_split(&dir.path().join("missing"), shard(0, 4)).unwrap();
        std::fs::create_dir(dir.path().join("shard-1-of-4")).unwrap();
        other_split(dir.path(), shard(0, 4)).unwrap();
        match other_split(dir.path(), shard(0, 2)) {
            Err(PlanError::Usage(m)) => assert!(m.contains("shard-1-of-4"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
