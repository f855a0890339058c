//! E2B paths onto the sandbox's confined directories: symlinks resolved as the sandbox itself
//! would, and who owns what.

use std::collections::VecDeque;

use crate::emulator::paths;
use crate::emulator::state::SandboxEntry;
use crate::errors::error_chain;
use crate::sandbox::local::confined::Beneath;
use crate::sandbox::{Role, SandboxError};

/// The system directory, which only `root` may write (as on E2B, where it is root's).
const SYSTEM_DIR: &str = "/opt/wmo-e2b";
/// Symlink hops one path may take, as Linux allows.
const MAX_HOPS: usize = 40;

/// The user E2B reports as the owner (and group) of a path.
pub(super) fn owner_of(e2b: &str) -> &'static str {
    if root_only(e2b) {
        "root"
    } else {
        "user"
    }
}

/// Whether only `root` may write at `e2b`: the runner's directory, and the tests a verifier
/// is given (which the agent, as `user`, must never write).
pub(super) fn root_only(e2b: &str) -> bool {
    [SYSTEM_DIR, crate::sandbox::TESTS_DIR].iter().any(|dir| {
        e2b.strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// How much of a path's symlinks envd would follow for an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::emulator) enum Follow {
    /// Every component (reads, writes, listings, working directories).
    All,
    /// All but the last, which is acted on itself (stat, remove, move).
    Parents,
}

/// Resolves the symlinks of a normalized E2B path as the sandbox itself would, so a link
/// made inside the sandbox works as on E2B. Each hop is looked up beneath the sandbox's
/// directories; what lies outside them is never looked at (a link out is left for the
/// confined operation to refuse).
pub(in crate::emulator) fn resolve(
    entry: &SandboxEntry,
    e2b: &str,
    follow: Follow,
) -> Result<String, String> {
    let mut todo: VecDeque<String> = e2b
        .split('/')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    let mut done = String::new();
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        match part.as_str() {
            "." => continue,
            ".." => {
                done.truncate(done.rfind('/').unwrap_or(0));
                continue;
            }
            _ => {}
        }
        let candidate = format!("{done}/{part}");
        if todo.is_empty() && follow == Follow::Parents {
            done = candidate;
            break;
        }
        let link = entry.sandbox.files(&candidate).ok().and_then(|(b, rel)| {
            b.symlink_metadata(&rel)
                .ok()
                .filter(|m| m.file_type().is_symlink())
                .and_then(|_| b.read_link(&rel).ok())
        });
        let Some(target) = link else {
            done = candidate;
            continue;
        };
        hops += 1;
        if hops > MAX_HOPS {
            return Err(format!("too many levels of symbolic links: {e2b}"));
        }
        let target = target.to_string_lossy().into_owned();
        if target.starts_with('/') {
            done.clear();
        }
        for (i, p) in target.split('/').filter(|p| !p.is_empty()).enumerate() {
            todo.insert(i, p.to_string());
        }
    }
    Ok(if done.is_empty() { "/".into() } else { done })
}

/// The sandbox's confined view of an E2B path (its symlinks resolved as `follow` says), and
/// the path as requested, normalized.
pub(super) fn locate(
    entry: &SandboxEntry,
    path: &str,
    role: Role,
    follow: Follow,
) -> Result<(Beneath, String, String), String> {
    let e2b = paths::normalize(path, role).map_err(|e| e.to_string())?;
    let resolved = resolve(entry, &e2b, follow)?;
    let (files, rel) = entry.sandbox.files(&resolved).map_err(|e| match e {
        SandboxError::BadPath { .. } => format!(
            "path '{e2b}' is outside /home/user, /tmp and {SYSTEM_DIR}: the emulator serves only these"
        ),
        other => error_chain(&other),
    })?;
    Ok((files, rel, e2b))
}
