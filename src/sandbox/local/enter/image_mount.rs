//! The helper's side of an image root (see `image_root`): before it execs a task holder, the
//! helper gives itself a mount namespace of its own, mounts the unpacked image there
//! read-only and *idmapped* onto the sandbox's id range, and a writable overlay over it in
//! the task namespace's layer directory; the holder's bwrap then binds that overlay as its
//! root.
//!
//! Done here, as the host's root in the host's user namespace, because an idmapped mount of
//! a host directory takes that (a sandbox's own user namespace may not make one), and
//! because the mounts must exist before bwrap, which cannot mount an overlay, starts.
//!
//! The idmapping: the image's ids 0‥65535 are the sandbox's ids 0‥65535 (host `base + id`),
//! so what the image's root owns is the sandbox's root's, which no task process ever is: the
//! agent cannot change the image's programs under the verifier, and the unpacked tree on the
//! host stays as the image made it, shared by every sandbox of that image. The image's
//! working directory alone is mounted again over itself with the image's user (its root,
//! unless it names another) as the sandbox user: tasks work there as they would in a
//! container of the image.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::helper::{cannot_enter, Failure};
use crate::sandbox::local::isolation::{RANGE_SIZE, SANDBOX_UID};

// From the kernel's `linux/mount.h`.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// `struct mount_attr`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// What to mount (see `request::ImageMount`).
pub(super) struct Spec<'a> {
    pub rootfs: &'a OsStr,
    pub layer: &'a OsStr,
    pub base: u32,
    /// The image's working directory, relative to its root, if it has one.
    pub workdir: Option<&'a OsStr>,
    /// The image id the sandbox user stands for in the working directory.
    pub user: u32,
}

fn failed(what: &str) -> Failure {
    cannot_enter(format!("{what}: {}", io::Error::last_os_error()))
}

fn c_path(p: &Path) -> Result<CString, Failure> {
    CString::new(p.as_os_str().as_bytes()).map_err(cannot_enter)
}

/// The image at `layer/merged`: `rootfs` read-only and idmapped at `layer/lower` beneath
/// `layer/upper`, and its working directory's own overlay (`layer/w*`) over itself, in a
/// mount namespace this helper makes its own.
pub(super) fn mount(spec: &Spec<'_>) -> Result<(), Failure> {
    let layer = Path::new(spec.layer);
    // Overlay's options name paths separated by `,` and `:`: none may hold either.
    if layer
        .as_os_str()
        .as_bytes()
        .iter()
        .any(|b| b",:\\".contains(b))
    {
        return Err(cannot_enter(
            "a layer directory whose path overlay cannot name",
        ));
    }
    // SAFETY: plain system calls on C strings and fds we own; this process is the helper,
    // single-threaded, so its children may allocate.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) == -1 {
            return Err(failed("cannot make a mount namespace for the image"));
        }
        // Nothing mounted here reaches the host's namespace.
        let private = libc::MS_REC | libc::MS_PRIVATE;
        let null = std::ptr::null();
        if libc::mount(null, c"/".as_ptr(), null, private, null.cast()) == -1 {
            return Err(failed("cannot make the image's mounts private"));
        }
        let rootfs = open_dir(&c_path(Path::new(spec.rootfs))?)?;
        let userns = idmap_namespace(&id_map(spec.base, None))?;
        let tree = clone_tree(&rootfs, AT_RECURSIVE)?;
        set_idmap(&tree, &userns)?;
        move_to(&tree, libc::AT_FDCWD, &c_path(&layer.join("lower"))?, 0)?;
        overlay(layer, "", "lower")?;
        let Some(dir) = spec.workdir.filter(|d| !d.is_empty()) else {
            return Ok(());
        };
        let dir = CString::new(dir.as_bytes()).map_err(cannot_enter)?;
        // Through no symlink of the image's, in either tree: one could name any host path.
        let source = beneath(&rootfs, &dir)?;
        let userns = idmap_namespace(&id_map(spec.base, Some(spec.user)))?;
        let tree = clone_tree(&source, AT_RECURSIVE)?;
        set_idmap(&tree, &userns)?;
        move_to(&tree, libc::AT_FDCWD, &c_path(&layer.join("wlower"))?, 0)?;
        overlay(layer, "w", "wlower")?;
        let merged = open_dir(&c_path(&layer.join("merged"))?)?;
        let target = beneath(&merged, &dir)?;
        let top = clone_tree(&open_dir(&c_path(&layer.join("wmerged"))?)?, 0)?;
        move_to(&top, target.as_raw_fd(), c"", MOVE_MOUNT_T_EMPTY_PATH)
    }
}

/// Mounts the overlay of `layer/<lower>` beneath `layer/<prefix>upper` at
/// `layer/<prefix>merged` (`<prefix>merged` for the root: `merged`).
unsafe fn overlay(layer: &Path, prefix: &str, lower: &str) -> Result<(), Failure> {
    let part = |name: &str| layer.join(format!("{prefix}{name}"));
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        layer.join(lower).display(),
        part("upper").display(),
        part("work").display()
    );
    let options = CString::new(options).map_err(cannot_enter)?;
    let at = c_path(&part("merged"))?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    let fs = c"overlay".as_ptr();
    if libc::mount(fs, at.as_ptr(), fs, flags, options.as_ptr().cast()) == -1 {
        return Err(failed("cannot mount the task's layer over the image"));
    }
    Ok(())
}

/// A detached copy of the mount tree at `dir` (`AT_RECURSIVE`: with the mounts beneath it).
unsafe fn clone_tree(dir: &OwnedFd, recursive: libc::c_uint) -> Result<OwnedFd, Failure> {
    let flags = OPEN_TREE_CLONE
        | libc::O_CLOEXEC as libc::c_uint
        | libc::AT_EMPTY_PATH as libc::c_uint
        | recursive;
    let fd = libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), c"".as_ptr(), flags);
    if fd < 0 {
        return Err(failed("cannot open the image's tree"));
    }
    Ok(OwnedFd::from_raw_fd(fd as RawFd))
}

/// Maps `tree`'s ids through `userns`, read-only, without set-id programs or devices.
unsafe fn set_idmap(tree: &OwnedFd, userns: &OwnedFd) -> Result<(), Failure> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let set = libc::syscall(
        libc::SYS_mount_setattr,
        tree.as_raw_fd(),
        c"".as_ptr(),
        libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
        &attr as *const MountAttr,
        std::mem::size_of::<MountAttr>(),
    );
    if set != 0 {
        return Err(failed("cannot map the image's ids onto the sandbox's"));
    }
    Ok(())
}

/// Attaches the detached mount `tree` at `path` beneath `dir` (with `T_EMPTY_PATH`: at
/// `dir` itself).
unsafe fn move_to(
    tree: &OwnedFd,
    dir: RawFd,
    path: &CStr,
    flags: libc::c_uint,
) -> Result<(), Failure> {
    let moved = libc::syscall(
        libc::SYS_move_mount,
        tree.as_raw_fd(),
        c"".as_ptr(),
        dir,
        path.as_ptr(),
        MOVE_MOUNT_F_EMPTY_PATH | flags,
    );
    if moved != 0 {
        return Err(failed("cannot mount the image"));
    }
    Ok(())
}

unsafe fn open_dir(path: &CStr) -> Result<OwnedFd, Failure> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    let fd = libc::open(path.as_ptr(), flags);
    if fd < 0 {
        return Err(failed(&format!("cannot open {}", path.to_string_lossy())));
    }
    Ok(OwnedFd::from_raw_fd(fd))
}

/// The directory `rel` beneath `dir`, reached through no symlink and never out of `dir`.
unsafe fn beneath(dir: &OwnedFd, rel: &CStr) -> Result<OwnedFd, Failure> {
    let mut how: libc::open_how = std::mem::zeroed();
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    let fd = libc::syscall(
        libc::SYS_openat2,
        dir.as_raw_fd(),
        rel.as_ptr(),
        &how as *const libc::open_how,
        std::mem::size_of::<libc::open_how>(),
    );
    if fd < 0 {
        let what = format!(
            "the image's working directory /{} is no plain directory of it",
            rel.to_string_lossy()
        );
        return Err(failed(&what));
    }
    Ok(OwnedFd::from_raw_fd(fd as RawFd))
}

/// The uid and gid map of an idmapped mount onto the sandbox's range at `base`: the image's
/// id `n` is the sandbox's `n`, except that with `user`, the image's `user` is the sandbox
/// user and the image's id of the sandbox user's number takes `user`'s place.
fn id_map(base: u32, user: Option<u32>) -> String {
    let Some(u) = user.filter(|&u| u != SANDBOX_UID && u < RANGE_SIZE) else {
        return format!("0 {base} {RANGE_SIZE}\n");
    };
    let (lo, hi) = (u.min(SANDBOX_UID), u.max(SANDBOX_UID));
    let mut map = String::new();
    for (inside, to, count) in [
        (0, 0, lo),
        (lo, hi, 1),
        (lo + 1, lo + 1, hi - lo - 1),
        (hi, lo, 1),
        (hi + 1, hi + 1, RANGE_SIZE - hi - 1),
    ] {
        if count > 0 {
            map.push_str(&format!("{inside} {} {count}\n", base + to));
        }
    }
    map
}

/// A user namespace with `map` as its uid and gid maps, for an idmapped mount: made by a
/// child that unshares one and waits, mapped from here, opened, and the child killed.
unsafe fn idmap_namespace(map: &str) -> Result<OwnedFd, Failure> {
    let mut pipe = [0; 2];
    if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) == -1 {
        return Err(failed("cannot make a pipe"));
    }
    let [read, write] = pipe;
    let child = libc::fork();
    if child == -1 {
        return Err(failed("cannot fork"));
    }
    if child == 0 {
        libc::close(read);
        let ok = libc::unshare(libc::CLONE_NEWUSER) == 0;
        libc::write(write, [u8::from(ok)].as_ptr().cast(), 1);
        // Killed once its namespace is opened.
        loop {
            libc::pause();
        }
    }
    libc::close(write);
    let mut ready = [0u8; 1];
    let got = libc::read(read, ready.as_mut_ptr().cast(), 1);
    libc::close(read);
    let opened = (|| {
        if got != 1 || ready[0] != 1 {
            return Err(cannot_enter(
                "cannot make a user namespace for the image's ids",
            ));
        }
        for file in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{child}/{file}"), map)
                .map_err(|e| cannot_enter(format!("cannot map the image's ids: {e}")))?;
        }
        std::fs::File::open(format!("/proc/{child}/ns/user"))
            .map(OwnedFd::from)
            .map_err(|e| cannot_enter(format!("cannot open the image's id map: {e}")))
    })();
    libc::kill(child, libc::SIGKILL);
    libc::waitpid(child, std::ptr::null_mut(), 0);
    opened
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_working_directory_map_swaps_the_images_user_and_the_sandbox_user() {
        assert_eq!(id_map(100_000, None), "0 100000 65536\n");
        assert_eq!(id_map(100_000, Some(1000)), "0 100000 65536\n");
        assert_eq!(
            id_map(100_000, Some(0)),
            "0 101000 1\n1 100001 999\n1000 100000 1\n1001 101001 64535\n"
        );
        assert_eq!(
            id_map(100_000, Some(2000)),
            "0 100000 1000\n1000 102000 1\n1001 101001 999\n2000 101000 1\n2001 102001 63535\n"
        );
    }
}
