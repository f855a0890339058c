//! Pausing a sandbox and resuming it, from this wmo-e2b process or any other.
//!
//! A pause first records itself in `meta.json` (its kind, when, and the timeout a resume
//! gives back), and from then on the sandbox serves no call and has no deadline: no watcher
//! or sweep ends it. A process start that raced the record sees it once its own process
//! record is written, and undoes itself (see `process`); one whose record came first is seen
//! by the pause. Then:
//! - **memory**: every process of the sandbox's namespaces is stopped where it is (see
//!   `freeze`), and a resume continues them, output and exits reaching their callers as
//!   before;
//! - **filesystem**: every process ends, as a kill ends them (see `teardown`), and the files
//!   (home, `/tmp`, system directory) stay; a resume starts new holders: a reboot, with no
//!   runner and no service.
//!
//! A resume gives the sandbox a deadline again: the timeout it was created with, from now
//! (E2B's connect gives the timeout it is sent, which callers here set afterwards).
//!
//! Every pause and resume holds the sandbox directory's lock (see `DirLock`) throughout, so
//! two of them never interleave, and no other rewrite of `meta.json` loses the record. A
//! sandbox whose deadline passed is paused (or killed) here first, whoever notices it: the
//! watcher, a sweep, a list, a connect.

use std::sync::Arc;

use super::freeze::{self, Namespaces};
use super::meta::{self, DirLock, Meta, PauseMode, PausedRecord, PROCS_DIR};
use super::ns::{self, Space};
use super::proc_table::KILL_WAIT;
use super::state::{Mode, SandboxState};
use super::teardown;
use crate::sandbox::{OnTimeout, PauseKind, Paused, Result, RunState, SandboxError};
use crate::sync::lock;

/// How a paused sandbox comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// As it was paused: a memory pause continues its processes, a filesystem pause
    /// reboots.
    AsPaused,
    /// Rebooted either way: the processes of a memory pause end (E2B's `memory: false`).
    Reboot,
}

/// What a resume found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// It ran already; nothing was done.
    WasRunning,
    /// It was paused and runs now.
    Now,
}

/// Pauses a running sandbox; `AlreadyPaused` when it is paused, `Gone` when it died.
pub(super) fn pause(state: &Arc<SandboxState>, kind: PauseKind) -> Result<Paused> {
    if kind == PauseKind::Memory && matches!(state.mode, Mode::None) {
        return Err(memory_needs_bwrap());
    }
    let held = state.lock_meta()?;
    let m = state.read_meta()?;
    if m.paused.is_some() {
        return Ok(Paused::AlreadyPaused);
    }
    if m.expired_at(meta::now_ms()) && m.on_timeout() == OnTimeout::Kill {
        state.destroy()?;
        return Err(state.gone());
    }
    pause_held(state, &held, &m, kind)?;
    Ok(Paused::Now)
}

/// Brings the sandbox where its deadline sends it, if that passed (killed, or paused), and
/// says whether it runs or is paused; `Gone` once it is dead.
pub(super) fn settle(state: &Arc<SandboxState>) -> Result<RunState> {
    let held = state.lock_meta()?;
    let m = state.read_meta()?;
    if m.paused.is_some() {
        return Ok(RunState::Paused);
    }
    if !m.expired_at(meta::now_ms()) {
        return Ok(RunState::Running);
    }
    match m.on_timeout() {
        OnTimeout::Kill => {
            state.destroy()?;
            Err(state.gone())
        }
        OnTimeout::Pause(kind) => {
            pause_held(state, &held, &m, kind)?;
            Ok(RunState::Paused)
        }
    }
}

/// Resumes a paused sandbox (one whose deadline passed is paused first, as it would have
/// been), giving it its timeout again from now.
pub(super) fn resume(state: &Arc<SandboxState>, how: Resume) -> Result<Resumed> {
    let held = state.lock_meta()?;
    let mut m = state.read_meta()?;
    if m.paused.is_none() {
        if !m.expired_at(meta::now_ms()) {
            return Ok(Resumed::WasRunning);
        }
        match m.on_timeout() {
            OnTimeout::Kill => {
                state.destroy()?;
                return Err(state.gone());
            }
            OnTimeout::Pause(kind) => m = pause_held(state, &held, &m, kind)?,
        }
    }
    let Some(record) = m.paused else {
        return Ok(Resumed::WasRunning);
    };
    if how == Resume::Reboot || record.kind == PauseMode::Filesystem {
        // Also after a filesystem pause: one that failed may have left a process behind.
        end_every_process(state)?;
        if let Mode::Bwrap(bwrap) = state.mode {
            state.start_holder(bwrap, Space::Sandbox)?;
            state.start_holder(bwrap, Space::Task)?;
        }
    } else {
        freeze::resume(&namespaces(state), &record.kept_stopped)
            .map_err(|e| state.io_error("continuing the sandbox's processes", e))?;
    }
    state.rewrite_meta(&held, |m| {
        m.paused = None;
        m.deadline = meta::deadline_after(record.timeout);
    })?;
    if let Mode::Bwrap(bwrap) = state.mode {
        state.prepare_spare(bwrap);
    }
    Ok(Resumed::Now)
}

/// Pauses the running sandbox `m` describes, the lock held; returns the record written.
fn pause_held(
    state: &Arc<SandboxState>,
    held: &DirLock,
    m: &Meta,
    kind: PauseKind,
) -> Result<Meta> {
    if kind == PauseKind::Memory && matches!(state.mode, Mode::None) {
        return Err(memory_needs_bwrap());
    }
    let record = PausedRecord {
        kind: kind.into(),
        at: meta::now_ms() / 1000,
        timeout: m.resume_timeout(),
        kept_stopped: Vec::new(),
    };
    let paused = state.rewrite_meta(held, |m| m.paused = Some(record))?;
    // A spare namespace still being made would start its processes after the pause; the
    // next reset makes another.
    if let Some(spare) = state.take_spare() {
        // A spare that will not die is ended with the sandbox: it is recorded.
        if let Ok(true) = spare.kill(KILL_WAIT) {
            ns::forget(&state.dir, Space::Spare);
        }
    }
    match kind {
        PauseKind::Filesystem => {
            end_every_process(state)?;
            Ok(paused)
        }
        PauseKind::Memory => {
            let mut kept = Vec::new();
            let stopped = freeze::stop(&namespaces(state), &state.dir.join(PROCS_DIR), &mut kept);
            if let Err(e) = stopped {
                // Back to running, as before: a half-stopped sandbox must not stay.
                let _ = freeze::resume(&namespaces(state), &kept);
                let _ = state.rewrite_meta(held, |m| m.paused = None);
                if let Mode::Bwrap(bwrap) = state.mode {
                    state.prepare_spare(bwrap);
                }
                return Err(state.io_error("stopping the sandbox's processes", e));
            }
            if kept.is_empty() {
                return Ok(paused);
            }
            state.rewrite_meta(held, |m| {
                if let Some(p) = &mut m.paused {
                    p.kept_stopped = kept;
                }
            })
        }
    }
}

/// Ends every process of the sandbox as a kill does, proven, and forgets them and its
/// holders; the files stay.
fn end_every_process(state: &SandboxState) -> Result<()> {
    let records = teardown::end_processes(&state.dir, &state.id, Some(&state.procs))?;
    for space in [Space::Task, Space::Spare, Space::Sandbox] {
        ns::forget(&state.dir, space);
    }
    state.forget_holders();
    let mut table = lock(&state.procs);
    for rec in &records {
        table.remove(&rec.pid);
        meta::remove_proc_record(&state.dir, rec.pid);
    }
    Ok(())
}

/// The PID namespaces the sandbox's holders hold now.
fn namespaces(state: &SandboxState) -> Namespaces {
    Namespaces::of(&ns::recorded(&state.dir))
}

fn memory_needs_bwrap() -> SandboxError {
    SandboxError::Unsupported(
        "a memory pause needs --isolation bwrap: without namespaces the processes a \
         sandbox detached cannot all be found"
            .into(),
    )
}
