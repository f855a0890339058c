//! A root filesystem being written, every operation relative to an open directory and none
//! following a symlink: a parent is reached from the root one component at a time with
//! `O_NOFOLLOW`, so a symlink that a layer placed (`a -> /etc`) can never carry a later write
//! (`a/passwd`) out of the tree.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Why a path could not be resolved inside the tree.
#[derive(Debug)]
pub enum ResolveError {
    /// A parent component is a symlink.
    ThroughSymlink,
    /// A parent component is neither a directory nor a symlink.
    NotADirectory,
    Io(io::Error),
}

/// What is at a name, without following a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Dir,
    Other,
}

/// Ownership, permissions and modification time of an entry.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: i64,
}

/// The tree under construction: its root's descriptor and the last parent resolved (layers
/// list a directory's entries together, so most entries reuse it).
pub struct Rootfs {
    root: OwnedFd,
    cached: Option<(Vec<u8>, OwnedFd)>,
    /// Ownership is kept only when the process may give files away.
    as_root: bool,
}

impl Rootfs {
    pub fn open(dir: &Path) -> io::Result<Rootfs> {
        let root = open_at(libc::AT_FDCWD, &c_path(dir)?, libc::O_RDONLY)?;
        // SAFETY: geteuid has no preconditions.
        let as_root = unsafe { libc::geteuid() } == 0;
        Ok(Rootfs {
            root,
            cached: None,
            as_root,
        })
    }

    pub fn root_fd(&self) -> RawFd {
        self.root.as_raw_fd()
    }

    /// Forgets the cached parent: to be called after anything was removed, since the cached
    /// directory may be what went.
    pub fn forget(&mut self) {
        self.cached = None;
    }

    /// The directory `dir` (components joined by `/`, empty for the root), walked from the
    /// root without following symlinks. Missing components are made (mode 0755) when `create`;
    /// otherwise a missing one gives `None`.
    pub fn dir(&mut self, dir: &[u8], create: bool) -> Result<Option<RawFd>, ResolveError> {
        if dir.is_empty() {
            return Ok(Some(self.root.as_raw_fd()));
        }
        if let Some((path, fd)) = &self.cached {
            if path == dir {
                return Ok(Some(fd.as_raw_fd()));
            }
        }
        let mut current: Option<OwnedFd> = None;
        for component in dir.split(|&b| b == b'/') {
            let name = c_name(component).map_err(ResolveError::Io)?;
            let at = current
                .as_ref()
                .map_or(self.root.as_raw_fd(), |fd| fd.as_raw_fd());
            let next = match open_at(at, &name, libc::O_PATH) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {
                    mkdir_at(at, &name, 0o755).map_err(ResolveError::Io)?;
                    open_at(at, &name, libc::O_PATH).map_err(ResolveError::Io)?
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
                    return Err(match lstat_at(at, &name) {
                        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                            ResolveError::ThroughSymlink
                        }
                        Ok(_) => ResolveError::NotADirectory,
                        Err(e) => ResolveError::Io(e),
                    });
                }
                Err(e) => return Err(ResolveError::Io(e)),
            };
            current = Some(next);
        }
        let fd = current.ok_or(ResolveError::NotADirectory)?;
        let raw = fd.as_raw_fd();
        self.cached = Some((dir.to_vec(), fd));
        Ok(Some(raw))
    }

    /// A descriptor of `dir` that outlives the next resolution.
    pub fn dir_owned(&mut self, dir: &[u8]) -> Result<Option<OwnedFd>, ResolveError> {
        match self.dir(dir, false)? {
            // SAFETY: `fd` is open (owned by self); dup gives a descriptor of our own.
            Some(fd) => match unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) } {
                -1 => Err(ResolveError::Io(io::Error::last_os_error())),
                // SAFETY: a fresh descriptor nobody else owns.
                dup => Ok(Some(unsafe { OwnedFd::from_raw_fd(dup) })),
            },
            None => Ok(None),
        }
    }

    /// Sets ownership (when running as root), mode and mtime on an open file or directory.
    /// Ownership goes first: changing it clears setuid and setgid bits.
    pub fn set_meta_fd(&self, fd: RawFd, meta: Meta) -> io::Result<()> {
        if self.as_root {
            // SAFETY: a valid descriptor.
            let rc = unsafe { libc::fchown(fd, meta.uid as libc::uid_t, meta.gid as libc::gid_t) };
            check_owner(rc)?;
        }
        // SAFETY: a valid descriptor.
        check(unsafe { libc::fchmod(fd, meta.mode as libc::mode_t) })?;
        let times = [timespec(meta.mtime), timespec(meta.mtime)];
        // SAFETY: a valid descriptor and two timespecs.
        check(unsafe { libc::futimens(fd, times.as_ptr()) })
    }

    /// Sets ownership and mtime on `name` in `parent` without following it (a symlink), and
    /// its mode unless it is a symlink (whose mode Linux ignores).
    pub fn set_meta_at(
        &self,
        parent: RawFd,
        name: &CStr,
        meta: Meta,
        symlink: bool,
    ) -> io::Result<()> {
        let nofollow = libc::AT_SYMLINK_NOFOLLOW;
        if self.as_root {
            let (uid, gid) = (meta.uid as libc::uid_t, meta.gid as libc::gid_t);
            // SAFETY: a valid descriptor and C string.
            check_owner(unsafe { libc::fchownat(parent, name.as_ptr(), uid, gid, nofollow) })?;
        }
        if !symlink {
            // SAFETY: as above; `name` was just made by us and is no symlink.
            check(unsafe { libc::fchmodat(parent, name.as_ptr(), meta.mode as libc::mode_t, 0) })?;
        }
        let times = [timespec(meta.mtime), timespec(meta.mtime)];
        // SAFETY: as above, with two timespecs.
        check(unsafe { libc::utimensat(parent, name.as_ptr(), times.as_ptr(), nofollow) })
    }
}

/// What is at `name` in `parent`, if anything.
pub fn found_at(parent: RawFd, name: &CStr) -> io::Result<Option<Found>> {
    match lstat_at(parent, name) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => Ok(Some(Found::Dir)),
        Ok(_) => Ok(Some(Found::Other)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn mkdir_at(parent: RawFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: a valid descriptor and C string.
    check(unsafe { libc::mkdirat(parent, name.as_ptr(), mode as libc::mode_t) })
}

/// A new regular file, refusing to open anything already there (a symlink included).
pub fn create_file_at(parent: RawFd, name: &CStr) -> io::Result<File> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and C string; the result is owned below.
    let fd = unsafe { libc::openat(parent, name.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

pub fn symlink_at(target: &CStr, parent: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings and descriptor.
    check(unsafe { libc::symlinkat(target.as_ptr(), parent, name.as_ptr()) })
}

pub fn fifo_at(parent: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: a valid descriptor and C string.
    check(unsafe { libc::mknodat(parent, name.as_ptr(), libc::S_IFIFO | 0o600, 0) })
}

/// A hard link; flags 0 links a symlink itself, never what it points to.
pub fn link_at(from: RawFd, from_name: &CStr, to: RawFd, to_name: &CStr) -> io::Result<()> {
    // SAFETY: valid descriptors and C strings.
    check(unsafe { libc::linkat(from, from_name.as_ptr(), to, to_name.as_ptr(), 0) })
}

/// A directory inside `parent` opened for reading, never through a symlink.
pub fn open_dir_at(parent: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    open_at(parent, name, libc::O_RDONLY)
}

/// The names in an open directory, through its descriptor's magic link (nothing resolved by
/// path).
pub fn names_in(dir: RawFd) -> io::Result<Vec<CString>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(PathBuf::from(format!("/proc/self/fd/{dir}")))? {
        names.push(c_name(entry?.file_name().as_bytes())?);
    }
    Ok(names)
}

pub fn c_name(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

fn c_path(path: &Path) -> io::Result<CString> {
    c_name(path.as_os_str().as_bytes())
}

fn open_at(parent: RawFd, name: &CStr, access: libc::c_int) -> io::Result<OwnedFd> {
    let flags = access | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and C string; the result is owned below.
    let fd = unsafe { libc::openat(parent, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn lstat_at(parent: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: zeroed memory is a valid `stat`, filled in by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor, C string and out pointer.
    check(unsafe { libc::fstatat(parent, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

fn timespec(secs: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: 0,
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A chown's result: an id the user namespace cannot map (EINVAL) leaves the owner as it is,
/// since the tree is still usable; anything else is an error.
fn check_owner(rc: libc::c_int) -> io::Result<()> {
    match check(rc) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}
