//! Batch evaluation: tasks run on a rayon pool of `-j` workers, each taking the next task in
//! file order on a warm pooled sandbox; results are appended as each task ends.
//!
//! A task's way to its line in `results.jsonl`: [`run`] schedules it, `attempt` runs attempts
//! (a transport failure is replayed on a fresh sandbox), each attempt prepares the workspace
//! (`workspace`), runs the episode through the broker, verifies, and `verdict` turns what
//! happened into the record. A task whose handling panics ends as `error` with the panic's
//! message, and the run goes on. Workers never print: they send [`EvalEvent`]s to one
//! reporter.

mod attempt;
mod budget;
mod cause;
mod control;
pub mod environments;
mod outcome;
pub mod plan;
pub mod provenance;
pub mod results;
pub mod reward;
pub mod run_lock;
mod sandbox_limits;
pub mod schedule;
mod scripts;
pub mod shard;
pub mod spend;
mod summary;
pub mod templates;
mod verdict;
mod verifier;
mod workspace;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Map;

use crate::environment;
use crate::errors::error_chain;
use crate::pool::Pool;
use crate::provider::Provider;
use crate::skills::SkillSet;
use crate::sync::{into_inner, lock};
use crate::task::{Task, TaskList};
pub use budget::{SpendPlan, TaskLimits, UnpricedCost};
pub use control::RunControl;
pub use environments::Environments;
pub use results::{ResultsWriter, Status, TaskRecord};
pub use schedule::AttemptPlan;
pub use summary::{EvalSummary, Tally, Verdict};
pub use verifier::VerifierMode;

/// Per-run limits; a task's own `timeout_s` and `max_turns` win over these.
#[derive(Debug, Clone)]
pub struct EvalLimits {
    pub max_turns: u32,
    pub max_tool_actions: u32,
    pub max_output_tokens: u32,
    pub episode_timeout: Duration,
    pub bash_timeout: Duration,
    /// How long a task's `verify` may run, unless the task sets `verify_timeout_s`.
    pub verify_timeout: Duration,
    pub transport_retries: u32,
    /// What each task's sandbox may take (a task may narrow them).
    pub sandbox: crate::sandbox::Limits,
    /// The network the pool's sandboxes were made with (a task may narrow it).
    pub network: crate::sandbox::Network,
    /// The reward a task's verifier must reach to pass (`--pass-threshold`).
    pub pass_threshold: f64,
}

/// `verify`'s bound when neither the run nor the task names one.
pub const DEFAULT_VERIFY_TIMEOUT: Duration = Duration::from_secs(300);

impl Default for EvalLimits {
    fn default() -> Self {
        EvalLimits {
            max_turns: 20,
            max_tool_actions: 40,
            max_output_tokens: 4096,
            episode_timeout: Duration::from_secs(300),
            bash_timeout: environment::sandbox::DEFAULT_BASH_TIMEOUT,
            verify_timeout: DEFAULT_VERIFY_TIMEOUT,
            transport_retries: 1,
            sandbox: crate::sandbox::Limits::defaults(),
            network: crate::sandbox::Network::Host,
            pass_threshold: 1.0,
        }
    }
}

/// What a run reports, in the order it happens (for each task: started, retrying,
/// finished), ending with its summary.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EvalEvent {
    RunStarted {
        /// Attempts to run (tasks, with one attempt each).
        total: usize,
        already_finished: usize,
        /// Attempts of each task (`--attempts`).
        attempts: u32,
        jobs: usize,
        out_dir: PathBuf,
    },
    TaskStarted {
        id: String,
        /// Which of the task's attempts (from 1).
        attempt: u32,
    },
    /// A running task moved on to `phase`.
    TaskPhase {
        id: String,
        attempt: u32,
        phase: Phase,
    },
    TaskRetrying {
        id: String,
        attempt: u32,
        reason: String,
    },
    TaskFinished {
        record: Box<TaskRecord>,
    },
    /// A result that could not be written; the run stops scheduling.
    ResultsFailed {
        message: String,
    },
    /// The user's first Ctrl-C: running tasks are being cancelled.
    Interrupted,
    /// Said by the reporter itself at a fixed interval off a terminal: how far the run is
    /// and what every running task is doing.
    Heartbeat {
        seconds: f64,
        done: usize,
        total: usize,
        running: Vec<RunningTask>,
    },
    /// The run is over; nothing follows.
    Summary {
        summary: Box<EvalSummary>,
        out_dir: PathBuf,
    },
}

/// Where a running task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Getting a sandbox (from started until setup).
    Sandbox,
    Setup,
    Episode,
    Verify,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Sandbox => "sandbox",
            Phase::Setup => "setup",
            Phase::Episode => "episode",
            Phase::Verify => "verify",
        }
    }
}

/// A running task in a heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunningTask {
    pub id: String,
    pub attempt: u32,
    pub phase: Phase,
    /// Seconds since it started.
    pub seconds: f64,
}

/// What runs inside the runner.
#[derive(Debug, Clone, Default)]
pub enum Harness {
    /// The runner's own tool-calling loop.
    #[default]
    Builtin,
    /// The real pi agent loop (its packages installed where the bootstrap points).
    Pi,
    /// A user's harness: files, `agent.mjs` exporting `runEpisode`, sent to each runner
    /// once and named by their digest after that.
    Files(HarnessFiles),
    /// No agent: the task's reference solution runs, as tool calls the host makes through
    /// the runner's own loop (see `scripts`); no model is asked.
    Oracle,
    /// No agent: submits at once, no model asked (a dataset's tests must fail it).
    Nop,
    /// An agent run as a process of the task (`agent:NAME`, `cmd:COMMAND`), served the
    /// model APIs by the runner's endpoint.
    Agent(AgentHarness),
}

/// An agent the host runs in the task (see [`crate::environment::AgentLaunch`]).
#[derive(Debug, Clone)]
pub struct AgentHarness {
    /// The recipe's name, or `cmd`.
    pub name: String,
    pub command: String,
    pub envs: Vec<(String, String)>,
    /// The known agent it is, if it is one.
    pub recipe: Option<&'static crate::runner::agents::AgentRecipe>,
    /// The package's published integrity, once installed.
    pub digest: Option<String>,
    /// The model the endpoint names to it (the run's `--model`).
    pub model: String,
}

impl AgentHarness {
    /// Sets the agent's variable `key` to `value`, in place of any it had.
    pub fn set_env(&mut self, key: &str, value: String) {
        self.envs.retain(|(k, _)| k != key);
        self.envs.push((key.to_string(), value));
    }

    pub fn launch(&self) -> crate::environment::AgentLaunch {
        crate::environment::AgentLaunch {
            name: self.name.clone(),
            command: self.command.clone(),
            envs: self.envs.clone(),
            model: self.model.clone(),
        }
    }
}

/// A user harness's files and their digest (computed once: hashing them every episode
/// would cost what sending them once saves).
#[derive(Debug, Clone)]
pub struct HarnessFiles {
    pub files: Map<String, serde_json::Value>,
    /// `sha256:<hex>` of the files, by path.
    pub digest: String,
}

impl HarnessFiles {
    pub fn new(files: Map<String, serde_json::Value>) -> HarnessFiles {
        let digest = crate::digest::sha256_parts(
            files
                .iter()
                .map(|(path, v)| (path.as_str(), v.as_str().unwrap_or("").as_bytes())),
        );
        HarnessFiles { files, digest }
    }
}

impl Harness {
    /// The harness as records and provenance name it.
    pub fn name(&self) -> &'static str {
        match self {
            Harness::Builtin => "builtin",
            Harness::Pi => "pi",
            Harness::Files(_) => "user",
            Harness::Oracle => "oracle",
            Harness::Nop => "nop",
            Harness::Agent(_) => "agent",
        }
    }

    /// The loop the runner runs: oracle and nop are scripts played through its own.
    fn runner_loop(&self) -> &'static str {
        match self {
            Harness::Oracle | Harness::Nop => "builtin",
            Harness::Agent(_) => "endpoint",
            other => other.name(),
        }
    }

    /// Whether the harness plays a script of its own instead of asking a model.
    pub fn is_scripted(&self) -> bool {
        matches!(self, Harness::Oracle | Harness::Nop)
    }

    /// Whether the host vouches for the harness's code, which runs in the runner itself: a
    /// sandbox whose runner ran other code is never reused (see `verifier`).
    fn vouched(&self) -> bool {
        !matches!(self, Harness::Files(_))
    }

    fn files(&self) -> Option<&HarnessFiles> {
        match self {
            Harness::Files(f) => Some(f),
            _ => None,
        }
    }
}

/// Everything a run needs, already validated.
pub struct EvalRun<'a> {
    /// The selected tasks, as places in the checked tasks file: each is read when it runs.
    pub tasks: &'a TaskList,
    /// Attempts an earlier run finished (`--resume`), not run again.
    pub already_finished: usize,
    /// How many attempts each task gets, and which are already finished.
    pub attempts: &'a AttemptPlan,
    pub out_dir: &'a Path,
    pub jobs: usize,
    pub limits: EvalLimits,
    pub pool: Arc<Pool>,
    pub provider: Arc<dyn Provider>,
    pub harness: Harness,
    /// With a world model, tool calls are simulated by it instead of run in the sandbox
    /// (and the task's files, setup and verify are not used).
    pub world_model: Option<Arc<dyn Provider>>,
    /// Skills offered to every episode (`--skills`).
    pub skills: Option<Arc<SkillSet>>,
    pub control: Arc<RunControl>,
    /// Caps and prices; the providers above are metered with its meter.
    pub spend: SpendPlan,
    /// What produces this run's results (each record adds its task's line).
    pub provenance: provenance::Provenance,
    /// Where `verify` runs (`--verifier`).
    pub verifier: VerifierMode,
    /// The images tasks run on, made before the run (see `environments`).
    pub environments: &'a Environments,
}

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot create the output directory {path}")]
    OutDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Results(#[from] results::ResultsError),
    #[error("cannot start {jobs} worker threads")]
    Workers {
        jobs: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
    #[error("cannot write {path}")]
    Summary {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Runs every task; returns once all finished (or were cancelled), the pool is closed and
/// `summary.json` is written. The reporter hears of everything, the summary last.
pub fn run(run: &EvalRun<'_>) -> Result<EvalSummary, EvalError> {
    let result = run_all(run);
    run.control.close_events();
    result
}

fn run_all(run: &EvalRun<'_>) -> Result<EvalSummary, EvalError> {
    let started = Instant::now();
    let started_at = std::time::SystemTime::now();
    let transcripts = run.out_dir.join("transcripts");
    for attempt in 1..=run.attempts.per_task() {
        let dir = transcripts_of(&transcripts, attempt);
        std::fs::create_dir_all(&dir).map_err(|source| EvalError::OutDir { path: dir, source })?;
    }
    let writer = ResultsWriter::open(&run.out_dir.join("results.jsonl"))?;
    let control = &run.control;
    let pending = run.attempts.pending(run.tasks);
    control.emit(EvalEvent::RunStarted {
        total: pending,
        already_finished: run.already_finished,
        attempts: run.attempts.per_task(),
        jobs: run.jobs,
        out_dir: run.out_dir.to_path_buf(),
    });
    let workers = rayon::ThreadPoolBuilder::new()
        .num_threads(run.jobs.max(1))
        .thread_name(|i| format!("eval-{i}"))
        .build()
        .map_err(|source| EvalError::Workers {
            jobs: run.jobs,
            source,
        })?;
    let summary = Mutex::new(EvalSummary {
        total: pending,
        tasks: run.tasks.len(),
        attempts: run.attempts.per_task(),
        already_finished: run.already_finished,
        caps: run.spend.caps,
        provenance: Some(run.provenance.clone()),
        ..EvalSummary::default()
    });
    let budget = budget::RunBudget::new(&run.spend, &run.pool);
    let finish = |task: &Task, attempt: u32, mut record: TaskRecord| {
        record.attempt = attempt;
        budget.finished(&mut record);
        cause::explain(
            &mut record,
            &cause::RunState {
                stopped_by: budget.stopped_by(),
                interrupted: control.interrupted(),
                fatal: control.fatal(),
            },
        );
        let image = run.environments.pinned(task);
        record.provenance = Some(run.provenance.for_line(task.line).on_image(image));
        // The record is on disk before anyone hears of it.
        if let Err(e) = writer.append(&record) {
            let message = error_chain(&e);
            // Results that cannot be kept make the run pointless: stop, and say why.
            control.stop(message.clone());
            control.emit(EvalEvent::ResultsFailed { message });
        }
        lock(&summary).add(&record);
        control.emit(EvalEvent::TaskFinished {
            record: Box::new(record),
        });
    };
    let run_work = |work: &schedule::Work<'_>| {
        if control.is_cancelled() && budget.stopped_by().is_none() {
            lock(&summary).not_run += 1;
            return;
        }
        let task = match run.tasks.load(work.entry) {
            Ok(task) => task,
            Err(e) => {
                // The file changed under the run: what it says now was never checked, so
                // nothing more starts.
                control.stop(error_chain(&e));
                lock(&summary).not_run += 1;
                return;
            }
        };
        let task = &task;
        // A task a cap keeps from starting is written, so `--resume` finds it.
        if let Some(why) = budget.refuse_next() {
            finish(task, work.attempt, verdict::skipped_record(task, why));
            return;
        }
        if control.is_cancelled() {
            lock(&summary).not_run += 1;
            return;
        }
        control.emit(EvalEvent::TaskStarted {
            id: task.id.clone(),
            attempt: work.attempt,
        });
        let transcripts = transcripts_of(&transcripts, work.attempt);
        finish(
            task,
            work.attempt,
            attempt::run_task_to_record(run, task, work.attempt, &transcripts),
        );
    };
    let all_done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| budget.watch_hard_cap(control, &all_done));
        // Every worker takes the next task in file order until none is left: tasks block on
        // sandboxes and models, so there is nothing to balance, and work stealing would only
        // have idle workers spin (measurably, at hundreds of workers) looking for it.
        let next = AtomicUsize::new(0);
        workers.broadcast(|_| {
            while let Some(slot) = run
                .attempts
                .slot(run.tasks, next.fetch_add(1, Ordering::Relaxed))
            {
                if let Some(work) = slot {
                    run_work(&work);
                }
            }
        });
        all_done.store(true, Ordering::Release);
    });
    let mut summary = into_inner(summary);
    summary.stopped_by = budget.stopped_by();
    let closed = run.pool.close().map_err(|e| error_chain(&e));
    // A create whose answer was lost may have made a sandbox all the same: found by its
    // lease tag and killed before the run ends, not left to `reap`.
    let settled = run.pool.settle_creates().map_err(|e| error_chain(&e));
    let cleanup: Vec<String> = [closed, settled]
        .into_iter()
        .filter_map(Result::err)
        .collect();
    if !cleanup.is_empty() {
        summary.cleanup_error = Some(cleanup.join("; "));
    }
    // Reported in the summary, not instead of it: what was written stays, and says so.
    if let Err(e) = writer.sync() {
        control.fail(error_chain(&e));
    }
    summary.sandboxes = run.pool.usage();
    summary.spend = budget.spent();
    summary.fatal = control.fatal();
    summary.interrupted = control.interrupted();
    summary.wall_seconds = started.elapsed().as_secs_f64();
    // The whole run across its invocations; what this one alone did is its last entry.
    let began = humantime::format_rfc3339_seconds(started_at).to_string();
    if let Err(e) = summary.span_run(run.out_dir, began) {
        // This invocation's figures stand, and the summary says why they are not the run's.
        let why = format!("cannot add up the whole run: {}", error_chain(&e));
        summary.fatal.get_or_insert(why);
    }
    // Shown even when it cannot be saved: the summary is how a run that stopped says why.
    let saved = summary.write(run.out_dir);
    control.emit(EvalEvent::Summary {
        summary: Box::new(summary.clone()),
        out_dir: run.out_dir.to_path_buf(),
    });
    saved.map_err(|source| EvalError::Summary {
        path: run.out_dir.join("summary.json"),
        source,
    })?;
    Ok(summary)
}

/// Where an attempt's transcripts go: the first's in `transcripts/` as before attempts
/// existed, each later one's in `transcripts/attempt-N/` (ids hold no slash, so no task's
/// file is ever taken for that directory). Two attempts of a task may run at once, so each
/// needs a file of its own.
fn transcripts_of(dir: &Path, attempt: u32) -> PathBuf {
    if attempt == schedule::FIRST_ATTEMPT {
        dir.to_path_buf()
    } else {
        dir.join(format!("attempt-{attempt}"))
    }
}
