//! One task's attempts: each on a pooled sandbox, the workspace prepared, the episode run
//! through the broker, the work verified. A transport failure (the sandbox or its runner went
//! away) is replayed on a fresh sandbox up to the run's limit. A task whose handling panics
//! ends as `error` and the run goes on: the sandbox it held is retired as the panic unwinds.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

use super::outcome::{Attempt, Progress};
use super::results::{SandboxRecord, Status, TaskRecord};
use super::sandbox_limits::within_limits;
use super::verdict::{error_record, limit_record, outcome_record};
use super::workspace::{error_text, prepare_workspace, SandboxFailure};
use super::{scripts, verifier, EvalEvent, EvalRun, Harness, Phase};
use crate::cancel::CancelToken;
use crate::environment::{self, Environment, SandboxEnvironment, WorldModelEnvironment};
use crate::episode::{
    self, Episode, EpisodeConfig, EpisodeOutcome, ModelBudget, Opening, StopReason, Transcript,
};
use crate::errors::{error_chain, panic_message};
use crate::pool::{Pool, PoolError, Warm};
use crate::task::{Solution, Task, SOLUTION_DIR};
use crate::terminal::escape;

/// Runs `task` to its record, whatever its handling does: a panic (a bug here, or in a
/// provider) ends this task as `error` with the panic's message instead of taking the run
/// down with it.
/// `k`: which of the task's attempts this is (from 1; `--attempts`).
pub(super) fn run_task_to_record(
    run: &EvalRun<'_>,
    task: &Task,
    k: u32,
    transcripts: &Path,
) -> TaskRecord {
    // Unwind safety: what a task shares with the rest of the run is behind poison-tolerant
    // locks (`sync::lock`) and atomics, and the sandbox it held is retired by `Held` as the
    // panic unwinds; nothing half-updated is read afterwards.
    match catch_unwind(AssertUnwindSafe(|| run_task(run, task, k, transcripts))) {
        Ok(record) => record,
        Err(payload) => {
            let why = escape(panic_message(payload.as_ref())).into_owned();
            let reason = format!("the task's handling failed (a bug in wmo-e2b): panicked: {why}");
            error_record(task, Status::Error, &Progress::default(), 1, reason)
        }
    }
}

/// A sandbox one attempt holds: handed back by [`Held::release`], or retired (killed, its
/// lease ended) when the attempt unwinds first, so a panic cannot leak it until the pool
/// closes.
pub(super) struct Held<'a> {
    pub pool: &'a Pool,
    pub warm: Option<Warm>,
}

impl Held<'_> {
    pub(super) fn release(mut self, healthy: bool) -> Result<(), PoolError> {
        match self.warm.take() {
            Some(warm) => self.pool.release(warm, healthy),
            None => Ok(()),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(warm) = self.warm.take() {
            let _ = self.pool.release(warm, false);
        }
    }
}

/// Runs `task` to its record.
fn run_task(run: &EvalRun<'_>, task: &Task, k: u32, transcripts: &Path) -> TaskRecord {
    if let Err(why) = scripts::harness_script(&run.harness, task) {
        return error_record(task, Status::Error, &Progress::default(), 1, why);
    }
    let transcript_path = transcripts.join(format!("{}.jsonl", task.id));
    let mut transcript =
        Transcript::append(&transcript_path).unwrap_or_else(|_| Transcript::disabled());
    let mut carried = Progress::default();
    let mut attempt = 0;
    let mut record = loop {
        attempt += 1;
        transcript.note(&format!("attempt {attempt}"));
        match run_attempt(run, task, k, &mut transcript, attempt, &carried) {
            Attempt::Done(record) => break *record,
            Attempt::Transport { reason, partial } => {
                carried = partial;
                transcript.note(&format!("attempt {attempt} failed: {reason}"));
                if attempt > run.limits.transport_retries || run.control.is_cancelled() {
                    let status = if run.control.is_cancelled() {
                        Status::Cancelled
                    } else {
                        Status::Error
                    };
                    break error_record(task, status, &carried, attempt, reason);
                }
                run.control.emit(EvalEvent::TaskRetrying {
                    id: task.id.clone(),
                    attempt: attempt + 1,
                    reason,
                });
            }
        }
    };
    record.retries.transport = attempt - 1;
    let _ = transcript.finish();
    record
}

fn run_attempt(
    run: &EvalRun<'_>,
    task: &Task,
    k: u32,
    transcript: &mut Transcript,
    attempt: u32,
    carried: &Progress,
) -> Attempt {
    let mut progress = carried.clone();
    let t0 = Instant::now();
    let acquired = run.pool.acquire_for(run.environments.of(task));
    progress.acquire += t0.elapsed().as_secs_f64();
    let acquired = match acquired {
        Ok(w) => w,
        Err(e) => {
            let reason = format!("could not get a sandbox: {}", error_chain(&e));
            if e.is_transport() && !matches!(e, PoolError::Closed) {
                return Attempt::Transport {
                    reason,
                    partial: progress,
                };
            }
            let status = if run.control.is_cancelled() {
                Status::Cancelled
            } else {
                Status::Error
            };
            if matches!(e, PoolError::Bootstrap(_)) && status == Status::Error {
                // A runner that cannot start for a reason a fresh sandbox will not fix (no
                // Node.js, a protocol mismatch) fails every task the same way: stop now.
                run.control.stop(reason.clone());
            }
            let mut r = error_record(task, status, &progress, attempt, reason);
            r.stop_reason = StopReason::Error;
            return Attempt::Done(Box::new(r));
        }
    };
    let mut held = Held {
        pool: &run.pool,
        warm: None,
    };
    let warm = held.warm.insert(acquired);
    let held_since = Instant::now();
    // A task that narrows the network below the pool's runs locked (a sandbox made with a
    // network cannot be given another), and the sandbox is unlocked for the next task.
    let locked = task_locks_network(run, task);
    if locked {
        if let Err(e) = warm.sandbox.set_internet(false) {
            let reason = format!("could not lock the sandbox's network: {}", error_chain(&e));
            let _ = held.release(false);
            return Attempt::Transport {
                reason,
                partial: progress,
            };
        }
    }
    let (result, healthy) = episode_in(run, task, k, transcript, attempt, warm, progress);
    let healthy = healthy && (!locked || warm.sandbox.set_internet(true).is_ok());
    let sandbox = SandboxRecord {
        id: Some(warm.sandbox.id().to_string()),
        reused: warm.reused,
        seconds: held_since.elapsed().as_secs_f64(),
    };
    // A release failure (a kill we could not prove) is the pool's to report at close.
    let _ = held.release(healthy);
    match result {
        Attempt::Done(mut r) => {
            r.sandbox = sandbox;
            Attempt::Done(r)
        }
        other => other,
    }
}

/// Whether `task` asks for less network than the run's sandboxes have. Only `none` can be
/// given to a pooled sandbox afterwards, so a task asking `internet` of a `host` run gets
/// `none`: narrower than it asked, never wider.
fn task_locks_network(run: &EvalRun<'_>, task: &Task) -> bool {
    task.network.is_some_and(|n| n < run.limits.network)
}

/// Prepares the workspace, runs the episode and the verify. Returns the attempt and whether
/// the sandbox may be reused.
fn episode_in(
    run: &EvalRun<'_>,
    task: &Task,
    k: u32,
    transcript: &mut Transcript,
    attempt: u32,
    warm: &mut Warm,
    mut progress: Progress,
) -> (Attempt, bool) {
    let sandbox = warm.sandbox.clone();
    let ws = run
        .pool
        .workspace_for(sandbox.as_ref(), run.environments.of(task));
    let wall = task
        .timeout_s
        .map_or(run.limits.episode_timeout, Duration::from_secs_f64);

    // The task's limits, in force from its setup on (a pooled sandbox had another task's).
    let limits = run.limits.sandbox.narrowed_by(task.limits.as_ref());
    if let Err(e) = sandbox.apply_limits(&limits) {
        let reason = error_text(&e, sandbox.home());
        return (
            Attempt::Transport {
                reason,
                partial: progress,
            },
            false,
        );
    }

    // Workspace: task files, then setup (not in a simulated environment).
    if run.world_model.is_none() {
        phase(run, task, k, Phase::Setup);
        if let Err(end) = prepare_workspace(task, &sandbox, &ws, wall, &progress, attempt) {
            return end;
        }
        if let (Harness::Oracle, Some(solution)) = (&run.harness, &task.solution) {
            if let Err(e) = upload_solution(solution, &sandbox) {
                let end = SandboxFailure::new(&e, "writing the reference solution", sandbox.home())
                    .end(task, &progress, attempt);
                return end;
            }
        }
    }

    // The episode.
    phase(run, task, k, Phase::Episode);
    let t_episode = Instant::now();
    let (result, hit) = within_limits(sandbox.as_ref(), run.control.cancel_token(), |cancel| {
        let terms = EpisodeTerms {
            ws: &ws,
            wall,
            budget: run.spend.task_budget(task, progress.counters.tokens),
        };
        run_episode(run, task, transcript, warm, terms, cancel)
    });
    progress.episode += t_episode.elapsed().as_secs_f64();
    // A limit ends the task as the agent's failure, whatever became of the episode (its
    // runner may be what the kernel killed); the sandbox is not used again.
    if let Some(hit) = hit.filter(|_| !run.control.is_cancelled()) {
        if let Err(e) = &result {
            progress.counters += e.partial();
        }
        let r = limit_record(task, hit, result.as_ref().ok(), &progress, attempt);
        return (Attempt::Done(Box::new(r)), false);
    }
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            progress.counters += e.partial();
            let reason = error_text(&e, sandbox.home());
            if e.is_transport() {
                let partial = progress;
                return (Attempt::Transport { reason, partial }, false);
            }
            let r = error_record(task, Status::Error, &progress, attempt, reason);
            return (Attempt::Done(Box::new(r)), false);
        }
    };
    let healthy = outcome.runner_idle
        && !matches!(
            outcome.stop_reason,
            StopReason::Timeout | StopReason::Cancelled
        );
    if let Some(failure) = outcome.provider_failure.as_ref().filter(|f| f.stops_run) {
        // A refused key or an unknown model fails every task the same way: stop now, before
        // the rest are run (and scored) against it.
        run.control.stop(failure.message.clone());
    }

    // The verdict: the agent stopped, then the verifier. Without a model the agent never
    // worked, and in a simulated environment nothing ran: the workspace says nothing about
    // the agent then.
    let judged = run.world_model.is_none()
        && outcome.provider_failure.is_none()
        && !matches!(
            outcome.stop_reason,
            StopReason::Cancelled | StopReason::Error
        );
    let t_verify = Instant::now();
    let verify_timeout = task
        .verify_timeout_s
        .map_or(run.limits.verify_timeout, Duration::from_secs_f64);
    phase(run, task, k, Phase::Verify);
    let verified = match verifier::verify(run, task, judged, warm, &ws, verify_timeout) {
        Ok(v) => v,
        Err(f) => return f.end(task, &progress, attempt),
    };
    let verify_secs = t_verify.elapsed().as_secs_f64();
    let record = outcome_record(
        task,
        &outcome,
        verified.record,
        &progress,
        attempt,
        verify_secs,
        run.limits.pass_threshold,
    );
    (
        Attempt::Done(Box::new(record)),
        healthy && verified.reusable,
    )
}

/// What an episode runs under: its workspace, its wall time and its model budget.
struct EpisodeTerms<'s> {
    ws: &'s str,
    wall: Duration,
    budget: ModelBudget,
}

/// The task's episode on `warm`, through the broker.
fn run_episode(
    run: &EvalRun<'_>,
    task: &Task,
    transcript: &mut Transcript,
    warm: &mut Warm,
    terms: EpisodeTerms<'_>,
    cancel: &CancelToken,
) -> Result<EpisodeOutcome, episode::EpisodeError> {
    let EpisodeTerms { ws, wall, budget } = terms;
    // An agent of its own brings its own prompt and tools.
    let own_agent = matches!(run.harness, Harness::Agent(_));
    let tools = match own_agent {
        true => Vec::new(),
        false => environment::default_tools(),
    };
    // Checked before the task started: a harness script is there when the harness has one.
    let harness_script = scripts::harness_script(&run.harness, task).ok().flatten();
    let mut config = EpisodeConfig {
        episode_id: crate::id::new_episode_id(),
        harness: run.harness.runner_loop().to_string(),
        system: match own_agent {
            true => String::new(),
            false => environment::system_prompt(ws, &tools),
        },
        tools,
        // A runner that holds these files already is told their digest only.
        files: match run.harness.files() {
            Some(h) if warm.harness_files.as_deref() != Some(h.digest.as_str()) => h.files.clone(),
            _ => serde_json::Map::new(),
        },
        files_digest: run.harness.files().map(|h| h.digest.clone()),
        max_turns: task.max_turns.unwrap_or(run.limits.max_turns),
        max_tool_actions: run.limits.max_tool_actions,
        max_output_tokens: run.limits.max_output_tokens,
        budget,
        temperature: None,
        wall,
        skills: None,
        agent: match &run.harness {
            Harness::Agent(agent) => Some(agent.launch()),
            _ => None,
        },
    };
    if let Some(skills) = &run.skills {
        config.offer_skills(skills.clone());
    }
    let env: Box<dyn Environment> = match &run.world_model {
        Some(model) => Box::new(WorldModelEnvironment::new(model.clone(), task)),
        None => Box::new(
            SandboxEnvironment::new(
                warm.sandbox.clone(),
                ws.to_string(),
                // The oracle's one command is the reference solution: the task's time is its.
                match run.harness {
                    Harness::Oracle => wall,
                    _ => run.limits.bash_timeout,
                },
            )
            .with_runner(warm.channel.pid()),
        ),
    };
    let mut ep = Episode {
        opening: Opening::Episode {
            instruction: &task.instruction,
        },
        label: &task.id,
        script: harness_script.as_deref().or(task.model_script.as_deref()),
        config: &config,
        provider: run.provider.as_ref(),
        environment: env.as_ref(),
        cancel,
        observer: transcript,
    };
    let outcome = episode::run_episode(&mut ep, &mut warm.channel);
    // The runner has the files now (it keeps what it is sent, even with an episode it then
    // refuses); a runner that failed is retired with its sandbox.
    if outcome.is_ok() {
        warm.harness_files = config.files_digest.clone();
    }
    outcome
}

/// Writes the reference solution's files under [`SOLUTION_DIR`] for the oracle to run.
fn upload_solution(
    solution: &Solution,
    sandbox: &std::sync::Arc<dyn crate::sandbox::Sandbox>,
) -> Result<(), crate::sandbox::SandboxError> {
    for (rel, content) in &solution.files {
        let path = crate::sandbox::contained_path(SOLUTION_DIR, rel)?;
        sandbox.write_file(&path, content.as_bytes())?;
    }
    Ok(())
}

/// Tells the reporter where the task's attempt `k` is now.
fn phase(run: &EvalRun<'_>, task: &Task, k: u32, phase: Phase) {
    run.control.emit(EvalEvent::TaskPhase {
        id: task.id.clone(),
        attempt: k,
        phase,
    });
}
