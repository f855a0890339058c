//! Stopping the agent before its work is verified: every process the task started is ended
//! and proven gone (as `reset` ends them: the task namespace's PID 1, then the recorded
//! groups), a fresh task namespace takes its place (as root, the namespace is swept instead
//! and kept unless the agent left something in it), and the verifier's `HOME`, `TMPDIR` and
//! `/tests` are made empty, so that nothing of the agent runs, or waits, where the verifier
//! will.
//!
//! With the runner too (a harness whose code the host does not vouch for ran in it), the
//! sandbox's own namespace is killed instead, which takes the runner, whatever it started
//! (however it detached), and the task namespaces nested in it; both namespaces are then
//! started anew for the verifier. Such a sandbox has no runner left and is never reused.
//!
//! Under `--isolation none` nothing can be proven: the recorded groups are killed, and a task
//! process that left its group lives on (the README says so).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use super::meta::{self, PROCS_DIR, TESTS_DIR};
use super::ns::{self, Space};
use super::proc_table::KILL_WAIT;
use super::reset::{end_task_groups, end_task_processes, sweep, Swept};
use super::snapshot::empty_dir;
use super::state::{Mode, SandboxState};
use super::sys;
use super::teardown;
use crate::sandbox::{Result, Role, SandboxError};
use crate::sync::lock;

pub(super) fn stop_agent(state: &Arc<SandboxState>, runner_too: bool) -> Result<()> {
    let unclean = |reason: String| SandboxError::Unclean {
        id: state.id.clone(),
        reason: format!("the agent cannot be proven stopped: {reason}"),
    };
    let records = meta::read_proc_records(&state.dir.join(PROCS_DIR))
        .map_err(|e| unclean(format!("cannot read its process records: {e}")))?;
    match state.mode {
        Mode::Bwrap(bwrap) if runner_too => {
            // A spare still being made would join the namespace killed next.
            let _ = state.take_spare();
            let sandbox = ns::read(&state.dir, Space::Sandbox).ok();
            end_every_process(state, sandbox, &records).map_err(unclean)?;
            state.forget_holders();
            state.start_holder(bwrap, Space::Sandbox)?;
            state.start_holder(bwrap, Space::Task)?;
            state.prepare_spare(bwrap);
        }
        // As root the holder's own processes are root's and the task's are not, so the task
        // namespace can be swept from inside and kept: the verifier needs no new one, unless
        // the task left something in it. On an image the agent's work is in the namespace's
        // layer, which the verifier must see: that namespace is kept whatever the sweep found.
        Mode::Bwrap(bwrap) if bwrap.is_root() => {
            let holder = state.holder(Space::Task)?;
            let swept = sweep(&holder)
                .map_err(|why| unclean(format!("sweeping its task namespace: {why}")))?;
            match swept {
                Swept::Leftovers if state.image.is_none() => {
                    end_task_processes(state, Some(holder), &records).map_err(unclean)?;
                    state.replace_task_namespace(bwrap)?;
                }
                Swept::Empty | Swept::Leftovers => {
                    end_task_groups(state, &records).map_err(unclean)?
                }
            }
        }
        Mode::Bwrap(bwrap) => {
            let holder = ns::read(&state.dir, Space::Task).ok();
            end_task_processes(state, holder, &records).map_err(unclean)?;
            state.replace_task_namespace(bwrap)?;
        }
        Mode::None => {
            let roles = |r: &&meta::ProcRecord| runner_too || r.role != Role::System;
            let alive =
                teardown::kill_recorded_groups(records.iter().filter(roles), Some(&state.procs))
                    .map_err(|(pgid, e)| {
                        unclean(format!("cannot kill process group {pgid}: {e}"))
                    })?;
            if !alive.is_empty() {
                return Err(unclean(format!(
                    "process groups {alive:?} still run {} s after SIGKILL",
                    KILL_WAIT.as_secs()
                )));
            }
        }
    }
    ready_verifier(state).map_err(|e| SandboxError::Io {
        id: state.id.clone(),
        what: "making the verifier's directories".into(),
        source: e,
    })
}

/// Kills the sandbox's namespace, which ends every process in it and in the namespaces
/// nested in it, then every recorded group (their launchers outside), and proves them gone.
fn end_every_process(
    state: &SandboxState,
    sandbox: Option<ns::Holder>,
    records: &[meta::ProcRecord],
) -> std::result::Result<(), String> {
    if let Some(holder) = sandbox {
        match holder.kill(KILL_WAIT) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "its namespace still runs {} s after SIGKILL",
                    KILL_WAIT.as_secs()
                ))
            }
            Err(e) => return Err(format!("cannot kill its namespace: {e}")),
        }
    }
    for h in ns::recorded(&state.dir) {
        // Nested in the namespace just killed; their launchers outside are left.
        let _ = h.kill(KILL_WAIT);
    }
    let alive = teardown::kill_recorded_groups(records, Some(&state.procs))
        .map_err(|(pgid, e)| format!("cannot kill process group {pgid}: {e}"))?;
    if !alive.is_empty() {
        return Err(format!(
            "process groups {alive:?} still run {} s after SIGKILL",
            KILL_WAIT.as_secs()
        ));
    }
    let mut table = lock(&state.procs);
    for rec in records {
        table.remove(&rec.pid);
        meta::remove_proc_record(&state.dir, rec.pid);
    }
    Ok(())
}

/// Empties `/tests` and makes the verifier's `HOME` and `TMPDIR` anew, owned by it: nothing
/// the agent could have put there (in a user namespace it shares the verifier's uid) is left.
pub(super) fn ready_verifier(state: &SandboxState) -> io::Result<()> {
    clear_verifier(state)?;
    let owner = state.verifier_owner();
    make_dir(&state.verifier, 0o755, None)?;
    for sub in ["home", "tmp"] {
        make_dir(&state.verifier.join(sub), 0o700, owner)?;
    }
    // `/logs/verifier`: the verifier's to write, anyone's to read. `/logs` was emptied
    // above, so nothing the agent put there is left.
    make_dir(&state.logs.join("verifier"), 0o755, owner)?;
    Ok(())
}

/// Empties `/tests` and the verifier's directory (a reset does, once the verifier is gone).
pub(super) fn clear_verifier(state: &SandboxState) -> io::Result<()> {
    // `/tests` is the sandbox user's, so that E2B's scripts, which the emulator runs as that
    // user, can empty it too; task namespaces see it read-only.
    for (dir, owner) in [
        (state.dir.join(TESTS_DIR), state.file_owner()),
        (state.verifier.clone(), None),
        // The sandbox user's, as `/tests` is, so E2B's root in the emulator can make
        // `/logs/verifier` there.
        (state.logs.clone(), state.file_owner()),
    ] {
        match empty_dir(&dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => make_dir(&dir, 0o755, owner)?,
            other => other?,
        }
    }
    Ok(())
}

fn make_dir(path: &Path, mode: u32, owner: Option<u32>) -> io::Result<()> {
    match fs::create_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    if let Some(uid) = owner {
        sys::chown(path, uid)?;
    }
    Ok(())
}
