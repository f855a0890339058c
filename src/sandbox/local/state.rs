//! What every handle on one local sandbox shares within this wmo-e2b process: where its
//! directories are and how the sandbox sees them, its namespace holders, its process table,
//! its cached deadline and pause, and the checks and errors every operation on it goes
//! through.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::confined::Beneath;
use super::isolation::{
    self, Binds, Bwrap, IdRange, Isolation, BWRAP_HOME, BWRAP_SYSTEM, BWRAP_TMP, SANDBOX_UID,
    VERIFIER_UID,
};
use super::limit_watch::LimitState;
use super::meta::{self, DirLock, Meta, MetaError, META_FILE, ROOT_DIR, SYSTEM_DIR, TMP_DIR};
use super::ns::Holder;
use super::proc_table::{ProcEntry, ProcTable};
use super::snapshot::Sealed;
use super::sys;
use super::teardown;
use crate::sandbox::{
    normalize_relative, ErrorClass, ImageRoot, Killed, OnTimeout, Result, Role, SandboxError,
    TESTS_DIR,
};
use crate::sync::lock;

mod namespaces;

/// What every sandbox of a backend shares.
pub(super) struct HostConfig {
    /// The passwd and group files bound into bwrap sandboxes.
    pub passwd: PathBuf,
    pub group: PathBuf,
    /// Host directories shown read-only to [`Role::System`] processes, and where.
    pub system_read_only: Vec<(PathBuf, String)>,
    /// Host directories shown read-only to every process, and where.
    pub everyone_read_only: Vec<(PathBuf, String)>,
    /// Whether task processes see the system directory, read-only.
    pub system_read_only_to_tasks: bool,
}

/// How a sandbox's processes start.
#[derive(Clone, Copy)]
pub(super) enum Mode {
    Bwrap(&'static Bwrap),
    None,
}

/// One of the sandbox's directories: where the sandbox sees it, and where it is on the host.
struct Mount {
    at: String,
    host: PathBuf,
}

/// What every handle on one sandbox shares within this wmo-e2b process: the table of processes
/// it started (so `connect(pid)` and `send_stdin` work from any handle) and cached meta.
pub(super) struct SandboxState {
    pub id: String,
    /// `<state>/sandboxes/<id>`.
    pub dir: PathBuf,
    pub sandboxes: PathBuf,
    pub mode: Mode,
    /// The host ids its user namespace maps, as root (see `id_range`).
    pub ids: Option<IdRange>,
    /// `home()` and `system_dir()` as the sandbox's processes see them.
    pub home: String,
    pub system: String,
    /// The sandbox paths the host may read and write, and the host directories behind them.
    mounts: Vec<Mount>,
    /// `<dir>/verifier`: the verifier's `HOME` and `TMPDIR` (see `stop`).
    pub verifier: PathBuf,
    /// `<dir>/logs`: `/logs` in the sandbox (see `stop`).
    pub logs: PathBuf,
    pub envs: Vec<(String, String)>,
    /// The image its task processes run on, if any (see `image_root`).
    pub image: Option<ImageRoot>,
    host: Arc<HostConfig>,
    /// Unix seconds. A cache: when it passes, meta.json is read again, since another wmo-e2b
    /// process may have extended it.
    deadline: AtomicU64,
    /// Whether meta.json said the sandbox is paused when last read.
    paused: AtomicBool,
    /// Which meta.json was last read: one that differs was rewritten since (paused, resumed,
    /// given a new deadline), here or by another wmo-e2b process, and is read again.
    read_stamp: Mutex<Option<Stamp>>,
    internet: AtomicBool,
    /// Its processes share a network namespace of its own (see `netns`).
    pub own_network: bool,
    gone: AtomicBool,
    /// So a second concurrent kill returns only once the first has finished.
    destroy_lock: Mutex<()>,
    /// The namespace holders last seen alive (bwrap only), by `Space`.
    holders: Mutex<[Option<Holder>; 3]>,
    /// The spare task namespace being made in the background, if any.
    spare: Mutex<Option<JoinHandle<Result<Holder>>>>,
    /// The task namespace this process last marked entered (see `ns::mark_entered`).
    entered: Mutex<Option<Holder>>,
    /// What `reset` returns to, once sealed.
    pub sealed: Mutex<Option<Sealed>>,
    pub procs: ProcTable,
    /// Its cgroups and the limits of its current task.
    pub limits: LimitState,
}

impl SandboxState {
    pub fn new(
        sandboxes: &Path,
        home_base: &str,
        meta: &Meta,
        host: Arc<HostConfig>,
    ) -> Result<SandboxState> {
        let dir = sandboxes.join(&meta.id);
        let mount = |at: String, name: &str| Mount {
            at,
            host: dir.join(name),
        };
        let (mode, mounts): (Mode, Vec<Mount>) = match meta.isolation {
            Isolation::Bwrap => {
                let bwrap = isolation::probe().map_err(|why| {
                    SandboxError::Unsupported(format!(
                        "sandbox {} was made with --isolation bwrap, which cannot run here: {why}",
                        meta.id
                    ))
                })?;
                let mounts = [
                    (BWRAP_HOME, ROOT_DIR),
                    (BWRAP_TMP, TMP_DIR),
                    (BWRAP_SYSTEM, SYSTEM_DIR),
                    (TESTS_DIR, meta::TESTS_DIR),
                ]
                .map(|(at, name)| mount(at.into(), name));
                (Mode::Bwrap(bwrap), mounts.into())
            }
            // Unconfined processes see host paths; the sandbox's own /tmp is the host's.
            Isolation::None => {
                let base = format!("{home_base}/{}", meta.id);
                let mounts =
                    [ROOT_DIR, SYSTEM_DIR].map(|name| mount(format!("{base}/{name}"), name));
                (Mode::None, mounts.into())
            }
        };
        let home = mounts[0].at.clone();
        let system = mounts
            .iter()
            .find(|m| m.host.ends_with(SYSTEM_DIR))
            .map_or_else(String::new, |m| m.at.clone());
        Ok(SandboxState {
            verifier: dir.join(meta::VERIFIER_DIR),
            logs: dir.join(meta::LOGS_DIR),
            id: meta.id.clone(),
            dir,
            sandboxes: sandboxes.to_path_buf(),
            mode,
            ids: meta.ids,
            home,
            system,
            mounts,
            envs: meta.envs.clone(),
            image: meta.image.clone(),
            host,
            deadline: AtomicU64::new(meta.deadline),
            paused: AtomicBool::new(meta.paused.is_some()),
            read_stamp: Mutex::new(None),
            internet: AtomicBool::new(meta.internet),
            own_network: meta.own_network,
            gone: AtomicBool::new(false),
            destroy_lock: Mutex::new(()),
            holders: Mutex::new([None, None, None]),
            spare: Mutex::new(None),
            entered: Mutex::new(None),
            sealed: Mutex::new(None),
            procs: Mutex::default(),
            limits: LimitState::default(),
        })
    }

    /// This sandbox's directories as bwrap binds them.
    pub fn binds(&self) -> Binds<'_> {
        Binds {
            home: &self.mounts[0].host,
            tmp: &self.mounts[1].host,
            system: &self.mounts[2].host,
            tests: &self.mounts[3].host,
            verifier: &self.verifier,
            logs: &self.logs,
            passwd: &self.host.passwd,
            group: &self.host.group,
            shared: &self.host.system_read_only,
            everyone: &self.host.everyone_read_only,
            system_to_tasks: self.host.system_read_only_to_tasks,
            root: None,
            boot_id: None,
        }
    }

    /// The uid that host-made files are handed to (when the host is root under bwrap).
    pub fn file_owner(&self) -> Option<u32> {
        self.host_owner(SANDBOX_UID)
    }

    /// The uid that owns the verifier's directories on the host (when the host is root).
    pub fn verifier_owner(&self) -> Option<u32> {
        self.host_owner(VERIFIER_UID)
    }

    fn host_owner(&self, inside: u32) -> Option<u32> {
        match self.mode {
            Mode::Bwrap(b) => b.host_owner(self.ids, inside),
            Mode::None => None,
        }
    }

    /// The host directory and relative path behind a sandbox path; `BadPath` when the path
    /// is relative, climbs with `..`, or lies outside every directory the host serves.
    pub fn locate(&self, path: &str) -> Result<(&Path, String)> {
        let bad = |reason| SandboxError::BadPath {
            path: path.to_string(),
            reason,
        };
        if !path.starts_with('/') {
            return Err(bad("sandbox paths must be absolute"));
        }
        for m in &self.mounts {
            let rest = match path.strip_prefix(m.at.as_str()) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
                _ => continue,
            };
            let rest = rest.trim_start_matches('/');
            if rest.is_empty() || rest.split('/').all(|p| p.is_empty() || p == ".") {
                return Ok((&m.host, String::new()));
            }
            return normalize_relative(rest)
                .map(|rel| (m.host.as_path(), rel))
                .map_err(bad);
        }
        Err(bad(
            "the path is outside the sandbox's home, /tmp and system directories",
        ))
    }

    /// Opens the directory behind `path` for confined operations, with the path beneath it.
    pub fn beneath(&self, path: &str) -> Result<(Beneath, String)> {
        let (dir, rel) = self.locate(path)?;
        let b =
            Beneath::open(dir, self.file_owner()).map_err(|e| self.file_error(path, "open", e))?;
        Ok((b, rel))
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

    /// Marks the sandbox gone (killed by someone else) and returns the error that says so.
    pub fn gone_now(&self) -> SandboxError {
        self.mark_gone();
        self.gone()
    }

    pub fn io_error(&self, what: impl Into<String>, source: io::Error) -> SandboxError {
        SandboxError::Io {
            id: self.id.clone(),
            what: what.into(),
            source,
        }
    }

    pub fn no_such_process(&self, pid: u32) -> SandboxError {
        SandboxError::NoSuchProcess {
            id: self.id.clone(),
            pid,
        }
    }

    pub fn paused_error(&self) -> SandboxError {
        SandboxError::Paused {
            id: self.id.clone(),
        }
    }

    /// `Gone` once the sandbox was killed (here or by another wmo-e2b process) or its deadline
    /// passed, `Paused` while it is paused (or due to be: its deadline passed and it pauses
    /// then); a passed deadline kills a sandbox that dies then now.
    pub fn ensure_live(&self) -> Result<()> {
        if self.is_gone() {
            return Err(self.gone());
        }
        self.refresh()?;
        if self.paused.load(Ordering::SeqCst) {
            return Err(self.paused_error());
        }
        if self.deadline_passed() {
            return self.recheck_deadline();
        }
        Ok(())
    }

    /// For the watcher: whether the sandbox's deadline has really passed (it is not paused,
    /// and no process moved the deadline), so that it must die or pause now.
    pub fn is_due(&self) -> bool {
        // The refresh also sees a resume by another process, which gives a deadline again.
        if self.is_gone() || self.refresh().is_err() || self.paused.load(Ordering::SeqCst) {
            return false;
        }
        if !self.deadline_passed() {
            return false;
        }
        self.reread_meta()
            .is_ok_and(|m| m.expired_at(meta::now_ms()))
    }

    fn deadline_passed(&self) -> bool {
        meta::now_ms() >= self.deadline.load(Ordering::SeqCst).saturating_mul(1000)
    }

    /// Reads meta.json again if it was rewritten since it was last read; `Gone` once it is
    /// not there.
    fn refresh(&self) -> Result<()> {
        // Every read that is noted holds the stamp's lock from before the read to after the
        // note, as a rewrite's note does: a read that raced a rewrite (seeing the meta before
        // it) can then never note after the rewrite noted, which would undo a pause.
        let mut seen = lock(&self.read_stamp);
        let stamp = match fs::symlink_metadata(self.dir.join(META_FILE)) {
            Ok(m) => Stamp::of(&m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(self.gone_now()),
            Err(e) => return Err(self.io_error("checking meta.json", e)),
        };
        if *seen != Some(stamp) {
            // Stamped before the read: a rewrite in between is read again next time.
            let m = self.read_meta()?;
            self.note(&m);
            *seen = Some(stamp);
        }
        Ok(())
    }

    /// Reads meta.json and caches what it says (see `refresh` for the lock).
    fn reread_meta(&self) -> Result<Meta> {
        let mut seen = lock(&self.read_stamp);
        let m = self.read_meta()?;
        self.note(&m);
        *seen = None;
        Ok(m)
    }

    /// Caches what `m` says of the deadline and the pause.
    fn note(&self, m: &Meta) {
        self.deadline.store(m.deadline, Ordering::SeqCst);
        self.paused.store(m.paused.is_some(), Ordering::SeqCst);
    }

    /// The cached deadline passed: unless another process moved it, the sandbox dies now, or
    /// (when it pauses at its deadline) serves nothing until the watcher or the next sweep
    /// has paused it.
    fn recheck_deadline(&self) -> Result<()> {
        let m = self.reread_meta()?;
        if m.paused.is_some() {
            return Err(self.paused_error());
        }
        if m.expired_at(meta::now_ms()) {
            return match m.on_timeout() {
                OnTimeout::Kill => {
                    self.destroy()?;
                    Err(self.gone())
                }
                OnTimeout::Pause(_) => Err(self.paused_error()),
            };
        }
        Ok(())
    }

    /// `meta.json` as it is on disk now; `Gone` once it is not there.
    pub fn read_meta(&self) -> Result<Meta> {
        meta::read_meta(&self.dir).map_err(|e| match e {
            MetaError::Missing => self.gone_now(),
            MetaError::Corrupt(e) | MetaError::Io(e) => self.io_error("reading meta.json", e),
        })
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

    /// Takes the lock every rewrite of meta.json holds (see `DirLock`).
    pub fn lock_meta(&self) -> Result<DirLock> {
        DirLock::take(&self.dir).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => self.gone_now(),
            _ => self.io_error("locking the sandbox directory", e),
        })
    }

    /// Rewrites meta.json (atomically) with `change` applied to what is on disk now.
    pub fn update_meta(&self, change: impl FnOnce(&mut Meta)) -> Result<Meta> {
        let held = self.lock_meta()?;
        self.rewrite_meta(&held, change)
    }

    /// [`SandboxState::update_meta`] for a caller that holds the lock already. A change that
    /// leaves meta.json as it was writes nothing: a renewal within the second the deadline
    /// already names (deadlines are whole seconds) costs no new file.
    pub fn rewrite_meta(&self, _held: &DirLock, change: impl FnOnce(&mut Meta)) -> Result<Meta> {
        let before = self.read_meta()?;
        let mut m = before.clone();
        change(&mut m);
        if m != before {
            match meta::write_meta(&self.dir, &m) {
                Ok(()) => {}
                // The directory vanished under us: killed by someone else.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(self.gone_now()),
                Err(e) => return Err(self.io_error("writing meta.json", e)),
            }
        }
        let mut seen = lock(&self.read_stamp);
        self.note(&m);
        *seen = None;
        Ok(m)
    }

    /// Moves the deadline to `secs` from now, for every wmo-e2b process.
    pub fn set_timeout(&self, secs: u64) -> Result<()> {
        self.update_meta(|m| m.deadline = meta::deadline_after(secs))?;
        Ok(())
    }

    /// Allows or locks the network of the processes started from now on.
    pub fn set_internet(&self, allowed: bool) -> Result<()> {
        if !allowed {
            sys::netlock_flag()?;
        }
        self.update_meta(|m| m.internet = allowed)?;
        // Processes already running keep the network they started with.
        self.internet.store(allowed, Ordering::SeqCst);
        Ok(())
    }

    /// The entry of a process this wmo-e2b process started here and has not reaped.
    pub fn entry(&self, pid: u32) -> Option<Arc<ProcEntry>> {
        lock(&self.procs).get(&pid).cloned()
    }

    /// The working directory of a new process; a directory the host serves must exist.
    pub fn cwd(&self, cwd: Option<&str>, role: Role) -> Result<String> {
        let Some(cwd) = cwd else {
            let workdir = self.image.as_ref().and_then(|i| i.workdir.clone());
            return Ok(match role {
                // An image's working directory, as its containers would start in.
                Role::Task | Role::Verify => workdir.unwrap_or_else(|| self.home.clone()),
                Role::System => self.system.clone(),
            });
        };
        if !cwd.starts_with('/') {
            return Err(SandboxError::BadPath {
                path: cwd.to_string(),
                reason: "the working directory must be an absolute path",
            });
        }
        let is_dir = match (self.mode, self.locate(cwd)) {
            (_, Ok(_)) => {
                let (b, rel) = self.beneath(cwd)?;
                b.metadata(&rel).is_ok_and(|m| m.is_dir())
            }
            // Elsewhere a confined process sees the read-only system directories.
            (Mode::Bwrap(_), Err(_)) => true,
            (Mode::None, Err(_)) => Path::new(cwd).is_dir(),
        };
        if !is_dir {
            return Err(SandboxError::NotFound {
                path: cwd.to_string(),
            });
        }
        Ok(cwd.to_string())
    }

    /// Classifies a file error by errno: a missing file is the caller's mistake (unless the
    /// whole sandbox is gone), and so is a path through a regular file or a symlink.
    pub fn file_error(&self, path: &str, what: &str, e: io::Error) -> SandboxError {
        let path = path.to_string();
        match e.raw_os_error() {
            Some(libc::ENOENT) => match self.ensure_live() {
                Ok(()) => SandboxError::NotFound { path },
                Err(gone) => gone,
            },
            // RESOLVE_BENEATH refused an absolute symlink or one that climbs out.
            Some(libc::EXDEV) => SandboxError::BadPath {
                path,
                reason: "it goes through a symlink that leaves the sandbox directory",
            },
            // O_NOFOLLOW met a symlink where the host never follows one.
            Some(libc::ELOOP) => SandboxError::BadPath {
                path,
                reason: "it goes through a symlink, which the host does not follow here",
            },
            Some(
                libc::ENOTDIR
                | libc::EISDIR
                | libc::EEXIST
                | libc::EACCES
                | libc::EPERM
                | libc::ENAMETOOLONG
                | libc::EFBIG
                | libc::ENXIO,
            ) => SandboxError::Remote {
                class: ErrorClass::BadRequest,
                message: format!("cannot {what} {path}"),
                source: Some(Box::new(e)),
            },
            _ if e.kind() == io::ErrorKind::InvalidInput => SandboxError::Remote {
                class: ErrorClass::BadRequest,
                message: format!("cannot {what} {path}: {e}"),
                source: None,
            },
            _ => self.io_error(format!("{what} {path}"), e),
        }
    }
}

/// Which file a path named when it was looked at: a rewrite (a rename over it) changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    size: u64,
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            size: m.size(),
        }
    }
}
