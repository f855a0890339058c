//! The sweep request's side in the helper: from inside a task PID namespace, as root with
//! `CAP_KILL` alone, it kills every process that is not root's until a look finds none (see
//! `stop`). No task process can signal or trace it: they are not root, and it never execs.
//! It reads ids as the host numbers them: in a sandbox with a user namespace the holders are
//! still the host's root there, and task processes are ids of the sandbox's range.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;

use super::helper::{
    cannot_enter, check, fail, gone, launcher, set_capabilities, Failure, Never, Opened,
    CANNOT_ENTER,
};

/// The exit status of a sweep that could not prove every task process gone.
const SWEEP_UNPROVEN: i32 = 3;
/// Rounds of a sweep (each a look at every process, then a kill of what it found) before it
/// gives up; a round that finds nothing ends it.
const SWEEP_ROUNDS: u32 = 2000;

/// Ends every process in the holder's PID namespace (and those nested in it) that is not
/// root's: the task's and the verifier's, never the holder's own (root's, as root starts it).
/// Run from inside the namespace, as root with no capability but `CAP_KILL`, so no task
/// process can signal it or trace it, and pid numbers are the namespace's own. Exits 0 once
/// a look finds none left; zombies are dead already.
pub(super) fn sweep(opened: &Opened) -> Result<Never, Failure> {
    let Some([mnt, _, _, root]) = &opened.rest else {
        return Err(cannot_enter("the namespaces were not opened to sweep"));
    };
    // SAFETY: plain system calls on fds we own; this process is the helper, single-threaded,
    // so its child may allocate and read files.
    unsafe {
        for (fd, kind, what) in [
            (&opened.pid, libc::CLONE_NEWPID, "join the PID namespace"),
            (mnt, libc::CLONE_NEWNS, "join the mount namespace"),
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
                    let victims = unprivileged_processes(me);
                    if victims.is_empty() {
                        libc::_exit(0);
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

/// Every live process this namespace's `/proc` shows whose real uid is not root's, but `me`.
fn unprivileged_processes(me: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![me];
    };
    let mut out = Vec::new();
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
        if !zombie && uid != Some("0") {
            out.push(pid);
        }
    }
    out
}

/// Keeps `CAP_KILL` alone, in every set that matters for a process that never execs.
unsafe fn only_kill_capability() -> io::Result<()> {
    const CAP_KILL: u32 = 5;
    check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    set_capabilities(1 << CAP_KILL)
}
