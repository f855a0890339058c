//! The last steps of a sandbox command before its exec, once it has joined its sandbox,
//! whichever way it was started (`spawn`'s direct entry, or the helper's `enter`): a network
//! of its own where it gets one, no privilege it could regain, the sandbox's umask, the
//! system-call filter.
//!
//! Raw system calls only, and never a glibc wrapper that acts for the whole process: the
//! direct entry runs these in a child that shares its parent's memory (`CLONE_VM`), where
//! glibc's `setresuid` would carry the id change to every thread of the parent (its set-id
//! broadcast), whose threads it believes are its own.

use std::io;

use super::isolation::Identity;
use super::seccomp;
use super::sys::check;

/// Turns this process, inside its sandbox, into the command about to be exec'd. On failure,
/// what to say on stderr (the errno of the failed call is still set).
///
/// # Safety
/// Only in a process about to exec: it changes this task's ids, capabilities and filter for
/// good.
pub(super) unsafe fn become_command(
    own_network: bool,
    drop_to: Option<Identity>,
) -> Result<(), &'static [u8]> {
    if own_network && (libc::unshare(libc::CLONE_NEWNET) == -1 || loopback_up().is_err()) {
        return Err(b"wmo-e2b: cannot make the command's network namespace\n");
    }
    if drop_privileges(drop_to).is_err() {
        return Err(b"wmo-e2b: cannot drop the command's privileges\n");
    }
    // What a task makes is its group's to write too, so the verifier (a member of that
    // group, see `isolation::VERIFIER_UID`) may build and write where the agent worked; an
    // agent that takes that away only fails its own verify.
    libc::umask(0o002);
    if seccomp::install().is_err() {
        return Err(b"wmo-e2b: cannot filter the command's system calls\n");
    }
    Ok(())
}

/// What `setpriv --reuid --regid --clear-groups --inh-caps=-all --bounding-set=-all
/// --no-new-privs` does, as bwrap does for the processes it starts: nothing the command
/// execs can gain a privilege.
unsafe fn drop_privileges(drop_to: Option<Identity>) -> io::Result<()> {
    // The bounding set first: emptying it takes CAP_SETPCAP, which the uid change ends.
    for cap in 0..64 {
        if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) == -1 {
            match io::Error::last_os_error().raw_os_error() {
                // Past the last capability this kernel knows.
                Some(libc::EINVAL) => break,
                _ => return Err(io::Error::last_os_error()),
            }
        }
    }
    if let Some(Identity { uid, group }) = drop_to {
        let (count, list) = match &group {
            Some(g) => (1usize, g as *const libc::gid_t),
            None => (0, std::ptr::null()),
        };
        check(libc::syscall(libc::SYS_setgroups, count, list))?;
        check(libc::syscall(libc::SYS_setresgid, uid, uid, uid))?;
        check(libc::syscall(libc::SYS_setresuid, uid, uid, uid))?;
    }
    set_capabilities(0)?;
    check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
}

/// Makes the effective and permitted sets `keep` (of the first 32 capabilities) and the
/// inheritable set empty (`capset` v3), for this task alone.
pub(super) unsafe fn set_capabilities(keep: u32) -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let none = Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    };
    let data = [
        Data {
            effective: keep,
            permitted: keep,
            inheritable: 0,
        },
        none,
    ];
    check(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()))
}

/// Brings up the loopback device of a new network namespace (it starts down).
unsafe fn loopback_up() -> io::Result<()> {
    let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    if sock == -1 {
        return Err(io::Error::last_os_error());
    }
    let mut req: libc::ifreq = std::mem::zeroed();
    for (to, from) in req.ifr_name.iter_mut().zip(b"lo") {
        *to = *from as libc::c_char;
    }
    let mut result = check(libc::ioctl(sock, libc::SIOCGIFFLAGS as _, &mut req));
    if result.is_ok() {
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        result = check(libc::ioctl(sock, libc::SIOCSIFFLAGS as _, &req));
    }
    libc::close(sock);
    result
}
