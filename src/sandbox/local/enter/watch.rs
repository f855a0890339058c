//! The watch request's side in the helper: the leader of a session that holds a sandbox's
//! namespace, started by `setsid --fork`. It names its session, starts
//! the program it watches, lets go of the caller's pipes, and kills the whole session once
//! the sandbox's `meta.json` is gone (the sandbox killed, or its state directory deleted
//! under it), so that nothing of a sandbox outlives it for long even when no wmo-e2b process
//! is left to kill it. Between looks it sleeps: one process, no shell, no `sleep` exec'd.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use super::helper::{cannot_enter, close_from, exec, stdio_to_null, Failure, Never};

/// How often the watcher looks for `meta.json`: a `stat` each time.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// Writes `session <pid>` on `announce` (its own pid: `setsid` made it the session's leader,
/// so a start given up on can be killed whole), then runs `argv` with every fd it was given
/// and watches `meta`.
pub(super) fn watch(announce: RawFd, meta: &OsStr, argv: &[OsString]) -> Result<Never, Failure> {
    if argv.is_empty() {
        return Err(cannot_enter("no program to watch"));
    }
    let line = format!("session {}\n", std::process::id());
    // SAFETY: write(2) from a buffer we own; this process is the helper, single-threaded, so
    // its child may allocate before its exec.
    unsafe {
        if libc::write(announce, line.as_ptr().cast(), line.len()) != line.len() as isize {
            return Err(cannot_enter(format!(
                "cannot name the session: {}",
                io::Error::last_os_error()
            )));
        }
        match libc::fork() {
            -1 => Err(cannot_enter(format!(
                "cannot start the watched program: {}",
                io::Error::last_os_error()
            ))),
            // The child ends as the helper does, by returning (it is the helper's only
            // thread).
            0 => exec(argv),
            _ => watcher(meta),
        }
    }
}

/// The watcher's life once the program runs: it holds nothing of the caller's (its pipes
/// reach end of file when the program lets go of them), reaps nothing itself (the kernel
/// does), and kills its session once `meta` is gone.
unsafe fn watcher(meta: &OsStr) -> ! {
    libc::signal(libc::SIGCHLD, libc::SIG_IGN);
    stdio_to_null();
    close_from(3);
    loop {
        std::thread::sleep(LOOK_EVERY);
        if gone(meta) {
            libc::kill(0, libc::SIGKILL);
        }
    }
}

/// Whether `meta` is gone for certain (an error that says nothing of it is not).
fn gone(meta: &OsStr) -> bool {
    match std::fs::symlink_metadata(meta) {
        Ok(_) => false,
        Err(e) => matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)),
    }
}
