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

/// Removes everything inside `dir`, never following a symlink.
pub(super) fn empty_dir(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        remove_tree(&entry?.path())?;
    }
    Ok(())
}

/// Removes a file, symlink or tree. A directory the sandbox made unreadable to its owner is
/// opened up first (as root the host needs no such help; in a user namespace it does).
pub(super) fn remove_tree(path: &Path) -> io::Result<()> {
    let m = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !m.is_dir() {
        return fs::remove_file(path);
    }
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            open_up(path)?;
            fs::remove_dir_all(path)
        }
        other => other,
    }
}

fn open_up(dir: &Path) -> io::Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            open_up(&entry.path())?;
        }
    }
    Ok(())
}

/// Copies a tree: directories, regular files and symlinks (as symlinks), with their modes;
/// anything else is left out. `owner` receives what is made.
pub(super) fn copy_tree(
    from: &Path,
    to: &Path,
    owner: Option<u32>,
    count: &mut usize,
) -> io::Result<()> {
    if !to.exists() {
        fs::create_dir(to)?;
    }
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        *count += 1;
        if *count > MAX_SEALED_ENTRIES {
            return Err(io::Error::other(format!(
                "more than {MAX_SEALED_ENTRIES} entries"
            )));
        }
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let m = fs::symlink_metadata(&src)?;
        let ft = m.file_type();
        if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&src)?, &dst)?;
        } else if ft.is_dir() {
            fs::create_dir(&dst)?;
            copy_tree(&src, &dst, owner, count)?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(m.mode() & 0o7777))?;
        } else if ft.is_file() {
            fs::copy(&src, &dst)?;
        } else {
            continue;
        }
        if let Some(uid) = owner {
            sys::chown(&dst, uid)?;
        }
    }
    Ok(())
}

/// What a tree holds, sorted by path.
pub(super) fn manifest(root: &Path) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    walk(root, "", &mut out)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<Entry>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if out.len() >= MAX_SEALED_ENTRIES {
            return Err(io::Error::other(format!(
                "more than {MAX_SEALED_ENTRIES} entries"
            )));
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
            walk(&entry.path(), &path, out)?;
        }
    }
    Ok(())
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
