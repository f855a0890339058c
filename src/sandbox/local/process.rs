//! Starting sandbox processes and carrying their output: foreground runs with bounded
//! capture, background processes with an event stream that a later `connect` can take over.
//!
//! Every process is `bash -c` in its own process group, recorded in `procs/<pid>` before the
//! caller hears of it, so a kill from any wmo-e2b process finds it, and entered in the
//! sandbox's process table (see `proc_table`) until the thread watching it (see `watch`) reaps
//! it.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::enter::Request;
use super::isolation::BWRAP_VERIFIER;
use super::meta::{self, ProcRecord};
use super::netns;
use super::ns::Space;
use super::outlet::Outlet;
use super::proc_table::{ProcEntry, KILL_WAIT};
use super::spawn::{Child, Io, Spawn};
use super::state::{Mode, SandboxState};
use super::sys;
use super::watch::{Watch, STDOUT};
use crate::sandbox::{
    Captured, ImageRoot, Output, OutputSink, ProcessEvent, Result, Role, RunOpts, SandboxError,
    TERM_GRACE,
};
use crate::sync::lock;

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

/// What to start.
pub(super) struct Launch<'a> {
    pub cmd: &'a str,
    /// As the process sees it: a sandbox path under bwrap, a host path without.
    pub cwd: String,
    pub role: Role,
    pub envs: &'a [(String, String)],
    pub stdin: bool,
    /// A process of this sandbox whose network this one joins when commands get networks
    /// of their own (see `SpawnOpts::network_of`).
    pub network_of: Option<u32>,
}

struct Started {
    entry: Arc<ProcEntry>,
    child: Child,
    reaped_tx: Sender<()>,
}

/// The command line of a sandbox process.
fn command(state: &SandboxState, l: &Launch) -> Result<Spawn> {
    // The caller's variables come after ours, so they may override any (HOME too).
    let home = match l.role {
        Role::Task => &state.home,
        Role::System => &state.system,
        Role::Verify => "",
    };
    // Where commands get networks of their own, a command lent another's joins that one.
    let join_network = l.network_of.filter(|_| !state.internet());
    let mut c = match state.mode {
        Mode::Bwrap(bwrap) => {
            let holder = state.holder(Space::for_role(l.role))?;
            if l.role != Role::System {
                state.mark_entered(&holder)?;
            }
            // With the network locked the command gets a network namespace of its own, so
            // it reaches nothing beyond itself (a server it starts there lives as long as it
            // does). Its shell by its path in the sandbox, which has no search to do.
            let image = state.image.as_ref().filter(|_| l.role != Role::System);
            let (env, argv) = match (l.role, image) {
                (Role::Verify, None) => (
                    verifier_env(&bwrap.path_env, BWRAP_VERIFIER, l.envs),
                    VERIFY_SHELL.to_vec(),
                ),
                (_, None) => (
                    sandbox_env(&bwrap.path_env, home, state.envs.iter().chain(l.envs)),
                    SHELL.to_vec(),
                ),
                // On an image: its variables beneath ours, its shell (a verifier's reads no
                // profile either way: `sh -c` reads none).
                (role, Some(image)) => {
                    let path = image_path(image);
                    // Who the process is stays ours: the image's variables cannot say
                    // otherwise.
                    let own = ["HOME", "USER", "LOGNAME", "SHELL", "TMPDIR"];
                    let image_env = image.env.iter().filter(|(k, _)| !own.contains(&k.as_str()));
                    let mut env = match role {
                        Role::Verify => {
                            let caller: Vec<_> = image_env.chain(l.envs).cloned().collect();
                            verifier_env(path, BWRAP_VERIFIER, &caller)
                        }
                        _ => sandbox_env(path, home, image_env.chain(&state.envs).chain(l.envs)),
                    };
                    env.retain(|(k, _)| k != "SHELL");
                    env.push(("SHELL".into(), image.shell.clone()));
                    let verify_bash = role == Role::Verify && image.shell.ends_with("/bash");
                    let shell = match verify_bash {
                        true => VERIFY_SHELL[1..].to_vec(),
                        false => vec!["-c"],
                    };
                    (
                        env,
                        [image.shell.as_str()].into_iter().chain(shell).collect(),
                    )
                }
            };
            let argv: Vec<&str> = argv.iter().copied().chain([l.cmd]).collect();
            let mut c = Request::Enter {
                holder: &holder,
                user_namespace: bwrap.in_user_namespace(state.ids),
                drop_to: bwrap.drops_to(l.role),
                own_network: !state.internet() && join_network.is_none(),
                cwd: &l.cwd,
                env: &env,
                argv: &argv,
            }
            .command(&[]);
            if state.own_network {
                let ns = netns::open(&holder)
                    .map_err(|e| state.io_error("joining the sandbox's network", e))?;
                c.join_netns(ns);
            } else if let Some(pid) = join_network {
                c.join_netns(network_of(state, pid)?);
            }
            c
        }
        // Unconfined, a verifier is a host process like any other, with the fixed
        // environment all the same.
        Mode::None if l.role == Role::Verify => {
            let verifier = state.dir.join(meta::VERIFIER_DIR);
            let mut c = Spawn::new(sys::program("bash"));
            c.args(VERIFY_SHELL[1..].iter().chain([&l.cmd]))
                .current_dir(&l.cwd);
            let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.into());
            for (k, v) in verifier_env(&path, &verifier.to_string_lossy(), l.envs) {
                c.env(k, v);
            }
            c
        }
        Mode::None => {
            let mut c = match state.internet() || join_network.is_some() {
                true => {
                    let mut c = Spawn::new(sys::program("bash"));
                    c.args(["-c", l.cmd]);
                    c
                }
                false => {
                    let mut c = Spawn::new(sys::program("unshare"));
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
            for key in PASSTHROUGH_ENV.iter().chain(HOST_ENV) {
                if let Some(v) = std::env::var_os(key) {
                    c.env(key, v);
                }
            }
            if std::env::var_os("PATH").is_none() {
                c.env("PATH", DEFAULT_PATH);
            }
            if let Some(pid) = join_network {
                c.join_netns(network_of(state, pid)?);
            }
            c.current_dir(&l.cwd)
                .env("HOME", home)
                .envs(state.envs.iter().map(|(k, v)| (k, v)))
                .envs(l.envs.iter().map(|(k, v)| (k, v)));
            c
        }
    };
    // Counted against the sandbox's limits before it runs anything.
    if let Some(cgroup) = state.limits.cgroup(&state.dir) {
        let procs = cgroup
            .procs_files()
            .map_err(|e| state.io_error("joining the sandbox's cgroups", e))?;
        c.join_cgroups(procs);
    }
    // Its own process group, which a kill of this command reaches entirely.
    c.new_process_group()
        .stdin(if l.stdin { Io::Piped } else { Io::Null })
        .stdout(Io::Piped)
        .stderr(Io::Piped);
    Ok(c)
}

/// The network namespace of `pid`, which must be a live process this sandbox started: a
/// caller cannot lend a command the network of a process that is not the sandbox's.
fn network_of(state: &SandboxState, pid: u32) -> Result<std::os::fd::OwnedFd> {
    if state.entry(pid).is_none() {
        return Err(state.no_such_process(pid));
    }
    let what = format!("joining the network of process {pid}");
    let file = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| state.io_error(what.clone(), e))?;
    // A process started while the sandbox had the host's network (a task that narrowed it
    // since) still has it: a command without network must not be given it.
    let host =
        std::fs::metadata("/proc/self/ns/net").map_err(|e| state.io_error(what.clone(), e))?;
    let theirs = file
        .metadata()
        .map_err(|e| state.io_error(what.clone(), e))?;
    if (theirs.dev(), theirs.ino()) == (host.dev(), host.ino()) {
        // Not a transport failure: a fresh sandbox of the same run would be refused alike.
        return Err(SandboxError::Unsupported(format!(
            "{what}: that process has the host's network, which a command without network must \
             not join (a task that narrows a --network host run: run it with --network none)"
        )));
    }
    Ok(std::os::fd::OwnedFd::from(file))
}

/// A task command's shell, and a verifier's, which reads no profile, rc file or `BASH_ENV`
/// (its environment has none) the agent could have left; the command follows.
const SHELL: &[&str] = &["/bin/bash", "-c"];
const VERIFY_SHELL: &[&str] = &["/bin/bash", "--noprofile", "--norc", "-c"];

/// A verifier's fixed environment (see [`Role::Verify`]): nothing of the sandbox's or the
/// agent's, its own `HOME` and `TMPDIR` under `dir`, then the caller's variables.
fn verifier_env(path: &str, dir: &str, caller: &[(String, String)]) -> Vec<(String, String)> {
    let (home, tmp) = (format!("{dir}/home"), format!("{dir}/tmp"));
    let fixed = [
        ("PATH", path),
        ("USER", "verifier"),
        ("LOGNAME", "verifier"),
        ("SHELL", "/bin/bash"),
        ("HOME", home.as_str()),
        ("TMPDIR", tmp.as_str()),
        ("PYTHONNOUSERSITE", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
    ];
    compose_env(&fixed, caller.iter())
}

/// The environment of a command under bwrap: ours alone but for the few variables passed
/// through, then the caller's (which may override any).
fn sandbox_env<'a>(
    path: &str,
    home: &str,
    caller: impl Iterator<Item = &'a (String, String)>,
) -> Vec<(String, String)> {
    let fixed = [
        ("PATH", path),
        ("USER", "user"),
        ("LOGNAME", "user"),
        ("SHELL", "/bin/bash"),
        ("TMPDIR", "/tmp"),
        ("HOME", home),
    ];
    compose_env(&fixed, caller)
}

/// An image's own `PATH`, or the usual one when it sets none.
fn image_path(image: &ImageRoot) -> &str {
    image
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or(DEFAULT_PATH, |(_, v)| v.as_str())
}

/// The host's few passed-through variables, then `fixed`, then the caller's: each later one
/// overrides an earlier one of the same name.
fn compose_env<'a>(
    fixed: &[(&str, &str)],
    caller: impl Iterator<Item = &'a (String, String)>,
) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = PASSTHROUGH_ENV
        .iter()
        .filter_map(|k| Some((k.to_string(), std::env::var(k).ok()?)))
        .collect();
    env.extend(fixed.iter().map(|(k, v)| (k.to_string(), v.to_string())));
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
        matches!(state.mode, Mode::Bwrap(_)) && !child.entered_directly(),
    );
    let entry = Arc::new(entry);
    lock(&state.procs).insert(pid, Arc::clone(&entry));
    Ok(Started {
        entry,
        child,
        reaped_tx,
    })
}

/// Undoes `start` when the thread that would watch the process could not be created.
fn fail_started(state: &SandboxState, entry: &ProcEntry, e: io::Error) -> SandboxError {
    // The child went down with the closure that could not run: kill it, leave the zombie.
    let _ = entry.kill_group();
    lock(&state.procs).remove(&entry.pid);
    meta::remove_proc_record(&state.dir, entry.pid);
    state.io_error("starting a helper thread", e)
}

fn spawn_thread(name: String, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new().name(name).spawn(f).map(drop)
}

/// Drops a process whose leader was reaped from the table, and its record too once nothing
/// of its group runs any more.
fn forget_reaped(state: &SandboxState, pid: u32) {
    lock(&state.procs).remove(&pid);
    if sys::live_groups(&[pid]).is_empty() {
        meta::remove_proc_record(&state.dir, pid);
    }
}

/// A started child and its reaping, which happens once.
struct Reaping {
    entry: Arc<ProcEntry>,
    child: Child,
    /// Dropped when the leader is reaped, which is what `ProcEntry::wait_reaped` hears; so
    /// `None` once it was.
    reaped_tx: Option<Sender<()>>,
    /// What the reaping found, until [`Reaping::reap`] hands it over.
    status: Option<io::Result<ExitStatus>>,
}

impl Reaping {
    fn new(started: Started) -> Reaping {
        Reaping {
            entry: started.entry,
            child: started.child,
            reaped_tx: Some(started.reaped_tx),
            status: None,
        }
    }

    /// The exit status of the leader, reaped now if it was not yet (its group optionally
    /// killed first, while the zombie still reserves the group id). Called once.
    fn reap(&mut self, kill_group_first: bool) -> io::Result<ExitStatus> {
        self.reap_now(kill_group_first);
        self.status
            .take()
            .unwrap_or_else(|| Err(io::Error::other("the process was reaped already")))
    }

    /// Reaps the leader if it has exited, without waiting.
    fn reap_if_exited(&mut self) {
        if self.reaped_tx.is_some() && sys::exited_keep_zombie(self.entry.pid).unwrap_or(false) {
            self.reap_now(false);
        }
    }

    fn reap_now(&mut self, kill_group_first: bool) {
        if self.reaped_tx.is_some() {
            self.status = Some(self.entry.reap(&mut self.child, kill_group_first));
            self.reaped_tx = None;
        }
    }
}

/// Runs a foreground command to completion or its timeout, watched from the caller's thread.
pub(super) fn run(state: &Arc<SandboxState>, l: &Launch, opts: &RunOpts) -> Result<Output> {
    let mut started = start(state, l, None)?;
    let pid = started.entry.pid;
    let mut watch = Watch::new(&mut started.child);
    let mut proc = Reaping::new(started);
    let max = opts.max_output;
    let mut captured = [Captured::default(), Captured::default()];
    let mut capture = |stream: usize, data: &[u8]| captured[stream].push(data, max);

    let mut timed_out = false;
    let mut give_up = Instant::now() + opts.timeout;
    let watched = loop {
        if watch.exited() {
            break Ok(());
        }
        let now = Instant::now();
        if now >= give_up {
            if timed_out {
                break Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no exit within 5 s of SIGKILL",
                ));
            }
            let _ = proc.entry.kill_group();
            timed_out = true;
            give_up = now + KILL_WAIT;
            continue;
        }
        if let Err(e) = watch.step(give_up - now, &mut capture) {
            let _ = proc.entry.kill_group();
            break Err(e);
        }
    };
    if let Err(e) = watched {
        // Stuck past SIGKILL, or unwatchable: reap it whenever it ends, off this thread, so
        // its pid stays reserved until then.
        let _ = spawn_thread(format!("lsb-run-{pid}-reap"), move || {
            let _ = proc.reap(true);
        });
        return Err(state.io_error("waiting for a command", e));
    }
    // Kill what the command left in the background: `run` returns when its command does.
    let status = proc.reap(true);
    // Output written just before the exit may still sit in the pipes; give it a short,
    // bounded time, since an escaped process could hold the pipes open forever.
    let _ = watch.drain(DRAIN_GRACE, false, &mut capture);
    if watch.pipes_open() {
        // An escaped process holds them: keep reading (and dropping) what it writes rather
        // than break its pipe.
        let _ = spawn_thread(format!("lsb-run-{pid}-drain"), move || {
            watch.discard_until_closed()
        });
    }
    forget_reaped(state, pid);
    let status = status.map_err(|e| state.io_error("waiting for a command", e))?;
    let exit_code = status.code();
    if exit_code.is_none() && !timed_out {
        // Killed by a signal: perhaps because the sandbox itself was killed.
        state.ensure_live()?;
    }
    let [stdout, stderr] = captured;
    Ok(Output {
        exit_code,
        stdout,
        stderr,
        timed_out,
    })
}

/// Starts a background process whose output goes to `sink`, delivered by one thread that
/// reads both pipes and reaps the process, and ends it `ends_after` (see
/// [`crate::sandbox::SpawnOpts::ends_after`]); returns its pid.
pub(super) fn spawn(
    state: &Arc<SandboxState>,
    l: &Launch,
    sink: Box<dyn OutputSink>,
    ends_after: Option<Duration>,
) -> Result<u32> {
    let mut started = start(state, l, Some(Outlet::new(sink)))?;
    let pid = started.entry.pid;
    let entry = Arc::clone(&started.entry);
    let watch = Watch::new(&mut started.child);
    let proc = Reaping::new(started);
    let follow_state = Arc::clone(state);
    let ends = ends_after.map(|after| Instant::now() + after);
    if let Err(e) = spawn_thread(format!("lsb-proc-{pid}"), move || {
        follow(&follow_state, watch, proc, ends)
    }) {
        return Err(fail_started(state, &entry, e));
    }
    Ok(pid)
}

/// The life of a background process on its one thread: output delivered as it comes, its
/// group sent SIGTERM at `ends` and SIGKILL a grace later, the leader reaped at its exit
/// (background children of a background process live on, until the sandbox dies), the
/// pipes drained while output keeps moving, then the last event.
fn follow(state: &SandboxState, mut watch: Watch, mut proc: Reaping, ends: Option<Instant>) {
    let pid = proc.entry.pid;
    let entry = Arc::clone(&proc.entry);
    let mut failed = None;
    // SIGTERM at the deadline, SIGKILL a grace later: the signals still to send, last first.
    let mut signals: Vec<(Instant, libc::c_int)> = ends.map_or_else(Vec::new, |at| {
        vec![(at + TERM_GRACE, libc::SIGKILL), (at, libc::SIGTERM)]
    });
    while !watch.exited() {
        let now = Instant::now();
        while let Some(&(_, signal)) = signals.last().filter(|(at, _)| *at <= now) {
            signals.pop();
            let _ = entry.signal_group(signal);
        }
        let within = signals.last().map_or(Duration::from_secs(3600), |(at, _)| {
            at.saturating_duration_since(now)
        });
        let stepped = watch.step(within, &mut |stream, data| {
            deliver(&entry, &mut proc, stream, data)
        });
        if let Err(e) = stepped {
            let _ = entry.kill_group();
            failed = Some(e);
            break;
        }
    }
    let status = proc.reap(false);
    let drained = watch.drain(DRAIN_GRACE, true, &mut |stream, data| {
        deliver(&entry, &mut proc, stream, data)
    });
    forget_reaped(state, pid);
    let last = match (failed, drained, status) {
        (Some(e), _, _) | (None, Err(e), _) | (None, Ok(()), Err(e)) => {
            ProcessEvent::Failed(state.io_error("waiting for a process", e))
        }
        (None, Ok(()), Ok(status)) => ProcessEvent::Exit(status.code()),
    };
    entry.finish(last);
    watch.discard_until_closed();
}

/// Hands one chunk of a background process's output to its subscriber.
fn deliver(entry: &ProcEntry, proc: &mut Reaping, stream: usize, data: &[u8]) {
    let event = match stream {
        STDOUT => ProcessEvent::Stdout(data.to_vec()),
        _ => ProcessEvent::Stderr(data.to_vec()),
    };
    // A subscriber that is slow to read must not keep an exited leader unreaped: kills wait
    // for the reaping.
    entry.deliver(event, &mut || proc.reap_if_exited());
}
