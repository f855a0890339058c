//! What a task runs on (an image, or a Dockerfile to build), its reference solution, and the
//! variables only its verifier sees: the task fields that are neither instructions nor files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Task;

/// The environment a task names: the root filesystem its commands see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvironmentSpec {
    /// An OCI image reference, by tag or digest, as written.
    Image(String),
    /// A Dockerfile on the host and the directory it is built in.
    Dockerfile { path: PathBuf, context: PathBuf },
}

/// A task's reference solution: files written to [`SOLUTION_DIR`], then `command` run in
/// the workspace as the agent's user.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Solution {
    /// Solution-directory-relative path to content.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    pub command: String,
}

/// Where the oracle writes a solution's files: a place the agent's user can write on every
/// backend (the sandbox's own `/tmp`, emptied by every reset).
pub const SOLUTION_DIR: &str = "/tmp/solution";

/// Longest reference an `image` may be (Docker's own bound on a reference is far below).
const MAX_REFERENCE: usize = 1024;

/// Reads the tasks-file fields `image` and `dockerfile` into `task.environment`, the
/// Dockerfile's path taken relative to the tasks file's directory.
pub(super) fn resolve_environment(task: &mut Task, tasks_file: &Path) -> Result<(), String> {
    task.environment = match (task.image.take(), task.dockerfile.take()) {
        (Some(_), Some(_)) => {
            return Err(
                "fields `image` and `dockerfile`: a task names one environment, not both".into(),
            )
        }
        (Some(reference), None) => {
            check_reference(&reference).map_err(|why| format!("field `image`: {why}"))?;
            Some(EnvironmentSpec::Image(reference))
        }
        (None, Some(rel)) => {
            let norm = crate::sandbox::normalize_relative(&rel)
                .map_err(|why| format!("field `dockerfile`: path {rel:?} is not allowed: {why}"))?;
            let base = tasks_file.parent().unwrap_or(Path::new(""));
            let path = base.join(norm);
            let context = path.parent().unwrap_or(base).to_path_buf();
            Some(EnvironmentSpec::Dockerfile { path, context })
        }
        (None, None) => None,
    };
    Ok(())
}

/// The shape of an image reference, no more: resolving it is the image store's.
pub fn check_reference(reference: &str) -> Result<(), String> {
    if reference.is_empty() || reference.len() > MAX_REFERENCE {
        return Err(format!(
            "an image reference is 1 to {MAX_REFERENCE} characters"
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/:@+".contains(c);
    if let Some(bad) = reference.chars().find(|c| !allowed(*c)) {
        return Err(format!(
            "{:?} has a character no image reference has: {:?}",
            crate::terminal::escape(reference),
            crate::terminal::escape(&bad.to_string())
        ));
    }
    Ok(())
}

/// Names a verifier's variable may have: a shell's, and none that would change how the
/// verifier's own shell or loader behaves.
pub(super) fn check_verify_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    const RESERVED: &[&str] = &["PATH", "HOME", "TMPDIR", "BASH_ENV", "ENV", "LD_PRELOAD"];
    for (name, value) in env {
        let shaped = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && name.len() <= 256;
        if !shaped || RESERVED.contains(&name.as_str()) || name.starts_with("LD_") {
            return Err(format!(
                "field `verify_env`: {:?} is not a variable a verifier may be given",
                crate::terminal::escape(name)
            ));
        }
        if value.contains('\0') || value.len() > 64 << 10 {
            return Err(format!(
                "field `verify_env.{name}`: a value holds no NUL and at most 64 KiB"
            ));
        }
    }
    Ok(())
}
