//! Copies of directory trees and listings of what they hold, as `reset` keeps and compares
//! them: a copy takes directories, regular files and symlinks (as symlinks) with their modes,
//! owners (where we may set them) and extended attributes, the tree's root included, and
//! never follows a symlink. A listing holds the same, so a task that leaves an xattr, an ACL
//! or another mode on the home or `/tmp` itself is seen.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::sys::check;

/// Files a sealed copy may hold at most; a home bigger than this is not worth copying back.
const MAX_SEALED_ENTRIES: usize = 10_000;
/// The longest path, in bytes below the copied directory, that a sealed copy or a listing
/// takes. It bounds the depth a copy reaches and, with [`MAX_SEALED_ENTRIES`], a listing's
/// memory; a deeper tree is refused, so the sandbox is retired instead of reused. Half the
/// kernel's `PATH_MAX`, so the sandbox's own directory fits in front of any such path.
const MAX_SEALED_PATH: usize = 2048;

/// Why a tree could not be copied or listed for a reset.
#[derive(Debug, thiserror::Error)]
pub(super) enum SnapshotError {
    #[error("more than {max} entries")]
    TooManyEntries { max: usize },
    #[error("a path longer than {max} bytes (the tree is too deep to copy)")]
    PathTooLong { max: usize },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// What `reset` returns to: the sealed copy of each directory and what it holds.
pub(super) struct Sealed {
    pub trees: Vec<SealedTree>,
}

pub(super) struct SealedTree {
    /// The sandbox's directory.
    pub live: PathBuf,
    /// Its copy, as it was when sealed.
    pub copy: PathBuf,
    pub listing: Vec<Entry>,
}

/// One entry of a directory tree, as a reset compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    /// Relative to the tree's root; the root itself is `.`.
    path: String,
    kind: Kind,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    link: Option<PathBuf>,
    /// A digest of every extended attribute's name and value (ACLs included), `None` when
    /// there are none: the listing's size stays bounded whatever a task stores in them.
    xattrs: Option<[u8; 32]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
    Other,
}

/// Removes everything inside `dir`, never following a symlink, however deep it goes.
pub(super) fn empty_dir(dir: &Path) -> io::Result<()> {
    crate::deep_remove::empty_dir(dir)
}

/// Removes a file, symlink or tree of any depth (see `deep_remove`).
pub(super) fn remove_tree(path: &Path) -> io::Result<()> {
    crate::deep_remove::remove_tree(path)
}

/// Copies a tree: directories, regular files and symlinks (as symlinks), with their modes and
/// extended attributes; anything else is left out. `to`, made if missing, takes the root's
/// own mode and attributes (any it had that `from` lacks are removed). With `keep_owner`
/// (we are root) every entry, the root too, keeps its owner and group. Walks with an explicit
/// stack, so a deep tree is refused by [`MAX_SEALED_PATH`] instead of overflowing anything.
pub(super) fn copy_tree(
    from: &Path,
    to: &Path,
    keep_owner: bool,
    count: &mut usize,
) -> Result<(), SnapshotError> {
    if !to.exists() {
        fs::create_dir(to)?;
    }
    // Before the children are made: a default ACL left on the root would shape them.
    sync_xattrs(from, to)?;
    // A directory's own metadata is given once it is filled, deepest first, so a read-only
    // directory still takes its entries.
    let mut dirs = vec![(from.to_path_buf(), to.to_path_buf())];
    let mut pending = vec![(from.to_path_buf(), to.to_path_buf(), 0usize)];
    while let Some((src_dir, dst_dir, rel_len)) = pending.pop() {
        for entry in fs::read_dir(&src_dir)? {
            let entry = entry?;
            *count += 1;
            if *count > MAX_SEALED_ENTRIES {
                return Err(SnapshotError::TooManyEntries {
                    max: MAX_SEALED_ENTRIES,
                });
            }
            let name = entry.file_name();
            let child_len = rel_len + 1 + name.len();
            if child_len > MAX_SEALED_PATH {
                return Err(SnapshotError::PathTooLong {
                    max: MAX_SEALED_PATH,
                });
            }
            let (src, dst) = (entry.path(), dst_dir.join(&name));
            let m = fs::symlink_metadata(&src)?;
            let ft = m.file_type();
            if ft.is_symlink() {
                std::os::unix::fs::symlink(fs::read_link(&src)?, &dst)?;
            } else if ft.is_dir() {
                fs::create_dir(&dst)?;
                sync_xattrs(&src, &dst)?;
                dirs.push((src.clone(), dst.clone()));
                pending.push((src, dst, child_len));
                continue;
            } else if ft.is_file() {
                fs::copy(&src, &dst)?;
            } else {
                continue;
            }
            copy_metadata(&m, &src, &dst, keep_owner)?;
        }
    }
    for (src, dst) in dirs.iter().rev() {
        copy_metadata(&fs::symlink_metadata(src)?, src, dst, keep_owner)?;
    }
    Ok(())
}

/// Gives `dst` the owner, mode and extended attributes `src` has (`m`), in that order: a
/// change of owner clears set-id bits and file capabilities, so they come after it.
fn copy_metadata(m: &fs::Metadata, src: &Path, dst: &Path, keep_owner: bool) -> io::Result<()> {
    if keep_owner {
        std::os::unix::fs::lchown(dst, Some(m.uid()), Some(m.gid()))?;
    }
    if !m.file_type().is_symlink() {
        fs::set_permissions(dst, fs::Permissions::from_mode(m.mode() & 0o7777))?;
    }
    sync_xattrs(src, dst)
}

/// What a tree holds, the root itself first as `.`, sorted by path. Refuses a tree past
/// [`MAX_SEALED_ENTRIES`] or [`MAX_SEALED_PATH`], so the listing's memory is bounded by both.
pub(super) fn manifest(root: &Path) -> Result<Vec<Entry>, SnapshotError> {
    let mut out = vec![list_one(root, ".".into())?];
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            if out.len() > MAX_SEALED_ENTRIES {
                return Err(SnapshotError::TooManyEntries {
                    max: MAX_SEALED_ENTRIES,
                });
            }
            if path.len() > MAX_SEALED_PATH {
                return Err(SnapshotError::PathTooLong {
                    max: MAX_SEALED_PATH,
                });
            }
            let listed = list_one(&entry.path(), path.clone())?;
            let is_dir = listed.kind == Kind::Dir;
            out.push(listed);
            if is_dir {
                pending.push((entry.path(), path));
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn list_one(at: &Path, path: String) -> io::Result<Entry> {
    let m = fs::symlink_metadata(at)?;
    let ft = m.file_type();
    let kind = if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File
    } else {
        Kind::Other
    };
    let xattrs = xattrs(at)?;
    let digest = (!xattrs.is_empty()).then(|| {
        let mut h = Sha256::new();
        for (name, value) in &xattrs {
            for part in [name.as_bytes(), value] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part);
            }
        }
        h.finalize().into()
    });
    Ok(Entry {
        path,
        kind,
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        size: if kind == Kind::File { m.len() } else { 0 },
        link: (kind == Kind::Symlink)
            .then(|| fs::read_link(at))
            .transpose()?,
        xattrs: digest,
    })
}

/// Makes `dst`'s extended attributes exactly `src`'s: adds or rewrites every one `src` has
/// and removes the others. One already as wanted is left alone: a label the system gives
/// every new file (SELinux's) may be one we could not set ourselves.
fn sync_xattrs(src: &Path, dst: &Path) -> io::Result<()> {
    let want = xattrs(src)?;
    let has = xattrs(dst)?;
    let dst_c = c_path(dst)?;
    for (name, _) in &has {
        if !want.iter().any(|(n, _)| n == name) {
            // SAFETY: NUL-terminated strings we own.
            check(unsafe { libc::lremovexattr(dst_c.as_ptr(), name.as_ptr()) })?;
        }
    }
    for (name, value) in want.iter().filter(|w| !has.contains(w)) {
        // SAFETY: NUL-terminated strings and a buffer of the length passed, all ours.
        check(unsafe {
            libc::lsetxattr(
                dst_c.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        })?;
    }
    Ok(())
}

/// Every extended attribute of `path` (not followed), sorted by name. Bounded by the kernel:
/// 64 KiB of names, 64 KiB a value. None where the filesystem keeps none.
fn xattrs(path: &Path) -> io::Result<Vec<(CString, Vec<u8>)>> {
    let c = c_path(path)?;
    let mut out = Vec::new();
    for name in xattr_names(&c)? {
        // SAFETY: a size query: NUL-terminated strings we own, no buffer.
        let len = unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        let len = usize::try_from(len).map_err(|_| io::Error::last_os_error())?;
        let mut value = vec![0u8; len];
        // SAFETY: the buffer holds `len` bytes.
        let got =
            unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), len) };
        // Nothing of the task runs while a tree is copied or listed: a size that changed
        // between the two calls is an error, not a race to retry.
        value.truncate(usize::try_from(got).map_err(|_| io::Error::last_os_error())?);
        out.push((name, value));
    }
    out.sort();
    Ok(out)
}

fn xattr_names(path: &CString) -> io::Result<Vec<CString>> {
    let unsupported = |e: &io::Error| e.raw_os_error() == Some(libc::EOPNOTSUPP);
    // SAFETY: a size query: a NUL-terminated path we own, no buffer.
    let len = unsafe { libc::llistxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
    let len = match usize::try_from(len) {
        Ok(len) => len,
        Err(_) => {
            let e = io::Error::last_os_error();
            return if unsupported(&e) {
                Ok(Vec::new())
            } else {
                Err(e)
            };
        }
    };
    let mut list = vec![0u8; len];
    // SAFETY: the buffer holds `len` bytes.
    let got = unsafe { libc::llistxattr(path.as_ptr(), list.as_mut_ptr().cast(), len) };
    list.truncate(usize::try_from(got).map_err(|_| io::Error::last_os_error())?);
    Ok(list
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .filter_map(|n| CString::new(n).ok())
        .collect())
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

pub(super) fn first_difference(want: &[Entry], got: &[Entry]) -> String {
    for (w, g) in want.iter().zip(got) {
        if w != g {
            return format!("{} is not as sealed", g.path);
        }
    }
    match (want.len(), got.len()) {
        (w, g) if g > w => format!("{} was left behind", got[w].path),
        (w, g) if w > g => format!("{} is missing", want[g].path),
        _ => "the listings differ".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deep_remove::test_support::deep_chain;

    #[test]
    fn a_tree_deeper_than_the_path_bound_is_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        fs::create_dir(&home).unwrap();
        deep_chain(&home, 20_000);
        let listed = manifest(&home);
        assert!(
            matches!(listed, Err(SnapshotError::PathTooLong { max: 2048 })),
            "{listed:?}"
        );
        let copied = copy_tree(&home, &tmp.path().join("copy"), false, &mut 0);
        assert!(
            matches!(copied, Err(SnapshotError::PathTooLong { max: 2048 })),
            "{copied:?}"
        );
        // And the reset's removal takes it all, however deep (the temporary directory's own
        // removal would not).
        empty_dir(&home).unwrap();
        assert_eq!(fs::read_dir(&home).unwrap().count(), 0);
    }

    #[test]
    fn a_deep_tree_within_the_bound_copies_and_lists_alike() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let deep: PathBuf = std::iter::repeat_n("d", 1_000).collect();
        fs::create_dir_all(home.join(&deep)).unwrap();
        fs::write(home.join(&deep).join("f"), "x").unwrap();
        fs::create_dir(home.join("ro")).unwrap();
        fs::write(home.join("ro/f"), "y").unwrap();
        fs::set_permissions(home.join("ro"), fs::Permissions::from_mode(0o555)).unwrap();
        let copy = tmp.path().join("copy");
        copy_tree(&home, &copy, false, &mut 0).unwrap();
        let (want, got) = (manifest(&home).unwrap(), manifest(&copy).unwrap());
        assert_eq!(want.len(), 1_004);
        assert_eq!(want, got, "{}", first_difference(&want, &got));
    }
}
