//! Paths a pattern names in a tree, as a shell's glob finds them: `*`, `?` and `[...]` within
//! a component, found through no symlink (a build context's or an upload's entries).

use std::fs;
use std::path::{Path, PathBuf};

/// Matches one pattern may have.
const MAX_MATCHES: usize = 100_000;

/// Entries under `root` that `pattern` names (`*`, `?` and `[...]` within a component), found
/// through no symlink; at least one.
pub fn matching(root: &Path, pattern: &str) -> Result<Vec<PathBuf>, String> {
    let mut found = vec![root.to_path_buf()];
    let parts: Vec<&str> = pattern
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let mut next = Vec::new();
        for dir in found.iter().filter(|d| is_real_dir(d)) {
            if !is_pattern(part) {
                let at = dir.join(part);
                if fs::symlink_metadata(&at).is_ok() && (last || is_real_dir(&at)) {
                    next.push(at);
                }
                continue;
            }
            let entries = fs::read_dir(dir).map_err(|e| format!("reading its files: {e}"))?;
            for entry in entries.flatten() {
                let name = entry.file_name();
                if wildcard(part.as_bytes(), name.as_encoded_bytes()) {
                    next.push(entry.path());
                }
                if next.len() > MAX_MATCHES {
                    return Err(format!("matches more than {MAX_MATCHES} entries"));
                }
            }
        }
        next.sort();
        found = next;
    }
    if found.is_empty() {
        return Err("matches nothing in its upload".into());
    }
    Ok(found)
}

pub fn is_real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// Whether `name` matches `pattern`: `*` any run of bytes, `?` one, `[...]` one of a set
/// (ranges, and `!` or `^` first to negate). Dot files match only a pattern that starts with
/// a dot, as a shell's glob has it.
fn wildcard(pattern: &[u8], name: &[u8]) -> bool {
    if name.first() == Some(&b'.') && pattern.first() != Some(&b'.') {
        return false;
    }
    // Iterative, with one backtrack point for the last `*`: linear in practice, and bounded
    // by pattern × name for any input.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => class(pattern, p, name[n]),
            Some(&c) if c == name[n] => Some(p + 1),
            _ => None,
        };
        match (step, star) {
            (Some(next), _) => {
                p = next;
                n += 1;
            }
            (None, Some((sp, sn))) => {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            (None, None) => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Where the class at `pattern[at]` ends when it holds `c`; `None` when it does not (or is
/// not closed, which matches nothing).
fn class(pattern: &[u8], at: usize, c: u8) -> Option<usize> {
    let mut i = at + 1;
    let negate = matches!(pattern.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    while let Some(&lo) = pattern.get(i) {
        if lo == b']' && !first {
            return (hit != negate).then_some(i + 1);
        }
        first = false;
        if pattern.get(i + 1) == Some(&b'-') && pattern.get(i + 2).is_some_and(|&h| h != b']') {
            let hi = pattern[i + 2];
            hit |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            hit |= lo == c;
            i += 1;
        }
    }
    None
}

/// Whether `s` holds a pattern character.
pub fn is_pattern(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_as_a_shell_does() {
        let yes = |p: &str, n: &str| assert!(wildcard(p.as_bytes(), n.as_bytes()), "{p} {n}");
        let no = |p: &str, n: &str| assert!(!wildcard(p.as_bytes(), n.as_bytes()), "{p} {n}");
        yes("*", "a.txt");
        yes("*.txt", "a.txt");
        yes("a?c", "abc");
        yes("[a-c]x", "bx");
        yes("[!a-c]x", "dx");
        yes("*a*b*c", "xxaxxbxxc");
        no("*.txt", "a.md");
        no("*", ".hidden");
        yes(".*", ".hidden");
        no("[a-c]x", "dx");
        no("[abc", "a");
        no("a?c", "ac");
    }

    #[test]
    fn matches_are_found_through_no_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir_all(root.join("folder/sub")).unwrap();
        fs::write(root.join("folder/a.txt"), "a").unwrap();
        fs::write(root.join("folder/b.md"), "b").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        let names = |p: &str| -> Vec<String> {
            matching(root, p)
                .unwrap()
                .iter()
                .map(|m| m.strip_prefix(root).unwrap().display().to_string())
                .collect()
        };
        assert_eq!(
            names("folder/*"),
            ["folder/a.txt", "folder/b.md", "folder/sub"]
        );
        assert_eq!(names("folder/*.txt"), ["folder/a.txt"]);
        assert_eq!(names("folder"), ["folder"]);
        assert_eq!(names("out"), ["out"]);
        assert!(matching(root, "out/passwd").is_err());
        assert!(matching(root, "out/*").is_err());
        assert!(matching(root, "missing/*").is_err());
        // `.` is the upload's root: a directory, copied by its contents.
        assert_eq!(matching(root, ".").unwrap(), [root.to_path_buf()]);
    }
}
