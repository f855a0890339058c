//! One eval at a time per output directory: an exclusive `flock` on `DIR/eval.lock`, held
//! for the whole run. The kernel drops the lock with the process, so a crash never leaves it
//! stale; the file keeps the holder's pid only so a refused run can say who holds it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file's name inside the output directory.
pub const LOCK_FILE: &str = "eval.lock";
/// A pid is a few digits; anything longer in the file is not ours.
const MAX_PID_TEXT: u64 = 32;

#[derive(Debug, thiserror::Error)]
pub enum RunLockError {
    #[error("another eval ({}) is writing to {dir}: wait for it to finish, or choose another --out", holder_text(*.pid))]
    Held { dir: PathBuf, pid: Option<u32> },
    #[error("cannot lock {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn holder_text(pid: Option<u32>) -> String {
    pid.map_or_else(|| "pid unknown".to_string(), |p| format!("pid {p}"))
}

/// Held until dropped (closing the file releases the lock).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

/// Takes the output directory's lock without waiting, or says who holds it.
pub fn lock_out_dir(dir: &Path) -> Result<RunLock, RunLockError> {
    let path = dir.join(LOCK_FILE);
    let io = |source| RunLockError::Io {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    loop {
        // SAFETY: flock on a descriptor this function owns; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                return Err(RunLockError::Held {
                    dir: dir.to_path_buf(),
                    pid: holder(&mut file),
                })
            }
            _ => return Err(io(e)),
        }
    }
    // Emptied first, then one small write: a reader sees no pid or the whole pid.
    file.set_len(0)
        .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()))
        .map_err(io)?;
    Ok(RunLock { _file: file })
}

/// The pid the holder wrote, if it wrote one yet.
fn holder(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.take(MAX_PID_TEXT).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_out_dir(dir.path()).unwrap();
        match lock_out_dir(dir.path()) {
            Err(RunLockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        drop(first);
        lock_out_dir(dir.path()).unwrap();
    }
}
