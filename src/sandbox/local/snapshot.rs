//! Copies of directory trees and listings of what they hold, as `reset` keeps and compares
//! them: a copy takes directories, regular files and symlinks (as symlinks) with their modes,
//! and never follows a symlink.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::sys;

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
    path: String,
    kind: Kind,
    mode: u32,
    size: u64,
    link: Option<PathBuf>,
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

/// Copies a tree: directories, regular files and symlinks (as symlinks), with their modes;
/// anything else is left out. `owner` receives what is made. Walks with an explicit stack,
/// so a deep tree is refused by [`MAX_SEALED_PATH`] instead of overflowing anything.
pub(super) fn copy_tree(
    from: &Path,
    to: &Path,
    owner: Option<u32>,
    count: &mut usize,
) -> Result<(), SnapshotError> {
    if !to.exists() {
        fs::create_dir(to)?;
    }
    // Modes are set once a directory is filled, deepest first, so a read-only directory
    // still takes its entries.
    let mut modes = Vec::new();
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
                modes.push((dst.clone(), m.mode() & 0o7777));
                pending.push((src, dst.clone(), child_len));
            } else if ft.is_file() {
                fs::copy(&src, &dst)?;
            } else {
                continue;
            }
            if let Some(uid) = owner {
                sys::chown(&dst, uid)?;
            }
        }
    }
    for (dir, mode) in modes.iter().rev() {
        fs::set_permissions(dir, fs::Permissions::from_mode(*mode))?;
    }
    Ok(())
}

/// What a tree holds, sorted by path. Refuses a tree past [`MAX_SEALED_ENTRIES`] or
/// [`MAX_SEALED_PATH`], so the listing's memory is bounded by both.
pub(super) fn manifest(root: &Path) -> Result<Vec<Entry>, SnapshotError> {
    let mut out: Vec<Entry> = Vec::new();
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
            if out.len() >= MAX_SEALED_ENTRIES {
                return Err(SnapshotError::TooManyEntries {
                    max: MAX_SEALED_ENTRIES,
                });
            }
            if path.len() > MAX_SEALED_PATH {
                return Err(SnapshotError::PathTooLong {
                    max: MAX_SEALED_PATH,
                });
            }
            let m = fs::symlink_metadata(entry.path())?;
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
            out.push(Entry {
                path: path.clone(),
                kind,
                mode: m.mode() & 0o7777,
                size: if kind == Kind::File { m.len() } else { 0 },
                link: (kind == Kind::Symlink)
                    .then(|| fs::read_link(entry.path()))
                    .transpose()?,
            });
            if kind == Kind::Dir {
                pending.push((entry.path(), path));
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
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
        let copied = copy_tree(&home, &tmp.path().join("copy"), None, &mut 0);
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
        copy_tree(&home, &copy, None, &mut 0).unwrap();
        let (want, got) = (manifest(&home).unwrap(), manifest(&copy).unwrap());
        assert_eq!(want.len(), 1_003);
        assert_eq!(want, got, "{}", first_difference(&want, &got));
    }
}
