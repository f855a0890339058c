//! On-disk records of a local sandbox: `meta.json`, the `procs/<pid>` files, ids, the
//! atomic writes that keep every reader (in any wmo-e2b process) from seeing half a file, and
//! the lock that keeps writers of `meta.json` from undoing each other.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::isolation::{IdRange, Isolation};
use super::{procs_dir, sys};
use crate::sandbox::{ImageRoot, Metadata, OnTimeout, PauseKind, Role};

/// A sandbox being killed: `.dead-<id>-<rand>` (see `teardown`).
pub(super) const TOMB_PREFIX: &str = ".dead-";
/// A sandbox being created: `.new-<id>`.
pub(super) const STAGING_PREFIX: &str = ".new-";
pub(super) const ID_PREFIX: &str = "lsb-";
pub(super) const META_FILE: &str = "meta.json";
pub(super) const ROOT_DIR: &str = "root";
pub(super) const PROCS_DIR: &str = "procs";
pub(super) const TMP_DIR: &str = "tmp";
pub(super) const SYSTEM_DIR: &str = "system";
/// A task's tests, for its verifier: shown read-only at `/tests` to task processes.
pub(super) const TESTS_DIR: &str = "tests";
/// The verifier's own `HOME` and `TMPDIR`, made anew before each verify (see `stop`).
pub(super) const VERIFIER_DIR: &str = "verifier";
/// `/logs` in the sandbox, where Harbor's verifier leaves its reward (see `stop`).
pub(super) const LOGS_DIR: &str = "logs";
/// The copy of the home and `/tmp` that `reset` restores.
pub(super) const SEALED_DIR: &str = "sealed";

/// How long a writer of `meta.json` waits for the lock: longer than the slowest pause or
/// resume, which hold it throughout.
const LOCK_WAIT: Duration = Duration::from_secs(60);
const LOCK_POLL: Duration = Duration::from_millis(5);

/// Bounds what we read back from records another process (or a person) may have written.
const MAX_META_BYTES: u64 = 1 << 20;
const MAX_PROC_RECORD_BYTES: u64 = 64 * 1024;

/// The contents of `meta.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Meta {
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Unix seconds; the sandbox is dead from this instant on.
    pub deadline: u64,
    pub metadata: Metadata,
    pub template: Option<String>,
    pub internet: bool,
    /// Its processes share a network namespace of its own (`Network::Internet`), made at
    /// create, instead of the host's.
    #[serde(default)]
    pub own_network: bool,
    pub owner_pid: u32,
    /// Applied to every process; stored so a `connect` from another wmo-e2b process applies
    /// them too.
    #[serde(default)]
    pub envs: Vec<(String, String)>,
    /// How its processes are confined (fixed at create).
    #[serde(default)]
    pub isolation: Isolation,
    /// As root under bwrap: the host ids its user namespace maps (see `id_range`); `None`
    /// for sandboxes without one (made without root, or before ranges existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<IdRange>,
    /// Seconds of life it was created with, which a resume gives it again.
    #[serde(default)]
    pub timeout: u64,
    /// How it is paused when its deadline passes; `None`: it dies then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_at_deadline: Option<PauseMode>,
    /// Set while it is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<PausedRecord>,
    /// The image its task processes run on (see `image_root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRoot>,
}

impl Meta {
    /// Whether its deadline has passed; a paused sandbox has none.
    pub fn expired_at(&self, now_ms: u64) -> bool {
        self.paused.is_none() && now_ms >= self.deadline.saturating_mul(1000)
    }

    pub fn on_timeout(&self) -> OnTimeout {
        self.pause_at_deadline
            .map_or(OnTimeout::Kill, |m| OnTimeout::Pause(m.into()))
    }

    /// The seconds of life a resume gives: what it was created with (records from before
    /// that was kept: the life it was first given).
    pub fn resume_timeout(&self) -> u64 {
        if self.timeout > 0 {
            self.timeout
        } else {
            self.deadline.saturating_sub(self.created).max(1)
        }
    }
}

/// How a sandbox is paused, as `meta.json` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum PauseMode {
    Memory,
    Filesystem,
}

impl From<PauseKind> for PauseMode {
    fn from(kind: PauseKind) -> PauseMode {
        match kind {
            PauseKind::Memory => PauseMode::Memory,
            PauseKind::Filesystem => PauseMode::Filesystem,
        }
    }
}

impl From<PauseMode> for PauseKind {
    fn from(mode: PauseMode) -> PauseKind {
        match mode {
            PauseMode::Memory => PauseKind::Memory,
            PauseMode::Filesystem => PauseKind::Filesystem,
        }
    }
}

/// What `meta.json` keeps of a paused sandbox, so that any wmo-e2b process can resume it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PausedRecord {
    pub kind: PauseMode,
    /// Unix seconds.
    pub at: u64,
    /// Seconds of life the resume gives it.
    pub timeout: u64,
    /// Processes (pid, start time) that were stopped before the pause, by the sandbox
    /// itself: a resume leaves them stopped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_stopped: Vec<(u32, u64)>,
}

#[derive(Debug)]
pub(super) enum MetaError {
    /// No `meta.json`: the sandbox was killed (or never finished being created).
    Missing,
    /// Present but not a meta record (torn by a crash, or edited by hand).
    Corrupt(io::Error),
    Io(io::Error),
}

pub(super) fn read_meta(dir: &Path) -> Result<Meta, MetaError> {
    let bytes = match read_bounded(&dir.join(META_FILE), MAX_META_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(MetaError::Missing),
        Err(e) => return Err(MetaError::Io(e)),
    };
    serde_json::from_slice(&bytes).map_err(|e| MetaError::Corrupt(io::Error::from(e)))
}

pub(super) fn write_meta(dir: &Path, meta: &Meta) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(meta).map_err(io::Error::from)?;
    write_atomic(dir, META_FILE, &bytes)
}

/// The lock on a sandbox directory, held (in any wmo-e2b process) by whoever rewrites its
/// `meta.json` from what it read there, so that no write undoes another: a pause or resume
/// holds it from its first look to its last write. Released on drop.
pub(super) struct DirLock {
    _dir: File,
}

impl DirLock {
    /// Takes the lock on `dir`, waiting for at most [`LOCK_WAIT`]. NotFound when `dir` is
    /// gone (the sandbox was killed).
    pub fn take(dir: &Path) -> io::Result<DirLock> {
        let file = File::open(dir)?;
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock on a descriptor we own; the lock goes with it.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(DirLock { _dir: file });
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(err);
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "another wmo-e2b process held the sandbox's lock for {} s",
                        LOCK_WAIT.as_secs()
                    ),
                ));
            }
            std::thread::sleep(LOCK_POLL);
        }
    }
}

/// A process record: which process a pid meant when we started it, for whom, and its
/// command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProcRecord {
    pub pid: u32,
    pub start_time: u64,
    pub role: Role,
    pub cmd: String,
}

/// Writes `procs/<pid>`: the start time and role on the first line, the command after it.
pub(super) fn write_proc_record(sandbox_dir: &Path, rec: &ProcRecord) -> io::Result<()> {
    let role = match rec.role {
        Role::Task => "task",
        Role::System => "system",
        Role::Verify => "verify",
    };
    let text = format!("{} {role}\n{}", rec.start_time, rec.cmd);
    let procs = sandbox_dir.join(PROCS_DIR);
    let write = || write_atomic(&procs, &rec.pid.to_string(), text.as_bytes());
    match write() {
        Err(e) if e.kind() == io::ErrorKind::NotFound && procs_dir::lost_at_boot(&procs) => {
            procs_dir::make_again(&procs)?;
            write()
        }
        written => written,
    }
}

pub(super) fn remove_proc_record(sandbox_dir: &Path, pid: u32) {
    // Best effort: a leftover record only costs a start-time check at the next kill.
    let _ = fs::remove_file(sandbox_dir.join(PROCS_DIR).join(pid.to_string()));
}

/// Every parseable record in a `procs` directory; unreadable ones are skipped because a
/// record that cannot be checked must never be signalled.
pub(super) fn read_proc_records(procs: &Path) -> io::Result<Vec<ProcRecord>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(procs) {
        Err(e) if e.kind() == io::ErrorKind::NotFound && procs_dir::lost_at_boot(procs) => {
            return Ok(out)
        }
        read => read?,
    };
    for entry in entries {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(bytes) = read_bounded(&entry.path(), MAX_PROC_RECORD_BYTES) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let (first, cmd) = text.split_once('\n').unwrap_or((&text, ""));
        let mut head = first.split_whitespace();
        let Some(Ok(start_time)) = head.next().map(str::parse) else {
            continue;
        };
        // Records written before roles existed are task processes.
        let role = match head.next() {
            Some("system") => Role::System,
            Some("verify") => Role::Verify,
            _ => Role::Task,
        };
        out.push(ProcRecord {
            pid,
            start_time,
            role,
            cmd: cmd.to_string(),
        });
    }
    out.sort_by_key(|r| r.pid);
    Ok(out)
}

/// Writes `dir/name` so that readers see the old file or the new one, never a mix: a temp
/// file in the same directory, renamed over. Fails with NotFound when `dir` is gone, which is
/// how a write learns that its sandbox was killed meanwhile.
///
/// No fsync: the rename is what makes readers safe, and these records only matter while the
/// machine is up (after a power loss every local sandbox process is gone anyway). Syncing cost
/// a disk flush on every deadline change and process start.
pub(super) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.{}.tmp", sys::random_hex(6)?));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        fs::rename(&tmp, dir.join(name))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

pub(super) fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)?.take(max).read_to_end(&mut bytes)?;
    Ok(bytes)
}

pub(super) fn private_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().mode(0o700).create(path)
}

pub(super) fn private_dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(path)
}

pub(super) fn new_id() -> io::Result<String> {
    Ok(format!("{ID_PREFIX}{}", sys::random_hex(8)?))
}

/// Only names we could have made are ever joined onto the sandboxes directory.
pub(super) fn is_id(s: &str) -> bool {
    s.len() == ID_PREFIX.len() + 16
        && s.starts_with(ID_PREFIX)
        && s[ID_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The deadline `secs` from now, rounded up to a whole second so a sandbox never lives less
/// than it was promised.
pub(super) fn deadline_after(secs: u64) -> u64 {
    now_ms()
        .saturating_add(secs.saturating_mul(1000))
        .div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_recognised() {
        let id = new_id().unwrap();
        assert!(is_id(&id), "{id}");
        for bad in [
            "",
            "lsb-",
            "lsb-../../etc/passwd",
            "lsb-0123456789ABCDEF",
            "xyz",
        ] {
            assert!(!is_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn meta_round_trips_and_torn_meta_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta {
            id: "lsb-0000000000000000".into(),
            created: 1,
            deadline: 2,
            metadata: [("k".to_string(), "v".to_string())].into(),
            template: None,
            internet: true,
            own_network: true,
            owner_pid: 7,
            envs: vec![("A".into(), "b".into())],
            isolation: Isolation::Bwrap,
            ids: Some(IdRange { base: 1 << 30 }),
            timeout: 30,
            pause_at_deadline: Some(PauseMode::Filesystem),
            paused: Some(PausedRecord {
                kind: PauseMode::Memory,
                at: 3,
                timeout: 30,
                kept_stopped: vec![(9, 10)],
            }),
            image: None,
        };
        write_meta(dir.path(), &meta).unwrap();
        assert_eq!(read_meta(dir.path()).unwrap(), meta);
        fs::write(dir.path().join(META_FILE), b"{\"id\": \"lsb-").unwrap();
        assert!(matches!(read_meta(dir.path()), Err(MetaError::Corrupt(_))));
        fs::remove_file(dir.path().join(META_FILE)).unwrap();
        assert!(matches!(read_meta(dir.path()), Err(MetaError::Missing)));
    }

    #[test]
    fn proc_records_round_trip_with_their_role() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(PROCS_DIR)).unwrap();
        let rec = ProcRecord {
            pid: 42,
            start_time: 7,
            role: Role::System,
            cmd: "exec node runner.mjs\nsecond line".into(),
        };
        write_proc_record(dir.path(), &rec).unwrap();
        // A record from before roles existed.
        fs::write(dir.path().join(PROCS_DIR).join("43"), "9\nsleep 1").unwrap();
        let read = read_proc_records(&dir.path().join(PROCS_DIR)).unwrap();
        assert_eq!(read[0], rec);
        assert_eq!((read[1].pid, read[1].role), (43, Role::Task));
    }

    #[test]
    fn a_paused_sandbox_never_expires() {
        let json = r#"{"id": "lsb-0000000000000000", "created": 10, "deadline": 40,
            "metadata": {}, "template": null, "internet": true, "owner_pid": 7}"#;
        let mut meta: Meta = serde_json::from_str(json).unwrap();
        // A record from before pausing existed: killed at its deadline, resumed with the
        // life it was first given.
        assert_eq!(meta.on_timeout(), OnTimeout::Kill);
        assert_eq!(meta.resume_timeout(), 30);
        assert!(meta.expired_at(40_000));
        meta.paused = Some(PausedRecord {
            kind: PauseMode::Filesystem,
            at: 20,
            timeout: 30,
            kept_stopped: Vec::new(),
        });
        assert!(!meta.expired_at(u64::MAX));
        let text = serde_json::to_string(&meta).unwrap();
        assert!(text.contains(r#""kind":"filesystem""#), "{text}");
    }

    #[test]
    fn the_directory_lock_is_held_once() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::take(dir.path()).unwrap();
        let other = File::open(dir.path()).unwrap();
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(rc, -1, "a second holder got the lock");
        drop(held);
        assert!(DirLock::take(dir.path()).is_ok());
        let gone = dir.path().join("gone");
        assert_eq!(
            DirLock::take(&gone).err().map(|e| e.kind()),
            Some(io::ErrorKind::NotFound)
        );
    }

    #[test]
    fn deadline_rounds_up() {
        let before = now_ms();
        let d = deadline_after(1);
        assert!(d * 1000 >= before + 1000);
        assert!(d * 1000 <= now_ms() + 2000);
    }
}
