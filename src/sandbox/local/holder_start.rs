//! Starting a namespace holder (see `ns`).
//!
//! Holders are sessions of their own, children of no wmo-e2b process, so they outlive the
//! command that made them (a project's sandbox does). Each is recorded before its namespace
//! is used. A sandbox holder is started with `setsid --fork`, led by a small watcher on the
//! host that kills the whole session once the sandbox's `meta.json` is gone (the sandbox
//! killed, or its state directory deleted under it), so a holder never outlives its sandbox
//! for long even when no wmo-e2b process is left to kill it. As root, a task holder is
//! started inside the sandbox holder's PID namespace (see `enter::lead`) and needs no
//! watcher: it dies with that namespace. Without root it has a watcher too.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::admission;
use super::cgroup::Cgroup;
use super::enter::{
    self, ImageMount, Pass, Request, HOST_ROOT_INSIDE, MAP_BLOCK_FD, QUEUES_AT, QUEUES_DIR,
};
use super::id_range::PROBE_BASE;
use super::image_root::Layer;
use super::isolation::{Binds, Bwrap, IdRange};
use super::meta::META_FILE;
use super::netns;
use super::ns::{self, Holder, Space};
use super::spawn::Io;
use super::spawn::Spawn;
use super::start_report::read_until;
use super::sys;
use crate::sandbox::{ImageRoot, Role};
use crate::sync::lock;

/// How long a holder may take to report its namespace. Long: a holder that fails closes its
/// pipes and is seen at once, so this bounds only one that hangs, and a start on a host
/// busy with others (see `admission`) is slow, not failed.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Where a sandbox holder finds this program, to run as its PID 1.
const INIT_DIR: &str = "/run/wmo-e2b";
const INIT_AT: &str = "/run/wmo-e2b/init";
/// How long the watcher's first line may take once the start is given up on.
const SESSION_LINE_WAIT: Duration = Duration::from_secs(2);
/// The fds a nested holder's bwrap finds its parent's namespaces on (see `enter`).
const JOINED_PID: &str = "10";
const JOINED_USER: &str = "11";

/// How long a refused probe stands before the next sandbox probes again.
const PROBE_AGAIN_AFTER: Duration = Duration::from_secs(60);

/// As root: this program, by path, where a sandbox's holder can run in a user namespace
/// mapping an id range (the kernel may refuse user namespaces). A success holds for the
/// process; a refusal only for [`PROBE_AGAIN_AFTER`], since a probe also fails when the host
/// is too busy to finish it within its bound, and one such moment must not take id ranges
/// (and image roots) from every later sandbox of the process.
pub(super) fn mapper(bwrap: &Bwrap) -> Option<&'static Path> {
    static MAPPER: OnceLock<PathBuf> = OnceLock::new();
    static REFUSED_AT: Mutex<Option<Instant>> = Mutex::new(None);
    if let Some(exe) = MAPPER.get() {
        return Some(exe);
    }
    if !bwrap.is_root() {
        return None;
    }
    // Held while probing: callers at once wait for one probe rather than start their own.
    let mut refused = lock(&REFUSED_AT);
    if let Some(exe) = MAPPER.get() {
        return Some(exe);
    }
    if refused.is_some_and(|at| at.elapsed() < PROBE_AGAIN_AFTER) {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    match check_mapped(bwrap, &exe) {
        Ok(()) => Some(MAPPER.get_or_init(|| exe)),
        Err(_) => {
            *refused = Some(Instant::now());
            None
        }
    }
}

/// Runs `/bin/true` the way a sandbox's first holder starts in its user namespace.
fn check_mapped(bwrap: &Bwrap, exe: &Path) -> Result<(), String> {
    let scratch = std::env::temp_dir();
    let binds = Binds {
        home: &scratch,
        tmp: &scratch,
        system: &scratch,
        tests: &scratch,
        verifier: &scratch,
        logs: &scratch,
        passwd: Path::new("/dev/null"),
        group: Path::new("/dev/null"),
        shared: &[],
        everyone: &[],
        system_to_tasks: false,
        root: None,
        boot_id: None,
    };
    let mut args: Vec<OsString> = enter::mapped(exe, PROBE_BASE).into();
    let (block_fd, host_root) = (MAP_BLOCK_FD.to_string(), HOST_ROOT_INSIDE.to_string());
    let mut opts = vec![
        "--unshare-user",
        "--userns-block-fd",
        &block_fd,
        "--info-fd",
        "1",
    ];
    opts.extend(["--uid", &host_root, "--gid", &host_root]);
    opts.extend(bwrap.holder_options());
    opts.push("--unshare-net");
    args.extend(bwrap.command_line(&binds, Role::Task, &opts).0);
    args.extend(["--".into(), "/bin/true".into()]);
    let mut cmd = Spawn::new(&args[0]);
    cmd.args(&args[1..]).env("PATH", &bwrap.path_env);
    super::probe::runs(cmd, "a test sandbox in a user namespace").map_err(|f| f.why)
}

/// Starts the holder of `space` (inside `parent` for the task namespace) and records it.
/// `ids`: the sandbox's id range, whose user namespace a first holder makes (as root).
/// `image`: the unpacked image a task holder's root is made of, over its own layer.
#[allow(clippy::too_many_arguments)]
pub(super) fn start(
    bwrap: &Bwrap,
    binds: &Binds<'_>,
    sandbox_dir: &Path,
    space: Space,
    parent: Option<&Holder>,
    own_network: bool,
    ids: Option<IdRange>,
    image: Option<(&ImageRoot, &Layer)>,
) -> io::Result<Holder> {
    let _pass = admission::admit();
    let user_namespace = bwrap.in_user_namespace(ids);
    // As root with an id range, bwrap and the holder run as the host's root inside the
    // sandbox's user namespace (see `enter::userns`).
    let block_fd = MAP_BLOCK_FD.to_string();
    let host_root = HOST_ROOT_INSIDE.to_string();
    let mut opts: Vec<&str> = Vec::new();
    if ids.is_some() && bwrap.is_root() {
        opts.extend(["--uid", &host_root, "--gid", &host_root]);
        if parent.is_none() {
            opts.extend(["--unshare-user", "--userns-block-fd", &block_fd]);
        }
    }
    // A nested holder's bwrap joins the user namespace by the fd the helper hands it, and
    // makes a PID namespace of its own inside the parent's. As root the helper starts bwrap
    // in the parent's PID namespace, so that all of the holder dies with the sandbox (see
    // `enter::lead`); without root bwrap joins it itself, by fd.
    let pass = match bwrap.is_root() {
        true => Pass::Lead {
            announce: 2,
            own_proc: true,
        },
        false => Pass::Fds,
    };
    match parent {
        Some(_) => {
            if user_namespace {
                opts.extend(["--userns", JOINED_USER]);
            }
            if pass == Pass::Fds {
                opts.extend(["--pidns", JOINED_PID]);
            }
            opts.push("--unshare-pid");
        }
        None => {
            opts.extend(bwrap.holder_options());
            // The sandbox's own network (see `netns`), which every other process joins.
            if own_network {
                opts.push("--unshare-net");
            }
        }
    }
    // bwrap reports the namespace (and PID 1's pid) as JSON on fd 1.
    opts.extend(["--info-fd", "1"]);
    let merged = image.map(|(_, layer)| layer.merged());
    let binds = Binds {
        root: merged.as_deref(),
        ..*binds
    };
    // The sandbox's own PID 1 is this program (see `enter::init`), in place of bwrap's and
    // the `sleep` it would wait on: one process fewer per sandbox. Bound in read-only by
    // path (a binary deleted since this process started cannot be), under a directory only
    // the holder's user may enter (root's, as root).
    let own_init = parent.is_none();
    if own_init {
        opts.push("--as-pid-1");
    }
    let mut line = bwrap.command_line(&binds, space.role(), &opts);
    if own_init {
        let exe = std::env::current_exe()?;
        line.push(["--perms", "0700", "--dir", INIT_DIR, "--ro-bind"]);
        line.path(&exe);
        line.push([INIT_AT]);
    }
    // A task namespace that a sweep may prove empty shows the sweep its message queues (see
    // `enter::sweep`), in a directory only root may enter: its task processes are not root.
    if parent.is_some() && bwrap.is_root() && image.is_none() {
        line.push([
            "--perms", "0700", "--dir", QUEUES_DIR, "--mqueue", QUEUES_AT,
        ]);
    }
    let mut args: Vec<OsString> = Vec::new();
    // `setsid --fork`: the holder is a session of its own, nobody's child here, and outlives
    // this process. Its leader watches the sandbox's `meta.json` (see `enter::watch`) and
    // names the session on stderr first, so that a start given up on is killed whole. A
    // nested holder that the helper leads inside its parent (as root) is named by the
    // helper, and ends with its parent.
    if parent.is_none() || pass == Pass::Fds {
        args.extend([bwrap.setsid.clone().into_os_string(), "--fork".into()]);
        args.extend(enter::watching(2, &sandbox_dir.join(META_FILE)));
    }
    // As root with an id range, the first holder's bwrap makes the sandbox's user namespace,
    // which the helper maps for it (the watcher stays outside, to see `meta.json`).
    if let (None, Some(range), true) = (parent, ids, bwrap.is_root()) {
        let mapper = mapper(bwrap).ok_or_else(|| {
            io::Error::other("user namespaces no longer work here, and this sandbox has one")
        })?;
        args.extend(enter::mapped(mapper, range.base));
    }
    // bwrap reads its options from stdin (`--args 0`), so PID 1's command line, which every
    // process in the namespace can read, names none of the host's paths.
    let mut line = line.0.into_iter();
    args.extend(line.next());
    args.extend(["--args".into(), "0".into()]);
    let mut options = Vec::new();
    for a in line {
        options.extend_from_slice(a.as_encoded_bytes());
        options.push(0);
    }
    // The holder says `ready` once it runs, which is after bwrap has finished the namespace's
    // mounts: bwrap reports its pid before that, and a command that entered the namespace
    // earlier would find it half built.
    args.push("--".into());
    match own_init {
        true => args.extend(enter::init(INIT_AT)),
        false => args.extend([
            "sh".into(),
            "-c".into(),
            // Its stdout is bwrap's report channel, which bwrap closes in the sandbox.
            "echo ready >&2; exec sleep infinity".into(),
        ]),
    }
    let request = match parent {
        Some(holder) => Request::Join {
            holder,
            user_namespace,
            pass,
            image: match (image, ids) {
                (Some((image, layer)), Some(range)) => Some(ImageMount {
                    rootfs: &image.rootfs,
                    layer: &layer.dir,
                    base: range.base,
                    workdir: layer.workdir.as_deref(),
                    user: image.user,
                }),
                (Some(_), None) => {
                    return Err(io::Error::other("an image root needs a sandbox id range"))
                }
                (None, _) => None,
            },
            argv: &args,
        },
        None => Request::Plain { argv: &args },
    };
    let mut cmd = request.command(&[("PATH", &bwrap.path_env)]);
    // The holder and everything in its namespace count against the sandbox's limits.
    if let Some(cgroup) = Cgroup::of(sandbox_dir) {
        cmd.join_cgroups(cgroup.procs_files()?);
    }
    if let (Some(parent), true) = (parent, own_network) {
        cmd.join_netns(netns::open(parent)?);
    }
    cmd.stdin(Io::Piped).stdout(Io::Piped).stderr(Io::Piped);
    let mut child = cmd.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // A few KiB, far below a pipe's buffer: the write never blocks.
        let written = std::io::Write::write_all(&mut stdin, &options);
        drop(stdin);
        if let Err(e) = written {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    }
    // Read here, not on a thread: a sandbox resetting at every task starts one a task.
    let deadline = Instant::now() + START_TIMEOUT;
    let (mut info, mut err) = (Vec::new(), Vec::new());
    let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    // bwrap's report (one JSON object) on stdout; the holder keeps fd 1 open, so stop at its
    // end. Then the holder's `ready` on stderr, or bwrap's complaint and EOF.
    let in_time = stdout
        .as_mut()
        .is_none_or(|out| read_until(out, &mut info, deadline, |b| b.contains(&b'}')))
        && stderr.as_mut().is_none_or(|e| {
            read_until(e, &mut err, deadline, |b| {
                b.windows(6).any(|w| w == b"ready\n")
            })
        });
    if !in_time {
        // `setsid` has returned; the holder is a session nobody here is the parent of, and
        // killing `setsid` alone would leave it running, unrecorded.
        if let Some(e) = stderr.as_mut() {
            let wait = Instant::now() + SESSION_LINE_WAIT;
            read_until(e, &mut err, wait, |b| session_of(b).is_some());
        }
        if let Some(session) = session_of(&err) {
            // Still the group `setsid` made (a pid reused since would lead another).
            if sys::proc_stat(session).is_some_and(|s| s.pgrp == session) {
                let _ = sys::kill_group(session);
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the namespace holder did not start within {} s",
                START_TIMEOUT.as_secs()
            ),
        ));
    }
    let err: String = String::from_utf8_lossy(&err)
        .lines()
        .filter(|l| !l.starts_with("session "))
        .map(|l| format!("{l}\n"))
        .collect();
    // `setsid --fork` returns at once; its child carries on as the holder.
    let _ = child.wait();
    let ready = err.contains("ready\n");
    let report = parse_report(&info).filter(|_| ready).ok_or_else(|| {
        io::Error::other(format!(
            "bwrap did not start a namespace holder: {}",
            err.trim()
        ))
    })?;
    let init = host_pid(report, parent)
        .ok_or_else(|| io::Error::other("the namespace holder's PID 1 is nowhere to be seen"))?;
    let died = || io::Error::other("the namespace holder died at once");
    let init_stat = sys::proc_stat(init).ok_or_else(died)?;
    let leader = sys::proc_stat(init_stat.pgrp).ok_or_else(died)?;
    let holder = Holder {
        init,
        start_time: init_stat.start_time,
        group: init_stat.pgrp,
        group_start: leader.start_time,
        layer: image.map_or(0, |(_, layer)| layer.number),
    };
    if let Err(e) = ns::write(sandbox_dir, space, &holder) {
        let _ = holder.kill(Duration::from_secs(5));
        return Err(e);
    }
    Ok(holder)
}

/// The session the watcher's first line names.
fn session_of(stderr: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(stderr.split(|&b| b == b'\n').next()?).ok()?;
    if !stderr.contains(&b'\n') {
        return None;
    }
    text.strip_prefix("session ")?.parse().ok()
}

/// What bwrap's info report says: PID 1's pid (as bwrap's own PID namespace numbers it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Report {
    child_pid: u32,
}

fn parse_report(info: &[u8]) -> Option<Report> {
    let end = info.iter().position(|&b| b == b'}')?;
    let v: serde_json::Value = serde_json::from_slice(&info[..=end]).ok()?;
    Some(Report {
        child_pid: u32::try_from(v.get("child-pid")?.as_u64()?).ok()?,
    })
}

/// PID 1's pid as the host numbers it. A bwrap started inside the sandbox's PID namespace
/// (in a user namespace the task namespace is made from inside the sandbox's) reports the pid
/// that namespace gives it; then the host's is the process numbered so one level down, whose
/// parent lives in the sandbox's namespace.
fn host_pid(report: Report, parent: Option<&Holder>) -> Option<u32> {
    let Some(parent) = parent else {
        return Some(report.child_pid);
    };
    let parent_ns = pid_namespace(parent.init)?;
    // PID 1 of a namespace one level below the sandbox's, whose parent is in the sandbox's.
    let nested = |pid: u32| {
        let levels = ns_pids(pid);
        levels.len() >= 3
            && levels.last() == Some(&1)
            && sys::proc_ppid(pid).and_then(pid_namespace) == Some(parent_ns)
    };
    // Reported as the host numbers it (bwrap ran in the host's PID namespace)...
    if nested(report.child_pid) {
        return Some(report.child_pid);
    }
    // ... or as the sandbox's namespace does.
    sys::proc_pids()?.find(|&pid| {
        let levels = ns_pids(pid);
        levels.len() >= 3 && levels[levels.len() - 2] == report.child_pid && nested(pid)
    })
}

/// The inode of the PID namespace `pid` lives in.
pub(super) fn pid_namespace(pid: u32) -> Option<u64> {
    namespace_inode(pid, "pid")
}

/// The inode of the `kind` namespace (`pid`, `net`, ...) `pid` lives in.
pub(super) fn namespace_inode(pid: u32, kind: &str) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok()?;
    let text = link.to_str()?;
    text.strip_prefix(kind)?
        .strip_prefix(":[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The pids `pid` has in each PID namespace it is in, outermost first (`NSpid`).
fn ns_pids(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
            line.split_whitespace()
                .skip(1)
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<u32>>>()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchers_first_line_names_its_session() {
        assert_eq!(session_of(b"session 4242\nready\n"), Some(4242));
        // Not yet whole, or not the watcher's line: nothing to kill.
        assert_eq!(session_of(b"session 42"), None);
        assert_eq!(session_of(b"bwrap: no\nsession 7\n"), None);
        assert_eq!(session_of(b"session x\n"), None);
    }

    #[test]
    fn info_reports_name_the_child() {
        let info = b"{\n    \"child-pid\": 4242,\n    \"pid-namespace\": 4026532181\n}\n";
        assert_eq!(parse_report(info), Some(Report { child_pid: 4242 }));
        assert_eq!(parse_report(b"{\"child-pid\": -1}"), None);
        assert_eq!(parse_report(b"garbage"), None);
    }

    #[test]
    fn our_own_pids_are_read() {
        let me = std::process::id();
        assert!(pid_namespace(me).is_some());
        assert_eq!(ns_pids(me).first(), Some(&me));
    }
}
