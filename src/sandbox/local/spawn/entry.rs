//! A command started straight into its sandbox, with no helper exec'd between (see `enter`
//! for the helper's way, which this one replaces wherever it can).
//!
//! The child that `spawn` starts (sharing this process's memory) joins the holder's IPC,
//! UTS, PID and mount namespaces from descriptors opened here, changes root and directory,
//! and starts the command on a second stack of its group with `CLONE_PARENT`: a PID
//! namespace takes in only processes started after the join, and `CLONE_PARENT` makes the
//! command a child of this process, not of the child, which then exits. So this process
//! reaps, signals and times the command itself, as any process it starts, with no launcher
//! between. The command takes its last steps (`pre_exec`) and execs.
//!
//! Until its exec the command shares this process's memory, which holds the host's
//! credentials: no process of the sandbox may read it then. The command makes that memory
//! not dumpable before it drops to the sandbox's user, so a process of that user can neither
//! trace it nor read its `/proc/<pid>/mem` or `environ` in the moment before the exec (which
//! gives it a memory of its own, dumpable again); root's uid drop would do as much where
//! `fs.suid_dumpable` is 0, but not where it is 1. This process stays not dumpable, which
//! root shrugs off. Without root the command is the sandbox's user from its start, so only
//! the helper's way is safe there (see `enter`'s `direct_entry`).
//!
//! Where this way fails for any reason (the holder gone, a program missing, a kernel that
//! lets no process sharing its memory join a user namespace), `Spawn::spawn` starts the
//! helper instead, which says why on the command's stderr and ends as a command that could
//! not run does.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::Plan;
use crate::sandbox::local::isolation::Identity;
use crate::sandbox::local::pre_exec;

/// The namespaces joined, in this order, after the user namespace if any (which owns them):
/// IPC and UTS first, PID before mount (the mount namespace's `/proc` is the PID
/// namespace's).
const KINDS: [libc::c_int; 4] = [
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNS,
];

/// What a direct entry needs: a holder's namespaces and root, opened (close-on-exec) after
/// the holder was checked to still be the one recorded, and the command.
#[derive(Debug)]
pub(in crate::sandbox::local) struct Entry {
    /// The holder's user namespace, where the sandbox has one.
    pub user: Option<OwnedFd>,
    /// IPC, UTS, PID, mount: as [`KINDS`].
    pub namespaces: [OwnedFd; 4],
    pub root: OwnedFd,
    /// A network namespace of the command's own, with only a loopback device.
    pub own_network: bool,
    /// As root: who to become.
    pub drop_to: Option<Identity>,
    /// The program by its path in the sandbox, then its arguments.
    pub argv: Vec<OsString>,
    /// Exactly the command's environment.
    pub env: Vec<(OsString, OsString)>,
    /// In the sandbox.
    pub cwd: OsString,
}

/// An entry as the child reads it: plain numbers, laid out before the start.
#[derive(Clone, Copy)]
pub(super) struct Joins {
    user: Option<RawFd>,
    namespaces: [RawFd; 4],
    root: RawFd,
    own_network: bool,
    drop_to: Option<Identity>,
}

impl Entry {
    pub(super) fn joins(&self) -> Joins {
        Joins {
            user: self.user.as_ref().map(AsRawFd::as_raw_fd),
            namespaces: self.namespaces.each_ref().map(AsRawFd::as_raw_fd),
            root: self.root.as_raw_fd(),
            own_network: self.own_network,
            drop_to: self.drop_to,
        }
    }
}

/// In the child, while it still shares this process's descriptor table: joins the
/// namespaces and takes the holder's root. The errno of a failed step is left set.
///
/// # Safety
/// In the child of a start only (see `spawn::child`).
pub(super) unsafe fn join(joins: &Joins) -> bool {
    if let Some(user) = joins.user {
        if libc::setns(user, libc::CLONE_NEWUSER) != 0 {
            return false;
        }
    }
    for (fd, kind) in joins.namespaces.iter().zip(KINDS) {
        if libc::setns(*fd, kind) != 0 {
            return false;
        }
    }
    libc::fchdir(joins.root) == 0 && libc::chroot(c".".as_ptr()) == 0
}

/// In the child, last: starts the command (see the module's comment) and records its pid.
///
/// # Safety
/// In the child of a start only, with `plan` the start's and `stack_top` a stack no one
/// else uses until the command's exec.
pub(super) unsafe fn start_command(plan: *mut Plan, stack_top: *mut libc::c_void) -> bool {
    let pid = libc::clone(
        command,
        stack_top,
        libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PARENT | libc::SIGCHLD,
        plan.cast(),
    );
    if pid < 0 {
        return false;
    }
    std::ptr::write_volatile(std::ptr::addr_of_mut!((*plan).command), pid);
    true
}

/// The command, from its start in the joined namespaces to its exec. As `spawn::child`:
/// raw system calls only.
extern "C" fn command(arg: *mut libc::c_void) -> libc::c_int {
    let plan = arg.cast::<Plan>();
    // SAFETY: as `spawn::child`: `plan` outlives this (both starts wait for the exec).
    unsafe {
        let Some(joins) = (*plan).joins else {
            super::fail(plan)
        };
        if (*plan).new_group && libc::setpgid(0, 0) != 0 {
            super::fail(plan);
        }
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
            || pre_exec::become_command(joins.own_network, joins.drop_to).is_err()
        {
            super::fail(plan);
        }
        super::exec(plan)
    }
}
