//! Where a sandbox's process records (`procs/<pid>`, see `meta`) live: on a tmpfs, where one
//! can be had safely. A record matters only while the machine is up (after a boot its process
//! is gone), and every command writes one and removes it: on a disk file system each is an
//! inode made and freed, which a busy host pays for again when it makes the next (ext4 skips
//! inodes freed a moment ago). So `procs` is a link to a directory of its own under
//! `/dev/shm/wmo-e2b-<uid>`, a directory only this user may use; where that cannot be had
//! (no tmpfs there, the name taken by another), `procs` is a directory beside `meta.json`.
//!
//! After a boot the link points nowhere: the records went with their processes, so it reads
//! as no record, and the next record written makes its directory anew.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::sys;

/// The shared memory file system every Linux system mounts.
const SHM: &str = "/dev/shm";

/// This user's directory of the tmpfs, made if need be; `None` where it is not a tmpfs, or
/// the name is not a directory that this user alone owns and may use.
fn runtime_dir(shm: &Path) -> Option<PathBuf> {
    // SAFETY: geteuid cannot fail and touches no memory.
    let uid = unsafe { libc::geteuid() };
    let dir = shm.join(format!("wmo-e2b-{uid}"));
    match DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return None,
        _ => {}
    }
    let m = fs::symlink_metadata(&dir).ok()?;
    let ours = m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0;
    (ours && sys::is_tmpfs(&dir)).then_some(dir)
}

/// Makes `sandbox_dir/procs`: a link to a new directory of the tmpfs, or a directory.
pub(super) fn make(sandbox_dir: &Path) -> io::Result<()> {
    make_in(sandbox_dir, Path::new(SHM))
}

fn make_in(sandbox_dir: &Path, shm: &Path) -> io::Result<()> {
    let procs = sandbox_dir.join(super::meta::PROCS_DIR);
    if let Some(base) = runtime_dir(shm) {
        let target = base.join(format!("procs-{}", sys::random_hex(8)?));
        if DirBuilder::new().mode(0o700).create(&target).is_ok() {
            return std::os::unix::fs::symlink(&target, &procs).inspect_err(|_| {
                let _ = fs::remove_dir(&target);
            });
        }
    }
    DirBuilder::new().mode(0o700).create(&procs)
}

/// The tmpfs directory `procs` links to, if it is one: what a sandbox's removal removes too.
pub(super) fn target(procs: &Path) -> Option<PathBuf> {
    let target = fs::read_link(procs).ok()?;
    let name = target.file_name()?.to_str()?;
    let base = target.parent()?.file_name()?.to_str()?;
    (name.starts_with("procs-") && base.starts_with("wmo-e2b-") && target.is_absolute())
        .then_some(target)
}

/// Whether `procs` links to a tmpfs directory that a boot took: its records went with their
/// processes.
pub(super) fn lost_at_boot(procs: &Path) -> bool {
    target(procs).is_some_and(|t| !t.exists())
}

/// Makes anew the tmpfs directory `procs` links to, lost at a boot.
pub(super) fn make_again(procs: &Path) -> io::Result<()> {
    let target = target(procs).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    DirBuilder::new().mode(0o700).create(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tmpfs of this machine to make runtime directories in, left as it was.
    fn shm_scratch() -> Option<tempfile::TempDir> {
        tempfile::tempdir_in(SHM)
            .ok()
            .filter(|d| sys::is_tmpfs(d.path()))
    }

    #[test]
    fn records_live_on_the_tmpfs_and_go_with_the_sandbox() {
        let Some(shm) = shm_scratch() else {
            eprintln!("skipped: no tmpfs at {SHM}");
            return;
        };
        let sandbox = tempfile::tempdir().unwrap();
        make_in(sandbox.path(), shm.path()).unwrap();
        let procs = sandbox.path().join(super::super::meta::PROCS_DIR);
        let target = target(&procs).expect("procs links to the tmpfs");
        assert!(target.starts_with(shm.path()), "{target:?}");
        assert!(sys::is_tmpfs(&target));
        fs::write(procs.join("42"), "7 task\nsleep 1").unwrap();
        assert!(target.join("42").exists());
        // A boot empties the tmpfs: the link dangles until a record is written again.
        fs::remove_dir_all(&target).unwrap();
        assert!(lost_at_boot(&procs));
        make_again(&procs).unwrap();
        assert!(!lost_at_boot(&procs) && target.is_dir());
    }

    #[test]
    fn a_runtime_directory_someone_else_could_use_is_not_used() {
        let Some(shm) = shm_scratch() else {
            eprintln!("skipped: no tmpfs at {SHM}");
            return;
        };
        // SAFETY: geteuid cannot fail and touches no memory.
        let uid = unsafe { libc::geteuid() };
        let taken = shm.path().join(format!("wmo-e2b-{uid}"));
        DirBuilder::new().mode(0o777).create(&taken).unwrap();
        fs::set_permissions(&taken, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let sandbox = tempfile::tempdir().unwrap();
        make_in(sandbox.path(), shm.path()).unwrap();
        let procs = sandbox.path().join(super::super::meta::PROCS_DIR);
        let m = fs::symlink_metadata(&procs).unwrap();
        assert!(m.is_dir(), "records went where others may write");
        assert_eq!(fs::read_dir(&taken).unwrap().count(), 0);
        // Not a tmpfs: a directory beside the sandbox's files.
        let disk = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        make_in(other.path(), disk.path()).unwrap();
        assert!(
            fs::symlink_metadata(other.path().join(super::super::meta::PROCS_DIR))
                .unwrap()
                .is_dir()
        );
    }
}
