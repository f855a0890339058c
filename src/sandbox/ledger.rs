//! The write-ahead lease ledger: one file per sandbox, written *before* the create call.
//!
//! A crash at any moment leaves either a lease naming a sandbox that exists, or a `creating`
//! lease whose sandbox can be found by its tag, so `reap` can always account for what a dead
//! run left behind. Every state change is an atomic replace (temp file, fsync, rename, fsync
//! of the directory); a torn or corrupt file is skipped with a warning, never a crash.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Lease file format version; bump on any incompatible change.
pub const LEASE_VERSION: u32 = 1;

/// Metadata tags every sandbox carries, so one whose lease file is lost can be attributed.
pub const TAG_LEASE: &str = "wmo-e2b.lease";
pub const TAG_OWNER: &str = "wmo-e2b.owner";
pub const TAG_RUN: &str = "wmo-e2b.run";
pub const TAG_KIND: &str = "wmo-e2b.kind";

/// Recorded deadlines run this far ahead of the real one, so extending a lease rewrites its
/// file at most once per slack period instead of on every `set_timeout`.
pub const DEADLINE_SLACK_SECS: u64 = 300;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    Creating,
    Active,
    Retired,
    CleanupFailed,
}

/// Who holds a lease: enough to prove, later and from another process, that it is dead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub host: String,
    pub pid: u32,
    /// Process start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    pub boot_id: String,
}

impl Owner {
    /// This process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            host: host_name(),
            pid,
            start_time: process_start_time(pid).unwrap_or(0),
            boot_id: boot_id(),
        }
    }

    /// The compact form used as a sandbox tag: `host:pid:start_time:boot_id`.
    pub fn tag(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.host, self.pid, self.start_time, self.boot_id
        )
    }

    pub fn from_tag(tag: &str) -> Option<Owner> {
        let mut parts = tag.rsplitn(4, ':');
        let boot_id = parts.next()?.to_string();
        let start_time = parts.next()?.parse().ok()?;
        let pid = parts.next()?.parse().ok()?;
        let host = parts.next()?.to_string();
        Some(Owner {
            host,
            pid,
            start_time,
            boot_id,
        })
    }

    /// Whether the owner is alive, dead, or cannot be told from here.
    pub fn liveness(&self) -> Liveness {
        if self.host != host_name() {
            return Liveness::Unknown;
        }
        if self.boot_id != boot_id() {
            // Same host, another boot: every process of that boot is gone.
            return Liveness::Dead;
        }
        match process_start_time(self.pid) {
            Some(t) if t == self.start_time => Liveness::Alive,
            _ => Liveness::Dead,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    Alive,
    Dead,
    /// Another host: its processes cannot be inspected from here.
    Unknown,
}

/// One lease file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub version: u32,
    pub lease: String,
    pub state: LeaseState,
    pub sandbox_id: Option<String>,
    pub backend: String,
    pub template: Option<String>,
    pub kind: String,
    pub run: String,
    pub owner: Owner,
    /// Unix seconds.
    pub created: u64,
    /// Unix seconds after which the sandbox cannot be alive (it has expired by then).
    pub deadline: u64,
    pub updated: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("cannot create the lease directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write lease file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A lease file that could not be read, named so the user can look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLease {
    pub path: PathBuf,
    pub reason: String,
}

/// The ledger of one state directory, for one owner and run.
#[derive(Debug, Clone)]
pub struct Ledger {
    dir: PathBuf,
    owner: Owner,
    run: String,
}

impl Ledger {
    pub fn open(state_dir: &Path, run: &str) -> Result<Ledger, LedgerError> {
        let dir = leases_dir(state_dir);
        create_private_dirs(&dir).map_err(|source| LedgerError::Dir {
            path: dir.clone(),
            source,
        })?;
        Ok(Ledger {
            dir,
            owner: Owner::current(),
            run: run.to_string(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    pub fn run(&self) -> &str {
        &self.run
    }

    /// Writes a `creating` lease; call before asking the backend for the sandbox.
    pub fn begin(
        &self,
        kind: &str,
        backend: &str,
        template: Option<&str>,
        timeout_secs: u64,
    ) -> Result<LeaseRecord, LedgerError> {
        let now = unix_now();
        let record = LeaseRecord {
            version: LEASE_VERSION,
            lease: new_lease_id(),
            state: LeaseState::Creating,
            sandbox_id: None,
            backend: backend.to_string(),
            template: template.map(str::to_string),
            kind: kind.to_string(),
            run: self.run.clone(),
            owner: self.owner.clone(),
            created: now,
            deadline: now + timeout_secs + DEADLINE_SLACK_SECS,
            updated: now,
            error: None,
        };
        self.write(&record)?;
        Ok(record)
    }

    /// Replaces a lease file atomically with `record`. A `creating` or `active` lease is made
    /// durable (file and directory synced) before this returns: that is the write-ahead
    /// promise. A retirement is atomic but not synced: losing one to a power cut leaves a lease
    /// that the next reap resolves again, and syncing cost two disk flushes per kill.
    pub fn write(&self, record: &LeaseRecord) -> Result<(), LedgerError> {
        let durable = matches!(record.state, LeaseState::Creating | LeaseState::Active);
        self.write_inner(record, durable)
    }

    fn write_inner(&self, record: &LeaseRecord, durable: bool) -> Result<(), LedgerError> {
        let path = self.path_of(&record.lease);
        let err = |source| LedgerError::Write {
            path: path.clone(),
            source,
        };
        let json = serde_json::to_vec_pretty(record).map_err(|e| err(e.into()))?;
        let tmp = self.dir.join(format!(".{}.tmp", record.lease));
        let mut f = File::create(&tmp).map_err(err)?;
        f.write_all(&json)
            .and_then(|()| f.write_all(b"\n"))
            .and_then(|()| if durable { f.sync_all() } else { Ok(()) })
            .map_err(err)?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(err)?;
        if durable {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(err)?;
        }
        Ok(())
    }

    /// Moves a lease to a new state, stamping the update time.
    pub fn transition(
        &self,
        record: &mut LeaseRecord,
        state: LeaseState,
        error: Option<String>,
    ) -> Result<(), LedgerError> {
        record.state = state;
        record.error = error;
        record.updated = unix_now();
        self.write(record)
    }

    pub fn path_of(&self, lease: &str) -> PathBuf {
        self.dir.join(format!("{lease}.json"))
    }

    /// This run's and this owner's leases in `state`, as their files say now.
    pub fn own(&self, state: LeaseState) -> Vec<LeaseRecord> {
        read_lease_dir(&self.dir)
            .0
            .into_iter()
            .map(|(_, lease)| lease)
            .filter(|l| l.state == state && l.run == self.run && l.owner == self.owner)
            .collect()
    }
}

/// `<state>/leases`.
pub fn leases_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("leases")
}

/// Every lease file of a state directory. Unreadable ones are returned as skipped.
pub fn read_leases(state_dir: &Path) -> (Vec<(PathBuf, LeaseRecord)>, Vec<SkippedLease>) {
    read_lease_dir(&leases_dir(state_dir))
}

fn read_lease_dir(dir: &Path) -> (Vec<(PathBuf, LeaseRecord)>, Vec<SkippedLease>) {
    let mut leases = Vec::new();
    let mut skipped = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (leases, skipped);
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    paths.sort();
    for path in paths {
        let parsed = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                serde_json::from_slice::<LeaseRecord>(&bytes).map_err(|e| e.to_string())
            });
        match parsed {
            Ok(r) if r.version == LEASE_VERSION => leases.push((path, r)),
            Ok(r) => skipped.push(SkippedLease {
                path,
                reason: format!(
                    "lease format version {} (this build reads {LEASE_VERSION})",
                    r.version
                ),
            }),
            Err(reason) => skipped.push(SkippedLease { path, reason }),
        }
    }
    (leases, skipped)
}

fn create_private_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn new_lease_id() -> String {
    format!("ls-{}", crate::id::unique_hex(12))
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length and gethostname NUL-terminates
    // within it (or truncates, which we accept).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Field 22 of `/proc/<pid>/stat`, read after the command name (which may hold spaces and
/// parentheses).
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    // After ")" come fields 3.. ; the start time is field 22, i.e. the 20th of these.
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tag_round_trips_and_this_process_is_alive() {
        let me = Owner::current();
        assert!(me.start_time > 0);
        assert_eq!(Owner::from_tag(&me.tag()), Some(me.clone()));
        assert_eq!(me.liveness(), Liveness::Alive);
        let mut other_boot = me.clone();
        other_boot.boot_id = "another-boot".into();
        assert_eq!(other_boot.liveness(), Liveness::Dead);
        let mut restarted = me.clone();
        restarted.start_time += 1;
        assert_eq!(restarted.liveness(), Liveness::Dead);
        let mut foreign = me;
        foreign.host = "elsewhere".into();
        assert_eq!(foreign.liveness(), Liveness::Unknown);
    }

    #[test]
    fn leases_are_written_atomically_and_torn_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), "run-1").unwrap();
        let mode = std::fs::metadata(ledger.dir()).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o700
        );
        let mut lease = ledger.begin("eval", "local", None, 900).unwrap();
        assert_eq!(lease.state, LeaseState::Creating);
        lease.sandbox_id = Some("sb-1".into());
        ledger
            .transition(&mut lease, LeaseState::Active, None)
            .unwrap();
        std::fs::write(ledger.dir().join("torn.json"), b"{\"version\": 1, \"lea").unwrap();
        let (leases, skipped) = read_leases(dir.path());
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].1.state, LeaseState::Active);
        assert_eq!(leases[0].1.sandbox_id.as_deref(), Some("sb-1"));
        assert_eq!(ledger.own(LeaseState::Active), [lease.clone()]);
        assert!(ledger.own(LeaseState::Creating).is_empty());
        let other_run = Ledger::open(dir.path(), "run-2").unwrap();
        assert!(other_run.own(LeaseState::Active).is_empty());
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].path.ends_with("torn.json"));
        // No temp files are left behind.
        let names: Vec<String> = std::fs::read_dir(ledger.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }
}
