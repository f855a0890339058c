//! The `join` request's way in as root: the helper joins a holder's PID namespace itself and
//! starts the rest there as a session of its own, whose leader it names. What runs so lives
//! and dies with the sandbox: when the holder's PID 1 ends, the kernel kills every process of
//! its namespace, this session's included, so it needs no watcher of its own (a nested
//! holder's bwrap that joined the namespace itself, `--pidns`, would stay outside it, and
//! once the sandbox is killed, wait forever for a child that never reports).

use std::ffi::OsString;
use std::io;
use std::os::fd::AsRawFd;

use super::helper::{cannot_enter, exec, gone, Failure, Never, Opened};

/// Joins `opened`'s PID namespace and starts the session leader that runs `argv` there,
/// which first writes `session <pid>` on `announce` (its pid as the host numbers it, so that a
/// start given up on can be killed whole). The leader is the child of a short-lived child:
/// orphaned inside the namespace, it is PID 1's to reap, so the namespace can end without
/// the host's init reaping anything of it. Exits once the leader is started.
///
/// With `own_proc` the leader then mounts a `/proc` of the namespace it is in over the
/// host's, in a mount namespace of its own: bwrap reads its child's namespaces at the pid
/// its own PID namespace gives it.
pub(super) fn lead(
    opened: &Opened,
    announce: u8,
    own_proc: bool,
    argv: &[OsString],
) -> Result<Never, Failure> {
    let failed = |what: &str| cannot_enter(format!("{what}: {}", io::Error::last_os_error()));
    // SAFETY: plain system calls on fds we own; this process is the helper, single-threaded,
    // so its children may allocate before their exec.
    unsafe {
        if libc::setns(opened.pid.as_raw_fd(), libc::CLONE_NEWPID) == -1 {
            return Err(failed("cannot join the PID namespace"));
        }
        // The children below end as the helper does, by returning (each is the helper's
        // only thread).
        match libc::fork() {
            // A PID namespace whose PID 1 has died takes in no process.
            -1 if !opened.holder_lives() => Err(gone()),
            -1 => Err(failed("cannot start the session")),
            0 => match libc::fork() {
                -1 => Err(failed("cannot start the session")),
                0 => {
                    if libc::setsid() == -1 || !announced(announce) {
                        return Err(failed("cannot name the session"));
                    }
                    if own_proc && !mounted_own_proc() {
                        return Err(failed("cannot mount the namespace's /proc"));
                    }
                    exec(argv)
                }
                _ => libc::_exit(0),
            },
            middle => {
                let mut status = 0;
                while libc::waitpid(middle, &mut status, 0) == -1
                    && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
                {
                }
                match libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                    true => libc::_exit(0),
                    false => Err(cannot_enter("cannot start the session")),
                }
            }
        }
    }
}

/// Writes `session <pid>` on `fd`: this process's pid in the host's `/proc` (still this
/// process's view of the files), not the one its PID namespace gives it.
fn announced(fd: u8) -> bool {
    let Some(pid) = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
    else {
        return false;
    };
    let line = format!("session {pid}\n");
    // SAFETY: write(2) from a buffer we own.
    let n = unsafe { libc::write(fd.into(), line.as_ptr().cast(), line.len()) };
    n == line.len() as isize
}

/// Mounts a `/proc` of this process's PID namespace over `/proc`, in a mount namespace of its
/// own whose mounts reach no other.
unsafe fn mounted_own_proc() -> bool {
    let null = std::ptr::null();
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    libc::unshare(libc::CLONE_NEWNS) == 0
        && libc::mount(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_REC | libc::MS_PRIVATE,
            null.cast(),
        ) == 0
        && libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            flags,
            null.cast(),
        ) == 0
}
