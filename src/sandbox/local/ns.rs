//! The PID namespaces of a bwrap sandbox and the processes that hold them open.
//!
//! A sandbox has two: the *sandbox* namespace, which every [`Role::System`] process (the
//! runner) joins, and inside it the *task* namespace, which every [`Role::Task`] process
//! joins. Each is held open by a holder: a bwrap whose PID 1 adopts and reaps whatever the
//! sandbox orphans (this program's `init` for the sandbox namespace, bwrap's own reaper
//! waiting with a `sleep` for the task namespace). Killing a namespace's PID 1 makes the
//! kernel kill every process in it (and in namespaces nested in it), however they detached,
//! and PID 1 is not gone until they all are: that is what makes "every process this task
//! started is dead" provable. `reset` kills the task namespace and starts a new one, unless
//! a sweep proves it as fresh as a new one (see `reset`).
//!
//! Each holder is recorded in `ns/<name>.json` before its namespace is used, so any wmo-e2b
//! process can join or kill it; `holder_start` starts them.

use std::io;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{meta, sys};
use crate::sandbox::Role;

/// Where holder records live in a sandbox directory.
pub(super) const NS_DIR: &str = "ns";
/// How long a holder's launcher is given to reap its PID 1 once that has exited.
const REAP_GRACE: Duration = Duration::from_millis(200);

/// Which of a sandbox's namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Space {
    Sandbox,
    Task,
    /// The next task namespace, made ahead of time so a reset need not wait for one.
    Spare,
}

impl Space {
    pub fn for_role(role: Role) -> Space {
        match role {
            Role::System => Space::Sandbox,
            Role::Task | Role::Verify => Space::Task,
        }
    }

    /// Whose mounts the holder's mount namespace has (commands may enter it).
    pub fn role(self) -> Role {
        match self {
            Space::Sandbox => Role::System,
            Space::Task | Space::Spare => Role::Task,
        }
    }

    fn file(self) -> &'static str {
        match self {
            Space::Sandbox => "sandbox.json",
            Space::Task => "task.json",
            Space::Spare => "spare.json",
        }
    }
}

/// A namespace holder: PID 1 of the namespace, and the session bwrap made for it (its
/// launcher outside the namespace belongs to it too), as the host numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Holder {
    pub init: u32,
    pub start_time: u64,
    /// The holder's process group (its session leader's pid) and the leader's start time.
    pub group: u32,
    pub group_start: u64,
    /// The layer directory its root is made of, on a sandbox with an image (see
    /// `image_root`); 0 for none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub layer: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Holder {
    pub fn is_alive(&self) -> bool {
        sys::is_alive(self.init, self.start_time)
    }

    /// SIGKILLs the namespace's PID 1, which takes every process in it down (PID 1 is not
    /// gone before they all are), then the holder's own group on the host; true once PID 1
    /// is proven gone.
    ///
    /// In that order because a process that entered a namespace from outside (a command,
    /// a nested holder's PID 1) is reaped by its launcher outside (the command's helper, the
    /// nested holder's bwrap). Killed first,
    /// the launcher would leave it to the host's init, which may reap late or never, and
    /// PID 1 does not exit before it is reaped. So the launchers outlive PID 1, and this
    /// holder's own launcher is given a moment to reap PID 1 too, whose pid in an enclosing
    /// namespace is freed only then.
    pub fn kill(&self, within: Duration) -> io::Result<bool> {
        sys::kill_recorded(self.init, self.start_time)?;
        // A PID 1 that has begun to exit waits for the kernel to end the rest of its
        // namespace, which on a host starved of CPU (a quota) takes long: dying is not stuck,
        // so it is given longer.
        let dying = || {
            sys::proc_stat(self.init)
                .is_some_and(|s| s.start_time == self.start_time && s.is_exiting())
        };
        let gone = sys::wait_gone(self.init, self.start_time, within)
            || (dying()
                && sys::wait_gone(self.init, self.start_time, super::proc_table::DYING_WAIT));
        if gone {
            sys::wait_reaped(self.init, self.start_time, REAP_GRACE);
        }
        sys::kill_recorded_group(self.group, self.group_start)?;
        Ok(gone)
    }
}

pub(super) fn read(sandbox_dir: &Path, space: Space) -> io::Result<Holder> {
    let bytes = meta::read_bounded(&sandbox_dir.join(NS_DIR).join(space.file()), 4096)?;
    serde_json::from_slice(&bytes).map_err(io::Error::from)
}

pub(super) fn write(sandbox_dir: &Path, space: Space, holder: &Holder) -> io::Result<()> {
    let bytes = serde_json::to_vec(holder).map_err(io::Error::from)?;
    meta::write_atomic(&sandbox_dir.join(NS_DIR), space.file(), &bytes)
}

pub(super) fn forget(sandbox_dir: &Path, space: Space) {
    // A leftover record only costs a start-time check at the next kill.
    let _ = std::fs::remove_file(sandbox_dir.join(NS_DIR).join(space.file()));
}

/// Names the task namespace last entered by a task process (from any wmo-e2b process): marked
/// before the process enters, so a namespace it does not name provably never ran a task
/// process, and a reset may keep it. One file per sandbox, rewritten in place at a fixed
/// width, so a mark never makes a new file but the sandbox's first.
const ENTERED_FILE: &str = "entered";

fn entered_line(holder: &Holder) -> String {
    format!("{:>20} {:>20}\n", holder.init, holder.start_time)
}

pub(super) fn mark_entered(sandbox_dir: &Path, holder: &Holder) -> io::Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(sandbox_dir.join(NS_DIR).join(ENTERED_FILE))?
        .write_all_at(entered_line(holder).as_bytes(), 0)
}

/// Whether `holder`'s namespace may have run a task process: named by the mark, or the mark
/// cannot be read.
pub(super) fn was_entered(sandbox_dir: &Path, holder: &Holder) -> bool {
    let line = entered_line(holder);
    match meta::read_bounded(&sandbox_dir.join(NS_DIR).join(ENTERED_FILE), 64) {
        Ok(bytes) => bytes == line.as_bytes(),
        Err(e) => e.kind() != io::ErrorKind::NotFound,
    }
}

/// Makes the spare's record the task namespace's, once the task namespace it replaces has
/// ended: the old record is removed first, so the rename replaces no file (which on ext4
/// would force the spare record's blocks out; swapping the two in one `renameat2` measured
/// as slow), and the spare stays recorded throughout. A promotion cut short between the two
/// steps is finished by the next reader of the task record (`SandboxState::holder`).
pub(super) fn promote_spare(sandbox_dir: &Path) -> io::Result<()> {
    let dir = sandbox_dir.join(NS_DIR);
    match std::fs::remove_file(dir.join(Space::Task.file())) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::rename(dir.join(Space::Spare.file()), dir.join(Space::Task.file()))
}

/// Every holder recorded in a sandbox directory (for teardown), nested ones first.
pub(super) fn recorded(sandbox_dir: &Path) -> Vec<Holder> {
    [Space::Task, Space::Spare, Space::Sandbox]
        .into_iter()
        .filter_map(|s| read(sandbox_dir, s).ok())
        .collect()
}
