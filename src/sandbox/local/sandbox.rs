//! The `Sandbox` handle on a local sandbox: each operation checks that the sandbox lives,
//! then runs it on the shared state (see `state`), its processes (see `process`) or its
//! files (see `confined`).

use std::io;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::confined::Beneath;
use super::isolation::Isolation;
use super::meta::{self, PROCS_DIR};
use super::proc_table::{ProcEntry, KILL_WAIT, STDIN_WRITE_TIMEOUT};
use super::process::{self, Launch};
use super::reset;
use super::state::{Mode, SandboxState};
use super::sys;
use crate::sandbox::{
    ErrorClass, LimitHit, Limits, Output, OutputSink, Process, ProcessInfo, Result, Role, RunOpts,
    Sandbox, SandboxError, SpawnOpts,
};
use crate::sync::lock;

/// Largest file `read_file` returns; the trait hands back one buffer, so it must be bounded.
const MAX_FILE_BYTES: u64 = 1 << 30;

/// A handle on a local sandbox. Dropping it does not kill the sandbox; `Backend::kill` does.
pub struct LocalSandbox {
    pub(super) state: Arc<SandboxState>,
}

impl LocalSandbox {
    /// What starting `cmd` needs. Fails when the sandbox is gone or the working directory is
    /// missing.
    fn launch<'a>(
        &self,
        cmd: &'a str,
        cwd: Option<&str>,
        role: Role,
        envs: &'a [(String, String)],
        stdin: bool,
    ) -> Result<Launch<'a>> {
        self.state.ensure_live()?;
        Ok(Launch {
            cmd,
            cwd: self.state.cwd(cwd, role)?,
            role,
            envs,
            stdin,
            network_of: None,
        })
    }

    /// Whether `path` is the image's to serve: the sandbox runs on one, and the path is in
    /// none of the directories the host reaches.
    pub fn in_image(&self, path: &str) -> bool {
        self.state.image.is_some()
            && path.starts_with('/')
            && matches!(self.state.locate(path), Err(SandboxError::BadPath { .. }))
    }

    /// The entry of a process this wmo-e2b process started here and has not reaped.
    fn entry(&self, pid: u32) -> Result<Arc<ProcEntry>> {
        self.state
            .entry(pid)
            .ok_or_else(|| self.state.no_such_process(pid))
    }

    /// The sandbox's directory (holding `meta.json`, `procs/` and the `root/` home).
    pub fn dir(&self) -> &Path {
        &self.state.dir
    }

    /// How the sandbox's processes are confined.
    pub fn isolation(&self) -> Isolation {
        match self.state.mode {
            Mode::Bwrap(_) => Isolation::Bwrap,
            Mode::None => Isolation::None,
        }
    }

    /// The host's confined view of a sandbox path, for servers that answer file requests
    /// (the emulator): operations on it never leave the sandbox's directories.
    pub fn files(&self, path: &str) -> Result<(Beneath, String)> {
        self.state.ensure_live()?;
        self.state.beneath(path)
    }

    /// What the sandbox's `/proc/sys/kernel/random/boot_id` reads (bwrap only): new each
    /// time it boots, kept across a memory pause.
    pub fn boot_id(&self) -> Result<String> {
        self.state.ensure_live()?;
        super::boot_id::read(&self.state.dir)
            .map_err(|e| self.state.io_error("reading the sandbox's boot id", e))
    }

    /// A stream to `port` where a process of the sandbox listens on it (in the sandbox's
    /// network, or a command's own); `None` when none does.
    pub fn connect_port(&self, port: u16, timeout: Duration) -> Result<Option<TcpStream>> {
        self.state.ensure_live()?;
        super::ports::connect(&self.state.dir, port, timeout)
            .map_err(|e| self.state.io_error(format!("connecting to port {port}"), e))
    }

    /// Classifies an error of an operation on [`LocalSandbox::files`].
    pub fn file_error(&self, path: &str, what: &str, e: io::Error) -> SandboxError {
        self.state.file_error(path, what, e)
    }
}

impl Sandbox for LocalSandbox {
    fn id(&self) -> &str {
        &self.state.id
    }

    fn home(&self) -> &str {
        &self.state.home
    }

    fn system_dir(&self) -> &str {
        &self.state.system
    }

    fn seal(&self) -> Result<()> {
        self.state.ensure_live()?;
        reset::seal(&self.state)
    }

    fn reset(&self) -> Result<()> {
        self.state.ensure_live()?;
        reset::reset(&self.state)
    }

    fn stop_agent(&self, runner_too: bool) -> Result<()> {
        self.state.ensure_live()?;
        super::stop::stop_agent(&self.state, runner_too)
    }

    fn run(&self, cmd: &str, opts: &RunOpts) -> Result<Output> {
        let launch = self.launch(cmd, opts.cwd.as_deref(), opts.role, &opts.envs, false)?;
        process::run(&self.state, &launch, opts)
    }

    fn spawn_into(&self, cmd: &str, opts: &SpawnOpts, sink: Box<dyn OutputSink>) -> Result<u32> {
        let mut launch =
            self.launch(cmd, opts.cwd.as_deref(), opts.role, &opts.envs, opts.stdin)?;
        launch.network_of = opts.network_of;
        process::spawn(&self.state, &launch, sink, opts.ends_after)
    }

    fn connect(&self, pid: u32) -> Result<Process> {
        self.state.ensure_live()?;
        let events = self
            .entry(pid)?
            .subscribe()
            .ok_or_else(|| self.state.no_such_process(pid))?;
        Ok(Process { pid, events })
    }

    fn send_stdin(&self, pid: u32, data: &[u8]) -> Result<()> {
        self.state.ensure_live()?;
        self.entry(pid)?
            .write_stdin(data, STDIN_WRITE_TIMEOUT)
            .map_err(|e| {
                self.state
                    .io_error(format!("writing to the stdin of process {pid}"), e)
            })
    }

    fn close_stdin(&self, pid: u32) -> Result<()> {
        self.state.ensure_live()?;
        self.entry(pid)?.close_stdin();
        Ok(())
    }

    fn processes(&self) -> Result<Vec<ProcessInfo>> {
        self.state.ensure_live()?;
        let records = match meta::read_proc_records(&self.state.dir.join(PROCS_DIR)) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.state.ensure_live()?;
                Vec::new()
            }
            Err(e) => return Err(self.state.io_error("reading the process records", e)),
        };
        Ok(records
            .into_iter()
            .filter(|r| {
                sys::proc_stat(r.pid)
                    .is_some_and(|s| s.start_time == r.start_time && s.is_running())
            })
            .map(|r| ProcessInfo {
                pid: r.pid,
                cmd: r.cmd,
            })
            .collect())
    }

    fn kill_process(&self, pid: u32) -> Result<()> {
        self.state.ensure_live()?;
        let kill_error = |e| self.state.io_error(format!("killing process {pid}"), e);
        let stuck = || {
            kill_error(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("still running {} s after SIGKILL", KILL_WAIT.as_secs()),
            ))
        };
        if let Some(entry) = self.state.entry(pid) {
            entry.kill_group().map_err(kill_error)?;
            if !entry.wait_reaped(KILL_WAIT) || !sys::wait_groups_gone(&[pid], KILL_WAIT).is_empty()
            {
                return Err(stuck());
            }
            lock(&self.state.procs).remove(&pid);
            meta::remove_proc_record(&self.state.dir, pid);
            return Ok(());
        }
        // Started by another wmo-e2b process (or its leader already exited here): only the
        // record says whether the pid is still ours.
        let record = meta::read_proc_records(&self.state.dir.join(PROCS_DIR))
            .unwrap_or_default()
            .into_iter()
            .find(|r| r.pid == pid)
            .ok_or_else(|| self.state.no_such_process(pid))?;
        if matches!(self.state.mode, Mode::Bwrap(_)) {
            sys::end_launched(pid, record.start_time).map_err(kill_error)?;
        }
        let signalled = sys::kill_recorded_group(pid, record.start_time).map_err(kill_error)?;
        if signalled && !sys::wait_groups_gone(&[pid], KILL_WAIT).is_empty() {
            return Err(stuck());
        }
        meta::remove_proc_record(&self.state.dir, pid);
        if signalled {
            Ok(())
        } else {
            Err(self.state.no_such_process(pid))
        }
    }

    fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        self.state.ensure_live()?;
        if self.in_image(path) {
            return super::image_files::read(self, path);
        }
        let (b, rel) = self.state.beneath(path)?;
        let read_err = |e| self.state.file_error(path, "read", e);
        let file = b.open_read(&rel).map_err(read_err)?;
        let len = file.metadata().map_err(read_err)?.len();
        if len > MAX_FILE_BYTES {
            return Err(SandboxError::Remote {
                class: ErrorClass::BadRequest,
                message: format!(
                    "{path} is {len} bytes; read_file returns at most {MAX_FILE_BYTES}"
                ),
                source: None,
            });
        }
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut io::Read::take(file, MAX_FILE_BYTES), &mut bytes)
            .map_err(read_err)?;
        Ok(bytes)
    }

    fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        self.state.ensure_live()?;
        if self.in_image(path) {
            return super::image_files::write(self, path, data);
        }
        let (b, rel) = self.state.beneath(path)?;
        if rel.is_empty() {
            return Err(SandboxError::BadPath {
                path: path.to_string(),
                reason: "the path names a directory",
            });
        }
        // A vanished sandbox directory makes every open fail with ENOENT; file_error tells
        // that from a missing parent.
        b.write(&rel, data)
            .map_err(|e| self.state.file_error(path, "write", e))
    }

    fn empty_dir(&self, path: &str) -> Result<bool> {
        self.state.ensure_live()?;
        if self.in_image(path) {
            return Ok(false);
        }
        let (b, rel) = self.state.beneath(path)?;
        if rel.is_empty() {
            return Err(SandboxError::BadPath {
                path: path.to_string(),
                reason: "the path names a directory of the sandbox's own",
            });
        }
        // Group-writable, as a task's `mkdir` (umask 002) makes it: the verifier, of the
        // sandbox user's group, writes where the agent worked.
        b.remove(&rel)
            .and_then(|()| b.make_dirs(&rel))
            .and_then(|_| b.set_dir_mode(&rel, 0o775))
            .map_err(|e| self.state.file_error(path, "make", e))?;
        Ok(true)
    }

    fn set_timeout(&self, secs: u64) -> Result<()> {
        self.state.ensure_live()?;
        self.state.set_timeout(secs)
    }

    fn set_internet(&self, allowed: bool) -> Result<()> {
        self.state.ensure_live()?;
        self.state.set_internet(allowed)
    }

    fn apply_limits(&self, limits: &Limits) -> Result<()> {
        self.state.ensure_live()?;
        let s = &self.state;
        s.limits
            .apply(&s.dir, limits)
            .map_err(|e| s.io_error("applying the sandbox's limits", e))
    }

    fn limit_reached(&self) -> Option<LimitHit> {
        self.state.limits.reached(&self.state.dir)
    }
}
