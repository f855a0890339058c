//! Killing a sandbox, from this wmo-e2b process or any other.
//!
//! A kill first renames the sandbox directory to a tombstone (`.dead-<id>-<rand>`). The rename
//! is atomic, so exactly one killer wins, `list` and `connect` stop seeing the sandbox at once,
//! and a process start racing the kill fails to record itself (its directory is gone) and
//! kills its own child. Then (under bwrap) the PID 1 of each of the sandbox's namespaces is
//! SIGKILLed, which takes every process in them down however it detached, and then every
//! recorded process group; the kill is confirmed, and the tombstone is removed. A tombstone
//! left by a crash is finished by the next sweep. SIGKILL ends stopped processes too, a
//! namespace's PID 1 included, so a memory-paused sandbox dies the same way (its commands'
//! launchers, outside, were never stopped and still reap them).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::cgroup::Cgroup;
use super::id_range;
use super::meta::{self, ProcRecord, PROCS_DIR, TOMB_PREFIX};
use super::ns;
use super::proc_table::{ProcTable, KILL_WAIT};
use super::sys;
use crate::sandbox::{Result, SandboxError};
use crate::sync::lock;

/// Moves the sandbox `id` out of sight. Fails with NotFound when it is already gone.
pub(super) fn bury(sandboxes: &Path, id: &str) -> io::Result<PathBuf> {
    let tomb = sandboxes.join(format!(
        "{TOMB_PREFIX}{id}-{}",
        meta::new_id()?.trim_start_matches(meta::ID_PREFIX)
    ));
    fs::rename(sandboxes.join(id), &tomb)?;
    Ok(tomb)
}

/// Kills every process group recorded in a buried sandbox, confirms they are gone, and removes
/// the tombstone. `table` holds the processes this wmo-e2b process started, if any.
pub(super) fn finish_burial(tomb: &Path, id: &str, table: Option<&ProcTable>) -> Result<()> {
    end_processes(tomb, id, table)?;
    // Nothing of the sandbox runs now, so its cgroups are empty (and what escaped every
    // kill above is killed there). A cgroup left behind is the next sweep's.
    if let Some(cgroup) = Cgroup::of(tomb) {
        let _ = cgroup.remove();
    }
    // Its ids may serve another sandbox now that nothing of this one runs. Left taken when
    // unreadable: the slot is freed once the tombstone is gone (see `id_range`).
    if let (Some(sandboxes), Ok(m)) = (tomb.parent(), meta::read_meta(tomb)) {
        if let Some(range) = m.ids {
            let _ = id_range::release(sandboxes, id, range);
        }
    }
    // Best effort: nothing runs any more, and a leftover tombstone is removed by the next sweep.
    // The task wrote the tree, so it may be of any depth: `deep_remove` never recurses.
    let records = super::procs_dir::target(&tomb.join(PROCS_DIR));
    let _ = crate::deep_remove::remove_tree(tomb);
    if let Some(records) = records {
        let _ = fs::remove_dir_all(records);
    }
    Ok(())
}

/// Kills every process of the sandbox in `dir` (its namespaces, then its recorded process
/// groups) and proves them gone, leaving its files: what a kill and a filesystem pause do.
/// Returns the process records it read, all of them now over.
pub(super) fn end_processes(
    dir: &Path,
    id: &str,
    table: Option<&ProcTable>,
) -> Result<Vec<ProcRecord>> {
    let io_error = |what: String, source: io::Error| SandboxError::Io {
        id: id.to_string(),
        what,
        source,
    };
    let records = match meta::read_proc_records(&dir.join(PROCS_DIR)) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_error("reading the process records".into(), e)),
    };
    // The namespaces first, innermost first, each proven gone before the next: see
    // `Holder::kill` for why the launchers (the recorded groups) must outlive them.
    for h in ns::recorded(dir) {
        match h.kill(KILL_WAIT) {
            Ok(true) => {}
            Ok(false) => {
                return Err(io_error(
                    format!("killing the namespace of process {}", h.init),
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("still running {} s after SIGKILL", KILL_WAIT.as_secs()),
                    ),
                ))
            }
            Err(e) => return Err(io_error(format!("killing namespace holder {}", h.init), e)),
        }
    }
    let alive = kill_recorded_groups(&records, table)
        .map_err(|(pgid, e)| io_error(format!("killing process group {pgid}"), e))?;
    if !alive.is_empty() {
        // A tombstone is kept so the next sweep tries again.
        return Err(io_error(
            format!("killing process groups {alive:?}"),
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("still running {} s after SIGKILL", KILL_WAIT.as_secs()),
            ),
        ));
    }
    Ok(records)
}

/// SIGKILLs the process group of each record (through its entry in `table` when this
/// wmo-e2b process started it, so that a launcher outlives its command) and waits, for at
/// most [`KILL_WAIT`], until none of them runs; returns the groups still running. `Err` names
/// the group that could not be signalled.
pub(super) fn kill_recorded_groups<'a>(
    records: impl IntoIterator<Item = &'a ProcRecord>,
    table: Option<&ProcTable>,
) -> std::result::Result<Vec<u32>, (u32, io::Error)> {
    let mut signalled = Vec::new();
    for rec in records {
        let ours = table.and_then(|t| lock(t).get(&rec.pid).cloned());
        let killed = match ours {
            Some(entry) => entry.kill_group(),
            None => sys::kill_recorded_group(rec.pid, rec.start_time),
        };
        match killed {
            Ok(true) => signalled.push(rec.pid),
            // Already gone, or the pid now names another process: nothing of ours is left.
            Ok(false) => {}
            Err(e) => return Err((rec.pid, e)),
        }
    }
    Ok(sys::wait_groups_gone(&signalled, KILL_WAIT))
}

/// Buries and finishes the sandbox `id` when no in-process state knows it.
pub(super) fn destroy_dir(sandboxes: &Path, id: &str) -> Result<bool> {
    match bury(sandboxes, id) {
        Ok(tomb) => finish_burial(&tomb, id, None).map(|()| true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(SandboxError::Io {
            id: id.to_string(),
            what: "moving the sandbox directory away".into(),
            source,
        }),
    }
}
