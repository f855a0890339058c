//! File operations the host performs inside a sandbox's directories, never leaving them.
//!
//! A sandbox can plant symlinks anywhere in its own directories, and on the local backend
//! those directories are plain host directories: a host that opened `notes.txt ->
//! /root/.ssh/id_rsa` by path would read the host's key. So every path is resolved by the
//! kernel beneath a directory we hold open: reads with `openat2(RESOLVE_BENEATH)` (a symlink
//! is followed only while it stays beneath; an absolute one, or one that climbs out, fails
//! with `EXDEV`), and writes one component at a time with `O_NOFOLLOW` (no symlink at all).
//! Where `openat2` is missing (Linux before 5.6) reads fall back to the no-symlink walk.
//! Opens use `O_NONBLOCK` and check for a regular file, so a FIFO the sandbox left in place of
//! a file can never block the host.

use std::ffi::CString;
use std::fs::{File, Metadata};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::sys;

/// Set once `openat2` answered `ENOSYS`.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
/// Retries of an `openat2` that raced a rename or mount (`EAGAIN`).
const OPENAT2_RETRIES: usize = 16;

/// A host directory that operations stay beneath. Paths given to it are relative and
/// normalized (no `..`, no empty or `.` components); `""` is the directory itself.
pub struct Beneath {
    root: OwnedFd,
    /// When the host runs as root, what it creates is handed to the sandbox user.
    owner: Option<u32>,
}

impl Beneath {
    pub fn open(dir: &Path, owner: Option<u32>) -> io::Result<Beneath> {
        let c = cstring(dir.as_os_str().as_bytes())?;
        // SAFETY: a valid C string; the returned fd is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let root = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Beneath { root, owner })
    }

    /// Opens a regular file for reading, following symlinks only while they stay beneath.
    pub fn open_read(&self, rel: &str) -> io::Result<File> {
        let fd = self.resolve(rel, libc::O_RDONLY | libc::O_NONBLOCK, true)?;
        let file = File::from(fd);
        regular(&file)?;
        sys::set_nonblocking(file.as_raw_fd(), false)?;
        Ok(file)
    }

    /// Creates or replaces a regular file, creating missing parents; no symlink anywhere on
    /// the path is followed.
    pub fn write(&self, rel: &str, data: &[u8]) -> io::Result<()> {
        self.write_open(rel, data).map(drop)
    }

    /// `write`, handing back the written file still open, so what is set on it next (its
    /// extended attributes) lands on that file, whatever the path names by then.
    pub fn write_open(&self, rel: &str, data: &[u8]) -> io::Result<File> {
        let (parent, name) = self.parent_dir(rel, true)?;
        let fd = open_at(
            parent.as_raw_fd(),
            name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0o644,
        )?;
        let mut file = File::from(fd);
        regular(&file)?;
        sys::set_nonblocking(file.as_raw_fd(), false)?;
        file.set_len(0)?;
        file.write_all(data)?;
        self.hand_over(file.as_raw_fd())?;
        Ok(file)
    }

    /// Opens what `rel` leads to, a regular file or a directory, following symlinks only
    /// while they stay beneath: a descriptor to read its extended attributes from. Anything
    /// else (a FIFO, a socket) is refused before it is opened for real, so opening has no
    /// effect on it.
    pub fn open_entry(&self, rel: &str) -> io::Result<File> {
        let path = File::from(self.resolve(rel, libc::O_PATH, true)?);
        let kind = path.metadata()?.file_type();
        if !kind.is_file() && !kind.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "neither a regular file nor a directory",
            ));
        }
        // The magic link reopens the very inode checked above; nothing is resolved again.
        let c = cstring(fd_path(path.as_raw_fd()).as_os_str().as_bytes())?;
        // SAFETY: a valid C string; the result is owned below.
        let fd = retry_eintr(|| unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: a fresh descriptor nobody else owns.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Creates `rel` and its missing parents as directories; false when it already existed.
    pub fn make_dirs(&self, rel: &str) -> io::Result<bool> {
        if rel.is_empty() {
            return Ok(false);
        }
        let (parent, name) = self.parent_dir(rel, true)?;
        let (_, created) = self.child_dir(&parent, name, true)?;
        Ok(created)
    }

    /// Gives the directory `rel` (never a symlink's target) the permission bits `mode`.
    pub fn set_dir_mode(&self, rel: &str, mode: u32) -> io::Result<()> {
        let fd = self.resolve(
            rel,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            true,
        )?;
        // An O_PATH descriptor is changed through its magic link, which names the directory.
        std::fs::set_permissions(
            fd_path(fd.as_raw_fd()),
            std::fs::Permissions::from_mode(mode),
        )
    }

    /// `lstat`: what the path itself is (a symlink is reported as one).
    pub fn symlink_metadata(&self, rel: &str) -> io::Result<Metadata> {
        let fd = self.resolve(rel, libc::O_PATH | libc::O_NOFOLLOW, true)?;
        File::from(fd).metadata()
    }

    /// `stat`: what the path leads to, following symlinks only while they stay beneath.
    pub fn metadata(&self, rel: &str) -> io::Result<Metadata> {
        let fd = self.resolve(rel, libc::O_PATH, true)?;
        File::from(fd).metadata()
    }

    /// The target text of a symlink.
    pub fn read_link(&self, rel: &str) -> io::Result<PathBuf> {
        let (parent, name) = self.parent_dir(rel, false)?;
        std::fs::read_link(fd_path(parent.as_raw_fd()).join(name))
    }

    /// The entries of a directory (not following symlinks out), sorted by name, with what
    /// each one itself is. Names that are not UTF-8 are skipped. At most `max` entries.
    pub fn list(&self, rel: &str, max: usize) -> io::Result<Vec<(String, Metadata)>> {
        let dir = self.resolve(rel, libc::O_RDONLY | libc::O_DIRECTORY, true)?;
        // The magic link names the open directory itself; nothing is resolved by path.
        let mut out = Vec::new();
        for entry in std::fs::read_dir(fd_path(dir.as_raw_fd()))? {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if out.len() >= max {
                return Err(io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!("more than {max} entries"),
                ));
            }
            match entry.metadata() {
                Ok(m) => out.push((name, m)),
                // Gone between the listing and the stat.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Removes a file, symlink or whole directory tree (symlinks inside are removed, never
    /// followed). Missing is not an error.
    pub fn remove(&self, rel: &str) -> io::Result<()> {
        let (parent, name) = match self.parent_dir(rel, false) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let c = cstring(name.as_bytes())?;
        // SAFETY: valid fd and C string.
        let rc = unsafe { libc::unlinkat(parent.as_raw_fd(), c.as_ptr(), 0) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ENOENT) => Ok(()),
            // Relative to the parent we hold, never following a symlink, at any depth.
            Some(libc::EISDIR) => crate::deep_remove::remove_at(parent.as_raw_fd(), &c),
            _ => Err(err),
        }
    }

    /// Renames `rel` to `to_rel` under `to` (which may be this same directory), creating the
    /// destination's missing parents.
    pub fn rename(&self, rel: &str, to: &Beneath, to_rel: &str) -> io::Result<()> {
        let (from_parent, from_name) = self.parent_dir(rel, false)?;
        let (to_parent, to_name) = to.parent_dir(to_rel, true)?;
        let (a, b) = (cstring(from_name.as_bytes())?, cstring(to_name.as_bytes())?);
        // SAFETY: valid fds and C strings.
        let rc = unsafe {
            libc::renameat(
                from_parent.as_raw_fd(),
                a.as_ptr(),
                to_parent.as_raw_fd(),
                b.as_ptr(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The directory holding the last component of `rel`, reached without following any
    /// symlink (created when `create`), and that component's name.
    fn parent_dir<'a>(&self, rel: &'a str, create: bool) -> io::Result<(OwnedFd, &'a str)> {
        let (dirs, name) = match rel.rsplit_once('/') {
            Some((d, n)) => (Some(d), n),
            None => (None, rel),
        };
        if name.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the path names the directory itself",
            ));
        }
        let mut dir = self.root.try_clone()?;
        for part in dirs.into_iter().flat_map(|d| d.split('/')) {
            dir = self.child_dir(&dir, part, create)?.0;
        }
        Ok((dir, name))
    }

    /// Opens the directory `name` in `parent` without following a symlink, creating it when
    /// `create` and missing; true when it was created.
    fn child_dir(&self, parent: &OwnedFd, name: &str, create: bool) -> io::Result<(OwnedFd, bool)> {
        let open = || {
            let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
            open_at(parent.as_raw_fd(), name, flags, 0)
        };
        match open() {
            Ok(fd) => Ok((fd, false)),
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                let c = cstring(name.as_bytes())?;
                // SAFETY: valid fd and C string.
                let rc = unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o755) };
                if rc != 0 {
                    let err = io::Error::last_os_error();
                    if err.raw_os_error() != Some(libc::EEXIST) {
                        return Err(err);
                    }
                }
                let fd = open()?;
                self.hand_over(fd.as_raw_fd())?;
                Ok((fd, true))
            }
            Err(e) => Err(e),
        }
    }

    /// Opens `rel` with `flags`; `follow` lets the kernel follow symlinks that stay beneath.
    fn resolve(&self, rel: &str, flags: libc::c_int, follow: bool) -> io::Result<OwnedFd> {
        if rel.is_empty() {
            return reopen(&self.root, flags);
        }
        if follow && !NO_OPENAT2.load(Ordering::Relaxed) {
            match openat2_beneath(self.root.as_raw_fd(), rel, flags) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        let (parent, name) = self.parent_dir(rel, false)?;
        open_at(parent.as_raw_fd(), name, flags | libc::O_NOFOLLOW, 0)
    }

    fn hand_over(&self, fd: RawFd) -> io::Result<()> {
        match self.owner {
            // SAFETY: fchown on a descriptor we hold.
            Some(uid) if unsafe { libc::fchown(fd, uid, uid) } != 0 => {
                let err = io::Error::last_os_error();
                // An O_PATH descriptor cannot be chowned on old kernels; go by its magic link.
                if err.raw_os_error() == Some(libc::EBADF) {
                    std::os::unix::fs::chown(fd_path(fd), Some(uid), Some(uid))
                } else {
                    Err(err)
                }
            }
            _ => Ok(()),
        }
    }
}

fn openat2_beneath(dir: RawFd, rel: &str, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = cstring(rel.as_bytes())?;
    // SAFETY: open_how is plain data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    for _ in 0..OPENAT2_RETRIES {
        // SAFETY: valid fd, C string and open_how of the size we pass.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if rc >= 0 {
            let fd = RawFd::try_from(rc).map_err(|_| io::Error::other("fd out of range"))?;
            // SAFETY: a fresh descriptor the kernel just returned.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR | libc::EAGAIN) => continue,
            _ => return Err(err),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::Interrupted,
        "the path kept changing while it was resolved",
    ))
}

fn reopen(fd: &OwnedFd, flags: libc::c_int) -> io::Result<OwnedFd> {
    open_at(fd.as_raw_fd(), ".", flags, 0)
}

/// Opens `name` in the directory `dir` (a file it creates gets `mode`), close-on-exec and
/// retried when interrupted. `name` is resolved as `flags` say: this adds no `O_NOFOLLOW`.
pub(super) fn open_at(
    dir: RawFd,
    name: &str,
    flags: libc::c_int,
    mode: libc::c_uint,
) -> io::Result<OwnedFd> {
    let c = cstring(name.as_bytes())?;
    // SAFETY: a valid fd and C string; the result is owned below.
    let fd =
        retry_eintr(|| unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn regular(file: &File) -> io::Result<()> {
    let m = file.metadata()?;
    if m.is_file() {
        Ok(())
    } else if m.is_dir() {
        Err(io::Error::from_raw_os_error(libc::EISDIR))
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ))
    }
}

fn retry_eintr(mut f: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        let rc = f();
        if rc >= 0 {
            return Ok(rc);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `/proc/self/fd/N`: names the open file itself, whatever path led to it.
fn fd_path(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, Beneath, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let b = Beneath::open(&root, None).unwrap();
        (dir, b, root)
    }

    #[test]
    fn reads_follow_symlinks_only_while_beneath() {
        let (dir, b, root) = setup();
        std::fs::write(dir.path().join("secret"), b"host secret").unwrap();
        std::fs::write(root.join("real.txt"), b"inside").unwrap();
        symlink("real.txt", root.join("rel")).unwrap();
        symlink(dir.path().join("secret"), root.join("abs")).unwrap();
        symlink("../secret", root.join("up")).unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        symlink("../..", root.join("d/out")).unwrap();
        let read = |rel: &str| std::io::read_to_string(b.open_read(rel)?);
        assert_eq!(read("rel").unwrap(), "inside");
        for escape in ["abs", "up", "d/out/secret"] {
            let err = read(escape).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{escape}: {err}");
        }
    }

    #[test]
    fn writes_never_follow_a_symlink() {
        let (dir, b, root) = setup();
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, b"untouched").unwrap();
        symlink(&outside, root.join("link.txt")).unwrap();
        symlink(dir.path(), root.join("linkdir")).unwrap();
        std::fs::write(root.join("inner.txt"), b"inner").unwrap();
        symlink("inner.txt", root.join("inner-link")).unwrap();
        assert!(b.write("link.txt", b"x").is_err());
        assert!(b.write("linkdir/new.txt", b"x").is_err());
        assert!(b.write("inner-link", b"x").is_err());
        assert_eq!(std::fs::read(&outside).unwrap(), b"untouched");
        assert!(!dir.path().join("new.txt").exists());
        assert_eq!(std::fs::read(root.join("inner.txt")).unwrap(), b"inner");
        b.write("a/b/c.txt", b"made").unwrap();
        assert_eq!(std::fs::read(root.join("a/b/c.txt")).unwrap(), b"made");
    }

    #[test]
    fn a_fifo_never_blocks_the_host() {
        let (_dir, b, root) = setup();
        let fifo = CString::new(root.join("pipe").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        assert!(b.open_read("pipe").is_err());
        assert!(b.write("pipe", b"x").is_err());
    }

    #[test]
    fn open_entry_takes_files_and_directories_beneath_only() {
        let (dir, b, root) = setup();
        std::fs::write(dir.path().join("secret"), b"host").unwrap();
        symlink(dir.path().join("secret"), root.join("out")).unwrap();
        std::fs::write(root.join("f"), b"x").unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        symlink("f", root.join("in")).unwrap();
        let fifo = CString::new(root.join("pipe").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        for ok in ["f", "d", "in", ""] {
            assert!(b.open_entry(ok).is_ok(), "{ok}");
        }
        let err = b.open_entry("out").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{err}");
        assert!(b.open_entry("pipe").is_err());
    }

    #[test]
    fn remove_and_rename_stay_beneath() {
        let (dir, b, root) = setup();
        let keep = dir.path().join("keep");
        std::fs::create_dir(&keep).unwrap();
        std::fs::write(keep.join("f"), b"keep").unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        symlink(&keep, root.join("d/link")).unwrap();
        b.remove("d").unwrap();
        assert!(keep.join("f").exists(), "remove followed a symlink out");
        assert!(!root.join("d").exists());
        b.write("x/y.txt", b"y").unwrap();
        b.rename("x/y.txt", &b, "z/w.txt").unwrap();
        assert_eq!(std::fs::read(root.join("z/w.txt")).unwrap(), b"y");
        let names: Vec<String> = b.list("", 10).unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["x", "z"]);
        assert!(b.make_dirs("x").is_ok_and(|made| !made));
        assert!(b.make_dirs("q/r").is_ok_and(|made| made));
    }
}
