//! A task's workspace in its sandbox: recreated empty, the task's files written, its setup
//! run; and how a failed sandbox call ends the attempt.

use std::sync::Arc;
use std::time::Duration;

use super::outcome::{Attempt, Progress};
use super::results::Status;
use super::verdict::error_record;
use crate::errors::error_chain;
use crate::sandbox::{shell_quote, ErrorClass, RunOpts, Sandbox, SandboxError};
use crate::task::Task;

/// Bytes of setup output quoted in a setup failure.
const SETUP_TAIL: usize = 2048;
/// Where the task's files wait, home-relative, for a workspace outside the home.
const STAGING: &str = ".wmo-e2b-task-files";

/// Writes the task's files and runs its setup. `Err` carries the attempt's end (and whether
/// the sandbox may be reused).
pub(super) fn prepare_workspace(
    task: &Task,
    sandbox: &Arc<dyn Sandbox>,
    ws: &str,
    wall: Duration,
    progress: &Progress,
    attempt: u32,
) -> Result<(), (Attempt, bool)> {
    let failed = |e: &SandboxError, what: &str| {
        SandboxFailure::new(e, what, sandbox.home()).end(task, progress, attempt)
    };
    let home = sandbox.home().trim_end_matches('/');
    // A workspace in the home is recreated empty; an image's working directory (see
    // `Pool::workspace_for`) starts as the image made it, and the task's files reach it
    // through the home, where the host writes, copied over by the task's user.
    let in_home = ws.strip_prefix(home).is_some_and(|r| r.starts_with('/'));
    let staging = format!("{home}/{STAGING}");
    let files_at = if in_home { ws } else { staging.as_str() };
    let mut paths = Vec::with_capacity(task.files.len());
    for (rel, content) in &task.files {
        match crate::sandbox::contained_path(files_at, rel) {
            Ok(p) => paths.push((p, content)),
            Err(e) => {
                let detail = error_text(&e, sandbox.home());
                return Err((setup_error(task, progress, attempt, detail), true));
            }
        }
    }
    // The workspace is recreated empty from home, by its home-relative name (command text
    // names no absolute sandbox path). Without files, setup runs in the same command. The
    // setup is a group of its own lines, so a trailing `&` backgrounds only what the setup
    // says, never the workspace's creation.
    let (rel, fresh) = if in_home {
        let rel = shell_quote(ws[home.len()..].trim_start_matches('/'));
        let fresh = format!("rm -rf {rel} && mkdir -p {rel}");
        (rel, fresh)
    } else {
        let (at, staged) = (shell_quote(ws), shell_quote(STAGING));
        (at.clone(), format!("rm -rf {staged} && mkdir -p {at}"))
    };
    let setup = task
        .setup
        .as_deref()
        .map(|s| format!("cd {rel} && {{\n{s}\n}}"));
    // Made by the host where the backend can (no process started), else by `fresh`.
    let made = in_home
        && sandbox
            .empty_dir(ws)
            .map_err(|e| failed(&e, "creating the workspace"))?;
    let opts = RunOpts {
        // The commands name the workspace relative to home.
        cwd: Some(sandbox.home().to_string()),
        timeout: wall,
        max_output: SETUP_TAIL,
        ..RunOpts::default()
    };
    let setup_out = if paths.is_empty() {
        let all = match (&setup, made) {
            (Some(s), true) => s.clone(),
            (None, true) => return Ok(()),
            (Some(s), false) => format!("{fresh} && {s}"),
            (None, false) => fresh,
        };
        sandbox.run(&all, &opts)
    } else {
        let fresh_out = match made {
            true => None,
            false => Some(sandbox.run(&fresh, &opts)),
        };
        match fresh_out {
            None => {}
            Some(Ok(out)) if out.exit_code == Some(0) => {}
            Some(Ok(out)) => {
                let detail = format!("cannot create the workspace: {}", out.stderr.to_text());
                let detail = without_home(detail, sandbox.home());
                return Err((setup_error(task, progress, attempt, detail), false));
            }
            Some(Err(e)) => return Err(failed(&e, "creating the workspace")),
        }
        for (path, content) in &paths {
            if let Err(e) = sandbox.write_file(path, content.as_bytes()) {
                return Err(failed(&e, "writing task files"));
            }
        }
        if !in_home {
            let staged = shell_quote(STAGING);
            let copy = format!("cp -R {staged}/. {rel}/ && rm -rf {staged}");
            match sandbox.run(&copy, &opts) {
                Ok(out) if out.exit_code == Some(0) => {}
                Ok(out) => {
                    let detail = format!(
                        "cannot copy the task's files into {ws}: {}",
                        out.stderr.to_text()
                    );
                    let detail = without_home(detail, sandbox.home());
                    return Err((setup_error(task, progress, attempt, detail), false));
                }
                Err(e) => return Err(failed(&e, "copying task files")),
            }
        }
        match &setup {
            Some(s) => sandbox.run(s, &opts),
            None => return Ok(()),
        }
    };
    match setup_out {
        Ok(out) if out.exit_code == Some(0) => Ok(()),
        Ok(out) => {
            let detail = format!(
                "setup failed ({}): {}{}",
                if out.timed_out {
                    "timed out".to_string()
                } else {
                    format!("exit {}", out.exit_code.map_or(-1, |c| c))
                },
                out.stdout.to_text(),
                out.stderr.to_text()
            );
            let detail = without_home(detail, sandbox.home());
            Err((setup_error(task, progress, attempt, detail), true))
        }
        Err(e) => Err(failed(&e, "running setup")),
    }
}

/// A sandbox call that failed, judged by its class where it was born: a transport failure
/// (the sandbox or its stream went away) may not recur on a fresh sandbox, so the episode is
/// replayed; anything else (a path the task names that cannot be written, say) would fail
/// the same way again, so it is the task's recorded error.
pub(super) struct SandboxFailure {
    transport: bool,
    /// The sandbox itself is fine: only the request was wrong.
    reusable: bool,
    reason: String,
}

impl SandboxFailure {
    pub(super) fn new(e: &SandboxError, what: &str, home: &str) -> SandboxFailure {
        SandboxFailure {
            transport: e.is_transport(),
            reusable: e.class() == ErrorClass::BadRequest,
            reason: format!("{what}: {}", error_text(e, home)),
        }
    }

    /// A failure that ends the task as its error, never replayed, on a sandbox not reused.
    pub(super) fn task_error(reason: String) -> SandboxFailure {
        SandboxFailure {
            transport: false,
            reusable: false,
            reason,
        }
    }

    /// The attempt's end, and whether the sandbox may be reused.
    pub(super) fn end(self, task: &Task, progress: &Progress, attempt: u32) -> (Attempt, bool) {
        if self.transport {
            let partial = progress.clone();
            let reason = self.reason;
            return (Attempt::Transport { reason, partial }, false);
        }
        (
            setup_error(task, progress, attempt, self.reason),
            self.reusable,
        )
    }
}

/// An error's text for a result, with the sandbox's home written `~`: on the local backend
/// the home is a directory of this host, and results are shared beyond it.
pub(super) fn error_text(e: &dyn std::error::Error, home: &str) -> String {
    #[derive(Debug)]
    struct Text(String);
    impl std::fmt::Display for Text {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    impl std::error::Error for Text {}

    let mut text = String::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        if !text.is_empty() {
            text.push_str(": ");
        }
        // Each part before the chain is collapsed and cut, so no piece of a home survives.
        text.push_str(&without_home(err.to_string(), home));
        cur = err.source();
    }
    error_chain(&Text(text))
}

/// `text` with the sandbox's home written `~`.
fn without_home(text: String, home: &str) -> String {
    let home = home.trim_end_matches('/');
    if home.is_empty() {
        text
    } else {
        text.replace(home, "~")
    }
}

/// An attempt that ended with the task's own error (its setup, its files): recorded, not
/// replayed.
fn setup_error(task: &Task, p: &Progress, attempt: u32, detail: String) -> Attempt {
    Attempt::Done(Box::new(error_record(
        task,
        Status::Error,
        p,
        attempt,
        detail,
    )))
}
