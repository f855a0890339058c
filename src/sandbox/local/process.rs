//! Starting sandbox processes and carrying their output: foreground runs with bounded
//! capture, background processes with an event stream that a later `connect` can take over.
//!
//! Every process is `bash -c` in its own process group, recorded in `procs/<pid>` before the
//! caller hears of it, so a kill from any wmo-e2b process finds it, and entered in the
//! sandbox's process table (see `proc_table`) until its waiter thread reaps it.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::enter::Request;
use super::isolation::Bwrap;
use super::meta::{self, ProcRecord};
use super::ns::Space;
use super::outlet::Outlet;
use super::proc_table::{ProcEntry, KILL_WAIT};
use super::state::{Mode, SandboxState};
use super::sys;
use crate::sandbox::{
    Captured, Output, Process, ProcessEvent, Result, Role, RunOpts, SandboxError,
};
use crate::sync::lock;

/// Read size for process output: large, because a runner may stream megabytes of frames.
const READ_CHUNK: usize = 64 * 1024;
/// How long output may keep trickling in after a process exits before we stop waiting for
/// its pipes: a grandchild that escaped the group can hold them open forever.
const DRAIN_GRACE: Duration = Duration::from_millis(250);
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

/// One output pipe of a child, boxed so stdout and stderr share a reader loop.
type Pipe = Option<Box<dyn Read + Send>>;

/// What to start.
pub(super) struct Launch<'a> {
    pub cmd: &'a str,
    /// As the process sees it: a sandbox path under bwrap, a host path without.
    pub cwd: String,
    pub role: Role,
    pub envs: &'a [(String, String)],
    pub stdin: bool,
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
                cwd: &l.cwd,
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
            c.current_dir(&l.cwd)
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
        if let Err(e) = sys::set_nonblocking(stdin.as_raw_fd(), true) {
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
            state.gone_now()
        } else {
            state.io_error("recording a process", e)
        });
    }
    // A pause recorded before the record above was written did not see this process, which
    // must not run in a paused sandbox (see `pause`).
    if let Err(e) = state.ensure_live() {
        abandon(&mut child);
        meta::remove_proc_record(&state.dir, pid);
        return Err(e);
    }
    let (entry, reaped_tx) = ProcEntry::new(
        pid,
        stat.start_time,
        child.stdin.take(),
        outlet,
        matches!(state.mode, Mode::Bwrap(_)),
    );
    let entry = Arc::new(entry);
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

/// Starts one reader thread per output pipe of the started child, stdout's feeding
/// `sinks[0]` and stderr's `sinks[1]`. The receiver hears once from each pipe, at its end of
/// file.
fn start_readers<F>(
    state: &SandboxState,
    started: &mut Started,
    name: &str,
    sinks: [F; 2],
) -> Result<Receiver<()>>
where
    F: FnMut(&[u8]) + Send + 'static,
{
    let (done_tx, done_rx) = bounded(2);
    for (i, (stream, sink)) in pipes(&mut started.child).into_iter().zip(sinks).enumerate() {
        let Some(stream) = stream else {
            let _ = done_tx.send(());
            continue;
        };
        let done = done_tx.clone();
        if let Err(e) = spawn_thread(format!("{name}-{i}"), move || pump(stream, sink, done)) {
            return Err(fail_started(
                state,
                &started.entry,
                Some(&mut started.child),
                e,
            ));
        }
    }
    Ok(done_rx)
}

/// Drops a process whose leader was reaped from the table, and its record too once nothing
/// of its group runs any more.
fn forget_reaped(state: &SandboxState, pid: u32) {
    lock(&state.procs).remove(&pid);
    if sys::live_groups(&[pid]).is_empty() {
        meta::remove_proc_record(&state.dir, pid);
    }
}

/// Runs a foreground command to completion or its timeout.
pub(super) fn run(state: &Arc<SandboxState>, l: &Launch, opts: &RunOpts) -> Result<Output> {
    let mut started = start(state, l, None)?;
    let pid = started.entry.pid;
    let max = opts.max_output;
    let captures = [
        Arc::new(Mutex::new(Captured::default())),
        Arc::new(Mutex::new(Captured::default())),
    ];
    let sinks = captures.each_ref().map(|capture| {
        let capture = Arc::clone(capture);
        move |data: &[u8]| lock(&capture).push(data, max)
    });
    let done_rx = start_readers(state, &mut started, &format!("lsb-run-{pid}"), sinks)?;

    let Started {
        entry,
        mut child,
        reaped_tx,
    } = started;
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
    forget_reaped(state, pid);
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
    let mut started = start(state, l, Some(outlet))?;
    let pid = started.entry.pid;
    let activity = Arc::new(Activity::default());
    let events_of: [fn(Vec<u8>) -> ProcessEvent; 2] = [ProcessEvent::Stdout, ProcessEvent::Stderr];
    let sinks = events_of.map(|make| {
        let entry = Arc::clone(&started.entry);
        let act = Arc::clone(&activity);
        move |data: &[u8]| {
            act.reads.fetch_add(1, Ordering::SeqCst);
            act.delivering.fetch_add(1, Ordering::SeqCst);
            entry.deliver(make(data.to_vec()));
            act.delivering.fetch_sub(1, Ordering::SeqCst);
        }
    });
    let done_rx = start_readers(state, &mut started, &format!("lsb-proc-{pid}"), sinks)?;

    let Started {
        entry,
        mut child,
        reaped_tx,
    } = started;
    let waiter_entry = Arc::clone(&entry);
    let waiter_state = Arc::clone(state);
    let waiter = move || {
        // Background children of a background process live on (until the sandbox dies).
        let status = waiter_entry.reap(&mut child, false);
        drop(reaped_tx);
        drain(&done_rx, &activity);
        forget_reaped(&waiter_state, pid);
        let last = match status {
            Ok(status) => ProcessEvent::Exit(status.code()),
            Err(e) => ProcessEvent::Failed(waiter_state.io_error("waiting for a process", e)),
        };
        waiter_entry.finish(last);
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
