//! The helper's side: a hook that runs before `main`, spots a request on the command line,
//! and carries it out (joining a holder's namespaces, dropping privileges, exec'ing the
//! command and launching it) without ever returning to `main`. The protocol's names and
//! numbers live here, with the code that reads them; `request` writes them.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::sandbox::local::confined::open_at;
use crate::sandbox::local::isolation::Identity;
use crate::sandbox::local::{pre_exec, sys};

/// The first argument that makes a program linking this library the helper. An option, so
/// that a program in which the hook somehow did not run refuses it rather than acting on it.
pub(super) const REQUEST: &str = "--wmo-e2b-sandbox-helper";
/// The prefix of the variables that carry the command's environment, numbered in order.
pub(super) const ENV_PREFIX: &str = "WMO_E2B_SANDBOX_ENV_";
/// The fds `join` hands on: the PID namespace, then the user namespace (`holder_start` names
/// them to bwrap).
const JOINED_PID_FD: RawFd = 10;
const JOINED_USER_FD: RawFd = 11;
/// The exit statuses of a helper that failed before the command could run: could not enter
/// (as `nsenter` or a join shell would), could not exec the command (as a shell would).
pub(super) const CANNOT_ENTER: i32 = 125;
const CANNOT_EXEC: i32 = 127;

// The hook: glibc runs `.init_array` entries before `main`, in every program, with the
// process still single-threaded.
#[used]
#[link_section = ".init_array"]
pub(super) static HELPER_HOOK: extern "C" fn() = helper_hook;

extern "C" fn helper_hook() {
    // Every other start of a program linking this library pays one read of its own
    // command line.
    let Ok(cmdline) = std::fs::read("/proc/self/cmdline") else {
        return;
    };
    let Some(body) = cmdline.strip_suffix(b"\0") else {
        return;
    };
    let mut args = body.split(|&b| b == 0).skip(1);
    if args.next() != Some(REQUEST.as_bytes()) {
        return;
    }
    let args: Vec<OsString> = args.map(|a| OsString::from_vec(a.to_vec())).collect();
    let why = match serve(&args) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    eprintln!("wmo-e2b: {why}");
    if why.code == GONE {
        // Its sandbox was killed under it: the process ends as the sandbox's did.
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    std::process::exit(why.code)
}

/// Why the helper could not do what it was asked, and the exit status that says so.
#[derive(Debug)]
pub(super) struct Failure {
    /// An exit status, or [`GONE`].
    code: i32,
    what: String,
}

/// Not an exit status: the holder's namespace is gone (the sandbox killed under a starting
/// process), and the helper dies of SIGKILL as everything in it did.
const GONE: i32 = -1;

pub(super) fn gone() -> Failure {
    Failure {
        code: GONE,
        what: "the sandbox's namespace is gone".into(),
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

pub(super) fn cannot_enter(what: impl std::fmt::Display) -> Failure {
    Failure {
        code: CANNOT_ENTER,
        what: what.to_string(),
    }
}

pub(super) enum Never {}

/// Carries out a request; returns only on failure.
fn serve(args: &[OsString]) -> Result<Never, Failure> {
    let bad = || cannot_enter("a malformed sandbox helper request");
    let (kind, rest) = args.split_first().ok_or_else(bad)?;
    match kind.as_bytes() {
        b"plain" => {
            only_stdio().map_err(cannot_enter)?;
            exec(rest)
        }
        b"map" => {
            let [base, argv @ ..] = rest else {
                return Err(bad());
            };
            let base = base.to_str().and_then(|b| b.parse().ok()).ok_or_else(bad)?;
            only_stdio().map_err(cannot_enter)?;
            super::userns::map_for_bwrap(base)?;
            exec(argv)
        }
        b"join" => {
            let [holder, user, pass, rootfs, layer, base, workdir, image_user, argv @ ..] = rest
            else {
                return Err(bad());
            };
            // `fds`, or the fd the leader is named on, and `p` for a `/proc` of its own.
            let lead = match pass.as_bytes() {
                b"fds" => None,
                [fd @ (b'1' | b'2'), own_proc @ ..] if matches!(own_proc, b"" | b"p") => {
                    Some((fd - b'0', own_proc == b"p"))
                }
                _ => return Err(bad()),
            };
            let opened = open_holder(holder, user == "u", false)?;
            if rootfs != "-" {
                let number = |n: &OsString| n.to_str().and_then(|n| n.parse().ok());
                super::image_mount::mount(&super::image_mount::Spec {
                    rootfs,
                    layer,
                    base: number(base).ok_or_else(bad)?,
                    workdir: (workdir != "-").then_some(workdir.as_os_str()),
                    user: number(image_user).ok_or_else(bad)?,
                })?;
            }
            only_stdio().map_err(cannot_enter)?;
            if let Some(u) = &opened.user {
                hand_on(u, JOINED_USER_FD)?;
            }
            match lead {
                Some((announce, own_proc)) => super::lead::lead(&opened, announce, own_proc, argv),
                None => {
                    hand_on(&opened.pid, JOINED_PID_FD)?;
                    exec(argv)
                }
            }
        }
        b"enter" => {
            let [holder, user, drop_to, net, cwd, argv @ ..] = rest else {
                return Err(bad());
            };
            let drop_to = match drop_to.as_bytes() {
                b"-" => None,
                id => Some(parse_identity(id).ok_or_else(bad)?),
            };
            let opened = open_holder(holder, user == "u", true)?;
            only_stdio().map_err(cannot_enter)?;
            enter(&opened, drop_to, net == "n", cwd, argv)
        }
        b"watch" => {
            let [announce, meta, argv @ ..] = rest else {
                return Err(bad());
            };
            let announce = match announce.as_bytes() {
                b"1" => 1,
                b"2" => 2,
                _ => return Err(bad()),
            };
            super::watch::watch(announce, meta, argv)
        }
        b"init" => match rest {
            [] => super::init::init(),
            _ => Err(bad()),
        },
        b"sweep" => {
            let [holder] = rest else {
                return Err(bad());
            };
            let opened = open_holder(holder, false, true)?;
            only_stdio().map_err(cannot_enter)?;
            super::sweep::sweep(&opened)
        }
        _ => Err(bad()),
    }
}

/// `UID` or `UID+GROUP` (see `request::identity_arg`).
fn parse_identity(text: &[u8]) -> Option<Identity> {
    let text = std::str::from_utf8(text).ok()?;
    let (uid, group) = match text.split_once('+') {
        Some((u, g)) => (u, Some(g.parse().ok()?)),
        None => (text, None),
    };
    Some(Identity {
        uid: uid.parse().ok()?,
        group,
    })
}

/// A holder's namespaces, opened close-on-exec.
pub(super) struct Opened {
    /// The holder's `/proc` entry: readable for as long as that very process lives.
    entry: File,
    pub pid: OwnedFd,
    pub user: Option<OwnedFd>,
    /// Mount, IPC, UTS and the root directory, for `enter`.
    pub rest: Option<[OwnedFd; 4]>,
}

/// Opens the namespaces of the holder named `PID:START_TIME`, then checks through the same
/// `/proc` entry that the pid still names that holder.
fn open_holder(named: &OsStr, user: bool, every: bool) -> Result<Opened, Failure> {
    let (pid, start_time) = named
        .to_str()
        .and_then(|s| s.split_once(':'))
        .and_then(|(p, t)| Some((p.parse::<u32>().ok()?, t.parse::<u64>().ok()?)))
        .ok_or_else(|| cannot_enter("a malformed holder in a sandbox helper request"))?;
    open_holder_at(pid, start_time, user, every)
}

/// As `open_holder`, for the holder whose PID 1 is `pid`, started at `start_time`.
pub(super) fn open_holder_at(
    pid: u32,
    start_time: u64,
    user: bool,
    every: bool,
) -> Result<Opened, Failure> {
    let entry = File::open(format!("/proc/{pid}")).map_err(|_| gone())?;
    let at = |name: &str| open_at(entry.as_raw_fd(), name, libc::O_RDONLY, 0).map_err(|_| gone());
    let pid = at("ns/pid")?;
    let user = if user { Some(at("ns/user")?) } else { None };
    let rest = if every {
        Some([at("ns/mnt")?, at("ns/ipc")?, at("ns/uts")?, at("root")?])
    } else {
        None
    };
    let mut stat = String::new();
    File::from(at("stat")?)
        .take(4096)
        .read_to_string(&mut stat)
        .map_err(|_| gone())?;
    match sys::parse_stat(&stat) {
        Some(s) if s.start_time == start_time => Ok(Opened {
            entry,
            pid,
            user,
            rest,
        }),
        _ => Err(gone()),
    }
}

impl Opened {
    /// Whether the holder's PID 1 still runs: its `/proc` entry readable and not exiting
    /// (killed, it stays readable until its launcher reaps it, and first waits, exiting, for
    /// the rest of its namespace to die, while the namespace already takes in no process).
    pub(super) fn holder_lives(&self) -> bool {
        let Ok(fd) = open_at(self.entry.as_raw_fd(), "stat", libc::O_RDONLY, 0) else {
            return false;
        };
        let mut stat = String::new();
        if File::from(fd).take(4096).read_to_string(&mut stat).is_err() {
            return false;
        }
        sys::parse_stat(&stat).is_some_and(|s| !s.is_exiting())
    }
}

/// Puts `fd` on `number`, to be inherited by the program exec'd next.
fn hand_on(fd: &OwnedFd, number: RawFd) -> Result<(), Failure> {
    // SAFETY: dup2 onto a number we own from here on; the duplicate is not close-on-exec.
    if unsafe { libc::dup2(fd.as_raw_fd(), number) } == -1 {
        return Err(cannot_enter(io::Error::last_os_error()));
    }
    Ok(())
}

/// Execs `argv` in this process, with this process's environment.
pub(super) fn exec(argv: &[OsString]) -> Result<Never, Failure> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| cannot_enter("no program to run"))?;
    let err = Command::new(program).args(args).exec();
    Err(Failure {
        code: CANNOT_EXEC,
        what: format!("cannot run {}: {err}", program.to_string_lossy()),
    })
}

/// The command's environment, from the numbered variables it travelled in.
fn command_env() -> Vec<CString> {
    let mut numbered: Vec<(usize, OsString)> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let n = k.to_str()?.strip_prefix(ENV_PREFIX)?.parse().ok()?;
            Some((n, v))
        })
        .collect();
    numbered.sort_by_key(|(n, _)| *n);
    numbered
        .into_iter()
        .filter_map(|(_, v)| CString::new(v.into_vec()).ok())
        .collect()
}

/// Joins every namespace, starts the command as a child and becomes its launcher.
fn enter(
    opened: &Opened,
    drop_to: Option<Identity>,
    own_network: bool,
    cwd: &OsStr,
    argv: &[OsString],
) -> Result<Never, Failure> {
    let Some([mnt, ipc, uts, root]) = &opened.rest else {
        return Err(cannot_enter("the namespaces were not opened to enter"));
    };
    let c = |s: &OsStr| CString::new(s.as_bytes()).map_err(cannot_enter);
    let argv: Vec<CString> = argv.iter().map(|a| c(a)).collect::<Result<_, _>>()?;
    let program = argv
        .first()
        .ok_or_else(|| cannot_enter("no program to run"))?;
    let envp = command_env();
    let cwd = c(cwd)?;
    let ptrs = |v: &[CString]| -> Vec<*const libc::c_char> {
        v.iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let (argv_ptrs, envp_ptrs) = (ptrs(&argv), ptrs(&envp));
    let step = |what: &str, rc: libc::c_int| {
        if rc == -1 {
            Err(cannot_enter(format!(
                "cannot {what}: {}",
                io::Error::last_os_error()
            )))
        } else {
            Ok(())
        }
    };
    // SAFETY: plain system calls on fds and C strings we own; this process is the helper,
    // single-threaded.
    unsafe {
        if let Some(user) = &opened.user {
            step(
                "join the user namespace",
                libc::setns(user.as_raw_fd(), libc::CLONE_NEWUSER),
            )?;
        }
        for (fd, kind, what) in [
            (ipc, libc::CLONE_NEWIPC, "join the IPC namespace"),
            (uts, libc::CLONE_NEWUTS, "join the UTS namespace"),
            (&opened.pid, libc::CLONE_NEWPID, "join the PID namespace"),
            (mnt, libc::CLONE_NEWNS, "join the mount namespace"),
        ] {
            step(what, libc::setns(fd.as_raw_fd(), kind))?;
        }
        step("enter the sandbox's root", libc::fchdir(root.as_raw_fd()))?;
        step("enter the sandbox's root", libc::chroot(c".".as_ptr()))?;
        step(
            &format!("enter {}", cwd.to_string_lossy()),
            libc::chdir(cwd.as_ptr()),
        )?;
        match libc::fork() {
            // A PID namespace whose PID 1 has died takes in no process.
            -1 if !opened.holder_lives() => Err(gone()),
            -1 => Err(cannot_enter(format!(
                "cannot start the command: {}",
                io::Error::last_os_error()
            ))),
            0 => {
                if let Err(why) = pre_exec::become_command(own_network, drop_to) {
                    fail(why, CANNOT_ENTER);
                }
                libc::execve(program.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr());
                fail(b"wmo-e2b: cannot start the command\n", CANNOT_EXEC)
            }
            command => launcher(command),
        }
    }
}

/// Says why on stderr and exits, in the command's process before its exec.
pub(super) unsafe fn fail(why: &[u8], code: libc::c_int) -> ! {
    libc::write(2, why.as_ptr().cast(), why.len());
    libc::_exit(code)
}

/// The launcher: holds nothing of the command's, waits for it and ends as it ended. A
/// SIGTERM to its group (a deadline: see `SpawnOpts::ends_after`) is the command's to
/// answer, so the launcher ignores it and still reports how the command ended.
pub(super) unsafe fn launcher(command: libc::pid_t) -> ! {
    libc::signal(libc::SIGTERM, libc::SIG_IGN);
    close_from(0);
    let mut status = 0;
    let signal = loop {
        if libc::waitpid(command, &mut status, 0) == command {
            if libc::WIFEXITED(status) {
                libc::_exit(libc::WEXITSTATUS(status));
            }
            break libc::WTERMSIG(status);
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // The command ran, but its end can no longer be read (seen, rarely, only while
            // its sandbox was being killed around it): it reads as killed, never as a
            // command that could not start (125).
            break libc::SIGKILL;
        }
    };
    // Killed by a signal: die of it too (without a core file), so the caller sees the same.
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    libc::setrlimit(libc::RLIMIT_CORE, &no_core);
    libc::signal(signal, libc::SIG_DFL);
    let mut set: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut set);
    libc::sigaddset(&mut set, signal);
    libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    libc::kill(libc::getpid(), signal);
    libc::_exit(128 + signal)
}

/// Marks every fd from 3 up close-on-exec: what the helper starts gets its stdio and
/// nothing else (fds inherited from the caller's own parent included).
fn only_stdio() -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range takes plain integers.
    if unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    } == 0
    {
        return Ok(());
    }
    // Kernels before 5.11: one fd at a time, up to the limit on open fds.
    for fd in 3..max_fds() {
        // SAFETY: fcntl on any number is harmless; unopened ones fail with EBADF.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

/// Points stdio at `/dev/null` (closes it where that cannot be opened): a process that lives
/// on then holds none of its caller's pipes open.
pub(super) unsafe fn stdio_to_null() {
    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
    for fd in 0..3 {
        match null {
            -1 => libc::close(fd),
            null => libc::dup2(null, fd),
        };
    }
    if null > 2 {
        libc::close(null);
    }
}

/// Closes every fd from `first` up.
pub(super) unsafe fn close_from(first: libc::c_uint) {
    if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) == 0 {
        return;
    }
    for fd in first as libc::c_int..max_fds() {
        libc::close(fd);
    }
}

/// One past the highest fd this process may have (bounded, for the fallbacks' loops).
fn max_fds() -> libc::c_int {
    // SAFETY: getrlimit writes into the struct we pass.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    libc::c_int::try_from(limit.rlim_cur.min(1 << 16)).unwrap_or(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_requests_are_refused() {
        // A join that says neither `fds` nor a stdio fd (with `p` at most) to name its
        // session on, before anything is opened.
        let join = |pass: &str| -> Vec<OsString> {
            [
                "join",
                "1:2",
                "-",
                pass,
                "-",
                "-",
                "-",
                "-",
                "-",
                "/bin/true",
            ]
            .map(OsString::from)
            .to_vec()
        };
        let (bad_fd, bad_flag, empty) = (join("3"), join("2x"), join(""));
        let malformed: [&[OsString]; 7] = [
            &[],
            &["enter".into()],
            &["join".into(), "x".into()],
            &["join".into(), "1:2:3".into(), "-".into()],
            &bad_fd,
            &bad_flag,
            &empty,
        ];
        for args in malformed {
            let Err(f) = serve(args);
            assert_eq!(f.code, CANNOT_ENTER, "{args:?}");
        }
    }
}
