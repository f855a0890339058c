//! Stopping and continuing every process of a sandbox's PID namespaces: what a memory pause
//! is here.
//!
//! A sandbox's processes are found by the PID namespace they live in: its holders' and any
//! nested in those, which is where every process of the sandbox is, however it detached
//! (`setsid`, double forks), unlike its process groups. The kernel offers no "stop this
//! namespace" (the cgroup freezer needs a cgroup of the sandbox's own, which a container's
//! root cannot count on), so each process is sent SIGSTOP, and passes repeat until one finds
//! nothing running: a child forked by a process not yet stopped is caught by the next pass,
//! and a stopped process forks no more. Signals go through pidfds (see
//! `sys::signal_recorded`), so a pid reused meanwhile is never touched.
//!
//! A command's launcher outside the namespaces (see `enter`; most commands have none, see
//! `spawn::Entry`) is left running: it waits for its command without asking to hear of
//! stops, so it sees nothing, and it can still reap the command if the paused sandbox is
//! killed (which `Holder::kill` needs). A launcher that has not yet put its command inside
//! is waited for, since that command would run.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::holder_start::pid_namespace;
use super::meta;
use super::ns::Holder;
use super::sys;

/// How long the processes of a sandbox may take to stop (or continue); a process in an
/// uninterruptible sleep stops only once the sleep ends.
const SETTLE_WITHIN: Duration = Duration::from_secs(5);
/// How often a pass looks again.
const PASS_PERIOD: Duration = Duration::from_millis(2);
/// `NS_GET_PARENT` from `linux/nsfs.h`: `_IO(0xb7, 0x2)`.
const NS_GET_PARENT: u64 = 0xb702;
/// Bounds the walk up a chain of nested PID namespaces (the kernel allows 32 levels).
const MAX_NS_DEPTH: usize = 32;

/// The PID namespaces of a sandbox, by inode: those of its holders that live.
pub(super) struct Namespaces(Vec<u64>);

impl Namespaces {
    pub fn of(holders: &[Holder]) -> Namespaces {
        Namespaces(
            holders
                .iter()
                .filter(|h| h.is_alive())
                .filter_map(|h| pid_namespace(h.init))
                .collect(),
        )
    }
}

/// One process of a sandbox, as `/proc` shows it.
#[derive(Debug, Clone, Copy)]
struct Member {
    pid: u32,
    start_time: u64,
    state: u8,
}

impl Member {
    /// Stopped by a signal or by its tracer.
    fn is_stopped(self) -> bool {
        matches!(self.state, b'T' | b't')
    }

    fn is_over(self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x')
    }

    fn id(self) -> (u32, u64) {
        (self.pid, self.start_time)
    }
}

/// Stops every process of `spaces` and waits until every launcher recorded in `procs_dir`
/// has its command inside. Puts in `kept` the processes that were stopped already, by the
/// sandbox itself, which a resume must leave so. Fails, leaving stopped what it stopped,
/// when that takes longer than [`SETTLE_WITHIN`].
pub(super) fn stop(
    spaces: &Namespaces,
    procs_dir: &Path,
    kept: &mut Vec<(u32, u64)>,
) -> io::Result<()> {
    let deadline = Instant::now() + SETTLE_WITHIN;
    let mut first = true;
    loop {
        let mut running = 0;
        for m in members(spaces) {
            if m.is_stopped() {
                if first {
                    kept.push(m.id());
                }
            } else if !m.is_over() && sys::signal_recorded(m.pid, m.start_time, libc::SIGSTOP)? {
                running += 1;
            }
        }
        first = false;
        let entering = entering_launchers(procs_dir);
        if running == 0 && entering == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{running} process(es) still running and {entering} still being started \
                     {} s after SIGSTOP",
                    SETTLE_WITHIN.as_secs()
                ),
            ));
        }
        std::thread::sleep(PASS_PERIOD);
    }
}

/// Continues every process of `spaces` that a signal stopped, but those in `kept`, and
/// proves none is left stopped.
pub(super) fn resume(spaces: &Namespaces, kept: &[(u32, u64)]) -> io::Result<()> {
    let deadline = Instant::now() + SETTLE_WITHIN;
    loop {
        let mut stopped = 0;
        // A tracer's stop ('t') is the tracer's to end.
        for m in members(spaces) {
            if m.state == b'T'
                && !kept.contains(&m.id())
                && sys::signal_recorded(m.pid, m.start_time, libc::SIGCONT)?
            {
                stopped += 1;
            }
        }
        if stopped == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{stopped} process(es) still stopped {} s after SIGCONT",
                    SETTLE_WITHIN.as_secs()
                ),
            ));
        }
        std::thread::sleep(PASS_PERIOD);
    }
}

/// Every process of `spaces` (and of namespaces nested in them): pid and start time.
pub(super) fn member_ids(spaces: &Namespaces) -> Vec<(u32, u64)> {
    members(spaces).into_iter().map(Member::id).collect()
}

/// Every process in one of `spaces` or in a namespace nested in one.
fn members(spaces: &Namespaces) -> Vec<Member> {
    if spaces.0.is_empty() {
        return Vec::new();
    }
    let Some(pids) = sys::proc_pids() else {
        return Vec::new();
    };
    // Whether a namespace is the sandbox's, decided once per namespace and pass.
    let mut inside: HashMap<u64, bool> = spaces.0.iter().map(|&ns| (ns, true)).collect();
    if let Some(own) = pid_namespace(std::process::id()) {
        inside.entry(own).or_insert(false);
    }
    let mut out = Vec::new();
    for pid in pids {
        // Unreadable: exited meanwhile, or not ours to inspect (and so not a sandbox's).
        let Some(ns) = pid_namespace(pid) else {
            continue;
        };
        let member = *inside.entry(ns).or_insert_with(|| {
            enclosing_namespaces(pid)
                .iter()
                .any(|outer| spaces.0.contains(outer))
        });
        if !member {
            continue;
        }
        if let Some(stat) = sys::proc_stat(pid) {
            out.push(Member {
                pid,
                start_time: stat.start_time,
                state: stat.state,
            });
        }
    }
    out
}

/// The PID namespaces enclosing the one `pid` lives in, innermost first, as far up as this
/// process may look (the kernel refuses to go above its own).
fn enclosing_namespaces(pid: u32) -> Vec<u64> {
    let mut out = Vec::new();
    let Ok(file) = File::open(format!("/proc/{pid}/ns/pid")) else {
        return out;
    };
    let mut ns = OwnedFd::from(file);
    for _ in 0..MAX_NS_DEPTH {
        // SAFETY: an ioctl without arguments on a namespace fd we own; it returns a new fd.
        let rc = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_PARENT as _) };
        if rc < 0 {
            break;
        }
        // SAFETY: a fresh descriptor the kernel just returned, owned by nobody else.
        let parent = unsafe { OwnedFd::from_raw_fd(rc) };
        let parent = File::from(parent);
        let Ok(m) = parent.metadata() else {
            break;
        };
        out.push(m.ino());
        ns = OwnedFd::from(parent);
    }
    out
}

/// How many launchers recorded in `procs_dir` live without a command yet: each is about to
/// put one in the sandbox's namespace. A recorded process in this process's own PID
/// namespace is a launcher; the others are the commands themselves, inside.
fn entering_launchers(procs_dir: &Path) -> usize {
    let Ok(records) = meta::read_proc_records(procs_dir) else {
        return 0;
    };
    records
        .iter()
        .filter(|r| sys::is_alive(r.pid, r.start_time) && sys::in_our_pid_namespace(r.pid))
        .filter(|r| {
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", r.pid))
                .is_ok_and(|c| c.trim().is_empty())
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_namespace_has_no_members() {
        assert!(members(&Namespaces(Vec::new())).is_empty());
    }

    #[test]
    fn our_own_namespace_is_not_nested_in_itself() {
        let own = pid_namespace(std::process::id()).unwrap();
        assert!(!enclosing_namespaces(std::process::id()).contains(&own));
    }
}
