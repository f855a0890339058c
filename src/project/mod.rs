//! Persistent projects: a named sandbox that outlives any one command, plus a host-side
//! mirror of every host-mediated write so a lost sandbox can be replaced and replayed.
//!
//! State lives in `<state>/projects/<name>/`: `project.json` (backend, sandbox id, lease) and
//! `mirror/` (one file per mirrored project path). Paths given by users are project-relative
//! and contained.

mod events;
mod handle;
pub mod session;
pub mod snapshot;
mod tools;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sandbox::{OnTimeout, PauseKind, SandboxError};
use crate::tree::TreeError;
pub use handle::Project;

/// The project workspace, relative to the sandbox's home.
pub const WORKSPACE_DIR: &str = "project";
/// A project sandbox's idle window: E2B's Hobby plan allows sandboxes of at most an hour (Pro:
/// 24 h), so the default fits every plan; a longer one is the user's choice.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
/// A turn's wall time when none is given. A turn that outlasts the idle window holds the
/// sandbox up for its whole length and a little more, so the default stays well inside the
/// Hobby plan's hour.
pub const DEFAULT_TURN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Output an `exec` returns, stdout and stderr together, as head + tail.
pub const MAX_EXEC_OUTPUT: usize = 32 * 1024;
/// After the polite TERM at the exec timeout, how long before KILL.
pub const EXEC_KILL_AFTER: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProjectState {
    pub name: String,
    pub backend: String,
    pub template: Option<String>,
    pub sandbox_id: String,
    /// The lease of the current sandbox (its `wmo-e2b.lease` tag).
    pub lease: Option<String>,
    pub timeout_secs: u64,
    /// Unix seconds.
    pub created: u64,
    /// How many times the sandbox was replaced.
    pub replacements: u32,
    /// What the sandbox does once `timeout_secs` pass without a project command. Projects
    /// recorded before pausing existed were killed.
    #[serde(default)]
    pub on_idle: OnIdle,
    /// What its sandbox reaches; projects recorded before network modes had the host's.
    #[serde(default)]
    pub network: crate::sandbox::Network,
}

/// What a project's sandbox does when it has been idle for the project's timeout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnIdle {
    /// It dies; the next command replaces it and replays the mirror.
    #[default]
    Kill,
    /// It pauses with its memory (processes continue on the next command).
    Pause,
    /// It pauses with its files only (the next command finds the files, no processes).
    PauseFilesystem,
}

impl OnIdle {
    /// What the sandbox is created to do at its deadline.
    pub fn on_timeout(self) -> OnTimeout {
        match self {
            OnIdle::Kill => OnTimeout::Kill,
            OnIdle::Pause => OnTimeout::Pause(PauseKind::Memory),
            OnIdle::PauseFilesystem => OnTimeout::Pause(PauseKind::Filesystem),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error("project name {0:?} is not valid: use 1-64 characters from a-z, 0-9, '.', '_' and '-', starting with a letter or digit")]
    BadName(String),
    #[error("project {0} already exists (close it first, or pick another name)")]
    Exists(String),
    #[error("no project named {0} (see `wmo-e2b project list`)")]
    NotFound(String),
    #[error("project {name} lives on the {backend} backend, not {wanted}")]
    WrongBackend {
        name: String,
        backend: String,
        wanted: String,
    },
    #[error("expected a relative project path, got {path:?}: {reason}")]
    BadPath { path: String, reason: String },
    #[error("cannot {what} the project state at {path}")]
    State {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the project sandbox failed while trying to {what}")]
    Sandbox {
        what: String,
        #[source]
        source: SandboxError,
    },
    #[error("{path} is not in the project, and not in its mirror")]
    Missing { path: String },
    #[error("cannot stage the tree")]
    Tree(#[from] TreeError),
    #[error("snapshot rejected: {0}")]
    Snapshot(String),
}

impl ProjectError {
    pub(crate) fn sandbox(what: impl Into<String>) -> impl FnOnce(SandboxError) -> ProjectError {
        let what = what.into();
        move |source| ProjectError::Sandbox { what, source }
    }
}

/// What a command should tell the user besides its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The sandbox was paused; connecting resumed it.
    Resumed { id: String },
    /// The sandbox was gone; a new one was created and the mirror replayed into it.
    Replaced {
        old: String,
        new: String,
        files: usize,
    },
}

/// The result of `exec`.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    pub exit_code: Option<i32>,
    pub output: String,
    pub timed_out: bool,
}

pub fn validate_name(name: &str) -> Result<(), ProjectError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(ProjectError::BadName(name.to_string()))
    }
}

/// Normalizes a user's project path: relative, no `..`, no empty result.
pub fn project_path(path: &str) -> Result<String, ProjectError> {
    crate::sandbox::normalize_relative(path).map_err(|reason| ProjectError::BadPath {
        path: path.to_string(),
        reason: reason.to_string(),
    })
}

pub fn projects_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("projects")
}

/// Every project under `state_dir`; unreadable ones are skipped.
pub fn list(state_dir: &Path) -> Vec<ProjectState> {
    let Ok(rd) = std::fs::read_dir(projects_dir(state_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<ProjectState> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("project.json")).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether a lease belongs to a project that still exists (its owner is the project, not the
/// process that created it).
pub fn lease_is_held(state_dir: &Path, lease: &str) -> bool {
    list(state_dir)
        .iter()
        .any(|p| p.lease.as_deref() == Some(lease))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths_are_checked() {
        for ok in ["demo", "a1", "my-proj.v2_x"] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "-x", "Caps", "a/b", "a b", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(project_path("src//./a.rs").unwrap(), "src/a.rs");
        for bad in ["", "/etc/passwd", "../x", "a/../../b", ".", "a\0"] {
            assert!(project_path(bad).is_err(), "{bad:?}");
        }
    }
}
