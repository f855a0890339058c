//! E2B paths as envd resolves them: `~` and relative paths are relative to the run-as user's
//! home; `.` and `..` are resolved lexically. The emulator's sandboxes are bwrap sandboxes
//! laid out as E2B's (home at `/home/user`, a private `/tmp`), so an E2B path is also the
//! local sandbox's own path; the local backend resolves it beneath the sandbox's directories.

use crate::sandbox::Role;

/// The home directory of E2B's default user.
pub(super) const E2B_HOME: &str = "/home/user";
/// The home directory of E2B's `root`.
const ROOT_HOME: &str = "/root";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum PathError {
    #[error("path {0:?} contains a NUL byte")]
    Nul(String),
}

/// The home of the E2B user a role runs as.
pub(super) fn home_of(role: Role) -> &'static str {
    match role {
        Role::Task => E2B_HOME,
        Role::System | Role::Verify => ROOT_HOME,
    }
}

/// Turns an E2B path into its normalized absolute form, resolving `~`, relative paths, `.`
/// and `..` lexically against `role`'s home.
pub(super) fn normalize(path: &str, role: Role) -> Result<String, PathError> {
    if path.contains('\0') {
        return Err(PathError::Nul(path.to_string()));
    }
    let home = home_of(role);
    let absolute = if path == "~" {
        home.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    };
    Ok(lexical(&absolute))
}

/// `/a/./b/../c` → `/a/c`; `..` never climbs above `/`.
pub(super) fn lexical(absolute: &str) -> String {
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
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_envd() {
        let user = |p: &str| normalize(p, Role::Task).unwrap();
        assert_eq!(user("/home/user"), "/home/user");
        assert_eq!(user("a/./b"), "/home/user/a/b");
        assert_eq!(user("~/x"), "/home/user/x");
        assert_eq!(user("~"), "/home/user");
        assert_eq!(user("/home/user/a/../b"), "/home/user/b");
        assert_eq!(user("/home/user//c/"), "/home/user/c");
        assert_eq!(user("/tmp/../../etc"), "/etc");
        assert_eq!(normalize("x", Role::System).unwrap(), "/root/x");
        assert!(normalize("a\0b", Role::Task).is_err());
    }
}
