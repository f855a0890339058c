//! One local sandbox: its shared in-process state and the `Sandbox` handle over it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::meta::{self, Meta, MetaError, META_FILE, PROCS_DIR, ROOT_DIR};
use super::process::{self, Launch, ProcEntry, ProcTable, KILL_WAIT, STDIN_WRITE_TIMEOUT};
use super::{lock, sys, teardown};
use crate::sandbox::{
    contained_path, ErrorClass, Killed, Output, Process, ProcessInfo, Result, RunOpts, Sandbox,
    SandboxError, SpawnOpts,
};

/// Largest file `read_file` returns; the trait hands back one buffer, so it must be bounded.
const MAX_FILE_BYTES: u64 = 1 << 30;

/// What every handle on one sandbox shares within this wmo-e2b process: the table of processes
/// it started (so `connect(pid)` and `send_stdin` work from any handle) and cached meta.
pub(super) struct SandboxState {
    pub id: String,
    /// `<state>/sandboxes/<id>`.
    pub dir: PathBuf,
    pub sandboxes: PathBuf,
    pub home: String,
    pub envs: Vec<(String, String)>,
    /// Unix seconds. A cache: when it passes, meta.json is read again, since another wmo-e2b
    /// process may have extended it.
    deadline: AtomicU64,
    internet: AtomicBool,
    gone: AtomicBool,
    /// Serializes read-modify-write of meta.json within this process.
    meta_lock: Mutex<()>,
    /// So a second concurrent kill returns only once the first has finished.
    destroy_lock: Mutex<()>,
    pub procs: ProcTable,
}

impl SandboxState {
    pub fn new(sandboxes: &Path, home_base: &str, meta: &Meta) -> SandboxState {
        SandboxState {
            id: meta.id.clone(),
            dir: sandboxes.join(&meta.id),
            sandboxes: sandboxes.to_path_buf(),
            home: format!("{home_base}/{}/{ROOT_DIR}", meta.id),
            envs: meta.envs.clone(),
            deadline: AtomicU64::new(meta.deadline),
            internet: AtomicBool::new(meta.internet),
            gone: AtomicBool::new(false),
            meta_lock: Mutex::new(()),
            destroy_lock: Mutex::new(()),
            procs: Mutex::default(),
        }
    }

    pub fn internet(&self) -> bool {
        self.internet.load(Ordering::SeqCst)
    }

    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    pub fn mark_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
    }

    pub fn gone(&self) -> SandboxError {
        SandboxError::Gone {
            id: self.id.clone(),
        }
    }

    pub fn io_error(&self, what: impl Into<String>, source: io::Error) -> SandboxError {
        SandboxError::Io {
            id: self.id.clone(),
            what: what.into(),
            source,
        }
    }

    fn no_such_process(&self, pid: u32) -> SandboxError {
        SandboxError::NoSuchProcess {
            id: self.id.clone(),
            pid,
        }
    }

    /// `Gone` once the sandbox was killed (here or by another wmo-e2b process) or its deadline
    /// passed; a passed deadline kills it now.
    pub fn ensure_live(&self) -> Result<()> {
        if self.is_gone() {
            return Err(self.gone());
        }
        if meta::now_ms() >= self.deadline.load(Ordering::SeqCst).saturating_mul(1000) {
            return self.recheck_deadline();
        }
        match fs::symlink_metadata(self.dir.join(META_FILE)) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.mark_gone();
                Err(self.gone())
            }
            Err(e) => Err(self.io_error("checking meta.json", e)),
        }
    }

    /// For the watcher: kills the sandbox if its deadline has really passed.
    pub fn expire_if_due(&self) {
        if !self.is_gone()
            && meta::now_ms() >= self.deadline.load(Ordering::SeqCst).saturating_mul(1000)
        {
            // Nobody to tell: a sandbox that cannot be killed now is retried at the next tick.
            let _ = self.recheck_deadline();
        }
    }

    /// The cached deadline passed: unless another process moved it, the sandbox dies now.
    fn recheck_deadline(&self) -> Result<()> {
        match meta::read_meta(&self.dir) {
            Ok(m) if !m.expired_at(meta::now_ms()) => {
                self.deadline.store(m.deadline, Ordering::SeqCst);
                Ok(())
            }
            Ok(_) => {
                self.destroy()?;
                Err(self.gone())
            }
            Err(MetaError::Missing) => {
                self.mark_gone();
                Err(self.gone())
            }
            Err(MetaError::Corrupt(e) | MetaError::Io(e)) => {
                Err(self.io_error("reading meta.json", e))
            }
        }
    }

    /// Kills every process group of the sandbox and removes it.
    pub fn destroy(&self) -> Result<Killed> {
        let _one = lock(&self.destroy_lock);
        match teardown::bury(&self.sandboxes, &self.id) {
            Ok(tomb) => {
                self.mark_gone();
                teardown::finish_burial(&tomb, &self.id, Some(&self.procs))?;
                Ok(Killed::Now)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.mark_gone();
                Ok(Killed::AlreadyGone)
            }
            Err(e) => Err(self.io_error("moving the sandbox directory away", e)),
        }
    }

    /// Rewrites meta.json (atomically) with `change` applied to what is on disk now.
    fn update_meta(&self, change: impl FnOnce(&mut Meta)) -> Result<Meta> {
        let _one = lock(&self.meta_lock);
        let mut m = match meta::read_meta(&self.dir) {
            Ok(m) => m,
            Err(MetaError::Missing) => {
                self.mark_gone();
                return Err(self.gone());
            }
            Err(MetaError::Corrupt(e) | MetaError::Io(e)) => {
                return Err(self.io_error("reading meta.json", e))
            }
        };
        change(&mut m);
        match meta::write_meta(&self.dir, &m) {
            Ok(()) => Ok(m),
            // The directory vanished under us: killed by someone else.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.mark_gone();
                Err(self.gone())
            }
            Err(e) => Err(self.io_error("writing meta.json", e)),
        }
    }

    fn entry(&self, pid: u32) -> Option<Arc<ProcEntry>> {
        lock(&self.procs).get(&pid).cloned()
    }

    fn cwd(&self, cwd: Option<&str>) -> Result<PathBuf> {
        let Some(cwd) = cwd else {
            return Ok(PathBuf::from(&self.home));
        };
        if !cwd.starts_with('/') {
            return Err(SandboxError::BadPath {
                path: cwd.to_string(),
                reason: "the working directory must be an absolute path",
            });
        }
        if !Path::new(cwd).is_dir() {
            return Err(SandboxError::NotFound {
                path: cwd.to_string(),
            });
        }
        Ok(PathBuf::from(cwd))
    }

    /// Maps an absolute path under `home` to the file it names, lexically refusing escapes.
    fn resolve(&self, path: &str) -> Result<PathBuf> {
        let bad = |reason| SandboxError::BadPath {
            path: path.to_string(),
            reason,
        };
        let rel = path
            .strip_prefix(self.home.as_str())
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| bad("the path is not under the sandbox home"))?;
        match contained_path(&self.home, rel) {
            Ok(p) => Ok(PathBuf::from(p)),
            Err(SandboxError::BadPath { reason, .. }) => Err(bad(reason)),
            Err(e) => Err(e),
        }
    }

    /// Classifies a file error by errno: a missing file is the caller's mistake (unless the
    /// whole sandbox is gone), and so is a path through a regular file.
    fn file_error(&self, path: &Path, what: &str, e: io::Error) -> SandboxError {
        let path = path.display().to_string();
        match e.raw_os_error() {
            Some(libc::ENOENT) => match self.ensure_live() {
                Ok(()) => SandboxError::NotFound { path },
                Err(gone) => gone,
            },
            Some(
                libc::ENOTDIR
                | libc::EISDIR
                | libc::EEXIST
                | libc::EACCES
                | libc::EPERM
                | libc::ENAMETOOLONG
                | libc::ELOOP
                | libc::EFBIG,
            ) => SandboxError::Remote {
                class: ErrorClass::BadRequest,
                message: format!("cannot {what} {path}"),
                source: Some(Box::new(e)),
            },
            _ => self.io_error(format!("{what} {path}"), e),
        }
    }

    /// Creates the directories between `home` and `target` one by one. `create_dir_all` could
    /// recreate the sandbox directory itself after a concurrent kill; this fails instead.
    fn make_parents(&self, target: &Path) -> Result<()> {
        let Some(rel) = target
            .parent()
            .and_then(|p| p.strip_prefix(&self.home).ok())
        else {
            return Ok(());
        };
        let mut dir = PathBuf::from(&self.home);
        for part in rel.components() {
            dir.push(part);
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(self.file_error(&dir, "create directory", e)),
            }
        }
        Ok(())
    }
}

/// A handle on a local sandbox. Dropping it does not kill the sandbox; `Backend::kill` does.
pub struct LocalSandbox {
    pub(super) state: Arc<SandboxState>,
}

impl LocalSandbox {
    /// The sandbox's directory (holding `meta.json`, `procs/` and the `root/` home).
    pub fn dir(&self) -> &Path {
        &self.state.dir
    }
}

impl Sandbox for LocalSandbox {
    fn id(&self) -> &str {
        &self.state.id
    }

    fn home(&self) -> &str {
        &self.state.home
    }

    fn run(&self, cmd: &str, opts: &RunOpts) -> Result<Output> {
        self.state.ensure_live()?;
        let cwd = self.state.cwd(opts.cwd.as_deref())?;
        let launch = Launch {
            cmd,
            cwd: &cwd,
            envs: &opts.envs,
            stdin: false,
        };
        process::run(&self.state, &launch, opts)
    }

    fn spawn(&self, cmd: &str, opts: &SpawnOpts) -> Result<Process> {
        self.state.ensure_live()?;
        let cwd = self.state.cwd(opts.cwd.as_deref())?;
        let launch = Launch {
            cmd,
            cwd: &cwd,
            envs: &opts.envs,
            stdin: opts.stdin,
        };
        process::spawn(&self.state, &launch)
    }

    fn connect(&self, pid: u32) -> Result<Process> {
        self.state.ensure_live()?;
        let events = self
            .state
            .entry(pid)
            .and_then(|e| e.subscribe())
            .ok_or_else(|| self.state.no_such_process(pid))?;
        Ok(Process { pid, events })
    }

    fn send_stdin(&self, pid: u32, data: &[u8]) -> Result<()> {
        self.state.ensure_live()?;
        let entry = self
            .state
            .entry(pid)
            .ok_or_else(|| self.state.no_such_process(pid))?;
        entry.write_stdin(data, STDIN_WRITE_TIMEOUT).map_err(|e| {
            self.state
                .io_error(format!("writing to the stdin of process {pid}"), e)
        })
    }

    fn close_stdin(&self, pid: u32) -> Result<()> {
        self.state.ensure_live()?;
        let entry = self
            .state
            .entry(pid)
            .ok_or_else(|| self.state.no_such_process(pid))?;
        entry.close_stdin();
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
                "still running 5 s after SIGKILL",
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
        let file = self.state.resolve(path)?;
        let read_err = |e| self.state.file_error(&file, "read", e);
        let len = fs::metadata(&file).map_err(read_err)?.len();
        if len > MAX_FILE_BYTES {
            return Err(SandboxError::Remote {
                class: ErrorClass::BadRequest,
                message: format!(
                    "{path} is {len} bytes; read_file returns at most {MAX_FILE_BYTES}"
                ),
                source: None,
            });
        }
        meta::read_bounded(&file, MAX_FILE_BYTES).map_err(read_err)
    }

    fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        self.state.ensure_live()?;
        let file = self.state.resolve(path)?;
        self.state.make_parents(&file)?;
        fs::write(&file, data).map_err(|e| self.state.file_error(&file, "write", e))
    }

    fn set_timeout(&self, secs: u64) -> Result<()> {
        self.state.ensure_live()?;
        let m = self
            .state
            .update_meta(|m| m.deadline = meta::deadline_after(secs))?;
        self.state.deadline.store(m.deadline, Ordering::SeqCst);
        Ok(())
    }

    fn set_internet(&self, allowed: bool) -> Result<()> {
        self.state.ensure_live()?;
        if !allowed {
            sys::netlock_flag()?;
        }
        self.state.update_meta(|m| m.internet = allowed)?;
        // Processes already running keep the network they started with.
        self.state.internet.store(allowed, Ordering::SeqCst);
        Ok(())
    }
}
