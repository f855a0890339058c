//! The PID namespaces of a bwrap sandbox and the processes that hold them open.
//!
//! A sandbox has two: the *sandbox* namespace, which every [`Role::System`] process (the
//! runner) joins, and inside it the *task* namespace, which every [`Role::Task`] process
//! joins. Each is held open by a holder: a bwrap whose PID 1 (bwrap's own reaper) waits with
//! a `sleep` and adopts whatever the sandbox orphans. Killing a namespace's PID 1 makes the
//! kernel kill every process in it (and in namespaces nested in it), however they detached,
//! and PID 1 is not gone until they all are: that is what makes "every process this task
//! started is dead" provable. `reset` kills the task namespace and starts a new one.
//!
//! Holders are started with `setsid --fork`, so they belong to no wmo-e2b process and outlive
//! the command that made them (a project's sandbox does). Each is recorded in
//! `ns/<name>.json` before its namespace is used, so any wmo-e2b process can join or kill it.
//! A holder is a session of its own, led by a small watcher on the host that kills the whole
//! session once the sandbox's `meta.json` is gone (the sandbox killed, or its state directory
//! deleted under it), so a holder never outlives its sandbox for long even when no wmo-e2b
//! process is left to kill it.

use std::io::{self, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::isolation::{Args, Binds, Bwrap};
use super::{meta, sys};
use crate::sandbox::Role;

/// Where holder records live in a sandbox directory.
pub(super) const NS_DIR: &str = "ns";
/// How long a holder may take to report its namespace.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of bwrap's `--info-fd` report we read at most.
const MAX_INFO: usize = 4096;

/// Opens the namespaces of the holder named by `$1` (PID 1, start time `$2`) as fds, checks
/// that the pid still names that holder (so a recycled pid can never put a command in someone
/// else's namespace), and runs the rest. Always fd 3, its PID namespace; with `$3` = `user`,
/// fd 4, its user namespace; with `enter`, fds 4 to 7: its mount, IPC and UTS namespaces and
/// its root directory. Field 22 of `/proc/PID/stat` is the start time; the command name
/// before it may hold spaces, so the fields are counted after its closing `) `.
const JOIN: &str = r#"p=$1 t=$2 m=$3; shift 3
exec 3</proc/"$p"/ns/pid || exit 125
case $m in
user) exec 4</proc/"$p"/ns/user || exit 125 ;;
enter) exec 4</proc/"$p"/ns/mnt 5</proc/"$p"/ns/ipc 6</proc/"$p"/ns/uts 7</proc/"$p"/root || exit 125 ;;
esac
read -r s </proc/"$p"/stat || exit 125
f() { shift 19; [ "$1" = "$t" ]; }
f ${s##*) } || { echo "wmo-e2b: the sandbox's namespace is gone" >&2; exit 125; }
exec "$@""#;

/// How a command joins a holder's namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Join {
    /// A fresh bwrap in the holder's PID namespace (and user namespace when not root).
    Bwrap,
    /// Into the holder's own mount, PID, IPC and UTS namespaces with `nsenter` (root only):
    /// no mounts to set up, so a task's command starts at a fraction of the cost.
    Enter,
}

/// Runs the holder (`$2...`) and watches the sandbox's `meta.json` (`$1`); when it is gone,
/// kills the whole session: watcher, bwrap and the namespace's PID 1.
const WATCH: &str = r#"m=$1; shift
"$@" &
while [ -e "$m" ]; do sleep 10; done
kill -KILL 0"#;

/// Which of a sandbox's namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Space {
    Sandbox,
    Task,
    /// The next task namespace, made ahead of time so a reset need not wait for one.
    Spare,
}

impl Space {
    pub fn for_role(role: Role) -> Space {
        match role {
            Role::System => Space::Sandbox,
            Role::Task => Space::Task,
        }
    }

    /// Whose mounts the holder's mount namespace has (commands may enter it).
    fn role(self) -> Role {
        match self {
            Space::Sandbox => Role::System,
            Space::Task | Space::Spare => Role::Task,
        }
    }

    fn file(self) -> &'static str {
        match self {
            Space::Sandbox => "sandbox.json",
            Space::Task => "task.json",
            Space::Spare => "spare.json",
        }
    }
}

/// A namespace holder: PID 1 of the namespace, and the session bwrap made for it (its
/// launcher outside the namespace belongs to it too), as the host numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Holder {
    pub init: u32,
    pub start_time: u64,
    /// The holder's process group (its session leader's pid) and the leader's start time.
    pub group: u32,
    pub group_start: u64,
}

impl Holder {
    pub fn is_alive(&self) -> bool {
        sys::is_alive(self.init, self.start_time)
    }

    /// SIGKILLs the holder's group and its PID 1, which takes the whole namespace down; true
    /// once PID 1 is proven gone (which it is only after every process in the namespace).
    /// The holder's own launchers outside the namespace die of the same signal.
    pub fn kill(&self, within: Duration) -> io::Result<bool> {
        self.signal()?;
        Ok(sys::wait_gone(self.init, self.start_time, within))
    }

    /// Sends SIGKILL without waiting.
    pub fn signal(&self) -> io::Result<()> {
        sys::kill_recorded_group(self.group, self.group_start)?;
        sys::kill_recorded(self.init, self.start_time)?;
        Ok(())
    }

    /// The leading arguments of a command that runs inside this namespace: the join shell.
    pub fn join_prefix(&self, bwrap: &Bwrap, join: Join) -> Args {
        let mut a = Args::default();
        a.path(&bwrap.sh);
        a.push(["-c", JOIN, "sh"]);
        let mode = match join {
            Join::Enter => "enter",
            Join::Bwrap if bwrap.join_options().contains(&"--userns") => "user",
            Join::Bwrap => "pid",
        };
        a.push([
            self.init.to_string().as_str(),
            self.start_time.to_string().as_str(),
            mode,
        ]);
        a
    }
}

pub(super) fn read(sandbox_dir: &Path, space: Space) -> io::Result<Holder> {
    let bytes = meta::read_bounded(&sandbox_dir.join(NS_DIR).join(space.file()), 4096)?;
    serde_json::from_slice(&bytes).map_err(io::Error::from)
}

pub(super) fn write(sandbox_dir: &Path, space: Space, holder: &Holder) -> io::Result<()> {
    let bytes = serde_json::to_vec(holder).map_err(io::Error::from)?;
    meta::write_atomic(&sandbox_dir.join(NS_DIR), space.file(), &bytes)
}

pub(super) fn forget(sandbox_dir: &Path, space: Space) {
    // A leftover record only costs a start-time check at the next kill.
    let _ = std::fs::remove_file(sandbox_dir.join(NS_DIR).join(space.file()));
}

/// Every holder recorded in a sandbox directory (for teardown), nested ones first.
pub(super) fn recorded(sandbox_dir: &Path) -> Vec<Holder> {
    [Space::Task, Space::Spare, Space::Sandbox]
        .into_iter()
        .filter_map(|s| read(sandbox_dir, s).ok())
        .collect()
}

/// Starts the holder of `space` (inside `parent` for the task namespace) and records it.
pub(super) fn start(
    bwrap: &Bwrap,
    binds: &Binds<'_>,
    sandbox_dir: &Path,
    space: Space,
    parent: Option<&Holder>,
) -> io::Result<Holder> {
    let mut opts = match parent {
        Some(_) => {
            let mut o = bwrap.join_options();
            o.push("--unshare-pid");
            o
        }
        None => bwrap.holder_options(),
    };
    // bwrap reports the namespace (and PID 1's host pid) as JSON on fd 1.
    opts.extend(["--info-fd", "1"]);
    let line = bwrap.command_line(binds, space.role(), true, &opts, &[]);
    let mut args = parent
        .map(|p| p.join_prefix(bwrap, Join::Bwrap).0)
        .unwrap_or_default();
    // `setsid --fork`: the holder is a session of its own, nobody's child here, and outlives
    // this process.
    args.extend([
        bwrap.setsid.clone().into_os_string(),
        "--fork".into(),
        bwrap.sh.clone().into_os_string(),
        "-c".into(),
        WATCH.into(),
        "sh".into(),
    ]);
    args.push(sandbox_dir.join(super::meta::META_FILE).into_os_string());
    args.extend(line.0);
    // The holder says `ready` once it runs, which is after bwrap has finished the namespace's
    // mounts: bwrap reports its pid before that, and a command that entered the namespace
    // earlier would find it half built.
    args.extend([
        "--".into(),
        "sh".into(),
        "-c".into(),
        // Its stdout is bwrap's report channel, which bwrap closes in the sandbox.
        "echo ready >&2; exec sleep infinity".into(),
    ]);
    let mut cmd = Command::new(&args[0]);
    cmd.args(&args[1..])
        .env_clear()
        .env("PATH", &bwrap.path_env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("lsb-holder".into())
        .spawn(move || {
            let mut info = Vec::new();
            let mut err = Vec::new();
            // bwrap's report (one JSON object) on stdout; the holder keeps fd 1 open, so stop
            // at its end. Then the holder's `ready` on stderr, or bwrap's complaint and EOF.
            if let Some(out) = stdout {
                read_until(out, &mut info, |b| b.contains(&b'}'));
            }
            if let Some(e) = stderr {
                read_until(e, &mut err, |b| b.windows(6).any(|w| w == b"ready\n"));
            }
            let _ = tx.send((info, String::from_utf8_lossy(&err).into_owned()));
        })?;
    let (info, err) = match rx.recv_timeout(START_TIMEOUT) {
        Ok(r) => r,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the namespace holder did not start within 10 s",
            ));
        }
    };
    // `setsid --fork` returns at once; its child carries on as the holder.
    let _ = child.wait();
    let ready = err.contains("ready\n");
    let init = parse_child_pid(&info).filter(|_| ready).ok_or_else(|| {
        io::Error::other(format!(
            "bwrap did not start a namespace holder: {}",
            err.trim()
        ))
    })?;
    let died = || io::Error::other("the namespace holder died at once");
    let init_stat = sys::proc_stat(init).ok_or_else(died)?;
    let leader = sys::proc_stat(init_stat.pgrp).ok_or_else(died)?;
    let holder = Holder {
        init,
        start_time: init_stat.start_time,
        group: init_stat.pgrp,
        group_start: leader.start_time,
    };
    if let Err(e) = write(sandbox_dir, space, &holder) {
        let _ = holder.kill(Duration::from_secs(5));
        return Err(e);
    }
    Ok(holder)
}

/// Reads `src` into `buf` until `done(buf)`, end of file, or [`MAX_INFO`] bytes.
fn read_until(mut src: impl Read, buf: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) {
    let mut chunk = [0u8; 512];
    while buf.len() < MAX_INFO && !done(buf) {
        match src.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// `"child-pid": N` from bwrap's info report.
fn parse_child_pid(info: &[u8]) -> Option<u32> {
    let end = info.iter().position(|&b| b == b'}')?;
    let v: serde_json::Value = serde_json::from_slice(&info[..=end]).ok()?;
    u32::try_from(v.get("child-pid")?.as_u64()?).ok()
}

/// Waits until each signalled holder is proven gone, for at most `within` in all; returns
/// those still running.
pub(super) fn wait_all_gone(holders: &[Holder], within: Duration) -> Vec<Holder> {
    let deadline = Instant::now() + within;
    holders
        .iter()
        .copied()
        .filter(|h| {
            let left = deadline.saturating_duration_since(Instant::now());
            !(sys::wait_gone(h.init, h.start_time, left)
                && sys::wait_groups_gone(&[h.group], left).is_empty())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_reports_name_the_child() {
        let info = b"{\n    \"child-pid\": 4242,\n    \"pid-namespace\": 4026532181\n}\n";
        assert_eq!(parse_child_pid(info), Some(4242));
        assert_eq!(parse_child_pid(b"{\"child-pid\": -1}"), None);
        assert_eq!(parse_child_pid(b"garbage"), None);
    }
}
