//! Starting sandbox processes and carrying their output: foreground runs with bounded
//! capture, background processes with an event stream that a later `connect` can take over.
//!
//! Every process is `bash -c` in its own process group, recorded in `procs/<pid>` before the
//! caller hears of it, so a kill from any wmo-e2b process finds it. One waiter thread per
//! process reaps it; until then its zombie keeps the pid (and so the group id) from being
//! reused, which is what makes group signals from other threads safe.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, SendTimeoutError, Sender};

use super::enter::Request;
use super::isolation::Bwrap;
use super::meta::{self, ProcRecord};
use super::ns::Space;
use super::sandbox::{Mode, SandboxState};
use super::sys;
use crate::sandbox::{
    Captured, Output, Process, ProcessEvent, Result, Role, RunOpts, SandboxError,
};
use crate::sync::lock;

/// Read size for process output: large, because a runner may stream megabytes of frames.
const READ_CHUNK: usize = 64 * 1024;
/// Chunks buffered per subscriber before the reader blocks (backpressure, never loss).
const EVENT_BUFFER: usize = 64;
/// How long output may keep trickling in after a process exits before we stop waiting for
/// its pipes: a grandchild that escaped the group can hold them open forever.
const DRAIN_GRACE: Duration = Duration::from_millis(250);
/// Bound on waiting for a SIGKILLed process to be reaped.
pub(super) const KILL_WAIT: Duration = Duration::from_secs(5);
/// Bound on one `send_stdin`: a process that does not read its stdin for this long is stuck.
pub(super) const STDIN_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a delivery blocked on a slow subscriber checks whether `connect` replaced it.
const RETARGET_POLL: Duration = Duration::from_millis(100);

/// Host variables a sandbox process inherits. Everything else is dropped so the host's
/// credentials (API keys and the like) never reach sandboxed code.
const PASSTHROUGH_ENV: &[&str] = &["LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM"];
/// More host variables an unconfined (`--isolation none`) process inherits, since it runs on
/// the host as the host's user.
const HOST_ENV: &[&str] = &["PATH", "USER", "LOGNAME", "SHELL", "TMPDIR"];
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Run inside a fresh network namespace: bring loopback up (as E2B sandboxes without internet
/// still have it) and then become the user's command. `$1` is the command, passed as an
/// argument so it needs no quoting.
const NETLOCKED_SHELL: &str = "ip link set lo up >/dev/null 2>&1; exec bash -c \"$1\"";

pub(super) type ProcTable = Mutex<HashMap<u32, Arc<ProcEntry>>>;

/// One output pipe of a child, boxed so stdout and stderr share a reader loop.
type Pipe = Option<Box<dyn Read + Send>>;

/// What to start.
pub(super) struct Launch<'a> {
    pub cmd: &'a str,
    /// As the process sees it: a sandbox path under bwrap, a host path without.
    pub cwd: &'a str,
    pub role: Role,
    pub envs: &'a [(String, String)],
    pub stdin: bool,
}

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
    /// Whether the process is a command's launcher outside the sandbox (under bwrap), the
    /// command being its child inside.
    launcher: bool,
}

impl ProcEntry {
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
    fn reap(&self, child: &mut Child, kill_group_first: bool) -> io::Result<ExitStatus> {
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

/// Where a background process's output goes: the current subscriber, replaceable by
/// `connect`.
pub(super) struct Outlet {
    sub: Mutex<Subscriber>,
    /// Held for each delivery, so the final event (delivered under it) follows every chunk.
    turn: Mutex<()>,
}

struct Subscriber {
    tx: Option<Sender<ProcessEvent>>,
    generation: u64,
    finished: bool,
}

impl Outlet {
    fn new() -> (Outlet, Receiver<ProcessEvent>) {
        let (tx, rx) = bounded(EVENT_BUFFER);
        let outlet = Outlet {
            sub: Mutex::new(Subscriber {
                tx: Some(tx),
                generation: 0,
                finished: false,
            }),
            turn: Mutex::new(()),
        };
        (outlet, rx)
    }

    fn subscribe(&self) -> Option<Receiver<ProcessEvent>> {
        let mut sub = lock(&self.sub);
        if sub.finished {
            return None;
        }
        let (tx, rx) = bounded(EVENT_BUFFER);
        sub.tx = Some(tx);
        sub.generation += 1;
        Some(rx)
    }

    fn deliver(&self, event: ProcessEvent) {
        let _turn = lock(&self.turn);
        self.send(event);
    }

    /// Delivers the last event; everything after it is dropped.
    fn finish(&self, event: ProcessEvent) {
        let _turn = lock(&self.turn);
        self.send(event);
        let mut sub = lock(&self.sub);
        sub.finished = true;
        sub.tx = None;
    }

    fn send(&self, mut event: ProcessEvent) {
        loop {
            let (tx, generation) = {
                let sub = lock(&self.sub);
                match (&sub.tx, sub.finished) {
                    (Some(tx), false) => (tx.clone(), sub.generation),
                    // Nobody listens: drain the pipe anyway so the process never stalls.
                    _ => return,
                }
            };
            // A bounded send, re-checked, rather than a blocking one: a subscriber that was
            // abandoned but not dropped must not wedge delivery to the one `connect` made.
            match tx.send_timeout(event, RETARGET_POLL) {
                Ok(()) => return,
                Err(SendTimeoutError::Timeout(back)) => event = back,
                Err(SendTimeoutError::Disconnected(_)) => {
                    let mut sub = lock(&self.sub);
                    if sub.generation == generation {
                        sub.tx = None;
                    }
                    return;
                }
            }
        }
    }
}

/// Progress of a background process's readers, so the waiter can tell pipes still carrying
/// output (or blocked on a slow subscriber) from pipes held open by a silent grandchild.
#[derive(Default)]
struct Activity {
    reads: AtomicU64,
    delivering: AtomicUsize,
}

struct Started {
    entry: Arc<ProcEntry>,
    child: Child,
    reaped_tx: Sender<()>,
}

/// The command line of a sandbox process.
fn command(state: &SandboxState, l: &Launch) -> Result<Command> {
    // The caller's variables come after ours, so they may override any (HOME too).
    let home = match l.role {
        Role::Task => &state.home,
        Role::System => &state.system,
    };
    let mut c = match state.mode {
        Mode::Bwrap(bwrap) => {
            let holder = state.holder(Space::for_role(l.role))?;
            // With the network locked the command gets a network namespace of its own, so
            // it reaches nothing beyond itself (a server it starts there lives as long as it
            // does). Its shell by its path in the sandbox, which has no search to do.
            let env = sandbox_env(bwrap, home, state.envs.iter().chain(l.envs));
            Request::Enter {
                holder: &holder,
                user_namespace: bwrap.in_user_namespace(),
                drop_to: bwrap.drops_to(),
                own_network: !state.internet(),
                cwd: l.cwd,
                env: &env,
                argv: &["/bin/bash", "-c", l.cmd],
            }
            .command(&[])
        }
        Mode::None => {
            let mut c = match state.internet() {
                true => {
                    let mut c = Command::new(sys::program("bash"));
                    c.args(["-c", l.cmd]);
                    c
                }
                false => {
                    let mut c = Command::new(sys::program("unshare"));
                    c.args([
                        sys::netlock_flag()?,
                        "--",
                        "bash",
                        "-c",
                        NETLOCKED_SHELL,
                        "bash",
                        l.cmd,
                    ]);
                    c
                }
            };
            c.env_clear();
            for key in PASSTHROUGH_ENV.iter().chain(HOST_ENV) {
                if let Some(v) = std::env::var_os(key) {
                    c.env(key, v);
                }
            }
            if std::env::var_os("PATH").is_none() {
                c.env("PATH", DEFAULT_PATH);
            }
            c.current_dir(l.cwd)
                .env("HOME", home)
                .envs(state.envs.iter().map(|(k, v)| (k, v)))
                .envs(l.envs.iter().map(|(k, v)| (k, v)));
            c
        }
    };
    // Its own process group, which a kill of this command reaches entirely.
    c.process_group(0)
        .stdin(if l.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Ok(c)
}

/// The environment of a command under bwrap: ours alone but for the few variables passed
/// through, then the caller's (which may override any).
fn sandbox_env<'a>(
    bwrap: &Bwrap,
    home: &str,
    caller: impl Iterator<Item = &'a (String, String)>,
) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = PASSTHROUGH_ENV
        .iter()
        .filter_map(|k| Some((k.to_string(), std::env::var(k).ok()?)))
        .collect();
    for (k, v) in [
        ("PATH", bwrap.path_env.as_str()),
        ("USER", "user"),
        ("LOGNAME", "user"),
        ("SHELL", "/bin/bash"),
        ("TMPDIR", "/tmp"),
        ("HOME", home),
    ] {
        env.insert(k.into(), v.into());
    }
    env.extend(caller.cloned());
    env.into_iter().collect()
}

/// Kills and reaps a child we cannot hand out.
fn abandon(child: &mut Child) {
    // Not yet reaped, so the pid still names this child and its group.
    let _ = sys::kill_group(child.id());
    let _ = child.wait();
}

/// Starts the process and records it on disk and in the table.
fn start(state: &Arc<SandboxState>, l: &Launch, outlet: Option<Outlet>) -> Result<Started> {
    let mut child = command(state, l)?
        .spawn()
        .map_err(|e| state.io_error("starting a process", e))?;
    let pid = child.id();
    // Unreaped, the child's /proc entry exists even if it already exited.
    let Some(stat) = sys::proc_stat(pid) else {
        abandon(&mut child);
        return Err(state.io_error(
            "reading the new process's /proc entry",
            io::ErrorKind::NotFound.into(),
        ));
    };
    if let Some(stdin) = &child.stdin {
        if let Err(e) = sys::set_nonblocking(stdin.as_raw_fd()) {
            abandon(&mut child);
            return Err(state.io_error("preparing the process's stdin", e));
        }
    }
    let record = ProcRecord {
        pid,
        start_time: stat.start_time,
        role: l.role,
        cmd: l.cmd.to_string(),
    };
    if let Err(e) = meta::write_proc_record(&state.dir, &record) {
        // Unrecorded, the process could outlive its sandbox: a kill from another wmo-e2b
        // process would not know it.
        abandon(&mut child);
        return Err(if e.kind() == io::ErrorKind::NotFound {
            state.mark_gone();
            state.gone()
        } else {
            state.io_error("recording a process", e)
        });
    }
    let (reaped_tx, reaped_rx) = bounded(0);
    let entry = Arc::new(ProcEntry {
        pid,
        start_time: stat.start_time,
        reaped: Mutex::new(false),
        reaped_rx,
        stdin: Mutex::new(child.stdin.take()),
        outlet,
        launcher: matches!(state.mode, Mode::Bwrap(_)),
    });
    lock(&state.procs).insert(pid, Arc::clone(&entry));
    Ok(Started {
        entry,
        child,
        reaped_tx,
    })
}

/// Undoes `start` when a helper thread could not be created.
fn fail_started(
    state: &SandboxState,
    entry: &ProcEntry,
    child: Option<&mut Child>,
    e: io::Error,
) -> SandboxError {
    match child {
        Some(child) => abandon(child),
        // The child went down with the closure that could not run: kill it, leave the zombie.
        None => {
            let _ = entry.kill_group();
        }
    }
    lock(&state.procs).remove(&entry.pid);
    meta::remove_proc_record(&state.dir, entry.pid);
    state.io_error("starting a helper thread", e)
}

/// The child's stdout and stderr, in that order.
fn pipes(child: &mut Child) -> [Pipe; 2] {
    [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
}

fn spawn_thread(name: String, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new().name(name).spawn(f).map(drop)
}

/// Reads `src` in large chunks into `sink` until end of file, then reports on `done`.
fn pump(mut src: impl Read, mut sink: impl FnMut(&[u8]), done: Sender<()>) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => sink(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // EIO and the like: the stream is over either way.
            Err(_) => break,
        }
    }
    let _ = done.send(());
}

/// Runs a foreground command to completion or its timeout.
pub(super) fn run(state: &Arc<SandboxState>, l: &Launch, opts: &RunOpts) -> Result<Output> {
    let Started {
        entry,
        mut child,
        reaped_tx,
    } = start(state, l, None)?;
    let pid = entry.pid;
    let max = opts.max_output;
    let captures = [
        Arc::new(Mutex::new(Captured::default())),
        Arc::new(Mutex::new(Captured::default())),
    ];
    let (done_tx, done_rx) = bounded(2);
    for (i, (stream, capture)) in pipes(&mut child).into_iter().zip(&captures).enumerate() {
        let Some(stream) = stream else {
            let _ = done_tx.send(());
            continue;
        };
        let capture = Arc::clone(capture);
        let done = done_tx.clone();
        let sink = move |data: &[u8]| lock(&capture).push(data, max);
        if let Err(e) = spawn_thread(format!("lsb-run-{pid}-{i}"), move || {
            pump(stream, sink, done)
        }) {
            return Err(fail_started(state, &entry, Some(&mut child), e));
        }
    }
    drop(done_tx);

    let (exit_tx, exit_rx) = bounded(1);
    let waiter_entry = Arc::clone(&entry);
    let waiter = move || {
        // Kill what the command left in the background: `run` returns when its command does.
        let status = waiter_entry.reap(&mut child, true);
        drop(reaped_tx);
        let _ = exit_tx.send(status);
    };
    if let Err(e) = spawn_thread(format!("lsb-run-{pid}-wait"), waiter) {
        return Err(fail_started(state, &entry, None, e));
    }

    let (status, timed_out) = match exit_rx.recv_timeout(opts.timeout) {
        Ok(status) => (status, false),
        Err(RecvTimeoutError::Timeout) => {
            let _ = entry.kill_group();
            match exit_rx.recv_timeout(KILL_WAIT) {
                Ok(status) => (status, true),
                Err(_) => {
                    return Err(state.io_error(
                        "reaping a timed-out command",
                        io::Error::new(io::ErrorKind::TimedOut, "no exit within 5 s of SIGKILL"),
                    ))
                }
            }
        }
        Err(RecvTimeoutError::Disconnected) => {
            return Err(state.io_error(
                "waiting for a command",
                io::Error::other("the waiter thread ended without a status"),
            ))
        }
    };
    // Output written just before the exit may still sit in the pipes; give the readers a
    // short, bounded time, since an escaped process could hold the pipes open forever.
    let drain_until = Instant::now() + DRAIN_GRACE;
    for _ in 0..2 {
        if done_rx.recv_deadline(drain_until).is_err() {
            break;
        }
    }
    lock(&state.procs).remove(&pid);
    if sys::live_groups(&[pid]).is_empty() {
        meta::remove_proc_record(&state.dir, pid);
    }
    let status = status.map_err(|e| state.io_error("waiting for a command", e))?;
    let exit_code = status.code();
    if exit_code.is_none() && !timed_out {
        // Killed by a signal: perhaps because the sandbox itself was killed.
        state.ensure_live()?;
    }
    let [out, err] = captures;
    let take = |c: Arc<Mutex<Captured>>| std::mem::take(&mut *lock(&c));
    Ok(Output {
        exit_code,
        stdout: take(out),
        stderr: take(err),
        timed_out,
    })
}

/// Starts a background process whose output arrives as events.
pub(super) fn spawn(state: &Arc<SandboxState>, l: &Launch) -> Result<Process> {
    let (outlet, events) = Outlet::new();
    let Started {
        entry,
        mut child,
        reaped_tx,
    } = start(state, l, Some(outlet))?;
    let pid = entry.pid;
    let activity = Arc::new(Activity::default());
    let (done_tx, done_rx) = bounded(2);
    let events_of: [fn(Vec<u8>) -> ProcessEvent; 2] = [ProcessEvent::Stdout, ProcessEvent::Stderr];
    for (i, (stream, make)) in pipes(&mut child).into_iter().zip(events_of).enumerate() {
        let Some(stream) = stream else {
            let _ = done_tx.send(());
            continue;
        };
        let sink_entry = Arc::clone(&entry);
        let act = Arc::clone(&activity);
        let sink = move |data: &[u8]| {
            act.reads.fetch_add(1, Ordering::SeqCst);
            act.delivering.fetch_add(1, Ordering::SeqCst);
            if let Some(outlet) = &sink_entry.outlet {
                outlet.deliver(make(data.to_vec()));
            }
            act.delivering.fetch_sub(1, Ordering::SeqCst);
        };
        let done = done_tx.clone();
        if let Err(e) = spawn_thread(format!("lsb-proc-{pid}-{i}"), move || {
            pump(stream, sink, done)
        }) {
            return Err(fail_started(state, &entry, Some(&mut child), e));
        }
    }
    drop(done_tx);

    let waiter_entry = Arc::clone(&entry);
    let waiter_state = Arc::clone(state);
    let waiter = move || {
        // Background children of a background process live on (until the sandbox dies).
        let status = waiter_entry.reap(&mut child, false);
        drop(reaped_tx);
        drain(&done_rx, &activity);
        lock(&waiter_state.procs).remove(&pid);
        if sys::live_groups(&[pid]).is_empty() {
            meta::remove_proc_record(&waiter_state.dir, pid);
        }
        let last = match status {
            Ok(status) => ProcessEvent::Exit(status.code()),
            Err(e) => ProcessEvent::Failed(waiter_state.io_error("waiting for a process", e)),
        };
        if let Some(outlet) = &waiter_entry.outlet {
            outlet.finish(last);
        }
    };
    if let Err(e) = spawn_thread(format!("lsb-proc-{pid}-wait"), waiter) {
        return Err(fail_started(state, &entry, None, e));
    }
    Ok(Process { pid, events })
}

/// Waits for both readers of an exited process to reach end of file, as long as output keeps
/// moving; stops once the pipes have been silent for a grace period.
fn drain(done: &Receiver<()>, activity: &Activity) {
    let mut ended = 0;
    let mut seen = activity.reads.load(Ordering::SeqCst);
    while ended < 2 {
        match done.recv_timeout(DRAIN_GRACE) {
            Ok(()) => ended += 1,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let now = activity.reads.load(Ordering::SeqCst);
                if now == seen && activity.delivering.load(Ordering::SeqCst) == 0 {
                    return;
                }
                seen = now;
            }
        }
    }
}
