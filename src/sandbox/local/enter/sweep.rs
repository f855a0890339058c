//! The sweep request's side in the helper: from inside a task PID namespace, as root with
//! `CAP_KILL` alone, it kills every process that is not root's until a look finds none, then
//! looks for anything of the task left in the namespace (see `stop` and `reset`). No task
//! process can signal or trace it: they are not root, and it never execs. It reads ids as the
//! host numbers them: in a sandbox with a user namespace the holders are still the host's
//! root there, and task processes are ids of the sandbox's range.
//!
//! What a task can leave in its namespace once its processes are gone: SysV IPC objects and
//! POSIX message queues (its IPC namespace), and files in `/dev/shm`, the one tmpfs of the
//! namespace a task's user may write (the others are root's, and the seccomp filter keeps a
//! task from mounting, unsharing or touching keys). The look covers each; a namespace it
//! finds empty is as fresh as a new one.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;

use super::helper::{cannot_enter, fail, gone, launcher, Failure, Never, Opened, CANNOT_ENTER};
use crate::sandbox::local::pre_exec::set_capabilities;
use crate::sandbox::local::sys::check;

/// The exit status of a sweep that could not prove every task process gone.
const SWEEP_UNPROVEN: i32 = 3;
/// The exit status of a sweep that ended every task process but found something of the
/// task's left in the namespace; its stderr names what.
pub(in crate::sandbox::local) const SWEEP_LEFTOVERS: i32 = 4;
/// Rounds of a sweep (each a look at every process, then a kill of what it found) before it
/// gives up; a round that finds nothing ends it.
const SWEEP_ROUNDS: u32 = 2000;
/// Where a task namespace's POSIX message queues are seen: its holder mounts its IPC
/// namespace's queue filesystem there, in a directory only root may enter (see
/// `holder_start`), so the sweep reads them without a mount of its own.
pub(in crate::sandbox::local) const QUEUES_DIR: &str = "/run/wmo-e2b";
pub(in crate::sandbox::local) const QUEUES_AT: &str = "/run/wmo-e2b/queues";
/// The namespace's own processes, as it numbers them: bwrap's reaper and the holder's
/// `sleep` (see `holder_start`).
const HOLDER_PIDS: [libc::pid_t; 2] = [1, 2];

/// Ends every process in the holder's PID namespace (and those nested in it) that is not
/// root's: the task's and the verifier's, never the holder's own (root's, as root starts it).
/// Run from inside the namespace, as root with no capability but `CAP_KILL`, so no task
/// process can signal it or trace it, and pid numbers are the namespace's own. Once a look
/// finds none left (zombies are dead already), exits 0 if the namespace holds nothing else
/// of the task's, [`SWEEP_LEFTOVERS`] if it does.
pub(super) fn sweep(opened: &Opened) -> Result<Never, Failure> {
    let Some([mnt, ipc, _, root]) = &opened.rest else {
        return Err(cannot_enter("the namespaces were not opened to sweep"));
    };
    // SAFETY: plain system calls on fds we own; this process is the helper, single-threaded,
    // so its child may allocate and read files.
    unsafe {
        for (fd, kind, what) in [
            (&opened.pid, libc::CLONE_NEWPID, "join the PID namespace"),
            (mnt, libc::CLONE_NEWNS, "join the mount namespace"),
            (ipc, libc::CLONE_NEWIPC, "join the IPC namespace"),
        ] {
            if libc::setns(fd.as_raw_fd(), kind) == -1 {
                return Err(cannot_enter(format!(
                    "cannot {what}: {}",
                    io::Error::last_os_error()
                )));
            }
        }
        if libc::fchdir(root.as_raw_fd()) == -1 || libc::chroot(c".".as_ptr()) == -1 {
            return Err(cannot_enter(format!(
                "cannot enter the sandbox's root: {}",
                io::Error::last_os_error()
            )));
        }
        match libc::fork() {
            -1 if !opened.holder_lives() => Err(gone()),
            -1 => Err(cannot_enter(format!(
                "cannot start the sweep: {}",
                io::Error::last_os_error()
            ))),
            0 => {
                if only_kill_capability().is_err() {
                    fail(b"wmo-e2b: cannot drop to CAP_KILL\n", CANNOT_ENTER);
                }
                let me = libc::getpid();
                for _ in 0..SWEEP_ROUNDS {
                    let (victims, roots) = processes(me);
                    if victims.is_empty() {
                        let mut left = leftovers();
                        if roots.iter().any(|pid| !HOLDER_PIDS.contains(pid)) {
                            left.push("a process of root's that is not the holder's".into());
                        }
                        if left.is_empty() {
                            libc::_exit(0);
                        }
                        eprintln!("wmo-e2b: the task left {}", left.join(", "));
                        libc::_exit(SWEEP_LEFTOVERS);
                    }
                    for pid in victims {
                        libc::kill(pid, libc::SIGKILL);
                    }
                    libc::usleep(1000);
                }
                fail(
                    b"wmo-e2b: task processes still run after the sweep\n",
                    SWEEP_UNPROVEN,
                )
            }
            sweeper => launcher(sweeper),
        }
    }
}

/// Every live process this namespace's `/proc` shows but `me`: those whose real uid is not
/// root's, then root's.
fn processes(me: libc::pid_t) -> (Vec<libc::pid_t>, Vec<libc::pid_t>) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return (vec![me], Vec::new());
    };
    let (mut others, mut roots) = (Vec::new(), Vec::new());
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let mut status = String::new();
        // Gone between the listing and the read: nothing to kill.
        let Ok(f) = File::open(format!("/proc/{pid}/status")) else {
            continue;
        };
        if f.take(4096).read_to_string(&mut status).is_err() {
            continue;
        }
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        let zombie = field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
        let uid = field("Uid:").and_then(|u| u.split_whitespace().next());
        match (zombie, uid == Some("0")) {
            (true, _) => {}
            (false, true) => roots.push(pid),
            (false, false) => others.push(pid),
        }
    }
    (others, roots)
}

/// What of the task's the namespace still holds with no task process left, named; what
/// cannot be read counts as held.
fn leftovers() -> Vec<String> {
    let mut left = Vec::new();
    for (dir, what) in [
        ("/dev/shm", "files in /dev/shm"),
        // Not there (a namespace on an image has none): unseen, so counted as held.
        (QUEUES_AT, "POSIX message queues"),
    ] {
        if !std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()) {
            left.push(what.to_string());
        }
    }
    for (table, what) in [
        ("shm", "SysV shared memory"),
        ("sem", "SysV semaphores"),
        ("msg", "SysV message queues"),
    ] {
        // A header line, then one line an object.
        let mut text = String::new();
        let read = File::open(format!("/proc/sysvipc/{table}"))
            .and_then(|f| f.take(64 * 1024).read_to_string(&mut text));
        if read.is_err() || text.lines().count() != 1 {
            left.push(what.to_string());
        }
    }
    left
}

/// Keeps `CAP_KILL` alone, in every set that matters for a process that never execs.
unsafe fn only_kill_capability() -> io::Result<()> {
    const CAP_KILL: u32 = 5;
    check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    set_capabilities(1 << CAP_KILL)
}
