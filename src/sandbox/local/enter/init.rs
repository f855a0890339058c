//! The init request's side in the helper: PID 1 of a sandbox's namespace (bwrap
//! `--as-pid-1`), in place of bwrap's own PID 1 and the `sleep` it would wait on. It says
//! `ready` (bwrap has built the namespace by then), lets go of the caller's pipes, and from
//! then on only reaps: whatever the sandbox orphans is its child. Its memory holds nothing of
//! the host's, and it is not dumpable, so no process of the sandbox can trace or read it.

use super::helper::{close_from, stdio_to_null, Failure, Never};

extern "C" fn on_child(_: libc::c_int) {}

/// Says `ready` on stderr, then reaps every child, forever.
pub(super) fn init() -> Result<Never, Failure> {
    // SAFETY: plain system calls on fds and signal sets of our own; this process is the
    // helper, single-threaded.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        let ready = b"ready\n";
        libc::write(2, ready.as_ptr().cast(), ready.len());
        stdio_to_null();
        close_from(3);
        // SIGCHLD is handled (a PID 1 gets no signal it leaves at its default) and blocked
        // but while waiting for it, so that no exit slips between a reap and the wait.
        libc::signal(libc::SIGCHLD, on_child as *const () as libc::sighandler_t);
        let mut child: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut child);
        libc::sigaddset(&mut child, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &child, std::ptr::null_mut());
        let mut waiting: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut waiting);
        loop {
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            libc::sigsuspend(&waiting);
        }
    }
}
