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
//! host stays as the image made it, shared by every sandbox of that image.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::helper::{cannot_enter, Failure};
use crate::sandbox::local::isolation::RANGE_SIZE;

// From the kernel's `linux/mount.h`.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// `struct mount_attr`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Mounts `rootfs` read-only, idmapped onto `base`, at `layer/lower`, and an overlay of it
/// with `layer/upper` at `layer/merged`, in a mount namespace this helper makes its own.
pub(super) fn mount(rootfs: &OsStr, layer: &OsStr, base: u32) -> Result<(), Failure> {
    let fail = |what: &str| cannot_enter(format!("{what}: {}", io::Error::last_os_error()));
    let layer = Path::new(layer);
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(cannot_enter);
    let (rootfs, lower) = (c(Path::new(rootfs))?, c(&layer.join("lower"))?);
    let merged = c(&layer.join("merged"))?;
    // Overlay's options name paths separated by `,` and `:`: none may hold either.
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        layer.join("lower").display(),
        layer.join("upper").display(),
        layer.join("work").display()
    );
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
    let options = CString::new(options).map_err(cannot_enter)?;
    // SAFETY: plain system calls on C strings and fds we own; this process is the helper,
    // single-threaded, so its child may allocate.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) == -1 {
            return Err(fail("cannot make a mount namespace for the image"));
        }
        // Nothing mounted here reaches the host's namespace.
        let private = libc::MS_REC | libc::MS_PRIVATE;
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            private,
            std::ptr::null(),
        ) == -1
        {
            return Err(fail("cannot make the image's mounts private"));
        }
        let userns = idmap_namespace(base)?;
        let tree = libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            rootfs.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
        );
        if tree < 0 {
            return Err(fail("cannot open the image's tree"));
        }
        let tree = OwnedFd::from_raw_fd(tree as RawFd);
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            attr_clr: 0,
            propagation: 0,
            userns_fd: std::os::fd::AsRawFd::as_raw_fd(&userns) as u64,
        };
        let set = libc::syscall(
            libc::SYS_mount_setattr,
            std::os::fd::AsRawFd::as_raw_fd(&tree),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        );
        if set != 0 {
            return Err(fail("cannot map the image's ids onto the sandbox's"));
        }
        let moved = libc::syscall(
            libc::SYS_move_mount,
            std::os::fd::AsRawFd::as_raw_fd(&tree),
            c"".as_ptr(),
            libc::AT_FDCWD,
            lower.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        );
        if moved != 0 {
            return Err(fail("cannot mount the image"));
        }
        let flags = libc::MS_NOSUID | libc::MS_NODEV;
        let overlay = c"overlay".as_ptr();
        if libc::mount(
            overlay,
            merged.as_ptr(),
            overlay,
            flags,
            options.as_ptr().cast(),
        ) == -1
        {
            return Err(fail("cannot mount the task's layer over the image"));
        }
    }
    Ok(())
}

/// A user namespace mapping ids 0‥65535 onto `base`, for an idmapped mount: made by a child
/// that unshares one and waits, mapped from here, opened, and the child killed.
unsafe fn idmap_namespace(base: u32) -> Result<OwnedFd, Failure> {
    let fail = |what: &str| cannot_enter(format!("{what}: {}", io::Error::last_os_error()));
    let mut pipe = [0; 2];
    if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) == -1 {
        return Err(fail("cannot make a pipe"));
    }
    let [read, write] = pipe;
    let child = libc::fork();
    if child == -1 {
        return Err(fail("cannot fork"));
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
    let map = format!("0 {base} {RANGE_SIZE}\n");
    let opened = (|| {
        if got != 1 || ready[0] != 1 {
            return Err(cannot_enter(
                "cannot make a user namespace for the image's ids",
            ));
        }
        for file in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{child}/{file}"), &map)
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
