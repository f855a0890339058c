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
//! Its command line, which any process of the sandbox may read at any moment
//! (`/proc/<pid>/cmdline` asks for no right), is this process's as well: before the first
//! direct entry this process overwrites it with a title of its program's name and subcommand
//! alone (`hide_command_line`), so that a key given on it (the emulator's `--api-key`) is not
//! the sandbox's to read; where that fails, the helper's way is used.
//!
//! Where this way fails for any reason (the holder gone, a program missing, a kernel that
//! lets no process sharing its memory join a user namespace), `Spawn::spawn` starts the
//! helper instead, which says why on the command's stderr and ends as a command that could
//! not run does.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

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

/// Whether this process's command line is hidden from what the kernel shows of it (see the
/// module's comment): tried once, as a direct entry's first start needs it.
pub(in crate::sandbox::local) fn command_line_hidden() -> bool {
    static HIDDEN: OnceLock<bool> = OnceLock::new();
    *HIDDEN.get_or_init(|| hide_command_line().is_ok())
}

/// Overwrites this process's arguments where the kernel keeps them, the memory
/// `/proc/self/cmdline` reads, with a title of the program's file name and its first argument
/// where that is a plain word (a subcommand), padded with NULs. Nothing here reads the
/// arguments after the start (std's `env::args` would read the title now).
fn hide_command_line() -> io::Result<()> {
    let mut args = std::env::args_os();
    let mut title = args
        .next()
        .as_deref()
        .and_then(|p| Path::new(p).file_name())
        .map_or_else(|| b"wmo-e2b".to_vec(), |n| n.as_bytes().to_vec());
    if let Some(sub) = args.next() {
        let sub = sub.as_bytes();
        if !sub.is_empty() && sub.iter().all(|b| b.is_ascii_lowercase() || *b == b'-') {
            title.push(0);
            title.extend_from_slice(sub);
        }
    }
    let (start, end) = argument_area()?;
    let len = end - start;
    // SAFETY: [start, end) is this process's argument area, which the kernel wrote on its
    // stack at the exec and which stays mapped and writable for its life; nothing else here
    // reads it once the start is over.
    let area = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) };
    let shown = title.len().min(len - 1);
    area[..shown].copy_from_slice(&title[..shown]);
    // The last byte stays a NUL, or the kernel reads on into the environment
    // (setproctitle's way).
    area[shown..].fill(0);
    Ok(())
}

/// Where the kernel keeps this process's arguments: `arg_start` and `arg_end` of
/// `/proc/self/stat` (its fields 48 and 49, which it shows a process for itself).
fn argument_area() -> io::Result<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let bad = || io::Error::other("/proc/self/stat shows no argument area");
    // Fields from the third on follow the command name's closing parenthesis.
    let after_name = stat.rsplit_once(')').ok_or_else(bad)?.1;
    let mut fields = after_name.split_whitespace().skip(48 - 3);
    let mut next =
        || -> io::Result<usize> { fields.next().and_then(|f| f.parse().ok()).ok_or_else(bad) };
    let (start, end) = (next()?, next()?);
    // At least a byte, and at most 2 MiB, a bound of ours (past it, the helper's way).
    if start == 0 || end <= start || end - start > 2 << 20 {
        return Err(bad());
    }
    Ok((start, end))
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
