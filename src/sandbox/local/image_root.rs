//! A sandbox whose task processes run on an image's root filesystem (`CreateSpec::image`).
//!
//! Each task namespace gets a layer directory of its own, `layers/<n>/`, with the image
//! mounted read-only at `lower`, a writable `upper` and overlay's `work`, and the overlay of
//! the two at `merged`, which its holder's bwrap binds as `/` (the mounts are made by the
//! helper that starts the holder, see `enter::image_mount`, and live only in that holder's
//! mount namespace). What a task writes anywhere in the image lands in its own `upper`, and
//! a reset, which starts a new task namespace over a new layer, leaves nothing of it: the
//! old layer is removed once its holder is dead.
//!
//! The runner (`Role::System`) keeps the host's system directories: it needs Node.js, which
//! an image need not have.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use super::holder_start;
use super::isolation::{self, Isolation};
use super::{meta, sys};
use crate::sandbox::{Result, SandboxError};

/// Where a sandbox's task layers live in its directory.
pub(super) const LAYERS_DIR: &str = "layers";
/// The file naming the current task namespace's layer, in `layers/`.
const CURRENT: &str = "task";
/// A layer no holder names is left alone this long: its holder may still be starting.
const STARTING_GRACE: Duration = Duration::from_secs(60);

/// Whether sandboxes with an image root can be made here: their ids must map onto an id
/// range of their own, which takes root, bubblewrap and user namespaces.
pub(super) fn supported(isolation: Isolation) -> Result<()> {
    let mapped = isolation == Isolation::Bwrap
        && isolation::probe()
            .ok()
            .and_then(holder_start::mapper)
            .is_some();
    if mapped {
        return Ok(());
    }
    Err(SandboxError::Unsupported(
        "a task environment's image runs only in sandboxes with user ids of their own: run \
         wmo-e2b as root, with bubblewrap (--isolation bwrap) and user namespaces enabled"
            .into(),
    ))
}

/// A task namespace's layer directory, made for one holder.
pub(super) struct Layer {
    /// Names it (`layers/<number>`), recorded with the holder.
    pub number: u64,
    pub dir: PathBuf,
    /// The image's working directory relative to its root, which has a layer of its own
    /// here (`w*`, see `enter::image_mount`).
    pub workdir: Option<String>,
}

impl Layer {
    /// Makes a fresh layer in `sandbox_dir`: `upper` owned by the sandbox's root as the
    /// image's root directory is, `wupper` (for the image's working directory `workdir`) by
    /// the sandbox user, as `owners` give them on the host; the rest the host's.
    pub fn make(
        sandbox_dir: &Path,
        owners: (u32, u32),
        workdir: Option<&str>,
    ) -> io::Result<Layer> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let layers = sandbox_dir.join(LAYERS_DIR);
        fs::create_dir_all(&layers)?;
        // Unique within this sandbox for any process: our pid, then a count of our own.
        let number =
            (u64::from(std::process::id()) << 32) | u64::from(NEXT.fetch_add(1, Ordering::Relaxed));
        let dir = layers.join(number.to_string());
        fs::create_dir(&dir)?;
        let workdir = workdir.map(relative).filter(|w| !w.is_empty());
        let mut parts = vec![
            ("lower", None),
            ("upper", Some((0o755, owners.0))),
            ("work", None),
        ];
        parts.push(("merged", None));
        if workdir.is_some() {
            // Group-writable, as what tasks make is (the verifier is of the group).
            parts.extend([("wlower", None), ("wupper", Some((0o775, owners.1)))]);
            parts.extend([("wwork", None), ("wmerged", None)]);
        }
        for (part, owned) in parts {
            let path = dir.join(part);
            fs::create_dir(&path)?;
            if let Some((mode, owner)) = owned {
                fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
                sys::chown(&path, owner)?;
            }
        }
        Ok(Layer {
            number,
            dir,
            workdir,
        })
    }

    /// The layer of the sandbox's current task namespace (`layers/task` names it): the one a
    /// task holder started again for the same task (after its runner is stopped, or a
    /// pause) is made over, so the task's changes live on until a reset.
    pub fn current(sandbox_dir: &Path, workdir: Option<&str>) -> Option<Layer> {
        let text = fs::read_to_string(sandbox_dir.join(LAYERS_DIR).join(CURRENT)).ok()?;
        let number: u64 = text.trim().parse().ok()?;
        let dir = Layer::dir_of(sandbox_dir, number);
        dir.is_dir().then(|| Layer {
            number,
            dir,
            workdir: workdir.map(relative).filter(|w| !w.is_empty()),
        })
    }

    /// Makes this layer the current task namespace's (see [`Layer::current`]).
    pub fn make_current(sandbox_dir: &Path, number: u64) -> io::Result<()> {
        let layers = sandbox_dir.join(LAYERS_DIR);
        let staged = layers.join(format!(".{CURRENT}.new"));
        fs::write(&staged, number.to_string())?;
        fs::rename(staged, layers.join(CURRENT))
    }

    /// Forgets the current task namespace's layer: the next task starts on a fresh one.
    pub fn forget_current(sandbox_dir: &Path) {
        let _ = fs::remove_file(sandbox_dir.join(LAYERS_DIR).join(CURRENT));
    }

    pub fn merged(&self) -> PathBuf {
        self.dir.join("merged")
    }

    /// The layer directory `number` names in `sandbox_dir`.
    pub fn dir_of(sandbox_dir: &Path, number: u64) -> PathBuf {
        sandbox_dir.join(LAYERS_DIR).join(number.to_string())
    }
}

/// The ids of the images every local sandbox under `state_dir` runs on, in whatever state it
/// is (being made, running, expired but not yet swept, paused): what an image prune keeps.
/// A sandbox whose meta cannot be read counts as using nothing; its holders, if any, keep
/// their mounts whatever is removed beneath them (they read no new file of a removed tree).
pub fn images_in_use(state_dir: &Path) -> HashSet<String> {
    let Ok(entries) = fs::read_dir(state_dir.join("sandboxes")) else {
        return HashSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| meta::read_meta(&e.path()).ok()?.image.map(|i| i.id))
        .collect()
}

/// An absolute directory of the image as a path relative to its root, spelled so that it
/// can never read as the helper's "none" (`-`).
fn relative(dir: &str) -> String {
    match dir.trim_matches('/') {
        "-" => "./-".into(),
        rel => rel.to_string(),
    }
}

/// Removes the layers of `sandbox_dir` that no holder in `keep` names and that are old
/// enough that no holder is still being started over them; returns how many it removed.
pub(super) fn sweep(sandbox_dir: &Path, keep: &[u64]) -> usize {
    let Ok(entries) = fs::read_dir(sandbox_dir.join(LAYERS_DIR)) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let named = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u64>().ok());
        if named.is_some_and(|n| keep.contains(&n)) {
            continue;
        }
        let young = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_none_or(|age| age < STARTING_GRACE);
        if !young && crate::deep_remove::remove_tree(&entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_has_its_four_parts_and_a_number_of_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let owner = nix_uid();
        let a = Layer::make(tmp.path(), (owner, owner), None).unwrap();
        let b = Layer::make(tmp.path(), (owner, owner), Some("/app/")).unwrap();
        assert_eq!(b.workdir.as_deref(), Some("app"));
        assert!(b.dir.join("wupper").is_dir() && !a.dir.join("wupper").exists());
        assert_ne!(a.number, b.number);
        for part in ["lower", "upper", "work", "merged"] {
            assert!(a.dir.join(part).is_dir(), "{part}");
        }
        assert_eq!(Layer::dir_of(tmp.path(), a.number), a.dir);
        // Fresh layers are left alone even when no holder names them yet.
        assert_eq!(sweep(tmp.path(), &[]), 0);
        assert!(a.dir.is_dir() && b.dir.is_dir());
    }

    #[test]
    fn a_sweep_removes_old_layers_no_holder_names() {
        let tmp = tempfile::tempdir().unwrap();
        let owner = nix_uid();
        let (kept, old) = (
            Layer::make(tmp.path(), (owner, owner), None).unwrap(),
            Layer::make(tmp.path(), (owner, owner), None).unwrap(),
        );
        let long_ago = SystemTime::now() - 2 * STARTING_GRACE;
        for l in [&kept, &old] {
            fs::File::open(&l.dir)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        assert_eq!(sweep(tmp.path(), &[kept.number]), 1);
        assert!(kept.dir.is_dir());
        assert!(!old.dir.exists());
    }

    fn nix_uid() -> u32 {
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    }
}
