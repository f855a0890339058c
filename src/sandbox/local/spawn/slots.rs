//! The groups of low descriptor numbers and the stacks that starts take turns with (see
//! `spawn`): made once, early, and handed from start to start.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock};

use crossbeam_channel::{Receiver, Sender};

use super::dup_onto;
use crate::sync::lock;

/// How many starts may be under way at once (each holds a group only until its child execs).
/// A direct entry (see `entry`) holds its group while it joins the sandbox and makes the
/// command's network namespace, which the kernel serializes and which takes milliseconds
/// while others are torn down: enough groups that starts into other sandboxes need not wait.
pub(super) const GROUPS: usize = 32;
/// The stacks of a start: the child's on the upper half, and on the lower the command's that
/// a direct entry's child starts (see `entry`) while it waits, its frames above. Each makes
/// a few system calls and nothing else.
const STACK_BYTES: usize = 128 * 1024;
/// One page below the stack that faults instead of letting an overflow write past it.
const GUARD_BYTES: usize = 4096;

/// The groups of slots, the `/dev/null` they hold when free, and the mark below which the
/// child's table is copied.
pub(super) struct Slots {
    devnull: OwnedFd,
    pub keep_below: libc::c_uint,
    free_tx: Sender<Group>,
    free_rx: Receiver<Group>,
}

/// Three low descriptor numbers and a stack, used by one start at a time.
pub(super) struct Group {
    pub fds: [RawFd; 3],
    pub stack_top: *mut libc::c_void,
    pub command_stack_top: *mut libc::c_void,
}

// SAFETY: a group is handed from thread to thread whole; its stack is only used by the child
// of the start that holds it.
unsafe impl Send for Group {}

impl Slots {
    pub(super) fn take(&self) -> Group {
        // `free_tx` lives as long as `self`, so the channel never disconnects.
        match self.free_rx.recv() {
            Ok(group) => group,
            Err(_) => unreachable!("the slot channel's sender lives in the same static"),
        }
    }

    /// Puts /dev/null back into the group's slots and frees it. A slot that cannot take it
    /// (dup3 onto a number we hold fails only on a broken kernel) is closed instead, so no
    /// later child gets this one's pipe nor does the pipe stay open here, and the group is
    /// retired: its numbers may be reused by anything now.
    pub(super) fn give_back(&self, group: Group) {
        let mut intact = true;
        for &slot in &group.fds {
            if dup_onto(self.devnull.as_raw_fd(), slot).is_err() {
                // SAFETY: the slot is ours; nothing else refers to its number.
                unsafe { libc::close(slot) };
                intact = false;
            }
        }
        if intact {
            let _ = self.free_tx.send(group);
        }
    }
}

/// The slots, made at the first start (early, while few descriptors are open, so they are
/// low). A failure (no descriptor left, say) is not kept: the next start tries again.
pub(super) fn slots() -> io::Result<&'static Slots> {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    static MAKING: Mutex<()> = Mutex::new(());
    if let Some(slots) = SLOTS.get() {
        return Ok(slots);
    }
    let _one_maker = lock(&MAKING);
    if let Some(slots) = SLOTS.get() {
        return Ok(slots);
    }
    let made = make_slots()
        .map_err(|e| io::Error::new(e.kind(), format!("preparing to start processes: {e}")))?;
    Ok(SLOTS.get_or_init(|| made))
}

fn make_slots() -> io::Result<Slots> {
    let devnull = OwnedFd::from(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")?,
    );
    // Owned until every one exists, so a failure part way closes those made.
    let mut fds = Vec::with_capacity(3 * GROUPS);
    for _ in 0..3 * GROUPS {
        // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor, the lowest free from 3.
        let fd = unsafe { libc::fcntl(devnull.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: new, and ours.
        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let stacks = (0..GROUPS)
        .map(|_| map_stack())
        .collect::<io::Result<Vec<_>>>()?;
    let highest = fds.iter().map(AsRawFd::as_raw_fd).max().unwrap_or(2);
    // From here the numbers are the groups' for the life of the process.
    let mut fds = fds.into_iter().map(IntoRawFd::into_raw_fd);
    let (free_tx, free_rx) = crossbeam_channel::bounded(GROUPS);
    for stack_top in stacks {
        let mut group = [-1; 3];
        for (slot, fd) in group.iter_mut().zip(fds.by_ref()) {
            *slot = fd;
        }
        let _ = free_tx.send(Group {
            fds: group,
            stack_top,
            // SAFETY: halfway down the same mapping.
            command_stack_top: unsafe { stack_top.cast::<u8>().sub(STACK_BYTES / 2) }.cast(),
        });
    }
    Ok(Slots {
        devnull,
        keep_below: (highest + 1) as libc::c_uint,
        free_tx,
        free_rx,
    })
}

/// A stack for the child (kept for the life of the process; one whose group was never made
/// stays mapped, 132 KiB), with a guard page below it.
fn map_stack() -> io::Result<*mut libc::c_void> {
    // SAFETY: a new anonymous private mapping, which nothing else refers to.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            GUARD_BYTES + STACK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the first page of the mapping just made.
    if unsafe { libc::mprotect(base, GUARD_BYTES, libc::PROT_NONE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: one past the end of the mapping: where a downward-growing stack starts.
    Ok(unsafe { base.cast::<u8>().add(GUARD_BYTES + STACK_BYTES) }.cast())
}
