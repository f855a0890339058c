//! Starting a child without copying this process's descriptor table.
//!
//! A new process gets a copy of its parent's descriptor table, and its exec then closes every
//! copied descriptor marked close-on-exec. Both steps touch every descriptor the parent
//! holds; an eval at high concurrency holds several per live sandbox (a runner's pipes and
//! pidfd, a running command's), so with `posix_spawn` (std's way) every process a task starts
//! paid for every other sandbox: measured 2.9 ms of CPU per start with 8,000 descriptors
//! open against 0.9 ms with none, and each start touches the same shared counters from
//! every core at once.
//!
//! Here the child shares the parent's table (`CLONE_FILES`) and its memory until its exec
//! (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does), and its first act is to take a table of
//! its own holding only the descriptors below a low mark (`close_range` with
//! `CLOSE_RANGE_UNSHARE`): a copy of a handful, whatever the parent holds. The stdio the
//! child is to have must therefore sit below that mark, so this process keeps a few groups
//! of three low descriptor numbers (slots) for it: a start takes a free group, puts its
//! pipe ends in the slots, starts the child, and puts `/dev/null` back. The child then moves
//! the slots onto 0, 1 and 2 and closes everything else before its exec: it inherits nothing
//! but its stdio, whichever descriptors the parent holds and however they are marked.
//!
//! The child runs on a stack of its group's while the starting thread waits, sharing this
//! process's memory: it makes raw system calls only (no allocation, no lock, no panic), and
//! every signal is blocked across the start so no handler of ours runs on it. Dispositions
//! that name a handler are reset in the child, as `posix_spawn` does, and SIGPIPE (which
//! Rust's runtime ignores) is made default again, as std does for its children.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ChildStderr, ChildStdin, ChildStdout, ExitStatus};

pub(super) use entry::{command_line_hidden, Entry};
use slots::slots;
#[cfg(test)]
use slots::GROUPS;

mod entry;
mod slots;

const CLOSE_RANGE_UNSHARE: libc::c_uint = 1 << 1;
/// The cgroups a child may join: one per controller hierarchy (cgroup v1's memory, pids,
/// cpu), or the one of v2.
pub(super) const MAX_CGROUPS: usize = 3;

/// What one of the child's fds 0, 1 and 2 becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Io {
    /// `/dev/null`.
    Null,
    /// A new pipe, whose other end the `Child` holds.
    Piped,
}

/// A command to start: its program by path, its arguments, exactly its environment (nothing
/// of this process's passes unless named), and its stdio (`/dev/null` unless set).
#[derive(Debug)]
pub(super) struct Spawn {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: Option<OsString>,
    stdio: [Io; 3],
    new_group: bool,
    /// `cgroup.procs` files the child writes itself into before anything else (see
    /// `cgroup`): what it starts then counts against the sandbox's limits from its first
    /// instruction.
    cgroups: Vec<OwnedFd>,
    /// A network namespace the child joins before its exec (a sandbox's own, see `netns`).
    netns: Option<OwnedFd>,
    /// The command to start straight into its sandbox, before this one (the helper) is
    /// tried (see `entry`).
    entry: Option<Entry>,
}

/// A started child: std's pipe types, so callers read and write it as they would std's.
/// Like std's, it is not reaped when dropped.
#[derive(Debug)]
pub(super) struct Child {
    pid: u32,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    status: Option<ExitStatus>,
    /// The command itself, started straight into its sandbox (see `entry`), rather than a
    /// helper that launches it.
    entered_directly: bool,
}

impl Spawn {
    /// `program` is a path; a bare name is refused at the start rather than looked up in the
    /// current directory (see `sys::program`).
    pub fn new(program: impl AsRef<OsStr>) -> Spawn {
        Spawn {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            stdio: [Io::Null; 3],
            new_group: false,
            cgroups: Vec::new(),
            netns: None,
            entry: None,
        }
    }

    /// Starts `entry` directly where it can, and this command (the helper that enters the
    /// same way) where it cannot.
    pub fn enter_directly(&mut self, entry: Entry) -> &mut Spawn {
        self.entry = Some(entry);
        self
    }

    /// The child joins the network namespace open as `ns` before its exec.
    pub fn join_netns(&mut self, ns: OwnedFd) -> &mut Spawn {
        self.netns = Some(ns);
        self
    }

    /// The child joins each cgroup whose `cgroup.procs` is open here, before its exec; at
    /// most [`MAX_CGROUPS`].
    pub fn join_cgroups(&mut self, procs: Vec<OwnedFd>) -> &mut Spawn {
        self.cgroups = procs;
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Spawn
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets a variable; a later setting of the same name wins.
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Spawn {
        let key = key.as_ref();
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Spawn
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (k, v) in vars {
            self.env(k, v);
        }
        self
    }

    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Spawn {
        self.cwd = Some(dir.as_ref().as_os_str().to_owned());
        self
    }

    /// The child leads a process group of its own.
    pub fn new_process_group(&mut self) -> &mut Spawn {
        self.new_group = true;
        self
    }

    pub fn stdin(&mut self, io: Io) -> &mut Spawn {
        self.stdio[0] = io;
        self
    }

    pub fn stdout(&mut self, io: Io) -> &mut Spawn {
        self.stdio[1] = io;
        self
    }

    pub fn stderr(&mut self, io: Io) -> &mut Spawn {
        self.stdio[2] = io;
        self
    }

    #[cfg(test)]
    pub fn get_args(&self) -> &[OsString] {
        &self.args
    }

    #[cfg(test)]
    pub fn get_envs(&self) -> &[(OsString, OsString)] {
        &self.env
    }

    /// Starts the child; an error says why it did not start (an exec that failed included:
    /// the child reports its errno before it exits, and is reaped here).
    pub fn spawn(&self) -> io::Result<Child> {
        if let Some(entry) = &self.entry {
            // Whatever went wrong, nothing of the command ran; the helper's way says why.
            if let Ok(child) = self.start(Some(entry)) {
                return Ok(child);
            }
        }
        self.start(None)
    }

    fn start(&self, entry: Option<&Entry>) -> io::Result<Child> {
        let (program, rest, vars, cwd) = match entry {
            Some(e) => {
                let (program, rest) = e.argv.split_first().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "no program to run")
                })?;
                (program, rest, &e.env, Some(&e.cwd))
            }
            None => (&self.program, &self.args[..], &self.env, self.cwd.as_ref()),
        };
        if !program.as_bytes().contains(&b'/') {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} was not found on PATH: install it, or add its directory to PATH",
                    program.to_string_lossy()
                ),
            ));
        }
        let path = c_string(program)?;
        let args = std::iter::once(program)
            .chain(rest)
            .map(|a| c_string(a))
            .collect::<io::Result<Vec<_>>>()?;
        let env = vars
            .iter()
            .map(|(k, v)| {
                let mut kv = k.clone();
                kv.push("=");
                kv.push(v);
                c_string(&kv)
            })
            .collect::<io::Result<Vec<_>>>()?;
        let cwd = cwd.map(|c| c_string(c)).transpose()?;
        let argv = null_terminated(&args);
        let envp = null_terminated(&env);
        if self.cgroups.len() > MAX_CGROUPS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a child joins at most 3 cgroups",
            ));
        }
        let mut cgroups = [-1; MAX_CGROUPS];
        for (slot, fd) in cgroups.iter_mut().zip(&self.cgroups) {
            *slot = fd.as_raw_fd();
        }

        // Our ends of the pipes, and the child's ends until they are in the slots.
        let mut ours: [Option<OwnedFd>; 3] = [None, None, None];
        let mut theirs: [Option<OwnedFd>; 3] = [None, None, None];
        for (i, io) in self.stdio.iter().enumerate() {
            if *io == Io::Piped {
                let (read, write) = pipe()?;
                let (mine, child) = if i == 0 { (write, read) } else { (read, write) };
                ours[i] = Some(mine);
                theirs[i] = Some(child);
            }
        }

        let slots = slots()?;
        let group = slots.take();
        // The slots hold /dev/null whenever no start is using them: a null stdio needs none.
        let placed = group
            .fds
            .iter()
            .zip(&theirs)
            .filter_map(|(&slot, fd)| Some((slot, fd.as_ref()?)))
            .try_for_each(|(slot, fd)| dup_onto(fd.as_raw_fd(), slot));
        let mut plan = Plan {
            path: path.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            cwd: cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            stdio: group.fds,
            keep_below: slots.keep_below,
            new_group: self.new_group,
            cgroups,
            netns: self.netns.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
            joins: entry.map(Entry::joins),
            command_stack_top: group.command_stack_top,
            command: 0,
            err: 0,
        };
        let started = placed.and_then(|()| clone_child(&mut plan, group.stack_top));
        slots.give_back(group);
        drop(theirs);
        let child = started?;
        // SAFETY: the child has exec'd or exited (CLONE_VFORK), and so has the command it
        // started, if any: nothing writes the plan now.
        let (err, command) = unsafe {
            (
                std::ptr::read_volatile(&plan.err),
                std::ptr::read_volatile(&plan.command),
            )
        };
        let pid = match entry {
            // The child only started the command, which is ours too: it has exited.
            Some(_) => {
                let _ = wait_pid(child);
                command
            }
            None => child,
        };
        if err != 0 || pid <= 0 {
            if pid > 0 {
                let _ = wait_pid(pid);
            }
            return Err(io::Error::from_raw_os_error(if err != 0 {
                err
            } else {
                libc::EIO
            }));
        }
        let [stdin, stdout, stderr] = ours;
        Ok(Child {
            pid: pid as u32,
            stdin: stdin.map(ChildStdin::from),
            stdout: stdout.map(ChildStdout::from),
            stderr: stderr.map(ChildStderr::from),
            status: None,
            entered_directly: entry.is_some(),
        })
    }
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Whether this is the command itself, started straight into its sandbox, rather than a
    /// helper that launches it.
    pub fn entered_directly(&self) -> bool {
        self.entered_directly
    }

    /// Reaps the child, waiting for its exit; its status once reaped.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = wait_pid(self.pid as libc::pid_t)?;
        self.status = Some(status);
        Ok(status)
    }

    /// SIGKILL, unless reaped already (the pid may name another process by then).
    pub fn kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our unreaped child.
        if unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

fn wait_pid(pid: libc::pid_t) -> io::Result<ExitStatus> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status into the int we own.
        if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn c_string(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a NUL byte in a command's argument or variable, which no process can be \
                 given: remove it ({})",
                s.to_string_lossy()
            ),
        )
    })
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are new descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes `slot` name what `fd` names, atomically (the number is never free meanwhile, so no
/// open elsewhere in this process can take it).
fn dup_onto(fd: RawFd, slot: RawFd) -> io::Result<()> {
    // SAFETY: dup3 takes two descriptor numbers; `slot` is ours for the life of the process.
    if unsafe { libc::dup3(fd, slot, libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What the child needs, laid out before it starts; it writes only `err`.
struct Plan {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// Null for the parent's.
    cwd: *const libc::c_char,
    /// For fds 0, 1 and 2: the slot to move there.
    stdio: [RawFd; 3],
    /// The child's own table holds the descriptors below this: every slot, and 0, 1 and 2.
    keep_below: libc::c_uint,
    new_group: bool,
    /// `cgroup.procs` fds in the parent's table (-1 for none), written while it is shared.
    cgroups: [RawFd; MAX_CGROUPS],
    /// A network namespace fd in the parent's table, or -1.
    netns: RawFd,
    /// For a direct entry: what the child joins before it starts the command (see `entry`),
    /// on the stack below its own.
    joins: Option<entry::Joins>,
    command_stack_top: *mut libc::c_void,
    /// The command's pid, once a direct entry's child has started it.
    command: libc::pid_t,
    /// The errno of the step that failed, for the parent to report.
    err: libc::c_int,
}

/// Starts the child on `stack_top`; returns once it has exec'd or exited.
fn clone_child(plan: &mut Plan, stack_top: *mut libc::c_void) -> io::Result<libc::pid_t> {
    // SAFETY: sigset_t is plain data; the masks are ours.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // SAFETY: the child runs `child` on a stack of its own (its group's, which no other
    // start uses meanwhile), reads `plan` (alive until this returns, which CLONE_VFORK holds
    // back until the child's exec or exit) and writes only `plan.err`.
    let pid = unsafe {
        libc::clone(
            child,
            stack_top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_FILES | libc::SIGCHLD,
            (plan as *mut Plan).cast(),
        )
    };
    let err = io::Error::last_os_error();
    // SAFETY: restores this thread's mask as it was.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if pid < 0 {
        return Err(err);
    }
    Ok(pid)
}

/// The child, from its start to its exec (or, for a direct entry, to the command's start).
/// Raw system calls only: it shares the parent's memory, and another thread of the parent
/// may hold any lock.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    let plan = arg.cast::<Plan>();
    // SAFETY: `plan` outlives the child's use of it (see `clone_child`); each call below is
    // a system call on plain values or on strings the parent laid out.
    unsafe {
        // Into the sandbox's cgroups while the parent's table (holding their fds) is still
        // ours: "0" names the writer. A child that cannot join does not run unbounded.
        if (*plan).netns >= 0 && libc::setns((*plan).netns, libc::CLONE_NEWNET) != 0 {
            fail(plan);
        }
        for fd in (*plan).cgroups {
            if fd >= 0 && libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                fail(plan);
            }
        }
        let joins = (*plan).joins;
        if let Some(joins) = &joins {
            if !entry::join(joins) {
                fail(plan);
            }
        }
        // A table of its own first: until then a descriptor change here is the parent's too.
        // (Linux 5.9; before it, the whole table is copied.)
        let own = libc::syscall(
            libc::SYS_close_range,
            (*plan).keep_below,
            libc::c_uint::MAX,
            CLOSE_RANGE_UNSHARE,
        ) == 0;
        if !own && libc::unshare(libc::CLONE_FILES) != 0 {
            fail(plan);
        }
        let stdio = (*plan).stdio;
        for (target, slot) in (0..).zip(stdio) {
            if libc::dup2(slot, target) < 0 {
                fail(plan);
            }
        }
        // Everything but stdio; where close_range is missing, close-on-exec still does it
        // for every descriptor this process opened.
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            0,
        );
        // A direct entry's command leads its own group (this child does not last).
        if (*plan).new_group && joins.is_none() && libc::setpgid(0, 0) != 0 {
            fail(plan);
        }
        if !(*plan).cwd.is_null() && libc::chdir((*plan).cwd) != 0 {
            fail(plan);
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=libc::SIGRTMAX() {
            if libc::sigaction(sig, std::ptr::null(), &mut action) == 0
                && (sig == libc::SIGPIPE
                    || (action.sa_sigaction != libc::SIG_DFL
                        && action.sa_sigaction != libc::SIG_IGN))
            {
                libc::sigaction(sig, &default, std::ptr::null_mut());
            }
        }
        if joins.is_some() {
            if !entry::start_command(plan, (*plan).command_stack_top) {
                fail(plan);
            }
            libc::_exit(0)
        }
        exec(plan)
    }
}

/// Unblocks every signal and execs the plan's program; returns only by [`fail`].
///
/// # Safety
/// In a child of a start, with the start's plan.
unsafe fn exec(plan: *mut Plan) -> ! {
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    libc::execve((*plan).path, (*plan).argv, (*plan).envp);
    fail(plan)
}

/// Leaves the errno of the step that failed for the parent (never 0, which reads as none)
/// and exits.
///
/// # Safety
/// In a child of a start, with the start's plan.
unsafe fn fail(plan: *mut Plan) -> ! {
    let err = match errno() {
        0 => libc::EIO,
        e => e,
    };
    std::ptr::write_volatile(std::ptr::addr_of_mut!((*plan).err), err);
    libc::_exit(127)
}

fn errno() -> libc::c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests;
