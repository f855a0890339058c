//! The host ids of a sandbox's user namespace, when wmo-e2b runs as root.
//!
//! Each such sandbox gets a user namespace of its own whose ids 0‥65535 are host ids
//! `base‥base+65535`, a range no other live sandbox has and no host account uses (they all lie
//! far above the ids systems hand out, and above the subordinate ranges rootless container
//! runtimes take from `/etc/subuid`). Whatever the kernel keys by uid (keyrings, signal and
//! ptrace rights, file ownership, per-user limits) then never crosses sandboxes, nor reaches
//! the host's own users.
//!
//! A range is taken by creating `<state>/id-ranges/<slot>` (holding the sandbox's id) while the
//! sandbox is still being built, and given back once its processes are proven gone (see
//! `teardown`). A slot whose sandbox no longer exists in any form (built, being built, or a
//! tombstone still being killed) was left by a crash and is taken again.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::isolation::{IdRange, RANGE_SIZE};
use super::meta::{self, STAGING_PREFIX, TOMB_PREFIX};
use super::sys;

/// The first host id handed out: 2^30, far above any account or subordinate range in use.
const FIRST_BASE: u32 = 1 << 30;
/// How many ranges fit between [`FIRST_BASE`] and 2^31 (ids stay positive as `i32`).
const SLOTS: u32 = (1 << 30) / RANGE_SIZE;
/// The range the probe of whether user namespaces work here maps, just below the others,
/// for the moment it runs `/bin/true`.
pub(super) const PROBE_BASE: u32 = FIRST_BASE - RANGE_SIZE;
const DIR: &str = "id-ranges";

fn slot_of(range: IdRange) -> Option<u32> {
    let slot = range.base.checked_sub(FIRST_BASE)? / RANGE_SIZE;
    (slot < SLOTS && FIRST_BASE + slot * RANGE_SIZE == range.base).then_some(slot)
}

/// `<state>/id-ranges`, beside `<state>/sandboxes`.
fn ranges_dir(sandboxes: &Path) -> PathBuf {
    sandboxes.parent().unwrap_or(sandboxes).join(DIR)
}

/// Takes a free range for the sandbox `id`, whose directory (`.new-<id>`) must exist already.
pub(super) fn allocate(sandboxes: &Path, id: &str) -> io::Result<IdRange> {
    let dir = ranges_dir(sandboxes);
    meta::private_dir_all(&dir)?;
    // One allocator at a time on this machine: a crash's slot is judged and taken again under
    // the lock, so two allocators never both take it.
    let _lock = meta::DirLock::take(&dir)?;
    let start = u32::from_str_radix(&sys::random_hex(4)?, 16).unwrap_or(0) % SLOTS;
    let mut present: Option<HashSet<String>> = None;
    for n in 0..SLOTS {
        let slot = (start + n) % SLOTS;
        let path = dir.join(slot.to_string());
        match claim(&path, id) {
            Ok(()) => return Ok(range_of(slot)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let holder = read_holder(&path)?;
        let present = match &mut present {
            Some(p) => p,
            None => present.insert(sandbox_ids(sandboxes)?),
        };
        if !present.contains(&holder) {
            fs::remove_file(&path)?;
            claim(&path, id)?;
            return Ok(range_of(slot));
        }
    }
    Err(io::Error::other(format!(
        "every one of the {SLOTS} user id ranges is taken by a live sandbox"
    )))
}

/// Gives back the sandbox `id`'s range, if the slot still names it.
pub(super) fn release(sandboxes: &Path, id: &str, range: IdRange) -> io::Result<()> {
    let Some(slot) = slot_of(range) else {
        return Ok(());
    };
    let dir = ranges_dir(sandboxes);
    let path = dir.join(slot.to_string());
    let _lock = meta::DirLock::take(&dir)?;
    match read_holder(&path) {
        Ok(holder) if holder == id => fs::remove_file(&path),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn range_of(slot: u32) -> IdRange {
    IdRange {
        base: FIRST_BASE + slot * RANGE_SIZE,
    }
}

fn claim(path: &Path, id: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(id.as_bytes())?;
    f.sync_all()
}

fn read_holder(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    fs::File::open(path)?.take(256).read_to_string(&mut text)?;
    Ok(text)
}

/// The ids of every sandbox that exists in any form: built, being built, or being killed.
fn sandbox_ids(sandboxes: &Path) -> io::Result<HashSet<String>> {
    let mut ids = HashSet::new();
    for entry in fs::read_dir(sandboxes)?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let id = if let Some(rest) = name.strip_prefix(TOMB_PREFIX) {
            // `.dead-<id>-<rand>`, where `<id>` itself holds no `-`.
            rest.rsplit_once('-').map_or(rest, |(id, _)| id)
        } else {
            name.strip_prefix(STAGING_PREFIX).unwrap_or(name)
        };
        ids.insert(id.to_string());
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_disjoint_and_take_back_what_a_crash_left() {
        let state = tempfile::tempdir().unwrap();
        let sandboxes = state.path().join("sandboxes");
        fs::create_dir(&sandboxes).unwrap();
        for id in ["sb-a", "sb-b"] {
            fs::create_dir(sandboxes.join(format!("{STAGING_PREFIX}{id}"))).unwrap();
        }
        let a = allocate(&sandboxes, "sb-a").unwrap();
        let b = allocate(&sandboxes, "sb-b").unwrap();
        assert!(a.base.abs_diff(b.base) >= RANGE_SIZE, "{a:?} {b:?}");
        assert!(a.base >= FIRST_BASE && a.host(RANGE_SIZE) < 1 << 31);
        assert_eq!(a.host(1000), a.base + 1000);
        // sb-a's directory vanished without a release (a crash): its slot is free again.
        fs::remove_dir(sandboxes.join(format!("{STAGING_PREFIX}sb-a"))).unwrap();
        let slot = dir_slot(&sandboxes, a);
        let holder = || read_holder(&slot).unwrap();
        assert_eq!(holder(), "sb-a");
        // A tombstone still being killed keeps its range.
        fs::create_dir(sandboxes.join(format!("{TOMB_PREFIX}sb-b-xyz"))).unwrap();
        fs::remove_dir(sandboxes.join(format!("{STAGING_PREFIX}sb-b"))).unwrap();
        let ids = sandbox_ids(&sandboxes).unwrap();
        assert!(ids.contains("sb-b") && !ids.contains("sb-a"), "{ids:?}");
        release(&sandboxes, "sb-other", a).unwrap();
        assert_eq!(
            holder(),
            "sb-a",
            "a release by another sandbox frees nothing"
        );
        release(&sandboxes, "sb-a", a).unwrap();
        assert!(!slot.exists());
    }

    fn dir_slot(sandboxes: &Path, r: IdRange) -> PathBuf {
        ranges_dir(sandboxes).join(slot_of(r).unwrap().to_string())
    }
}
