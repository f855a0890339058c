//! Proven clean reuse: `seal` keeps a copy of the home and `/tmp` as they are; `reset` ends
//! every task process and puts both back, then checks that they match the copy.
//!
//! Processes: every [`Role::Task`] process lives in the sandbox's task PID namespace, so
//! killing its PID 1 ends them all, `setsid`, `nohup` and double forks included, and PID 1 is
//! not gone until they are. Only then are the directories touched, so nothing of the task can
//! write behind the reset. The task namespace is kept for the next task when it is proven as
//! fresh as a new one: no task process ever entered it (every entry marks it first:
//! `ns::mark_entered`), or, as root on a sandbox with no image, a sweep from inside ended
//! every task process and found nothing they left (see `enter::sweep`). Otherwise a fresh one
//! takes its place. Keeping it is what lets a task cost no mount namespace, no `pivot_root`
//! and no holder's processes; an image's namespace is never kept, since what the task wrote
//! over the image is in its layer, which only a new namespace leaves behind.
//!
//! Only bwrap sandboxes can be proven clean: an unconfined process can leave its process group
//! and the host's `/tmp` is shared, so `reset` refuses under `--isolation none` and the caller
//! retires the sandbox instead.

use std::path::PathBuf;
use std::sync::Arc;

use super::enter::{Request, SWEEP_LEFTOVERS};
use super::meta::{self, ProcRecord, PROCS_DIR, ROOT_DIR, SEALED_DIR, TMP_DIR};
use super::ns::{self, Holder, Space};
use super::proc_table::KILL_WAIT;
use super::snapshot::{
    copy_tree, empty_dir, first_difference, manifest, remove_tree, Entry, Sealed, SealedTree,
    SnapshotError,
};
use super::state::{Mode, SandboxState};
use super::{probe, teardown};
use crate::sandbox::{Result, Role, SandboxError};
use crate::sync::lock;

/// The sandbox's own directories that a reset restores.
fn restored(state: &SandboxState) -> [(PathBuf, &'static str); 2] {
    [
        (state.dir.join(ROOT_DIR), "home"),
        (state.dir.join(TMP_DIR), "tmp"),
    ]
}

pub(super) fn seal(state: &SandboxState) -> Result<()> {
    let unclean = |reason: String| SandboxError::Unclean {
        id: state.id.clone(),
        reason,
    };
    if let Mode::None = state.mode {
        // Nothing to keep: a reset under --isolation none is refused anyway.
        return Ok(());
    }
    let mut guard = lock(&state.sealed);
    let base = state.dir.join(SEALED_DIR);
    remove_tree(&base).map_err(|e| unclean(format!("cannot clear the sealed copy: {e}")))?;
    meta::private_dir(&base).map_err(|e| unclean(format!("cannot keep a sealed copy: {e}")))?;
    let mut trees = Vec::new();
    let keep_owner = state.file_owner().is_some();
    for (live, name) in restored(state) {
        let copy = base.join(name);
        let mut count = 0;
        copy_tree(&live, &copy, keep_owner, &mut count)
            .map_err(|e| unclean(format!("cannot copy the {name} directory aside: {e}")))?;
        let listing = manifest(&copy).map_err(|e| unclean(format!("cannot list {name}: {e}")))?;
        trees.push(SealedTree {
            live,
            copy,
            listing,
        });
    }
    *guard = Some(Sealed { trees });
    Ok(())
}

pub(super) fn reset(state: &Arc<SandboxState>) -> Result<()> {
    let unclean = |reason: String| SandboxError::Unclean {
        id: state.id.clone(),
        reason,
    };
    let Mode::Bwrap(bwrap) = state.mode else {
        return Err(unclean(
            "under --isolation none a task's processes can leave their process group and its \
             /tmp is the host's, so the sandbox is not reused"
                .into(),
        ));
    };
    let guard = lock(&state.sealed);
    let Some(sealed) = guard.as_ref() else {
        return Err(unclean("it was never sealed".into()));
    };
    let records = meta::read_proc_records(&state.dir.join(PROCS_DIR))
        .map_err(|e| unclean(format!("cannot read its process records: {e}")))?;
    let holder = ns::read(&state.dir, Space::Task).ok();
    let kept = match holder.filter(Holder::is_alive) {
        // No task process entered it, so it holds nothing of the task's (and with no task
        // process recorded, no launcher outside it lives either).
        Some(h)
            if !ns::was_entered(&state.dir, &h)
                && records.iter().all(|r| r.role == Role::System) =>
        {
            true
        }
        Some(h) if state.reuses_task_namespace(bwrap) => {
            matches!(sweep(&h), Ok(Swept::Empty)) && end_task_groups(state, &records).is_ok()
        }
        _ => false,
    };
    if !kept {
        end_task_processes(state, holder, &records).map_err(unclean)?;
    }
    super::stop::clear_verifier(state).map_err(|e| {
        unclean(format!(
            "cannot empty /tests and the verifier's directory: {e}"
        ))
    })?;
    let keep_owner = state.file_owner().is_some();
    for (
        SealedTree {
            live,
            copy,
            listing,
        },
        (_, name),
    ) in sealed.trees.iter().zip(restored(state))
    {
        // The roots are emptied and given back their sealed mode, owner and extended
        // attributes, not replaced: they are bind-mounted into live namespaces (the runner's
        // keeps its binds across tasks), and a new directory would be invisible there. The
        // listing compared below covers the roots' own metadata, so this is proven as a
        // recreation would be.
        let restore = || -> std::result::Result<Vec<Entry>, SnapshotError> {
            empty_dir(live)?;
            let mut count = 0;
            copy_tree(copy, live, keep_owner, &mut count)?;
            manifest(live)
        };
        match restore() {
            Ok(now) if now == *listing => {}
            Ok(now) => {
                let first = first_difference(listing, &now);
                return Err(unclean(format!(
                    "its {name} directory differs from the sealed copy after the reset ({first})"
                )));
            }
            Err(e) => return Err(unclean(format!("cannot restore its {name} directory: {e}"))),
        }
    }
    drop(guard);
    if !kept {
        state.replace_task_namespace(bwrap)?;
        // What the task wrote over its image, its holder proven dead above.
        if let Some(old) = holder.filter(|h| h.layer != 0) {
            let layer = super::image_root::Layer::dir_of(&state.dir, old.layer);
            crate::deep_remove::remove_tree(&layer).map_err(|e| {
                unclean(format!("cannot remove the task's layer of its image: {e}"))
            })?;
        }
    }
    Ok(())
}

/// What a sweep of the task namespace found, every task process in it being gone.
pub(super) enum Swept {
    /// Nothing of the task's: the namespace is as fresh as a new one.
    Empty,
    /// Something the task made: an IPC object, a message queue, a `/dev/shm` file.
    Leftovers,
}

/// Kills every task process of the task namespace from inside it, as root (see
/// `enter::sweep`), and looks for what they left there. `Err`: they could not be proven gone.
pub(super) fn sweep(holder: &Holder) -> std::result::Result<Swept, String> {
    match probe::runs(Request::Sweep { holder }.command(&[]), "the sweep") {
        Ok(()) => Ok(Swept::Empty),
        Err(f) if f.code == Some(SWEEP_LEFTOVERS) => Ok(Swept::Leftovers),
        Err(f) => Err(f.why),
    }
}

/// Kills every task process and proves them gone: all of them by the task namespace's PID 1,
/// then the recorded ones by their groups (which hold their host-side launchers; see
/// `Holder::kill` for the order).
pub(super) fn end_task_processes(
    state: &SandboxState,
    holder: Option<Holder>,
    records: &[ProcRecord],
) -> std::result::Result<(), String> {
    if let Some(holder) = holder {
        match holder.kill(KILL_WAIT) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "its task namespace still runs {} s after SIGKILL",
                    KILL_WAIT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot kill its task namespace: {e}")),
        }
    }
    end_task_groups(state, records)
}

/// Kills the recorded task process groups (their launchers outside the namespace, once the
/// processes inside are gone), proves them gone, and drops their records.
pub(super) fn end_task_groups(
    state: &SandboxState,
    records: &[ProcRecord],
) -> std::result::Result<(), String> {
    let tasks = || records.iter().filter(|r| r.role != Role::System);
    let alive = teardown::kill_recorded_groups(tasks(), Some(&state.procs))
        .map_err(|(pgid, e)| format!("cannot kill process group {pgid}: {e}"))?;
    if !alive.is_empty() {
        return Err(format!(
            "task process groups {alive:?} still run {} s after SIGKILL",
            KILL_WAIT.as_secs()
        ));
    }
    let mut table = lock(&state.procs);
    for rec in tasks() {
        table.remove(&rec.pid);
        meta::remove_proc_record(&state.dir, rec.pid);
    }
    Ok(())
}
