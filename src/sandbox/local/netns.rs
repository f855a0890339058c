//! A sandbox's own network namespace (`Network::Internet`).
//!
//! The sandbox holder's bwrap makes it (`--unshare-net`, which also brings its loopback up);
//! every other process of the sandbox (the task holders, every command) joins it before its
//! exec (see `Spawn::join_netns`), so the sandbox's processes share one network that is
//! neither the host's nor another sandbox's. Outbound access comes from slirp4netns, a
//! user-mode network stack attached to the namespace by its holder's pid: it gives the
//! namespace an interface and a default route, makes every outbound connection from a
//! socket of its own on the host, and refuses the host's loopback
//! (`--disable-host-loopback`). Abstract unix sockets belong to a network namespace, so the
//! host's are out of reach too, and `/proc/net` lists the namespace's sockets only.
//! slirp4netns is recorded among the sandbox's processes (so a kill or a filesystem pause
//! ends it), joins its cgroups, and runs in the sandbox holder's PID namespace, so that it
//! dies with the sandbox however the sandbox ends.
//!
//! Joining a namespace from the host takes privileges over it: this mode needs bwrap as
//! root, not in a user namespace.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::cgroup::Cgroup;
use super::enter::{Pass, Request};
use super::isolation::{self, Bwrap, Isolation, IsolationChoice};
use super::meta::{self, ProcRecord};
use super::ns::Holder;
use super::spawn::Io;
use super::start_report::read_until;
use super::sys;
use crate::sandbox::Role;

/// The user-mode network stack (Debian's `slirp4netns`).
const TOOL: &str = "slirp4netns";
/// How long it may take to configure the namespace.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Why a sandbox cannot have a network of its own here, if it cannot.
pub(super) fn unavailable(bwrap: Option<&Bwrap>) -> Option<String> {
    match bwrap {
        None => Some("--network internet needs --isolation bwrap".into()),
        Some(b) if !b.is_root() => Some("--network internet needs wmo-e2b to run as root".into()),
        Some(_) if !sys::program(TOOL).is_absolute() => Some(format!(
            "--network internet needs {TOOL} (Debian: apt-get install {TOOL})"
        )),
        Some(_) => None,
    }
}

/// Why sandboxes made with `choice` cannot have a network of their own here, if they
/// cannot: what is missing.
pub fn unavailable_with(choice: IsolationChoice) -> Option<String> {
    match isolation::resolve(choice) {
        Ok(r) if r.isolation == Isolation::Bwrap => unavailable(isolation::probe().ok()),
        _ => unavailable(None),
    }
}

/// The network namespace `holder`'s PID 1 lives in, open for a child to join.
pub(super) fn open(holder: &Holder) -> io::Result<OwnedFd> {
    let ns = File::open(format!("/proc/{}/ns/net", holder.init))?;
    // The pid named the holder when it was checked; make sure it still does, so a recycled
    // pid never hands a command someone else's network.
    if !holder.is_alive() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "the sandbox's namespace holder is gone",
        ));
    }
    Ok(OwnedFd::from(ns))
}

/// Attaches slirp4netns to the namespace of `holder` (the sandbox holder) and records it;
/// returns once the namespace has its interface and default route.
pub(super) fn attach(bwrap: &Bwrap, sandbox_dir: &Path, holder: &Holder) -> io::Result<()> {
    let tool = sys::program(TOOL);
    let argv: [OsString; 7] = [
        tool.into_os_string(),
        "--configure".into(),
        "--mtu=65520".into(),
        "--disable-host-loopback".into(),
        "--ready-fd=1".into(),
        holder.init.to_string().into(),
        "tap0".into(),
    ];
    // Started inside the holder's PID namespace (in the host's network and files), as a
    // session of its own whose leader the helper names on stdout first: slirp4netns dies
    // with the sandbox's PID 1, even when no wmo-e2b process is left to kill it.
    let request = Request::Join {
        holder,
        user_namespace: false,
        pass: Pass::Lead {
            announce: 1,
            own_proc: false,
        },
        image: None,
        argv: &argv,
    };
    let mut cmd = request.command(&[("PATH", &bwrap.path_env)]);
    cmd.stdin(Io::Null).stdout(Io::Piped).stderr(Io::Null);
    if let Some(cgroup) = Cgroup::of(sandbox_dir) {
        cmd.join_cgroups(cgroup.procs_files()?);
    }
    let mut child = cmd.spawn()?;
    let mut said = Vec::new();
    // Its session on a line, then `1` on the ready fd once the namespace is configured.
    let ready = |b: &[u8]| {
        b.iter()
            .position(|&c| c == b'\n')
            .is_some_and(|nl| b[nl + 1..].contains(&b'1'))
    };
    let in_time = child.stdout.take().is_none_or(|mut out| {
        read_until(&mut out, &mut said, Instant::now() + READY_TIMEOUT, ready)
    });
    let _ = child.wait();
    let pid = String::from_utf8_lossy(&said)
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("session ")?.trim().parse::<u32>().ok());
    let stat = pid.and_then(|p| Some((p, sys::proc_stat(p)?)));
    if let Some((pid, stat)) = stat {
        meta::write_proc_record(
            sandbox_dir,
            &ProcRecord {
                pid,
                start_time: stat.start_time,
                role: Role::System,
                cmd: TOOL.into(),
            },
        )?;
    }
    if !in_time || !ready(&said) {
        if let Some((pid, _)) = stat {
            // SAFETY: a signal to the group we just started.
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
        }
        return Err(io::Error::other(format!(
            "{TOOL} did not configure the sandbox's network"
        )));
    }
    Ok(())
}
