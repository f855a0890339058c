//! Reading what a starting process reports on a pipe (a namespace holder's bwrap, slirp4netns
//! once it is ready), bounded in time and bytes.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::sys;

/// Bytes of a starting process's report we read at most.
const MAX_INFO: usize = 4096;

/// Reads `src` into `buf` until `done(buf)`, end of file or [`MAX_INFO`] bytes; false if
/// `deadline` passed first.
pub(super) fn read_until(
    src: &mut (impl Read + AsRawFd),
    buf: &mut Vec<u8>,
    deadline: Instant,
    done: impl Fn(&[u8]) -> bool,
) -> bool {
    let mut chunk = [0u8; 512];
    while buf.len() < MAX_INFO && !done(buf) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut fds = [libc::pollfd {
            fd: src.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        match sys::poll(&mut fds, left) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(_) => break,
        }
        match src.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    true
}
