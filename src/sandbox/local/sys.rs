//! The process syscalls the local backend needs (group signals, exit waits, `/proc` reads),
//! with errno kept as `io::Error` so callers classify failures by number, not text.

use std::collections::HashSet;
use std::io;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::proc_table::DYING_WAIT;
use super::spawn::Spawn;
use crate::sandbox::SandboxError;
use crate::sync::lock;

/// How often a bounded wait for a killed group looks again.
const GROUP_POLL: Duration = Duration::from_millis(5);
/// How long a launcher is given to reap the command killed under it and end.
const LAUNCHER_GRACE: Duration = Duration::from_millis(500);
/// A launcher reaps its exited child within microseconds; poll for that finely.
const REAP_POLL: Duration = Duration::from_millis(1);

/// What `/proc/<pid>/stat` says about one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProcStat {
    pub state: u8,
    pub ppid: u32,
    pub pgrp: u32,
    /// The kernel's task flags (field 9).
    pub flags: u64,
    /// Clock ticks after boot (field 22): with the pid it names one process for all time.
    pub start_time: u64,
}

impl ProcStat {
    /// Zombies and dead tasks are over: they only wait for a parent (maybe not us) to reap them.
    pub fn is_running(&self) -> bool {
        !matches!(self.state, b'Z' | b'X' | b'x')
    }

    /// Whether the process has begun to exit (`PF_EXITING`): it runs no code of its own any
    /// more. A namespace's PID 1 stays in that state, not yet a zombie, while the kernel kills
    /// the rest of its namespace, and its namespace already takes in no process.
    pub fn is_exiting(&self) -> bool {
        const PF_EXITING: u64 = 0x4;
        !self.is_running() || self.flags & PF_EXITING != 0
    }
}

/// The parent of `pid`, as the host numbers it.
pub(super) fn proc_ppid(pid: u32) -> Option<u32> {
    proc_stat(pid).map(|s| s.ppid)
}

pub(super) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

pub(super) fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name (field 2) may contain spaces and parentheses; it ends at the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3, so field N is `fields[N - 3]`.
    let state = *fields.first()?.as_bytes().first()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let pgrp = fields.get(2)?.parse().ok()?;
    let flags = fields.get(6)?.parse().ok()?;
    let start_time = fields.get(19)?.parse().ok()?;
    Some(ProcStat {
        state,
        ppid,
        pgrp,
        flags,
        start_time,
    })
}

/// A pid usable as a group id. 0 and 1 are refused: `kill(0)` and `kill(-1)` address our own
/// group and every process, which a corrupt record must never be able to trigger.
fn as_pgid(pid: u32) -> Option<libc::pid_t> {
    libc::pid_t::try_from(pid).ok().filter(|&p| p > 1)
}

/// SIGKILLs the process group `pgid`. `Ok(false)` when no such group exists.
pub(super) fn kill_group(pgid: u32) -> io::Result<bool> {
    signal_group(pgid, libc::SIGKILL)
}

/// Sends `signal` to a process group. `Ok(false)` when there is no such group.
pub(super) fn signal_group(pgid: u32, signal: libc::c_int) -> io::Result<bool> {
    match as_pgid(pgid) {
        // SAFETY: kill(2) has no memory-safety preconditions; a negative pid is a group.
        Some(g) => delivered(unsafe { libc::kill(-g, signal) }.into()),
        None => Ok(false),
    }
}

/// What a signalling call's return says: sent, no such process (`false`), or an error.
fn delivered(rc: libc::c_long) -> io::Result<bool> {
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// SIGKILLs the group a sandbox recorded as `(pid, start_time)`, unless the pid now names
/// another process.
///
/// When the leader still exists its start time must match. When it does not, the group may
/// live on in the leader's children; the kernel does not hand out a pid number while a group
/// still uses it, so a surviving group with that id is still ours.
pub(super) fn kill_recorded_group(pid: u32, start_time: u64) -> io::Result<bool> {
    match proc_stat(pid) {
        Some(stat) if stat.start_time != start_time => Ok(false),
        _ => kill_group(pid),
    }
}

fn group_exists(pgid: u32) -> bool {
    let Some(g) = as_pgid(pgid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the group exists and may be signalled.
    if unsafe { libc::kill(-g, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Every pid `/proc` lists now (processes come and go while it is read); `None` when
/// `/proc` cannot be read.
pub(super) fn proc_pids() -> Option<impl Iterator<Item = u32>> {
    let dir = std::fs::read_dir("/proc").ok()?;
    Some(
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()),
    )
}

/// The groups among `pgids` that still have a member that is not a zombie.
pub(super) fn live_groups(pgids: &[u32]) -> Vec<u32> {
    scan_groups(pgids).0
}

/// The groups of `pgids` with a running member, and whether every such member has begun to
/// exit.
fn scan_groups(pgids: &[u32]) -> (Vec<u32>, bool) {
    let candidates: Vec<u32> = pgids.iter().copied().filter(|&g| group_exists(g)).collect();
    if candidates.is_empty() {
        return (candidates, true);
    }
    // kill(2) still finds groups whose members are all zombies; only /proc tells those apart.
    let Some(pids) = proc_pids() else {
        return (candidates, false);
    };
    let wanted: HashSet<u32> = candidates.iter().copied().collect();
    let mut live = HashSet::new();
    let mut all_exiting = true;
    for pid in pids {
        if let Some(stat) = proc_stat(pid) {
            if stat.is_running() && wanted.contains(&stat.pgrp) {
                live.insert(stat.pgrp);
                all_exiting &= stat.is_exiting();
            }
        }
    }
    let live = candidates
        .into_iter()
        .filter(|g| live.contains(g))
        .collect();
    (live, all_exiting)
}

/// Polls until none of `pgids` has a running member, for at most `within` (or, when every
/// member left is exiting by then, [`DYING_WAIT`] more); returns the groups still alive.
pub(super) fn wait_groups_gone(pgids: &[u32], within: Duration) -> Vec<u32> {
    let mut last = (Vec::new(), false);
    let scan = |last: &mut (Vec<u32>, bool)| {
        *last = scan_groups(pgids);
        last.0.is_empty()
    };
    if !poll_until(Instant::now() + within, GROUP_POLL, || scan(&mut last)) && last.1 {
        poll_until(Instant::now() + DYING_WAIT, GROUP_POLL, || scan(&mut last));
    }
    last.0
}

/// Checks `done` every `period` until it holds or `deadline` has passed; whether it held.
fn poll_until(deadline: Instant, period: Duration, mut done: impl FnMut() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(period);
    }
}

/// Blocks until the child `pid` has exited, leaving it a zombie: while it is unreaped its pid
/// (and so its group id) cannot be reused, which makes signalling the group afterwards safe.
pub(super) fn wait_exit_keep_zombie(pid: u32) -> io::Result<()> {
    waitid_keep_zombie(pid, 0).map(drop)
}

/// Whether the child `pid` has exited, without waiting and without reaping it (see
/// [`wait_exit_keep_zombie`]).
pub(super) fn exited_keep_zombie(pid: u32) -> io::Result<bool> {
    waitid_keep_zombie(pid, libc::WNOHANG)
}

/// waitid(2) for the exit of the child `pid`, leaving it unreaped; with WNOHANG in `flags`,
/// false when it has not exited yet.
fn waitid_keep_zombie(pid: u32, flags: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: siginfo_t is plain data for which all-zero bytes are valid; waitid only
        // writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, exclusively borrowed siginfo_t for the whole call.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                libc::id_t::from(pid),
                &mut info,
                libc::WEXITED | libc::WNOWAIT | flags,
            )
        };
        if rc == 0 {
            // A child that has not exited (WNOHANG) leaves `si_pid` zero.
            // SAFETY: waitid returned 0, so `info` holds zeroes or a child's state.
            return Ok(unsafe { info.si_pid() } != 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// poll(2) over `fds` for at most `timeout`; the number of descriptors with events, 0 on
/// timeout or an interrupting signal.
pub(super) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    // Rounded up, so a wait shorter than a millisecond does not spin.
    let ms = timeout.as_micros().div_ceil(1000);
    let ms = libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX);
    let n = libc::nfds_t::try_from(fds.len()).unwrap_or(libc::nfds_t::MAX);
    // SAFETY: `fds` is a valid, exclusively borrowed slice of `n` pollfds for the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), n, ms) };
    match usize::try_from(rc) {
        Ok(n) => Ok(n),
        Err(_) => {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                Ok(0)
            } else {
                Err(err)
            }
        }
    }
}

/// `bytes` random bytes as lowercase hex (see [`crate::id::random_hex`]), failing as I/O does.
pub(super) fn random_hex(bytes: usize) -> io::Result<String> {
    crate::id::random_hex(bytes).map_err(|e| match e.raw_os_error() {
        Some(errno) => io::Error::from_raw_os_error(errno),
        None => io::Error::other(format!("no randomness: {e}")),
    })
}

/// Whether `path` is on a tmpfs.
pub(super) fn is_tmpfs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs reads a NUL-terminated path and writes only the struct we own.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut fs) == 0 && fs.f_type == libc::TMPFS_MAGIC
    }
}

/// Hands `path` (not following a symlink there) to the sandbox user.
pub(super) fn chown(path: &std::path::Path, uid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))
}

/// SIGKILLs the process `pid` if it is still the one that started at `start_time`.
/// `Ok(false)` when it is gone (or the pid names another process now).
pub(super) fn kill_recorded(pid: u32, start_time: u64) -> io::Result<bool> {
    let Some(p) = as_pgid(pid) else {
        return Ok(false);
    };
    match proc_stat(pid) {
        Some(stat) if stat.start_time == start_time && stat.is_running() => {
            // SAFETY: kill(2) has no memory-safety preconditions.
            delivered(unsafe { libc::kill(p, libc::SIGKILL) }.into())
        }
        _ => Ok(false),
    }
}

/// Whether the process that started at `start_time` still runs as `pid`.
pub(super) fn is_alive(pid: u32, start_time: u64) -> bool {
    proc_stat(pid).is_some_and(|s| s.start_time == start_time && s.is_running())
}

/// Waits until the recorded process is no longer running, for at most `within`: told by a
/// pidfd when the kernel has one (it becomes readable when the process has exited, and a
/// namespace's PID 1 exits only after everything in it), polled otherwise.
pub(super) fn wait_gone(pid: u32, start_time: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    if let Some(fd) = pidfd_open(pid) {
        // Opened after the check below fails only if the pid was reused meanwhile: then the
        // process we meant is gone.
        if !is_alive(pid, start_time) {
            return true;
        }
        let ms = libc::c_int::try_from(within.as_millis()).unwrap_or(libc::c_int::MAX);
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, exclusively borrowed for the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc > 0 {
            return true;
        }
    }
    poll_until(deadline, GROUP_POLL, || !is_alive(pid, start_time))
}

/// Waits until the recorded process, exited, has been reaped by its parent (its pid is
/// free), for at most `within`; true if it has.
pub(super) fn wait_reaped(pid: u32, start_time: u64, within: Duration) -> bool {
    poll_until(Instant::now() + within, REAP_POLL, || {
        proc_stat(pid).is_none_or(|s| s.start_time != start_time)
    })
}

/// SIGKILLs the children of the launcher `pid` (the commands it started inside a sandbox),
/// then waits a moment for the launcher to end, which it does once it has reaped them.
/// Killed together with its children instead, the launcher would leave them to the host's
/// init to reap, and the sandbox's namespace could not end before that (see
/// `Holder::kill`). Does nothing unless `pid` is still the process that started at
/// `start_time`, and a launcher: outside the sandbox, in this process's PID namespace (a
/// command entered directly is inside, and its children are its own business).
pub(super) fn end_launched(pid: u32, start_time: u64) -> io::Result<()> {
    if !is_alive(pid, start_time) || !in_our_pid_namespace(pid) {
        return Ok(());
    }
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let mut signalled = false;
    for child in children
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
    {
        // Opened first, then checked: a pid reused in between names no child of `pid`.
        let Some(fd) = pidfd_open(child) else {
            continue;
        };
        if proc_stat(child).is_none_or(|s| s.ppid != pid) {
            continue;
        }
        signalled |= pidfd_signal(&fd, libc::SIGKILL)?;
    }
    if signalled {
        wait_gone(pid, start_time, LAUNCHER_GRACE);
    }
    Ok(())
}

/// A system call's result, `-1` being its failure (an `int`, or `syscall`'s `long`).
pub(super) fn check(rc: impl Into<libc::c_long>) -> io::Result<()> {
    if rc.into() == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether `pid` lives in this process's PID namespace (not inside a sandbox's).
pub(super) fn in_our_pid_namespace(pid: u32) -> bool {
    let ns = |of: &str| std::fs::read_link(format!("/proc/{of}/ns/pid")).ok();
    ns(&pid.to_string()).is_some_and(|theirs| Some(theirs) == ns("self"))
}

/// Sends `signal` to `pid` if it is still the process that started at `start_time`; through
/// a pidfd where the kernel has them, so that a pid reused meanwhile is never signalled.
/// `Ok(false)` when that process is gone.
pub(super) fn signal_recorded(pid: u32, start_time: u64, signal: libc::c_int) -> io::Result<bool> {
    let Some(p) = as_pgid(pid) else {
        return Ok(false);
    };
    let fd = pidfd_open(pid);
    // Checked after the open: the pidfd then names the process the check saw.
    if proc_stat(pid).is_none_or(|s| s.start_time != start_time) {
        return Ok(false);
    }
    match fd {
        Some(fd) => pidfd_signal(&fd, signal),
        // SAFETY: kill(2) has no memory-safety preconditions.
        None => delivered(unsafe { libc::kill(p, signal) }.into()),
    }
}

/// Sends `signal` through a pidfd; `Ok(false)` when the process has exited.
fn pidfd_signal(fd: &std::os::fd::OwnedFd, signal: libc::c_int) -> io::Result<bool> {
    // SAFETY: a pidfd we own, a signal number, no siginfo.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            std::os::fd::AsRawFd::as_raw_fd(fd),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    delivered(rc)
}

/// A pidfd for `pid`, when the kernel offers them (Linux 5.3) and the process exists.
pub(super) fn pidfd_open(pid: u32) -> Option<std::os::fd::OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = std::os::fd::RawFd::try_from(rc)
        .ok()
        .filter(|&fd| fd >= 0)?;
    // SAFETY: a fresh descriptor the kernel just returned.
    Some(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Sets or clears O_NONBLOCK on a descriptor we own: set on our end of a pipe so writes can
/// be given a deadline, cleared on a file opened without blocking (so a FIFO could not block
/// the open) once it is known to be a regular file.
pub(super) fn set_nonblocking(fd: libc::c_int, nonblocking: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if nonblocking {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until `fd` is writable (or its reader is gone), for at most `timeout`. `Ok(false)` on
/// timeout.
pub(super) fn wait_writable(fd: libc::c_int, timeout: Duration) -> io::Result<bool> {
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, exclusively borrowed for the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    match rc {
        0 => Ok(false),
        n if n > 0 => Ok(true),
        _ => {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                Ok(true)
            } else {
                Err(err)
            }
        }
    }
}

/// The absolute path of a program found on `PATH`, resolved once per process.
///
/// Processes start by path (see `spawn`): a bare name is never looked up in a directory
/// other than `PATH`'s. One not found stays a bare name, which the start refuses by name.
pub(super) fn program(name: &'static str) -> std::path::PathBuf {
    static CACHE: OnceLock<
        std::sync::Mutex<std::collections::HashMap<&'static str, std::path::PathBuf>>,
    > = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = lock(cache);
    map.entry(name)
        .or_insert_with(|| {
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .map(|dir| dir.join(name))
                .find(|candidate| is_executable(candidate))
                // Not found: leave the bare name, so the spawn error names what is missing.
                .unwrap_or_else(|| std::path::PathBuf::from(name))
        })
        .clone()
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The `unshare` flag that puts a process in a fresh network namespace on this host, probed
/// once per wmo-e2b process.
pub(super) fn netlock_flag() -> Result<&'static str, SandboxError> {
    static PROBE: OnceLock<Result<&'static str, String>> = OnceLock::new();
    PROBE
        .get_or_init(probe_netlock)
        .clone()
        .map_err(SandboxError::Unsupported)
}

fn probe_netlock() -> Result<&'static str, String> {
    // SAFETY: geteuid cannot fail and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    // Unprivileged users need a user namespace (mapped to root inside) to own a netns.
    let flag = if root { "-n" } else { "-rn" };
    let mut cmd = Spawn::new(program("unshare"));
    cmd.args([flag, "true"]);
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    super::probe::runs(cmd, "it").map(|()| flag).map_err(|why| {
        format!(
            "the local backend cannot lock the network here: unshare {flag} failed ({why}); \
             run as root or enable unprivileged user namespaces"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parses_odd_command_names() {
        let line =
            "4242 (a) b (c)) S 1 4000 4000 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1 2";
        let stat = parse_stat(line).unwrap();
        assert_eq!(stat.state, b'S');
        assert_eq!(stat.pgrp, 4000);
        assert_eq!(stat.start_time, 98765);
        assert!(!stat.is_exiting());
        let exiting = line.replace(" 4194560 ", " 4194564 ");
        assert!(parse_stat(&exiting).unwrap().is_exiting());
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn own_stat_is_readable() {
        let stat = proc_stat(std::process::id()).unwrap();
        assert!(stat.is_running());
        assert!(!stat.is_exiting());
    }

    #[test]
    fn dangerous_group_ids_are_refused() {
        assert_eq!(as_pgid(0), None);
        assert_eq!(as_pgid(1), None);
        assert_eq!(as_pgid(u32::MAX), None);
        assert!(!kill_group(0).unwrap());
    }
}
