//! Mapping E2B sandbox paths onto a local sandbox: the E2B home `/home/user` is the local
//! sandbox's `home()`; relative paths and `~` are relative to it; nothing outside it is
//! reachable. The check is lexical (like the local backend's own files API): a symlink the
//! sandbox made itself can still point elsewhere, since a local sandbox is no security boundary.

use std::path::{Path, PathBuf};

/// The home directory of the default E2B user.
pub(super) const E2B_HOME: &str = "/home/user";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum PathError {
    #[error("path {0:?} contains a NUL byte")]
    Nul(String),
    #[error("path '{0}' is outside {E2B_HOME}: the emulator maps only the sandbox home")]
    Outside(String),
}

/// Turns an E2B path into its normalized absolute form (`/home/user/...`), resolving `~`,
/// relative paths, `.` and `..` lexically.
pub(super) fn normalize(path: &str) -> Result<String, PathError> {
    if path.contains('\0') {
        return Err(PathError::Nul(path.to_string()));
    }
    let absolute = if path == "~" {
        E2B_HOME.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{E2B_HOME}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{E2B_HOME}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in absolute.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// The local file an E2B path names, with its normalized E2B form.
pub(super) fn to_local(home: &Path, path: &str) -> Result<(PathBuf, String), PathError> {
    let e2b = normalize(path)?;
    let rest = if e2b == E2B_HOME {
        ""
    } else if let Some(rest) = e2b.strip_prefix(E2B_HOME).and_then(|r| r.strip_prefix('/')) {
        rest
    } else {
        return Err(PathError::Outside(e2b));
    };
    let local = if rest.is_empty() {
        home.to_path_buf()
    } else {
        home.join(rest)
    };
    Ok((local, e2b))
}

/// The E2B form of a local path under `home` (for symlink targets and the like); `None` when
/// it is outside.
pub(super) fn to_e2b(home: &Path, local: &Path) -> Option<String> {
    let rest = local.strip_prefix(home).ok()?;
    let rest = rest.to_str()?;
    Some(if rest.is_empty() {
        E2B_HOME.to_string()
    } else {
        format!("{E2B_HOME}/{rest}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_the_home_and_refuses_escapes() {
        let home = Path::new("/state/sandboxes/lsb-1/root");
        let ok = |p: &str| to_local(home, p).unwrap();
        assert_eq!(ok("/home/user").0, home);
        assert_eq!(ok("/home/user/a/b.txt").0, home.join("a/b.txt"));
        assert_eq!(ok("a/./b").0, home.join("a/b"));
        assert_eq!(ok("~/x").1, "/home/user/x");
        assert_eq!(ok("~").1, "/home/user");
        assert_eq!(ok("/home/user/a/../b").1, "/home/user/b");
        assert_eq!(ok("/home/user//c/").1, "/home/user/c");
        for bad in [
            "/etc/passwd",
            "/home/user/../other",
            "../x",
            "/home/username",
            "/",
            "a\0b",
        ] {
            assert!(to_local(home, bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            to_e2b(home, &home.join("q/r")).as_deref(),
            Some("/home/user/q/r")
        );
        assert_eq!(to_e2b(home, Path::new("/etc")), None);
    }
}
