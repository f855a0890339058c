//! The limits a sandbox's current task runs under, and which of them it ran into.
//!
//! Memory, processes and CPU are the kernel's to enforce (see `cgroup`); what the kernel
//! counted is read against what it had counted when the task's limits were applied, since a
//! pooled sandbox serves many tasks and the counters never go back. Disk is measured: the
//! sandbox's writable directories (home and its /tmp) are walked, bounded, whenever the
//! caller asks (eval asks every second of an episode), so a task may write past its
//! `disk_mb` by what it writes between two looks before it is stopped. A bind-mounted
//! size-limited tmpfs would bound it exactly but count against memory instead, and a loop
//! filesystem per sandbox costs a mkfs and root; see README "Limits".

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::cgroup::{Cgroup, Counters};
use super::meta::{ROOT_DIR, TMP_DIR};
use crate::sandbox::limits::{LimitHit, Limits};
use crate::sync::lock;

/// Entries one disk measure walks at most: past it the directories count as over their
/// limit (a task that makes this many files is filling the disk's inodes, if not its bytes).
const MAX_ENTRIES: usize = 500_000;
/// Directory depth one measure descends at most; deeper counts as over, like too many files.
const MAX_DEPTH: usize = 256;

/// What every handle on one sandbox shares about its limits.
#[derive(Debug, Default)]
pub(super) struct LimitState {
    /// Read from the sandbox's record at first use (it is written before any process runs).
    cgroup: OnceLock<Option<Cgroup>>,
    applied: Mutex<Applied>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Applied {
    disk_mb: Option<u64>,
    /// The kernel's counts when the limits were applied.
    base: Counters,
}

impl LimitState {
    /// The sandbox's cgroups, if it has any.
    pub fn cgroup(&self, sandbox_dir: &Path) -> Option<&Cgroup> {
        self.cgroup.get_or_init(|| Cgroup::of(sandbox_dir)).as_ref()
    }

    /// Puts `limits` in force for the task about to run and counts from now.
    pub fn apply(&self, sandbox_dir: &Path, limits: &Limits) -> io::Result<()> {
        let base = match self.cgroup(sandbox_dir) {
            Some(cg) => {
                cg.apply(limits)?;
                cg.counters()
            }
            None => Counters::default(),
        };
        *lock(&self.applied) = Applied {
            disk_mb: limits.disk_mb,
            base,
        };
        Ok(())
    }

    /// The limit the sandbox ran into since [`LimitState::apply`], if any.
    pub fn reached(&self, sandbox_dir: &Path) -> Option<LimitHit> {
        let applied = *lock(&self.applied);
        if let Some(cg) = self.cgroup(sandbox_dir) {
            let now = cg.counters();
            if now.oom_kills > applied.base.oom_kills {
                return Some(LimitHit::Memory);
            }
            if now.pids_refused > applied.base.pids_refused {
                return Some(LimitHit::Pids);
            }
        }
        let limit = applied.disk_mb? << 20;
        let roots = [sandbox_dir.join(ROOT_DIR), sandbox_dir.join(TMP_DIR)];
        match disk_usage(&roots, limit) {
            Usage::Within(_) => None,
            Usage::Over => Some(LimitHit::Disk),
        }
    }
}

/// What a measure of the writable directories found.
#[derive(Debug, PartialEq, Eq)]
enum Usage {
    Within(u64),
    Over,
}

/// The bytes `roots` take on disk (allocated blocks, so a sparse file counts what it
/// holds), stopping as soon as they pass `limit`, or when the walk passes its bounds.
fn disk_usage(roots: &[PathBuf], limit: u64) -> Usage {
    let mut total: u64 = 0;
    let mut entries = 0usize;
    // Depth-first, with an explicit stack: a hostile tree cannot exhaust ours.
    let mut stack: Vec<(PathBuf, usize)> = roots.iter().map(|r| (r.clone(), 0)).collect();
    while let Some((dir, depth)) = stack.pop() {
        let Ok(listing) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in listing.flatten() {
            entries += 1;
            if entries > MAX_ENTRIES {
                return Usage::Over;
            }
            let Ok(meta) = entry.metadata() else { continue };
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if total > limit {
                return Usage::Over;
            }
            if meta.is_dir() {
                if depth + 1 > MAX_DEPTH {
                    return Usage::Over;
                }
                stack.push((entry.path(), depth + 1));
            }
        }
    }
    Usage::Within(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_written_blocks_and_stops_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        fs::create_dir_all(&sub).unwrap();
        fs::write(sub.join("f"), vec![1u8; 256 * 1024]).unwrap();
        // A sparse file holds nothing on disk.
        let sparse = fs::File::create(dir.path().join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        let roots = [dir.path().to_path_buf()];
        match disk_usage(&roots, 1 << 20) {
            Usage::Within(n) => assert!((256 * 1024..1 << 20).contains(&n), "{n}"),
            Usage::Over => panic!("256 KiB is within 1 MiB"),
        }
        assert_eq!(disk_usage(&roots, 128 * 1024), Usage::Over);
    }
}
