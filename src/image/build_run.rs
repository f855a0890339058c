//! One step of a build (the builder's `build`, `push`, `rmi`) run to its end: its stdout and
//! stderr, merged in the order written, appended to the build's log and never to the
//! terminal; in a process group of its own that a deadline kills whole; killed too when
//! wmo-e2b dies, so a build never outlives the run that asked for it.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Bytes of builder output one build's log takes; the rest is counted, not kept.
pub const MAX_LOG_BYTES: u64 = 64 << 20;
/// Bytes of the log's end kept in memory, to quote in an error.
const TAIL_BYTES: usize = 8 << 10;
/// Lines of the log's end quoted in an error, and the characters of each.
pub const TAIL_LINES: usize = 20;
const TAIL_LINE_CHARS: usize = 300;
/// How long the log's reader may take to see the end once the step is gone: a process that
/// escaped the group may hold the pipe open, and the step is not waited on past this.
const DRAIN_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(25);

/// How a step ended.
#[derive(Debug)]
pub enum Ended {
    Exited(ExitStatus),
    /// Killed at the deadline, with its process group.
    TimedOut,
}

/// What a step left: how it ended, and the end of what it wrote.
#[derive(Debug)]
pub struct StepOutput {
    pub ended: Ended,
    /// The last lines it wrote (at most [`TAIL_LINES`], each cut to a few hundred
    /// characters), unescaped: the caller escapes them when it prints.
    pub tail: Vec<String>,
}

/// A build's log: the file, and the bytes the build has written to it so far.
pub struct Log {
    file: File,
    written: u64,
}

impl Log {
    pub fn new(file: File) -> Log {
        Log { file, written: 0 }
    }
}

/// Runs `cmd` (stdin closed) until it exits or `deadline` passes, appending what it writes
/// to `log`. An error is a failure to start it or to wait for it.
pub fn run_step(mut cmd: Command, log: &mut Log, deadline: Instant) -> io::Result<StepOutput> {
    let (read_end, write_end) = pipe()?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(write_end.try_clone()?))
        .stderr(Stdio::from(write_end))
        .process_group(0);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    // The command holds the pipe's write end until dropped: the reader sees the end only once
    // every holder but the step's processes has let go.
    drop(cmd);
    let (tx, rx) = crossbeam_channel::bounded(1);
    let sink = log.file.try_clone()?;
    let written = log.written;
    std::thread::Builder::new()
        .name("build-log".into())
        .spawn(move || {
            let _ = tx.send(drain(File::from(read_end), sink, written));
        })?;
    let ended = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ended::Exited(status),
            Ok(None) if Instant::now() >= deadline => {
                // SAFETY: kill(2) on the process group the child leads; no memory is involved.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
                let _ = child.wait();
                break Ended::TimedOut;
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => {
                // SAFETY: as above.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
                let _ = child.wait();
                return Err(e);
            }
        }
    };
    let tail = match rx.recv_timeout(DRAIN_WAIT) {
        Ok((written, tail)) => {
            log.written = written;
            tail_lines(&tail)
        }
        Err(_) => Vec::new(),
    };
    Ok(StepOutput { ended, tail })
}

/// Copies the pipe into the log up to [`MAX_LOG_BYTES`] in all, keeping its end in memory;
/// returns the bytes now in the log and that end.
fn drain(mut from: File, mut to: File, mut written: u64) -> (u64, Vec<u8>) {
    let mut tail: VecDeque<u8> = VecDeque::with_capacity(TAIL_BYTES);
    let mut block = [0u8; 8192];
    let mut cut = false;
    loop {
        let n = match from.read(&mut block) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &block[..n];
        let room = MAX_LOG_BYTES.saturating_sub(written).min(n as u64) as usize;
        if room > 0 && to.write_all(&chunk[..room]).is_ok() {
            written += room as u64;
        }
        if room < n && !cut {
            cut = true;
            let _ = writeln!(to, "\n[wmo-e2b: the log stops at {MAX_LOG_BYTES} bytes]");
        }
        tail.extend(chunk);
        let excess = tail.len().saturating_sub(TAIL_BYTES);
        tail.drain(..excess);
    }
    (written, tail.into())
}

/// The last [`TAIL_LINES`] non-empty lines of `bytes`, each at most a few hundred characters.
fn tail_lines(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines: Vec<String> = text
        .lines()
        .rev()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .take(TAIL_LINES)
        .map(|l| l.chars().take(TAIL_LINE_CHARS).collect())
        .collect();
    lines.reverse();
    lines
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn output_goes_to_the_log_in_order_and_its_end_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("log");
        let mut log = Log::new(File::create(&path).unwrap());
        let far = Instant::now() + Duration::from_secs(30);
        let out = run_step(sh("echo one; echo two >&2; exit 3"), &mut log, far).unwrap();
        assert!(matches!(out.ended, Ended::Exited(s) if s.code() == Some(3)));
        assert_eq!(out.tail, ["one", "two"]);
        let out = run_step(sh("seq 1 100"), &mut log, far).unwrap();
        assert_eq!(out.tail.len(), TAIL_LINES);
        assert_eq!(out.tail.last().map(String::as_str), Some("100"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("one\ntwo\n1\n2\n"), "{text}");
    }

    #[test]
    fn a_step_past_its_deadline_is_killed_with_its_group() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = Log::new(File::create(tmp.path().join("log")).unwrap());
        let pid_file = tmp.path().join("pid");
        let script = format!("sleep 60 & echo $! > {}; wait", pid_file.display());
        let started = Instant::now();
        let out = run_step(
            sh(&script),
            &mut log,
            Instant::now() + Duration::from_millis(500),
        )
        .unwrap();
        assert!(matches!(out.ended, Ended::TimedOut), "{out:?}");
        assert!(started.elapsed() < Duration::from_secs(20));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // A SIGKILLed process takes a moment to be gone on a loaded machine: bounded.
        let gone = || {
            // SAFETY: signal 0 only asks whether the pid exists.
            let alive = unsafe { libc::kill(pid, 0) } == 0;
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.split(' ').nth(2) == Some("Z"));
            !alive || zombie
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(), "the group's sleep outlived the step");
    }
}
