//! A child's output pipes and its exit, watched from one thread with poll(2).
//!
//! A background process costs one thread (not a reader per pipe plus a waiter), and a
//! foreground command none: its caller's thread does the watching. At a thousand live
//! sandboxes the difference is thousands of threads.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::spawn::Child;
use super::sys;

/// Index of stdout in what a watch hands its sink; stderr's is 1.
pub(super) const STDOUT: usize = 0;
/// Read size: large, because a runner may stream megabytes of frames.
const READ_CHUNK: usize = 64 * 1024;
/// How often an exit is looked for where the kernel offers no pidfd to wait on.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// The stdout and stderr of one unreaped child, and whether it has exited.
pub(super) struct Watch {
    pid: u32,
    pipes: [Option<OwnedFd>; 2],
    /// Readable once the child has exited; `None` where the kernel has no pidfds, and exits
    /// are then looked for every [`EXIT_POLL`].
    pidfd: Option<OwnedFd>,
    exited: bool,
    /// Room for one read, never zeroed: a page of it is touched only once a read reaches
    /// it, so a process that prints little (a runner's frames) costs a page or two, not 64 KiB.
    buf: Vec<u8>,
}

impl Watch {
    /// Takes the child's stdout and stderr pipes. The child must not be reaped yet, so its
    /// pid still names it.
    pub fn new(child: &mut Child) -> Watch {
        let pid = child.id();
        Watch {
            pid,
            pipes: [
                child.stdout.take().map(OwnedFd::from),
                child.stderr.take().map(OwnedFd::from),
            ],
            pidfd: sys::pidfd_open(pid),
            exited: false,
            buf: Vec::with_capacity(READ_CHUNK),
        }
    }

    /// Whether the child has exited (it stays a zombie until its owner reaps it).
    pub fn exited(&self) -> bool {
        self.exited
    }

    /// Whether a pipe is still open: the child, or something that inherited the pipe, may
    /// still write.
    pub fn pipes_open(&self) -> bool {
        self.pipes.iter().any(Option::is_some)
    }

    /// Waits at most `within` for output or the exit, and hands what it reads to `sink` as
    /// (stream, bytes). Whether anything was read.
    pub fn step(
        &mut self,
        within: Duration,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<bool> {
        let mut fds = [pollfd(-1); 3];
        for (slot, pipe) in fds.iter_mut().zip(&self.pipes) {
            if let Some(fd) = pipe {
                *slot = pollfd(fd.as_raw_fd());
            }
        }
        let mut within = within;
        if !self.exited {
            match &self.pidfd {
                Some(fd) => fds[2] = pollfd(fd.as_raw_fd()),
                None => within = within.min(EXIT_POLL),
            }
        }
        // poll(2) skips negative descriptors, so closed pipes stay in their slots.
        sys::poll(&mut fds, within)?;
        let mut read_any = false;
        for (stream, fd) in fds[..2].iter().enumerate() {
            if fd.revents != 0 {
                read_any |= self.read(stream, sink);
            }
        }
        if !self.exited {
            self.exited = match self.pidfd {
                Some(_) => fds[2].revents != 0,
                None => sys::exited_keep_zombie(self.pid)?,
            };
        }
        Ok(read_any)
    }

    /// Reads what the pipes still carry until both are closed or `grace` has passed: with
    /// `quiet` the grace counts from the last read (output still moving is waited for),
    /// otherwise from now.
    pub fn drain(
        &mut self,
        grace: Duration,
        quiet: bool,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<()> {
        let mut until = Instant::now() + grace;
        while self.pipes_open() {
            let left = until.saturating_duration_since(Instant::now());
            // Past the grace one last look, without waiting, still takes what the pipes
            // already hold: on a busy host the grace can pass before this thread runs.
            let read = self.step(left, sink)?;
            if left.is_zero() {
                break;
            }
            if read && quiet {
                until = Instant::now() + grace;
            }
        }
        Ok(())
    }

    /// Reads and drops whatever the pipes carry until both are closed, so that a process
    /// which inherited them and outlived the child never meets a broken pipe.
    pub fn discard_until_closed(mut self) {
        const LONG: Duration = Duration::from_secs(3600);
        while self.pipes_open() {
            if self.step(LONG, &mut |_, _| {}).is_err() {
                return;
            }
        }
    }

    /// One read from a pipe poll(2) flagged; closes it at end of file or on an error.
    fn read(&mut self, stream: usize, sink: &mut dyn FnMut(usize, &[u8])) -> bool {
        let Some(fd) = &self.pipes[stream] else {
            return false;
        };
        self.buf.clear();
        // SAFETY: reads at most the buffer's capacity into it, from a descriptor we own.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                self.buf.as_mut_ptr().cast(),
                self.buf.capacity(),
            )
        };
        match usize::try_from(n) {
            Ok(0) => self.pipes[stream] = None,
            Ok(n) => {
                // SAFETY: the read initialized the first `n` bytes, within the capacity.
                unsafe { self.buf.set_len(n) };
                sink(stream, &self.buf);
                return true;
            }
            Err(_) => {
                let err = io::Error::last_os_error();
                if !matches!(
                    err.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) {
                    // EIO and the like: the stream is over either way.
                    self.pipes[stream] = None;
                }
            }
        }
        false
    }
}

fn pollfd(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::super::spawn::{Io, Spawn};
    use super::*;

    /// Output a child wrote before its exit is taken even when the grace is already over by
    /// the time the drain runs (a busy host).
    #[test]
    fn a_drain_past_its_grace_still_takes_what_the_pipes_hold() {
        let mut child = Spawn::new("/bin/sh")
            .args(["-c", "printf out; printf err >&2"])
            .stdout(Io::Piped)
            .stderr(Io::Piped)
            .spawn()
            .unwrap();
        let mut watch = Watch::new(&mut child);
        sys::wait_exit_keep_zombie(child.id()).unwrap();
        let mut got = [Vec::new(), Vec::new()];
        watch
            .drain(Duration::ZERO, false, &mut |stream, data| {
                got[stream].extend_from_slice(data)
            })
            .unwrap();
        assert_eq!(got, [b"out".to_vec(), b"err".to_vec()]);
        assert!(watch.exited());
        child.wait().unwrap();
    }
}
