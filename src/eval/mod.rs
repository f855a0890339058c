//! Batch evaluation: tasks run in waves on a rayon pool of `-j` workers, each on a warm pooled
//! sandbox; results are appended as each task ends.
//!
//! Workers never print. They send [`EvalEvent`]s to one reporter, which draws progress or
//! writes JSON.

pub mod results;
pub mod run_lock;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use serde::Serialize;
use serde_json::Map;

use crate::cancel::CancelToken;
use crate::environment::{self, Environment, SandboxEnvironment, WorldModelEnvironment};
use crate::episode::{
    self, Episode, EpisodeConfig, EpisodeOutcome, StopReason, TokenMeter, Transcript,
};
use crate::errors::error_chain;
use crate::provider::Provider;
use crate::sandbox::pool::{Pool, PoolError, PoolUsage, Warm};
use crate::sandbox::shell_quote;
use crate::sandbox::{ErrorClass, RunOpts, SandboxError};
use crate::sync::lock;
use crate::task::Task;
pub use results::{ResultsWriter, Status, TaskRecord};
use results::{Retries, SandboxRecord, Timings, VerifyRecord};

/// Bytes of verify output kept in a result.
const VERIFY_TAIL: usize = 2048;
/// Bytes of setup output quoted in a setup failure.
const SETUP_TAIL: usize = 2048;

/// Per-run limits; a task's own `timeout_s` and `max_turns` win over these.
#[derive(Debug, Clone)]
pub struct EvalLimits {
    pub max_turns: u32,
    pub max_tool_actions: u32,
    pub max_output_tokens: u32,
    pub episode_timeout: Duration,
    pub bash_timeout: Duration,
    pub transport_retries: u32,
}

impl Default for EvalLimits {
    fn default() -> Self {
        EvalLimits {
            max_turns: 20,
            max_tool_actions: 40,
            max_output_tokens: 4096,
            episode_timeout: Duration::from_secs(300),
            bash_timeout: environment::sandbox::DEFAULT_BASH_TIMEOUT,
            transport_retries: 1,
        }
    }
}

/// What workers report, in the order it happens for each task.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EvalEvent {
    RunStarted {
        total: usize,
        skipped: usize,
        jobs: usize,
        out_dir: PathBuf,
    },
    TaskStarted {
        id: String,
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
}

/// Totals of a finished run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EvalSummary {
    pub total: usize,
    pub skipped: usize,
    pub passed: usize,
    pub failed: usize,
    pub errors: usize,
    pub cancelled: usize,
    /// Tasks never started (Ctrl-C stopped scheduling).
    pub not_run: usize,
    pub tokens: TokenMeter,
    pub transport_retries: u32,
    pub provider_retries: u32,
    pub sandboxes: PoolUsage,
    pub wall_seconds: f64,
    /// Kills the pool could not prove at close.
    pub cleanup_error: Option<String>,
    /// Why the run stopped early, when a problem made every task fail the same way (a
    /// runner that cannot start) or made going on pointless (results that cannot be
    /// written).
    pub fatal: Option<String>,
}

impl EvalSummary {
    fn add(&mut self, r: &TaskRecord) {
        match r.status {
            Status::Passed => self.passed += 1,
            Status::Failed => self.failed += 1,
            Status::Error => self.errors += 1,
            Status::Cancelled => self.cancelled += 1,
        }
        self.tokens.input += r.tokens.input;
        self.tokens.output += r.tokens.output;
        self.tokens.calls += r.tokens.calls;
        self.transport_retries += r.retries.transport;
        self.provider_retries += r.retries.provider;
    }
}

/// What runs inside the runner.
#[derive(Debug, Clone, Default)]
pub enum Harness {
    /// The runner's own tool-calling loop.
    #[default]
    Builtin,
    /// The real pi agent loop (its packages installed where the bootstrap points).
    Pi,
    /// A user's harness: files sent with every episode, `agent.mjs` exporting `runEpisode`.
    Files(Map<String, serde_json::Value>),
}

impl Harness {
    fn name(&self) -> &'static str {
        match self {
            Harness::Builtin => "builtin",
            Harness::Pi => "pi",
            Harness::Files(_) => "user",
        }
    }

    fn files(&self) -> Map<String, serde_json::Value> {
        match self {
            Harness::Files(f) => f.clone(),
            _ => Map::new(),
        }
    }
}

/// Everything a run needs, already validated.
pub struct EvalRun<'a> {
    pub tasks: &'a [Task],
    pub skipped: usize,
    pub out_dir: &'a Path,
    pub jobs: usize,
    pub limits: EvalLimits,
    pub pool: Arc<Pool>,
    pub provider: Arc<dyn Provider>,
    pub harness: Harness,
    /// With a world model, tool calls are simulated by it instead of run in the sandbox
    /// (and the task's files, setup and verify are not used).
    pub world_model: Option<Arc<dyn Provider>>,
    pub events: Sender<EvalEvent>,
    pub cancel: CancelToken,
    /// Set by the first worker that finds the run cannot go on (the runner cannot start).
    pub fatal: std::sync::OnceLock<String>,
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
}

/// Runs every task; returns once all finished (or were cancelled) and the pool is closed.
pub fn run(run: &EvalRun<'_>) -> Result<EvalSummary, EvalError> {
    let started = Instant::now();
    let transcripts = run.out_dir.join("transcripts");
    std::fs::create_dir_all(&transcripts).map_err(|source| EvalError::OutDir {
        path: transcripts.clone(),
        source,
    })?;
    let writer = ResultsWriter::open(&run.out_dir.join("results.jsonl"))?;
    let _ = run.events.send(EvalEvent::RunStarted {
        total: run.tasks.len(),
        skipped: run.skipped,
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
    let summary = std::sync::Mutex::new(EvalSummary {
        total: run.tasks.len(),
        skipped: run.skipped,
        ..EvalSummary::default()
    });
    workers.install(|| {
        use rayon::prelude::*;
        // One task per rayon job, so a slow task never holds back a queue of others.
        run.tasks.par_iter().with_max_len(1).for_each(|task| {
            if run.cancel.is_cancelled() {
                lock(&summary).not_run += 1;
                return;
            }
            let _ = run.events.send(EvalEvent::TaskStarted {
                id: task.id.clone(),
            });
            let record = run_task(run, task, &transcripts);
            // The record is on disk before anyone hears of it.
            if let Err(e) = writer.append(&record) {
                let message = error_chain(&e);
                // Results that cannot be kept make the run pointless: stop, and say why.
                let _ = run.fatal.set(message.clone());
                let _ = run.events.send(EvalEvent::ResultsFailed { message });
                run.cancel.cancel();
            }
            lock(&summary).add(&record);
            let _ = run.events.send(EvalEvent::TaskFinished {
                record: Box::new(record),
            });
        });
    });
    let mut summary = crate::sync::into_inner(summary);
    if let Err(e) = run.pool.close() {
        summary.cleanup_error = Some(error_chain(&e));
    }
    // Reported in the summary, not instead of it: what was written stays, and says so.
    if let Err(e) = writer.sync() {
        let _ = run.fatal.set(error_chain(&e));
    }
    summary.sandboxes = run.pool.usage();
    summary.fatal = run.fatal.get().cloned();
    summary.wall_seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// What one attempt produced.
enum Attempt {
    /// The task reached an end worth recording (any status).
    Done(Box<TaskRecord>),
    /// A transport failure a fresh sandbox may not have.
    Transport { reason: String, partial: Progress },
}

/// Counters carried across attempts.
#[derive(Default, Clone)]
struct Progress {
    turns: u32,
    tool_calls: u32,
    tokens: TokenMeter,
    provider_retries: u32,
    acquire: f64,
    episode: f64,
}

fn run_task(run: &EvalRun<'_>, task: &Task, transcripts: &Path) -> TaskRecord {
    let transcript_path = transcripts.join(format!("{}.jsonl", task.id));
    let mut transcript =
        Transcript::append(&transcript_path).unwrap_or_else(|_| Transcript::disabled());
    let mut carried = Progress::default();
    let mut attempt = 0;
    loop {
        attempt += 1;
        transcript.note(&format!("attempt {attempt}"));
        match run_attempt(run, task, &mut transcript, attempt, &carried) {
            Attempt::Done(mut record) => {
                record.retries.transport = attempt - 1;
                let _ = transcript.finish();
                return *record;
            }
            Attempt::Transport { reason, partial } => {
                carried = partial;
                transcript.note(&format!("attempt {attempt} failed: {reason}"));
                if attempt > run.limits.transport_retries || run.cancel.is_cancelled() {
                    let _ = transcript.finish();
                    let status = if run.cancel.is_cancelled() {
                        Status::Cancelled
                    } else {
                        Status::Error
                    };
                    let mut record = blank_record(task, status, &carried, attempt);
                    record.stop_reason = if status == Status::Cancelled {
                        StopReason::Cancelled.as_str().into()
                    } else {
                        StopReason::Error.as_str().into()
                    };
                    record.error = Some(reason);
                    record.retries.transport = attempt - 1;
                    return record;
                }
                let _ = run.events.send(EvalEvent::TaskRetrying {
                    id: task.id.clone(),
                    attempt: attempt + 1,
                    reason,
                });
            }
        }
    }
}

fn blank_record(task: &Task, status: Status, p: &Progress, attempts: u32) -> TaskRecord {
    TaskRecord {
        id: task.id.clone(),
        status,
        stop_reason: String::new(),
        answer: String::new(),
        verify: None,
        turns: p.turns,
        tool_calls: p.tool_calls,
        tokens: p.tokens,
        sandbox: SandboxRecord {
            id: None,
            reused: false,
            seconds: 0.0,
        },
        timings: Timings {
            acquire: p.acquire,
            episode: p.episode,
            verify: 0.0,
        },
        attempts,
        retries: Retries {
            transport: 0,
            provider: p.provider_retries,
        },
        error: None,
    }
}

fn run_attempt(
    run: &EvalRun<'_>,
    task: &Task,
    transcript: &mut Transcript,
    attempt: u32,
    carried: &Progress,
) -> Attempt {
    let mut progress = carried.clone();
    let t0 = Instant::now();
    let acquired = run.pool.acquire();
    progress.acquire += t0.elapsed().as_secs_f64();
    let mut warm = match acquired {
        Ok(w) => w,
        Err(e) => {
            let reason = format!("could not get a sandbox: {}", error_chain(&e));
            if e.is_transport() && !matches!(e, PoolError::Closed) {
                return Attempt::Transport {
                    reason,
                    partial: progress,
                };
            }
            let status = if run.cancel.is_cancelled() {
                Status::Cancelled
            } else {
                Status::Error
            };
            if matches!(e, PoolError::Bootstrap(_)) && status == Status::Error {
                // A runner that cannot start for a reason a fresh sandbox will not fix (no
                // Node.js, a protocol mismatch) fails every task the same way: stop now.
                let _ = run.fatal.set(reason.clone());
                run.cancel.cancel();
            }
            let mut r = blank_record(task, status, &progress, attempt);
            r.stop_reason = StopReason::Error.as_str().into();
            r.error = Some(reason);
            return Attempt::Done(Box::new(r));
        }
    };
    let held = Instant::now();
    let (attempt_result, healthy) = episode_in(run, task, transcript, attempt, &mut warm, progress);
    let sandbox = SandboxRecord {
        id: Some(warm.sandbox.id().to_string()),
        reused: warm.reused,
        seconds: held.elapsed().as_secs_f64(),
    };
    // A release failure (a kill we could not prove) is the pool's to report at close.
    let _ = run.pool.release(warm, healthy);
    match attempt_result {
        Attempt::Done(mut r) => {
            r.sandbox = sandbox;
            Attempt::Done(r)
        }
        other => other,
    }
}

/// Prepares the workspace, runs the episode and the verify. Returns the attempt and whether
/// the sandbox may be reused.
fn episode_in(
    run: &EvalRun<'_>,
    task: &Task,
    transcript: &mut Transcript,
    attempt: u32,
    warm: &mut Warm,
    mut progress: Progress,
) -> (Attempt, bool) {
    let sandbox = warm.sandbox.clone();
    let ws = run.pool.workspace_of(sandbox.as_ref());
    let wall = task
        .timeout_s
        .map_or(run.limits.episode_timeout, Duration::from_secs_f64);

    // Workspace: task files, then setup (not in a simulated environment).
    if run.world_model.is_none() {
        if let Err(attempt) = prepare_workspace(task, &sandbox, &ws, wall, &progress, attempt) {
            return attempt;
        }
    }

    // The episode.
    let tools = environment::default_tools();
    let config = EpisodeConfig {
        episode_id: crate::id::new_episode_id(),
        harness: run.harness.name().to_string(),
        system: environment::system_prompt(&ws, &tools),
        tools,
        files: run.harness.files(),
        max_turns: task.max_turns.unwrap_or(run.limits.max_turns),
        max_tool_actions: run.limits.max_tool_actions,
        max_output_tokens: run.limits.max_output_tokens,
        temperature: None,
        wall,
    };
    let env: Box<dyn Environment> = match &run.world_model {
        Some(model) => Box::new(WorldModelEnvironment::new(model.clone(), task)),
        None => Box::new(SandboxEnvironment::new(
            sandbox.clone(),
            ws.clone(),
            run.limits.bash_timeout,
        )),
    };
    let t_episode = Instant::now();
    let result = {
        let mut ep = Episode {
            task,
            config: &config,
            provider: run.provider.as_ref(),
            environment: env.as_ref(),
            cancel: &run.cancel,
            transcript,
        };
        episode::run_episode(&mut ep, &mut warm.channel)
    };
    progress.episode += t_episode.elapsed().as_secs_f64();
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            let p = e.partial();
            progress.turns += p.turns;
            progress.tool_calls += p.tool_calls;
            progress.tokens.input += p.tokens.input;
            progress.tokens.output += p.tokens.output;
            progress.tokens.calls += p.tokens.calls;
            progress.provider_retries += p.provider_retries;
            let reason = error_text(&e, sandbox.home());
            if e.is_transport() {
                return (
                    Attempt::Transport {
                        reason,
                        partial: progress,
                    },
                    false,
                );
            }
            let mut r = blank_record(task, Status::Error, &progress, attempt);
            r.stop_reason = StopReason::Error.as_str().into();
            r.error = Some(reason);
            return (Attempt::Done(Box::new(r)), false);
        }
    };
    let healthy = outcome.runner_idle
        && !matches!(
            outcome.stop_reason,
            StopReason::Budget | StopReason::Cancelled
        );
    if let Some(failure) = outcome.provider_failure.as_ref().filter(|f| f.stops_run) {
        // A refused key or an unknown model fails every task the same way: stop now, before
        // the rest are run (and scored) against it.
        let _ = run.fatal.set(failure.message.clone());
        run.cancel.cancel();
    }

    // The verdict.
    let t_verify = Instant::now();
    let verify = match (&task.verify, outcome.stop_reason) {
        // Without a model the agent never worked: the workspace says nothing about it.
        (Some(cmd), stop)
            if run.world_model.is_none()
                && outcome.provider_failure.is_none()
                && !matches!(stop, StopReason::Cancelled | StopReason::Error) =>
        {
            match sandbox.run(
                cmd,
                &RunOpts {
                    cwd: Some(ws.clone()),
                    timeout: wall,
                    max_output: VERIFY_TAIL,
                    ..RunOpts::default()
                },
            ) {
                Ok(out) => Some(VerifyRecord {
                    exit_code: out.exit_code,
                    timed_out: out.timed_out,
                    output_tail: format!("{}{}", out.stdout.to_text(), out.stderr.to_text()),
                }),
                Err(e) => {
                    let f = SandboxFailure::new(&e, "running verify", sandbox.home());
                    return f.end(task, &progress, attempt);
                }
            }
        }
        _ => None,
    };
    let verify_secs = t_verify.elapsed().as_secs_f64();
    let record = outcome_record(task, &outcome, verify, &progress, attempt, verify_secs);
    (Attempt::Done(Box::new(record)), healthy)
}

/// Writes the task's files and runs its setup. `Err` carries the attempt's end (and whether
/// the sandbox may be reused).
fn prepare_workspace(
    task: &Task,
    sandbox: &Arc<dyn crate::sandbox::Sandbox>,
    ws: &str,
    wall: Duration,
    progress: &Progress,
    attempt: u32,
) -> Result<(), (Attempt, bool)> {
    let failed = |e: &SandboxError, what: &str| {
        SandboxFailure::new(e, what, sandbox.home()).end(task, progress, attempt)
    };
    let mut paths = Vec::with_capacity(task.files.len());
    for (rel, content) in &task.files {
        match crate::sandbox::contained_path(ws, rel) {
            Ok(p) => paths.push((p, content)),
            Err(e) => {
                let detail = error_text(&e, sandbox.home());
                return Err((setup_error(task, progress, attempt, detail), true));
            }
        }
    }
    // The workspace is recreated empty from home, by its home-relative name (command text
    // names no absolute sandbox path). Without files, setup runs in the same command. The
    // setup is a group of its own lines, so a trailing `&` backgrounds only what the setup
    // says, never the workspace's creation.
    let rel = shell_quote(
        ws.strip_prefix(sandbox.home().trim_end_matches('/'))
            .unwrap_or(ws)
            .trim_start_matches('/'),
    );
    let fresh = format!("rm -rf {rel} && mkdir -p {rel}");
    let setup = task
        .setup
        .as_deref()
        .map(|s| format!("cd {rel} && {{\n{s}\n}}"));
    let opts = RunOpts {
        timeout: wall,
        max_output: SETUP_TAIL,
        ..RunOpts::default()
    };
    let setup_out = if paths.is_empty() {
        let all = match &setup {
            Some(s) => format!("{fresh} && {s}"),
            None => fresh,
        };
        sandbox.run(&all, &opts)
    } else {
        match sandbox.run(&fresh, &opts) {
            Ok(out) if out.exit_code == Some(0) => {}
            Ok(out) => {
                let detail = format!("cannot create the workspace: {}", out.stderr.to_text());
                let detail = without_home(detail, sandbox.home());
                return Err((setup_error(task, progress, attempt, detail), false));
            }
            Err(e) => return Err(failed(&e, "creating the workspace")),
        }
        for (path, content) in &paths {
            if let Err(e) = sandbox.write_file(path, content.as_bytes()) {
                return Err(failed(&e, "writing task files"));
            }
        }
        match &setup {
            Some(s) => sandbox.run(s, &opts),
            None => return Ok(()),
        }
    };
    match setup_out {
        Ok(out) if out.exit_code == Some(0) => Ok(()),
        Ok(out) => {
            let detail = format!(
                "setup failed ({}): {}{}",
                if out.timed_out {
                    "timed out".to_string()
                } else {
                    format!("exit {}", out.exit_code.map_or(-1, |c| c))
                },
                out.stdout.to_text(),
                out.stderr.to_text()
            );
            let detail = without_home(detail, sandbox.home());
            Err((setup_error(task, progress, attempt, detail), true))
        }
        Err(e) => Err(failed(&e, "running setup")),
    }
}

/// A sandbox call that failed, judged by its class where it was born: a transport failure
/// (the sandbox or its stream went away) may not recur on a fresh sandbox, so the episode is
/// replayed; anything else (a path the task names that cannot be written, say) would fail
/// the same way again, so it is the task's recorded error.
struct SandboxFailure {
    transport: bool,
    /// The sandbox itself is fine: only the request was wrong.
    reusable: bool,
    reason: String,
}

impl SandboxFailure {
    fn new(e: &SandboxError, what: &str, home: &str) -> SandboxFailure {
        SandboxFailure {
            transport: e.is_transport(),
            reusable: e.class() == ErrorClass::BadRequest,
            reason: format!("{what}: {}", error_text(e, home)),
        }
    }

    /// The attempt's end, and whether the sandbox may be reused.
    fn end(self, task: &Task, progress: &Progress, attempt: u32) -> (Attempt, bool) {
        if self.transport {
            let partial = progress.clone();
            let reason = self.reason;
            return (Attempt::Transport { reason, partial }, false);
        }
        (
            setup_error(task, progress, attempt, self.reason),
            self.reusable,
        )
    }
}

/// An error's text for a result, with the sandbox's home written `~`: on the local backend
/// the home is a directory of this host, and results are shared beyond it.
fn error_text(e: &dyn std::error::Error, home: &str) -> String {
    #[derive(Debug)]
    struct Text(String);
    impl std::fmt::Display for Text {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    impl std::error::Error for Text {}

    let mut text = String::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        if !text.is_empty() {
            text.push_str(": ");
        }
        // Each part before the chain is collapsed and cut, so no piece of a home survives.
        text.push_str(&without_home(err.to_string(), home));
        cur = err.source();
    }
    error_chain(&Text(text))
}

/// `text` with the sandbox's home written `~`.
fn without_home(text: String, home: &str) -> String {
    let home = home.trim_end_matches('/');
    if home.is_empty() {
        text
    } else {
        text.replace(home, "~")
    }
}

fn setup_error(task: &Task, p: &Progress, attempt: u32, detail: String) -> Attempt {
    let mut r = blank_record(task, Status::Error, p, attempt);
    r.stop_reason = StopReason::Error.as_str().into();
    r.error = Some(detail);
    Attempt::Done(Box::new(r))
}

fn outcome_record(
    task: &Task,
    o: &EpisodeOutcome,
    verify: Option<VerifyRecord>,
    p: &Progress,
    attempt: u32,
    verify_secs: f64,
) -> TaskRecord {
    // A provider that could not serve the episode is an infrastructure error, not a verdict:
    // `provider_error` with status `error` is what `--resume` runs again.
    let (stop_reason, error) = match (&o.provider_failure, o.stop_reason) {
        (Some(f), stop) if stop != StopReason::Cancelled => {
            (StopReason::ProviderError, Some(f.message.clone()))
        }
        _ => (o.stop_reason, o.note.clone()),
    };
    let status = match (stop_reason, &verify) {
        (StopReason::Cancelled, _) => Status::Cancelled,
        _ if o.provider_failure.is_some() => Status::Error,
        (StopReason::Error, _) => Status::Error,
        (_, Some(v)) if v.exit_code == Some(0) && !v.timed_out => Status::Passed,
        (_, Some(_)) => Status::Failed,
        (StopReason::Submit, None) => Status::Passed,
        (_, None) => Status::Failed,
    };
    let mut tokens = p.tokens;
    tokens.input += o.tokens.input;
    tokens.output += o.tokens.output;
    tokens.calls += o.tokens.calls;
    TaskRecord {
        id: task.id.clone(),
        status,
        stop_reason: stop_reason.as_str().into(),
        answer: o.answer.clone(),
        verify,
        turns: p.turns + o.turns,
        tool_calls: p.tool_calls + o.tool_calls,
        tokens,
        sandbox: SandboxRecord {
            id: None,
            reused: false,
            seconds: 0.0,
        },
        timings: Timings {
            acquire: p.acquire,
            episode: p.episode,
            verify: verify_secs,
        },
        attempts: attempt,
        retries: Retries {
            transport: 0,
            provider: p.provider_retries + o.provider_retries,
        },
        error,
    }
}
