//! The helper's side of a sandbox's user namespace as root (see `id_range`): bwrap makes the
//! namespace (`--unshare-user`) and waits on [`MAP_BLOCK_FD`] (`--userns-block-fd`) while a
//! child of this helper, still the host's root, writes its maps; then bwrap carries on.
//!
//! The maps: the sandbox's ids 0‥65535 are the range's host ids, and id 65536
//! ([`HOST_ROOT_INSIDE`]) is the host's root. bwrap and the holders run as that id, the
//! host's root with no capability outside the namespace: so they still reach the private
//! directories they bind (an unmapped id could neither be their owner nor create a file),
//! and every command that enters drops from it to the sandbox user (host `base + 1000`).

use std::io;
use std::time::{Duration, Instant};

use super::helper::{cannot_enter, stdio_to_null, Failure};
use crate::sandbox::local::isolation::RANGE_SIZE;
use crate::sandbox::local::sys;

/// The fd bwrap waits on until its user namespace is mapped (named in its options).
pub(in crate::sandbox::local) const MAP_BLOCK_FD: libc::c_int = 12;
/// The id the host's root has inside a sandbox's user namespace.
pub(in crate::sandbox::local) const HOST_ROOT_INSIDE: u32 = RANGE_SIZE;
/// How long the mapper waits for bwrap's namespace to appear.
const MAP_WAIT: Duration = Duration::from_secs(10);

/// Leaves a pipe's read end on [`MAP_BLOCK_FD`] for the bwrap this helper execs next, and a
/// child that maps the user namespace bwrap's first child makes onto `base`, then lets bwrap
/// go on by writing to the pipe.
pub(super) fn map_for_bwrap(base: u32) -> Result<(), Failure> {
    let fail = |what: &str| cannot_enter(format!("{what}: {}", io::Error::last_os_error()));
    let mut pipe = [0; 2];
    // SAFETY: plain system calls on fds we own; this process is the helper, single-threaded,
    // so its child may allocate and read files.
    unsafe {
        if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) == -1 {
            return Err(fail("cannot make a pipe"));
        }
        let [read, write] = pipe;
        // Not close-on-exec: bwrap inherits it.
        if libc::dup2(read, MAP_BLOCK_FD) == -1 {
            return Err(fail("cannot hand on the namespace's pipe"));
        }
        libc::close(read);
        match libc::fork() {
            -1 => Err(fail("cannot fork")),
            0 => {
                libc::close(MAP_BLOCK_FD);
                // bwrap's report and complaints are read until they end: none held here.
                stdio_to_null();
                let bwrap = libc::getppid() as u32;
                let mapped = map_child_of(bwrap, base);
                // Written either way: a bwrap whose namespace could not be mapped then fails
                // on its own (it cannot make its root as an unmapped id) and says so.
                libc::write(write, [u8::from(mapped)].as_ptr().cast(), 1);
                libc::_exit(i32::from(!mapped))
            }
            _ => {
                libc::close(write);
                Ok(())
            }
        }
    }
}

/// Waits for a child of `parent` in a new user namespace and writes its maps.
fn map_child_of(parent: u32, base: u32) -> bool {
    let map = format!("0 {base} {RANGE_SIZE}\n{HOST_ROOT_INSIDE} 0 1\n");
    let deadline = Instant::now() + MAP_WAIT;
    while Instant::now() < deadline {
        let children = sys::proc_pids()
            .into_iter()
            .flatten()
            .filter(|&pid| sys::proc_ppid(pid) == Some(parent));
        for child in children {
            // Refused for a process still in our own namespace: not the one bwrap makes.
            let write = |file: &str| std::fs::write(format!("/proc/{child}/{file}"), &map);
            if write("uid_map").is_ok() && write("gid_map").is_ok() {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}
