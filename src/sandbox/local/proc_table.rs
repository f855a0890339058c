//! The processes this wmo-e2b process started in a sandbox and has not reaped yet, shared by
//! every handle on the sandbox so that `connect(pid)`, `send_stdin` and kills work from any.
//!
//! A process's leader is reaped by the thread that watches it (see `watch`); until then its zombie keeps the pid (and
//! so the group id) from being reused, which is what makes group signals from other threads
//! safe. Every group signal takes the entry's `reaped` lock, so none races the reaping.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::process::{ChildStdin, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::outlet::Outlet;
use super::spawn::Child;
use super::sys;
use crate::sandbox::ProcessEvent;
use crate::sync::lock;

/// Bound on waiting for a SIGKILLed process to be reaped. Generous: a dying process needs
/// CPU to exit, which a host starved by a quota (a batch job's) gives slowly; the wait ends as
/// soon as the process is gone, so only a process that never dies costs the whole of it.
pub(super) const KILL_WAIT: Duration = Duration::from_secs(30);
/// How much longer what was SIGKILLed is waited for once all of it has begun to exit: on a
/// host starved of CPU (a quota) exiting takes long, and dying is not stuck.
pub(super) const DYING_WAIT: Duration = Duration::from_secs(300);
/// Bound on one `send_stdin`: a process that does not read its stdin for this long is stuck.
pub(super) const STDIN_WRITE_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) type ProcTable = Mutex<HashMap<u32, Arc<ProcEntry>>>;

/// A process this wmo-e2b process started and has not reaped yet.
pub(super) struct ProcEntry {
    pub pid: u32,
    pub start_time: u64,
    /// True once the leader is reaped. Group signals take this lock so they never race the
    /// reaping that frees the pid number.
    reaped: Mutex<bool>,
    /// Disconnects when the leader has been reaped.
    reaped_rx: Receiver<()>,
    stdin: Mutex<Option<ChildStdin>>,
    /// `None` for foreground runs, whose output goes to their `Output`.
    outlet: Option<Outlet>,
    /// Whether the process is a command's launcher outside the sandbox (under bwrap, a command
    /// that could not be entered directly), the command being its child inside.
    launcher: bool,
}

impl ProcEntry {
    /// The entry of a process just started, and the sender its waiter drops once the leader
    /// is reaped.
    pub fn new(
        pid: u32,
        start_time: u64,
        stdin: Option<ChildStdin>,
        outlet: Option<Outlet>,
        launcher: bool,
    ) -> (ProcEntry, Sender<()>) {
        let (reaped_tx, reaped_rx) = bounded(0);
        let entry = ProcEntry {
            pid,
            start_time,
            reaped: Mutex::new(false),
            reaped_rx,
            stdin: Mutex::new(stdin),
            outlet,
            launcher,
        };
        (entry, reaped_tx)
    }

    /// SIGKILLs the process's group. `Ok(false)` when nothing was left to kill.
    pub fn kill_group(&self) -> io::Result<bool> {
        let reaped = lock(&self.reaped);
        if !*reaped {
            if self.launcher {
                // Unreaped (the lock holds off the reaping), the pid is still the launcher's.
                sys::end_launched(self.pid, self.start_time)?;
            }
            return sys::kill_group(self.pid);
        }
        drop(reaped);
        sys::kill_recorded_group(self.pid, self.start_time)
    }

    /// Sends `signal` to the process's group while its leader is unreaped; SIGKILL as
    /// [`ProcEntry::kill_group`] does. `Ok(false)` when nothing was left to signal.
    pub fn signal_group(&self, signal: libc::c_int) -> io::Result<bool> {
        if signal == libc::SIGKILL {
            return self.kill_group();
        }
        let reaped = lock(&self.reaped);
        if *reaped {
            return Ok(false);
        }
        sys::signal_group(self.pid, signal)
    }

    /// Whether the leader was reaped within `within`.
    pub fn wait_reaped(&self, within: Duration) -> bool {
        matches!(
            self.reaped_rx.recv_timeout(within),
            Err(RecvTimeoutError::Disconnected)
        )
    }

    /// A new event stream for the process; the previous subscriber's channel disconnects.
    /// `None` for foreground runs and finished processes.
    pub fn subscribe(&self) -> Option<Receiver<ProcessEvent>> {
        self.outlet.as_ref()?.subscribe()
    }

    /// Hands a chunk of output to the subscriber (background processes only); see
    /// [`Outlet::deliver`] for `while_blocked`.
    pub fn deliver(&self, event: ProcessEvent, while_blocked: &mut dyn FnMut()) {
        if let Some(outlet) = &self.outlet {
            outlet.deliver(event, while_blocked);
        }
    }

    /// Hands the last event to the subscriber (background processes only).
    pub fn finish(&self, event: ProcessEvent) {
        if let Some(outlet) = &self.outlet {
            outlet.finish(event);
        }
    }

    /// Writes all of `data` to the process's stdin within `timeout`. The stdin lock is per
    /// process, so large writes to different processes proceed in parallel.
    pub fn write_stdin(&self, data: &[u8], timeout: Duration) -> io::Result<()> {
        let guard = lock(&self.stdin);
        let Some(stdin) = guard.as_ref() else {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "stdin is closed or was never opened",
            ));
        };
        let fd = stdin.as_raw_fd();
        let deadline = Instant::now() + timeout;
        let mut rest = data;
        let mut w: &ChildStdin = stdin;
        while !rest.is_empty() {
            match w.write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || !sys::wait_writable(fd, left)? {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the process did not read its stdin in time",
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn close_stdin(&self) {
        lock(&self.stdin).take();
    }

    /// Reaps the exited leader (optionally killing its group first, while the zombie still
    /// reserves the group id).
    pub fn reap(&self, child: &mut Child, kill_group_first: bool) -> io::Result<ExitStatus> {
        let exited = sys::wait_exit_keep_zombie(self.pid);
        let mut reaped = lock(&self.reaped);
        if exited.is_err() {
            // Cannot happen for our own child; if it does, wait without holding the gate.
            drop(reaped);
            let status = child.wait();
            *lock(&self.reaped) = true;
            return status;
        }
        if kill_group_first {
            let _ = sys::kill_group(self.pid);
        }
        let status = child.wait();
        *reaped = true;
        status
    }
}
