//! Removing directory trees of any depth, as a sandbox may leave them.
//!
//! `std::fs::remove_dir_all` recurses once per level (a tree 15,000 levels deep overflows the
//! stack) and holds a descriptor per level. Here nothing grows with depth: a directory is
//! emptied by removing its files and moving each subdirectory's own subdirectories up into it
//! (under fresh names), then removing the now flat subdirectory. Each pass over the directory
//! takes the tree one level shallower, so a tree of any depth is removed with two directories
//! open and no stack. Everything is done relative to open descriptors with `O_NOFOLLOW`: a
//! symlink is removed, never followed, and nothing is moved out of the tree being removed.
//!
//! A directory the sandbox made unreadable or unwritable to its owner is opened up (mode
//! 0700) before it is entered: as root the host needs no such help; in a user namespace it
//! does.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Names tried for a moved-up directory before giving up. The names carry a random salt, so
/// a sandbox cannot have made them ahead of time; a collision is a coincidence.
const HOIST_NAME_TRIES: u32 = 64;

/// Removes a file, symlink or directory tree of any depth, never following a symlink.
/// Missing is not an error.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (parent, name) = split(path)?;
    let parent = open_dir_path(parent)?;
    remove_at(parent.as_raw_fd(), &cstring(name.as_bytes())?)
}

/// Removes everything inside the directory `dir` (never following a symlink), keeping `dir`.
pub fn empty_dir(dir: &Path) -> io::Result<()> {
    let fd = open_dir_path(dir)?;
    empty(&fd, &mut Fresh::new())
}

/// Removes the entry `name` of the open directory `parent`: a file, a symlink or a whole
/// tree. Missing is not an error.
pub fn remove_at(parent: RawFd, name: &CStr) -> io::Result<()> {
    match unlink(parent, name, 0) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) if e.raw_os_error() != Some(libc::EISDIR) => return Err(e),
        Err(_) => {}
    }
    let dir = match open_child_dir(parent, name) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    empty(&dir, &mut Fresh::new())?;
    drop(dir);
    match unlink(parent, name, libc::AT_REMOVEDIR) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// Names for moved-up directories that nothing in the tree has yet.
struct Fresh {
    salt: u64,
    count: u64,
}

impl Fresh {
    fn new() -> Fresh {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS's randomness per instance.
        let salt = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Fresh { salt, count: 0 }
    }

    fn next(&mut self) -> io::Result<CString> {
        self.count += 1;
        cstring(format!(".wmo-rm-{:016x}-{}", self.salt, self.count).as_bytes())
    }
}

/// Empties `dir` a level per pass: files go, and each subdirectory's subdirectories move up
/// into `dir` before the subdirectory itself goes.
fn empty(dir: &OwnedFd, fresh: &mut Fresh) -> io::Result<()> {
    loop {
        let mut seen = false;
        let mut progressed = false;
        for name in names(dir.as_raw_fd())? {
            let name = name?;
            seen = true;
            match unlink_unless_dir(dir, &name)? {
                Unlinked::Removed => {
                    progressed = true;
                    continue;
                }
                Unlinked::Gone => continue,
                Unlinked::Dir => {}
            }
            let child = match open_child_dir(dir.as_raw_fd(), &name) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            progressed |= hoist(&child, dir, fresh)?;
            drop(child);
            match unlink_opening_up(dir, &name, libc::AT_REMOVEDIR) {
                Ok(()) => progressed = true,
                // Refilled behind us or already gone: the next pass sees it again.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTEMPTY)) => {}
                Err(e) => return Err(e),
            }
        }
        if !seen {
            return Ok(());
        }
        if !progressed {
            return Err(io::Error::other(
                "a directory could not be emptied: a pass removed nothing",
            ));
        }
    }
}

/// Removes the files of `child` and moves its subdirectories up into `into`; true when
/// anything was removed or moved.
fn hoist(child: &OwnedFd, into: &OwnedFd, fresh: &mut Fresh) -> io::Result<bool> {
    let mut progressed = false;
    for name in names(child.as_raw_fd())? {
        let name = name?;
        match unlink_unless_dir(child, &name)? {
            Unlinked::Removed => {
                progressed = true;
                continue;
            }
            Unlinked::Gone => continue,
            Unlinked::Dir => {}
        }
        move_up(child, &name, into, fresh)?;
        progressed = true;
    }
    Ok(progressed)
}

/// Moves the directory `name` of `from` into `into` under a name nothing there has.
fn move_up(from: &OwnedFd, name: &CStr, into: &OwnedFd, fresh: &mut Fresh) -> io::Result<()> {
    let mut opened_up = false;
    let mut tries = 0;
    loop {
        let target = fresh.next()?;
        // SAFETY: valid descriptors and C strings.
        let rc = unsafe {
            libc::renameat2(
                from.as_raw_fd(),
                name.as_ptr(),
                into.as_raw_fd(),
                target.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EEXIST) if tries < HOIST_NAME_TRIES => tries += 1,
            Some(libc::ENOENT) => return Ok(()),
            // Moving a directory rewrites its `..`, which needs write access to it, and
            // taking it out of `from` needs write access there.
            Some(libc::EACCES) if !opened_up => {
                opened_up = true;
                chmod_at(from.as_raw_fd(), name)?;
                fchmod(from.as_raw_fd())?;
            }
            _ => return Err(err),
        }
    }
}

/// `unlinkat`, retried once after giving `dir` mode 0700 when it refused for permissions.
/// What unlinking one entry as a file did.
enum Unlinked {
    Removed,
    /// It was gone already.
    Gone,
    /// It is a directory, left for the caller.
    Dir,
}

/// Unlinks `name` in `dir` unless it is a directory.
fn unlink_unless_dir(dir: &OwnedFd, name: &CStr) -> io::Result<Unlinked> {
    match unlink_opening_up(dir, name, 0) {
        Ok(()) => Ok(Unlinked::Removed),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Unlinked::Gone),
        Err(e) if e.raw_os_error() == Some(libc::EISDIR) => Ok(Unlinked::Dir),
        Err(e) => Err(e),
    }
}

fn unlink_opening_up(dir: &OwnedFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    match unlink(dir.as_raw_fd(), name, flags) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            fchmod(dir.as_raw_fd())?;
            unlink(dir.as_raw_fd(), name, flags)
        }
        other => other,
    }
}

/// Opens the directory `name` in `parent` for listing, never following a symlink; one the
/// sandbox made unreadable is given mode 0700 first.
fn open_child_dir(parent: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    match open_dir_at(parent, name) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            chmod_at(parent, name)?;
            open_dir_at(parent, name)
        }
        other => other,
    }
}

fn open_dir_at(parent: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and C string; the result is owned below.
    let fd = unsafe { libc::openat(parent, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_dir_path(dir: &Path) -> io::Result<OwnedFd> {
    open_dir_at(libc::AT_FDCWD, &cstring(dir.as_os_str().as_bytes())?)
}

/// The names in an open directory, `.` and `..` left out. Listed through the descriptor's
/// magic link, so nothing is resolved by path.
fn names(dir: RawFd) -> io::Result<impl Iterator<Item = io::Result<CString>>> {
    let entries = std::fs::read_dir(PathBuf::from(format!("/proc/self/fd/{dir}")))?;
    Ok(entries.map(|e| cstring(e?.file_name().as_bytes())))
}

fn unlink(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid descriptor and C string.
    if unsafe { libc::unlinkat(dir, name.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn chmod_at(dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: a valid descriptor and C string. `name` was just seen as a directory, and
    // fchmodat never follows a symlink here because a symlink is unlinked, not entered.
    if unsafe { libc::fchmodat(dir, name.as_ptr(), 0o700, libc::AT_SYMLINK_NOFOLLOW) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    // Older kernels refuse AT_SYMLINK_NOFOLLOW for fchmodat; a directory needs none.
    if err.raw_os_error() != Some(libc::EOPNOTSUPP) && err.raw_os_error() != Some(libc::ENOTSUP) {
        return Err(err);
    }
    // SAFETY: as above.
    if unsafe { libc::fchmodat(dir, name.as_ptr(), 0o700, 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn fchmod(dir: RawFd) -> io::Result<()> {
    // SAFETY: a valid descriptor.
    if unsafe { libc::fchmod(dir, 0o700) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn split(path: &Path) -> io::Result<(&Path, &OsStr)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            Ok((parent, name))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no entry to remove", path.display()),
        )),
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// Builds a chain of `depth` directories named `d` under `root` with descriptors, as no
    /// path could reach its bottom, and a file at the bottom.
    pub(crate) fn deep_chain(root: &Path, depth: usize) {
        let mut dir = open_dir_path(root).unwrap();
        let d = cstring(b"d").unwrap();
        for _ in 0..depth {
            // SAFETY: valid descriptor and C string.
            assert_eq!(
                unsafe { libc::mkdirat(dir.as_raw_fd(), d.as_ptr(), 0o755) },
                0
            );
            dir = open_dir_at(dir.as_raw_fd(), &d).unwrap();
        }
        let f = cstring(b"bottom").unwrap();
        // SAFETY: valid descriptor and C string.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                f.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::deep_chain;
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn removes_a_tree_deeper_than_any_stack() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("top");
        std::fs::create_dir(&top).unwrap();
        deep_chain(&top, 100_000);
        remove_tree(&top).unwrap();
        assert!(!top.exists());
    }

    #[test]
    fn empties_a_deep_wide_tree_keeping_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..50 {
            let sub = tmp.path().join(format!("s{i}"));
            std::fs::create_dir_all(sub.join("a/b/c")).unwrap();
            std::fs::write(sub.join("a/b/c/f"), "x").unwrap();
            std::fs::create_dir_all(sub.join(format!(".wmo-rm-{i}/x"))).unwrap();
        }
        deep_chain(tmp.path(), 5_000);
        empty_dir(tmp.path()).unwrap();
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn symlinks_are_removed_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let top = tmp.path().join("top");
        std::fs::create_dir_all(top.join("a")).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("a/link")).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("link")).unwrap();
        remove_tree(&top).unwrap();
        assert!(!top.exists());
        assert!(outside.join("keep").exists());
        // A symlink given as the path itself is removed, not its target.
        let link = tmp.path().join("to-outside");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        remove_tree(&link).unwrap();
        assert!(outside.join("keep").exists());
    }

    #[test]
    fn closed_directories_are_opened_up() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("top");
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        std::fs::write(top.join("a/b/f"), "x").unwrap();
        std::fs::set_permissions(top.join("a/b"), std::fs::Permissions::from_mode(0o000)).unwrap();
        std::fs::set_permissions(top.join("a"), std::fs::Permissions::from_mode(0o500)).unwrap();
        remove_tree(&top).unwrap();
        assert!(!top.exists());
        remove_tree(&top).unwrap();
    }
}
