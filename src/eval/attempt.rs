//! One task's attempts: each on a pooled sandbox, the workspace prepared, the episode run
//! through the broker, the work verified. A transport failure (the sandbox or its runner went
//! away) is replayed on a fresh sandbox up to the run's limit.

use std::path::Path;
use std::time::{Duration, Instant};

use super::outcome::{Attempt, Progress};
use super::results::{SandboxRecord, Status, TaskRecord, VerifyRecord};
use super::verdict::{error_record, outcome_record};
use super::workspace::{error_text, prepare_workspace, SandboxFailure};
use super::{EvalEvent, EvalRun};
use crate::environment::{self, Environment, SandboxEnvironment, WorldModelEnvironment};
use crate::episode::{
    self, Episode, EpisodeConfig, EpisodeOutcome, Opening, StopReason, Transcript,
};
use crate::errors::error_chain;
use crate::pool::{PoolError, Warm};
use crate::sandbox::RunOpts;
use crate::task::Task;

/// Bytes of verify output kept in a result.
const VERIFY_TAIL: usize = 2048;

/// Runs `task` to its record.
pub(super) fn run_task(run: &EvalRun<'_>, task: &Task, transcripts: &Path) -> TaskRecord {
    let transcript_path = transcripts.join(format!("{}.jsonl", task.id));
    let mut transcript =
        Transcript::append(&transcript_path).unwrap_or_else(|_| Transcript::disabled());
    let mut carried = Progress::default();
    let mut attempt = 0;
    let mut record = loop {
        attempt += 1;
        transcript.note(&format!("attempt {attempt}"));
        match run_attempt(run, task, &mut transcript, attempt, &carried) {
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
    let held = Instant::now();
    let (result, healthy) = episode_in(run, task, transcript, attempt, &mut warm, progress);
    let sandbox = SandboxRecord {
        id: Some(warm.sandbox.id().to_string()),
        reused: warm.reused,
        seconds: held.elapsed().as_secs_f64(),
    };
    // A release failure (a kill we could not prove) is the pool's to report at close.
    let _ = run.pool.release(warm, healthy);
    match result {
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
        if let Err(end) = prepare_workspace(task, &sandbox, &ws, wall, &progress, attempt) {
            return end;
        }
    }

    // The episode.
    let t_episode = Instant::now();
    let result = run_episode(run, task, transcript, warm, &ws, wall);
    progress.episode += t_episode.elapsed().as_secs_f64();
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

    // The verdict.
    let t_verify = Instant::now();
    let verify_timeout = task
        .verify_timeout_s
        .map_or(run.limits.verify_timeout, Duration::from_secs_f64);
    let verify = match verify(run, task, &outcome, warm, &ws, verify_timeout) {
        Ok(v) => v,
        Err(f) => return f.end(task, &progress, attempt),
    };
    let verify_secs = t_verify.elapsed().as_secs_f64();
    let record = outcome_record(task, &outcome, verify, &progress, attempt, verify_secs);
    (Attempt::Done(Box::new(record)), healthy)
}

/// The task's episode on `warm`, through the broker.
fn run_episode(
    run: &EvalRun<'_>,
    task: &Task,
    transcript: &mut Transcript,
    warm: &mut Warm,
    ws: &str,
    wall: Duration,
) -> Result<EpisodeOutcome, episode::EpisodeError> {
    let tools = environment::default_tools();
    let mut config = EpisodeConfig {
        episode_id: crate::id::new_episode_id(),
        harness: run.harness.name().to_string(),
        system: environment::system_prompt(ws, &tools),
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
        temperature: None,
        wall,
        skills: None,
    };
    if let Some(skills) = &run.skills {
        config.offer_skills(skills.clone());
    }
    let env: Box<dyn Environment> = match &run.world_model {
        Some(model) => Box::new(WorldModelEnvironment::new(model.clone(), task)),
        None => Box::new(SandboxEnvironment::new(
            warm.sandbox.clone(),
            ws.to_string(),
            run.limits.bash_timeout,
        )),
    };
    let mut ep = Episode {
        opening: Opening::Episode {
            instruction: &task.instruction,
        },
        label: &task.id,
        script: task.model_script.as_deref(),
        config: &config,
        provider: run.provider.as_ref(),
        environment: env.as_ref(),
        cancel: run.control.cancel_token(),
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

/// Runs the task's `verify` when the agent's work can be judged at all.
fn verify(
    run: &EvalRun<'_>,
    task: &Task,
    outcome: &EpisodeOutcome,
    warm: &Warm,
    ws: &str,
    timeout: Duration,
) -> Result<Option<VerifyRecord>, SandboxFailure> {
    let Some(cmd) = &task.verify else {
        return Ok(None);
    };
    // Without a model the agent never worked, and in a simulated environment nothing ran:
    // the workspace says nothing about the agent then.
    if run.world_model.is_some()
        || outcome.provider_failure.is_some()
        || matches!(
            outcome.stop_reason,
            StopReason::Cancelled | StopReason::Error
        )
    {
        return Ok(None);
    }
    let sandbox = &warm.sandbox;
    let opts = RunOpts {
        cwd: Some(ws.to_string()),
        timeout,
        max_output: VERIFY_TAIL,
        ..RunOpts::default()
    };
    match sandbox.run(cmd, &opts) {
        Ok(out) => Ok(Some(VerifyRecord {
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            output_tail: format!("{}{}", out.stdout.to_text(), out.stderr.to_text()),
        })),
        Err(e) => Err(SandboxFailure::new(&e, "running verify", sandbox.home())),
    }
}
