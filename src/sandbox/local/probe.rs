//! Short commands run to learn something (what this host can do, what a sweep found): no
//! input, only their complaints read, and a deadline.

use std::fmt;
use std::io::Read;
use std::time::Duration;

use super::spawn::{Io, Spawn};

/// How long a probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// A probe's complaint fits in a few KiB; never buffer more.
const MAX_COMPLAINT: u64 = 16 * 1024;

/// A probe that did not succeed: its exit code, when it exited, and why, in its own words
/// when it gave any.
#[derive(Debug)]
pub(super) struct Failed {
    pub code: Option<i32>,
    pub why: String,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.why)
    }
}

/// Runs a probe for at most [`PROBE_TIMEOUT`]. `what` names it in the message of one that
/// did not finish.
pub(super) fn runs(mut cmd: Spawn, what: &str) -> Result<(), Failed> {
    cmd.stdin(Io::Null).stdout(Io::Null).stderr(Io::Piped);
    let failed = |code, why| Err(Failed { code, why });
    match run_bounded(cmd, PROBE_TIMEOUT) {
        Ok(Some((status, _))) if status.success() => Ok(()),
        Ok(Some((status, stderr))) => failed(
            status.code(),
            match stderr.trim() {
                "" => status.to_string(),
                said => said.to_string(),
            },
        ),
        Ok(None) => failed(
            None,
            format!("{what} did not finish within {} s", PROBE_TIMEOUT.as_secs()),
        ),
        Err(e) => failed(None, e.to_string()),
    }
}

/// Runs a command with a deadline; `None` if it had to be killed.
fn run_bounded(
    cmd: Spawn,
    timeout: Duration,
) -> std::io::Result<Option<(std::process::ExitStatus, String)>> {
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let stderr = child.stderr.take();
    std::thread::Builder::new()
        .name("lsb-probe".into())
        .spawn(move || {
            let mut text = String::new();
            if let Some(s) = stderr {
                let _ = s.take(MAX_COMPLAINT).read_to_string(&mut text);
            }
            let _ = tx.send(child.wait().map(|status| (status, text)));
        })?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r.map(Some),
        Err(_) => {
            // The child is unreaped until the thread's wait returns, so `pid` is still it.
            if let Ok(p) = libc::pid_t::try_from(pid) {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            let _ = rx.recv_timeout(Duration::from_secs(1));
            Ok(None)
        }
    }
}
