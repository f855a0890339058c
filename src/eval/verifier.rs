//! The verify phase of an attempt, after the agent's: the agent is stopped and proven gone,
//! the task's tests arrive, and `verify` runs as the verifier (see [`Role::Verify`]) on the
//! files the agent left, in its sandbox or (`--verifier separate`) in a fresh one of the same
//! environment with the workspace copied in.

use std::sync::Arc;
use std::time::Duration;

use super::attempt::Held;
use super::results::VerifyRecord;
use super::reward;
use super::workspace::{error_text, SandboxFailure};
use super::EvalRun;
use crate::pool::Warm;
use crate::sandbox::{contained_path, shell_quote, Role, RunOpts, Sandbox, TESTS_DIR};
use crate::task::Task;

/// Bytes of verify output kept in a result.
const VERIFY_TAIL: usize = 2048;
/// The largest workspace `--verifier separate` copies (as a tar stream, held in memory).
const MAX_WORKSPACE_COPY: usize = 64 << 20;
/// Bound on packing or unpacking the workspace for a separate verifier.
const COPY_TIMEOUT: Duration = Duration::from_secs(300);
/// Where the copied workspace's archive waits in the fresh sandbox, home-relative.
const ARCHIVE: &str = ".wmo-e2b-workspace.tar";

/// Where `verify` runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VerifierMode {
    /// In the agent's sandbox, once the agent is stopped.
    #[default]
    Same,
    /// In a fresh sandbox of the same environment, with the workspace copied in.
    Separate,
}

/// How the verify phase went: its record, and whether the agent's sandbox may be reused.
pub(super) struct Verified {
    pub record: Option<VerifyRecord>,
    pub reusable: bool,
}

/// Stops the agent in `warm` and runs the task's `verify`. `judged` is false when the
/// agent's work says nothing (no model answered, the episode failed): verify is not run
/// then, and the agent is left to the reset.
pub(super) fn verify(
    run: &EvalRun<'_>,
    task: &Task,
    judged: bool,
    warm: &Warm,
    ws: &str,
    timeout: Duration,
) -> Result<Verified, SandboxFailure> {
    // Code the host does not vouch for ran in the runner itself: its memory cannot be proven
    // clean, so the runner is ended with the agent and the sandbox is not reused.
    let runner_too = !run.harness.vouched();
    let Some(cmd) = task.verify.as_deref().filter(|_| judged) else {
        return Ok(Verified {
            record: None,
            reusable: !runner_too,
        });
    };
    let sandbox = &warm.sandbox;
    sandbox
        .stop_agent(runner_too)
        .map_err(|e| SandboxFailure::stopped(&e, sandbox.home()))?;
    let record = match run.verifier {
        VerifierMode::Same => verify_in(sandbox, task, cmd, ws, timeout)?,
        VerifierMode::Separate => match pack_workspace(sandbox, ws)? {
            Ok(archive) => verify_separately(run, task, cmd, &archive, timeout)?,
            Err(why) => VerifyRecord {
                exit_code: None,
                timed_out: false,
                output_tail: why,
                reward: None,
            },
        },
    };
    Ok(Verified {
        record: Some(record),
        reusable: !runner_too,
    })
}

/// Writes the task's tests and runs `cmd` as the verifier at `ws`; the agent is stopped.
fn verify_in(
    sandbox: &Arc<dyn Sandbox>,
    task: &Task,
    cmd: &str,
    ws: &str,
    timeout: Duration,
) -> Result<VerifyRecord, SandboxFailure> {
    let failed =
        |e: &crate::sandbox::SandboxError, what: &str| SandboxFailure::new(e, what, sandbox.home());
    for (rel, content) in &task.tests {
        let path = contained_path(TESTS_DIR, rel).map_err(|e| failed(&e, "writing tests"))?;
        sandbox
            .write_file(&path, content.as_bytes())
            .map_err(|e| failed(&e, "writing tests"))?;
    }
    let opts = RunOpts {
        cwd: Some(ws.to_string()),
        role: Role::Verify,
        timeout,
        max_output: VERIFY_TAIL,
        // The task's verifier variables reach this command alone, never the agent's.
        envs: task
            .verify_env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    let out = sandbox
        .run(cmd, &opts)
        .map_err(|e| failed(&e, "running verify"))?;
    // Read whatever the exit: a test script may score and still exit non-zero.
    let reward = reward::read(sandbox).map_err(|e| failed(&e, "reading the reward"))?;
    Ok(VerifyRecord {
        exit_code: out.exit_code,
        timed_out: out.timed_out,
        output_tail: format!("{}{}", out.stdout.to_text(), out.stderr.to_text()),
        reward,
    })
}

/// The workspace as a tar stream, read as the verifier (nothing of the agent runs by now);
/// `Ok(Err(why))` when the agent's files cannot be copied (too large, unreadable), which
/// fails the task's verify.
fn pack_workspace(
    sandbox: &Arc<dyn Sandbox>,
    ws: &str,
) -> Result<Result<Vec<u8>, String>, SandboxFailure> {
    let opts = RunOpts {
        cwd: Some(sandbox.home().to_string()),
        role: Role::Verify,
        timeout: COPY_TIMEOUT,
        max_output: MAX_WORKSPACE_COPY,
        ..RunOpts::default()
    };
    let out = sandbox
        .run(&format!("tar -C {} -cf - .", shell_quote(ws)), &opts)
        .map_err(|e| SandboxFailure::new(&e, "copying the workspace", sandbox.home()))?;
    if out.stdout.dropped > 0 {
        return Ok(Err(format!(
            "the workspace is larger than the {} MiB a separate verifier copies",
            MAX_WORKSPACE_COPY >> 20
        )));
    }
    if out.exit_code != Some(0) {
        return Ok(Err(format!(
            "the workspace could not be copied for the verifier: {}",
            out.stderr.to_text()
        )));
    }
    let mut archive = out.stdout.head;
    archive.extend_from_slice(&out.stdout.tail);
    Ok(Ok(archive))
}

/// Unpacks `archive` as the workspace of a fresh sandbox from the pool and verifies there.
fn verify_separately(
    run: &EvalRun<'_>,
    task: &Task,
    cmd: &str,
    archive: &[u8],
    timeout: Duration,
) -> Result<VerifyRecord, SandboxFailure> {
    let mut held = Held {
        pool: &run.pool,
        warm: None,
    };
    let fresh = held.warm.insert(
        run.pool
            .acquire_for(run.environments.of(task))
            .map_err(SandboxFailure::no_sandbox)?,
    );
    let sandbox = fresh.sandbox.clone();
    let ws = run
        .pool
        .workspace_for(sandbox.as_ref(), run.environments.of(task));
    let result = (|| {
        let failed = |e: &crate::sandbox::SandboxError, what: &str| {
            SandboxFailure::new(e, what, sandbox.home())
        };
        let home = sandbox.home().trim_end_matches('/');
        sandbox
            .write_file(&format!("{home}/{ARCHIVE}"), archive)
            .map_err(|e| failed(&e, "copying the workspace in"))?;
        // Unpacked as the task's user, so the files are owned as the agent left them.
        let rel = shell_quote(ws.strip_prefix(home).unwrap_or(&ws).trim_start_matches('/'));
        let unpack = format!(
            "rm -rf {rel} && mkdir -p {rel} && tar -C {rel} -xf {ARCHIVE}; rc=$?; rm -f {ARCHIVE}; exit $rc"
        );
        let opts = RunOpts {
            cwd: Some(home.to_string()),
            timeout: COPY_TIMEOUT,
            max_output: VERIFY_TAIL,
            ..RunOpts::default()
        };
        let out = sandbox
            .run(&unpack, &opts)
            .map_err(|e| failed(&e, "copying the workspace in"))?;
        if out.exit_code != Some(0) {
            return Ok(VerifyRecord {
                exit_code: None,
                timed_out: out.timed_out,
                output_tail: format!(
                    "the workspace could not be unpacked for the verifier: {}",
                    out.stderr.to_text()
                ),
                reward: None,
            });
        }
        sandbox
            .stop_agent(false)
            .map_err(|e| SandboxFailure::stopped(&e, sandbox.home()))?;
        verify_in(&sandbox, task, cmd, &ws, timeout)
    })();
    // A release failure (a kill we could not prove) is the pool's to report at close.
    let _ = held.release(result.is_ok());
    result
}

impl SandboxFailure {
    /// The agent could not be proven stopped: its work cannot be judged, and a fresh
    /// sandbox would only let it try again, so this ends the task as an error. A stop that
    /// never reached the sandbox (a dropped stream) is a transport failure like any other.
    fn stopped(e: &crate::sandbox::SandboxError, home: &str) -> SandboxFailure {
        match e {
            crate::sandbox::SandboxError::Unclean { .. } => {
                SandboxFailure::task_error(format!("stopping the agent: {}", error_text(e, home)))
            }
            _ => SandboxFailure::new(e, "stopping the agent", home),
        }
    }

    fn no_sandbox(e: crate::pool::PoolError) -> SandboxFailure {
        SandboxFailure::task_error(format!(
            "could not get a sandbox for the separate verifier: {}",
            crate::errors::error_chain(&e)
        ))
    }
}
