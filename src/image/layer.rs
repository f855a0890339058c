//! One layer's entries applied to a root filesystem, as Docker and the OCI image spec have
//! it: later entries replace earlier ones, `.wh.NAME` removes NAME of the layers below,
//! `.wh..wh..opq` hides everything the layers below put in its directory, device nodes are
//! skipped. Every path is checked before it touches the tree.

use super::rootfs::{self, Found, Meta, ResolveError, Rootfs};
use super::tar_reader::{Entry, Kind, TarError, TarReader};
use super::unpack::{Bound, UnpackError, Unsafe};
use std::collections::HashSet;
use std::ffi::CStr;
use std::io::{Read, Write};

/// The most components in one entry's path.
pub const MAX_DEPTH: usize = 512;

const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// What the layers of one image may still use, and what they did.
pub struct Tally {
    pub entries_left: u64,
    /// Bytes of paths remembered (this layer's paths for its whiteouts, and the directories
    /// below) still allowed: a hostile layer's paths could otherwise fill memory.
    pub path_bytes_left: u64,
    pub entries: u64,
    pub devices_skipped: u64,
    /// Directories whose final mode, owner and mtime are set once every layer is in:
    /// writing into a directory changes its mtime, and a read-only one would refuse the
    /// entries after it.
    pub dirs: Vec<(Vec<u8>, Meta)>,
}

/// Applies the layer read by `tar` (named `digest` in errors) to `fs`.
pub fn apply_layer<R: Read>(
    tar: &mut TarReader<R>,
    fs: &mut Rootfs,
    digest: &str,
    tally: &mut Tally,
    on_tar_error: &dyn Fn(&mut TarReader<R>, TarError) -> UnpackError,
) -> Result<(), UnpackError> {
    // Paths this layer wrote, and their parents: a whiteout hides the layers below only.
    let mut this_layer: HashSet<Vec<u8>> = HashSet::new();
    // Directories this layer made opaque: a directory is emptied once, however many markers
    // a layer repeats in it (each pass would list it whole).
    let mut opaque: HashSet<Vec<u8>> = HashSet::new();
    loop {
        let entry = match tar.next_entry() {
            Ok(Some(entry)) => entry,
            Ok(None) => return Ok(()),
            Err(e) => return Err(on_tar_error(tar, e)),
        };
        if tally.entries_left == 0 {
            return Err(UnpackError::Bound {
                digest: digest.to_string(),
                bound: Bound::Entries,
            });
        }
        tally.entries_left -= 1;
        tally.entries += 1;
        let mut at = At {
            fs: &mut *fs,
            digest,
            entry: &entry,
        };
        let path = clean(&entry.path).map_err(|why| at.refuse(why))?;
        let (dir, name) = split(&path);
        if name.is_empty() {
            // The archive's own root, `./`: its metadata becomes the root's.
            match entry.kind {
                Kind::Dir => tally.dirs.push((Vec::new(), meta(&entry))),
                _ => return Err(at.refuse(Unsafe::ReplacesRoot)),
            }
            continue;
        }
        if name.starts_with(WHITEOUT) {
            at.whiteout(dir, name, &this_layer, &mut opaque)?;
            continue;
        }
        if matches!(entry.kind, Kind::CharDevice | Kind::BlockDevice) {
            tally.devices_skipped += 1;
            continue;
        }
        let remembered = mark(&mut this_layer, &path) + path.len() as u64;
        tally.path_bytes_left = tally
            .path_bytes_left
            .checked_sub(remembered)
            .ok_or_else(|| UnpackError::Bound {
                digest: digest.to_string(),
                bound: Bound::PathBytes,
            })?;
        let parent = at
            .dir(dir, true)?
            .ok_or_else(|| at.refuse(Unsafe::NotADirectory))?;
        let c_name = rootfs::c_name(name).map_err(|e| at.io("name", e))?;
        let existing = rootfs::found_at(parent, &c_name).map_err(|e| at.io("stat", e))?;
        if entry.kind == Kind::Dir && existing == Some(Found::Dir) {
            // A directory over a directory keeps what the layers below put in it.
            tally.dirs.push((path, meta(&entry)));
            continue;
        }
        if entry.kind == Kind::HardLink {
            at.hardlink(&path, dir, name)?;
            continue;
        }
        if existing.is_some() {
            at.remove(parent, &c_name)?;
        }
        let parent = at
            .dir(dir, false)?
            .ok_or_else(|| at.refuse(Unsafe::NotADirectory))?;
        match entry.kind {
            Kind::Dir => {
                // Owner-writable until the end, when its own mode is set.
                rootfs::mkdir_at(parent, &c_name, 0o700).map_err(|e| at.io("mkdir", e))?;
                tally.dirs.push((path, meta(&entry)));
            }
            Kind::File => {
                let mut file =
                    rootfs::create_file_at(parent, &c_name).map_err(|e| at.io("create", e))?;
                copy_data(tar, &mut file, &at, on_tar_error)?;
                at.fs
                    .set_meta_fd(std::os::fd::AsRawFd::as_raw_fd(&file), meta(&entry))
                    .map_err(|e| at.io("set metadata", e))?;
            }
            Kind::Symlink => {
                let target = rootfs::c_name(&entry.link).map_err(|e| at.io("link target", e))?;
                rootfs::symlink_at(&target, parent, &c_name).map_err(|e| at.io("symlink", e))?;
                at.fs
                    .set_meta_at(parent, &c_name, meta(&entry), true)
                    .map_err(|e| at.io("set metadata", e))?;
            }
            Kind::Fifo => {
                rootfs::fifo_at(parent, &c_name).map_err(|e| at.io("mkfifo", e))?;
                at.fs
                    .set_meta_at(parent, &c_name, meta(&entry), false)
                    .map_err(|e| at.io("set metadata", e))?;
            }
            Kind::HardLink | Kind::CharDevice | Kind::BlockDevice => {}
        }
    }
}

/// Sets the deferred directory metadata, the most recently written first (so a child is
/// done before a parent might be made unwritable), each directory once, with the last
/// metadata any layer gave it. One that is gone (a later layer removed or replaced it) is
/// skipped.
pub fn finish_dirs(fs: &mut Rootfs, dirs: &[(Vec<u8>, Meta)]) -> std::io::Result<()> {
    let mut done: HashSet<&[u8]> = HashSet::new();
    for (path, meta) in dirs.iter().rev() {
        if !done.insert(path) {
            continue;
        }
        if path.is_empty() {
            fs.set_meta_fd(fs.root_fd(), *meta)?;
            continue;
        }
        let (dir, name) = split(path);
        let parent = match fs.dir(dir, false) {
            Ok(Some(fd)) => fd,
            Ok(None) | Err(ResolveError::ThroughSymlink | ResolveError::NotADirectory) => continue,
            Err(ResolveError::Io(e)) => return Err(e),
        };
        let fd = match rootfs::open_dir_at(parent, &rootfs::c_name(name)?) {
            Ok(fd) => fd,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        fs.set_meta_fd(std::os::fd::AsRawFd::as_raw_fd(&fd), *meta)?;
    }
    Ok(())
}

/// The entry being applied, for resolving paths and naming it in errors.
struct At<'a> {
    fs: &'a mut Rootfs,
    digest: &'a str,
    entry: &'a Entry,
}

impl At<'_> {
    fn refuse(&self, why: Unsafe) -> UnpackError {
        UnpackError::Unsafe {
            digest: self.digest.to_string(),
            entry: String::from_utf8_lossy(&self.entry.path).into_owned(),
            why,
        }
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> UnpackError {
        UnpackError::Io {
            digest: self.digest.to_string(),
            entry: String::from_utf8_lossy(&self.entry.path).into_owned(),
            op,
            source,
        }
    }

    fn dir(&mut self, dir: &[u8], create: bool) -> Result<Option<libc::c_int>, UnpackError> {
        match self.fs.dir(dir, create) {
            Ok(fd) => Ok(fd),
            Err(ResolveError::ThroughSymlink) => Err(self.refuse(Unsafe::ThroughSymlink)),
            Err(ResolveError::NotADirectory) => Err(self.refuse(Unsafe::NotADirectory)),
            Err(ResolveError::Io(e)) => Err(self.io("open a parent directory", e)),
        }
    }

    /// Like [`At::dir`] without creating, as a descriptor that outlives later resolutions.
    fn dir_owned(&mut self, dir: &[u8]) -> Result<Option<std::os::fd::OwnedFd>, UnpackError> {
        match self.fs.dir_owned(dir) {
            Ok(fd) => Ok(fd),
            Err(ResolveError::ThroughSymlink) => Err(self.refuse(Unsafe::ThroughSymlink)),
            Err(ResolveError::NotADirectory) => Err(self.refuse(Unsafe::NotADirectory)),
            Err(ResolveError::Io(e)) => Err(self.io("open a parent directory", e)),
        }
    }

    fn remove(&mut self, parent: libc::c_int, name: &CStr) -> Result<(), UnpackError> {
        // The cached parent may be inside what goes.
        let result = crate::deep_remove::remove_at(parent, name);
        self.fs.forget();
        result.map_err(|e| self.io("remove", e))
    }

    /// `.wh.NAME` removes NAME; `.wh..wh..opq` empties its directory of what the layers
    /// below put there. Either leaves this layer's own entries alone.
    fn whiteout(
        &mut self,
        dir: &[u8],
        name: &[u8],
        this_layer: &HashSet<Vec<u8>>,
        opaque: &mut HashSet<Vec<u8>>,
    ) -> Result<(), UnpackError> {
        if name == OPAQUE {
            if opaque.contains(dir) {
                return Ok(());
            }
            // Remembered only once the directory exists, so markers in directories that
            // do not cannot grow the set past the tree itself.
            let Some(fd) = self.dir_owned(dir)? else {
                return Ok(());
            };
            opaque.insert(dir.to_vec());
            let fd = std::os::fd::AsRawFd::as_raw_fd(&fd);
            for child in rootfs::names_in(fd).map_err(|e| self.io("list", e))? {
                if !this_layer.contains(&join(dir, child.to_bytes())) {
                    self.remove(fd, &child)?;
                }
            }
            return Ok(());
        }
        let hidden = &name[WHITEOUT.len()..];
        if hidden.starts_with(WHITEOUT) {
            // AUFS's own metadata (`.wh..wh.plnk` and the like): not part of the image.
            return Ok(());
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(self.refuse(Unsafe::BadWhiteout));
        }
        if this_layer.contains(&join(dir, hidden)) {
            return Ok(());
        }
        let Some(fd) = self.dir(dir, false)? else {
            return Ok(());
        };
        let c_hidden = rootfs::c_name(hidden).map_err(|e| self.io("name", e))?;
        self.remove(fd, &c_hidden)
    }

    /// A hard link to an entry already in the tree, resolved like any entry path.
    fn hardlink(&mut self, path: &[u8], dir: &[u8], name: &[u8]) -> Result<(), UnpackError> {
        let target = clean(&self.entry.link).map_err(|_| self.refuse(Unsafe::LinkOutside))?;
        if target == path {
            return Ok(());
        }
        let (target_dir, target_name) = split(&target);
        if target_name.is_empty() {
            return Err(self.refuse(Unsafe::LinkTargetMissing));
        }
        let target_parent = self
            .dir_owned(target_dir)?
            .ok_or_else(|| self.refuse(Unsafe::LinkTargetMissing))?;
        let target_fd = std::os::fd::AsRawFd::as_raw_fd(&target_parent);
        let c_target = rootfs::c_name(target_name).map_err(|e| self.io("name", e))?;
        match rootfs::found_at(target_fd, &c_target).map_err(|e| self.io("stat", e))? {
            Some(Found::Other) => {}
            Some(Found::Dir) | None => return Err(self.refuse(Unsafe::LinkTargetMissing)),
        }
        let c_name = rootfs::c_name(name).map_err(|e| self.io("name", e))?;
        let parent = self
            .dir(dir, true)?
            .ok_or_else(|| self.refuse(Unsafe::NotADirectory))?;
        if rootfs::found_at(parent, &c_name)
            .map_err(|e| self.io("stat", e))?
            .is_some()
        {
            self.remove(parent, &c_name)?;
        }
        let parent = self
            .dir(dir, false)?
            .ok_or_else(|| self.refuse(Unsafe::NotADirectory))?;
        rootfs::link_at(target_fd, &c_target, parent, &c_name).map_err(|e| self.io("link", e))
    }
}

fn copy_data<R: Read>(
    tar: &mut TarReader<R>,
    file: &mut std::fs::File,
    at: &At<'_>,
    on_tar_error: &dyn Fn(&mut TarReader<R>, TarError) -> UnpackError,
) -> Result<(), UnpackError> {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match tar.read_data(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) => return Err(on_tar_error(tar, e)),
        };
        file.write_all(&buf[..n]).map_err(|e| at.io("write", e))?;
    }
}

fn meta(entry: &Entry) -> Meta {
    Meta {
        mode: entry.mode,
        uid: entry.uid,
        gid: entry.gid,
        mtime: entry.mtime,
    }
}

/// The path's components joined by `/`, with `.` and empty components dropped (`./a//b/`
/// is `a/b`); a `..` component, an absolute path or one too deep is refused.
pub fn clean(raw: &[u8]) -> Result<Vec<u8>, Unsafe> {
    if raw.first() == Some(&b'/') {
        return Err(Unsafe::Absolute);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut depth = 0;
    for component in raw.split(|&b| b == b'/') {
        match component {
            b"" | b"." => continue,
            b".." => return Err(Unsafe::ParentDir),
            _ => {}
        }
        depth += 1;
        if depth > MAX_DEPTH {
            return Err(Unsafe::TooDeep);
        }
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(component);
    }
    Ok(out)
}

/// `a/b/c` as (`a/b`, `c`); `c` as (``, `c`).
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memrchr(b'/', path) {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&path[..0], path),
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    path.extend_from_slice(dir);
    path.push(b'/');
    path.extend_from_slice(name);
    path
}

/// Records `path` and its parents as this layer's; returns the bytes newly remembered.
fn mark(this_layer: &mut HashSet<Vec<u8>>, path: &[u8]) -> u64 {
    let mut path = path;
    let mut added = 0;
    while this_layer.insert(path.to_vec()) {
        added += path.len() as u64;
        match memchr::memrchr(b'/', path) {
            Some(i) => path = &path[..i],
            None => break,
        }
    }
    added
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cleaned_or_refused() {
        assert_eq!(clean(b"./a//b/./c/").unwrap(), b"a/b/c");
        assert_eq!(clean(b"./").unwrap(), b"");
        assert!(matches!(clean(b"a/../../etc"), Err(Unsafe::ParentDir)));
        assert!(matches!(clean(b"/etc/passwd"), Err(Unsafe::Absolute)));
        let deep = "d/".repeat(MAX_DEPTH + 1);
        assert!(matches!(clean(deep.as_bytes()), Err(Unsafe::TooDeep)));
        assert_eq!(split(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split(b"c"), (&b""[..], &b"c"[..]));
    }
}
