//! One program of the bundle build (`npm ci`, `node build.mjs`) run to its end: in its own
//! process group, killed with everything it started at a deadline, its output kept bounded
//! (the head of stdout, which carries the build's report; the tail of stderr, for the error).

use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Bytes of stderr quoted in an error.
const STDERR_TAIL: usize = 4096;

/// Bytes of stdout kept: the build's one-line report is far smaller.
const STDOUT_HEAD: usize = 64 * 1024;

/// How a program ended.
pub(crate) struct Finished {
    /// `None`: killed at the deadline.
    pub status: Option<ExitStatus>,
    pub stdout: Vec<u8>,
    pub stderr_tail: String,
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) until it exits or `deadline`
/// passes. An error is a failure to start or to wait for it: `NotFound` means no such
/// program.
pub(crate) fn run_until(cmd: &mut Command, deadline: Instant) -> io::Result<Finished> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // its own process group, so a timeout kills it and everything it started
        .process_group(0);
    let mut child = cmd.spawn()?;
    let out = drain(child.stdout.take(), Keep::Head(STDOUT_HEAD));
    let err = drain(child.stderr.take(), Keep::Tail(STDERR_TAIL));
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() >= deadline => {
                // SAFETY: kill(2) on the process group the child leads; no memory is involved.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        }
    };
    Ok(Finished {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr_tail: tail(&err.join().unwrap_or_default()),
    })
}

/// Which part of a stream is kept.
#[derive(Clone, Copy)]
enum Keep {
    Head(usize),
    Tail(usize),
}

fn drain<R: Read + Send + 'static>(
    stream: Option<R>,
    keep: Keep,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let Some(mut s) = stream else {
            return kept;
        };
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => match keep {
                    Keep::Head(max) => {
                        let room = max.saturating_sub(kept.len());
                        kept.extend_from_slice(&buf[..n.min(room)]);
                    }
                    Keep::Tail(max) => {
                        kept.extend_from_slice(&buf[..n]);
                        if kept.len() > 4 * max {
                            kept.drain(..kept.len() - max);
                        }
                    }
                },
            }
        }
        kept
    })
}

fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(STDERR_TAIL);
    let text = String::from_utf8_lossy(&bytes[start..]);
    let text = text.trim();
    if text.is_empty() {
        "(nothing was written to stderr)".to_string()
    } else {
        text.to_string()
    }
}
