//! Skills: a directory of Markdown instructions the agent may read on demand.
//!
//! Each skill is `DIR/<name>.md`: front matter between two `---` lines holding `name` (the
//! file's stem) and a one-line `description`, then the body. Only names and descriptions go
//! into the system prompt; a body costs context only when the agent asks for it. The whole
//! directory is read and checked before anything starts, bounded, and every problem names the
//! file and what is wrong with it.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Skills in one directory at most: every description is in every system prompt.
pub const MAX_SKILLS: usize = 64;
/// Bytes of one skill file at most (front matter and body).
pub const MAX_SKILL_BYTES: u64 = 64 << 10;
/// Bytes of all skill files together at most.
pub const MAX_TOTAL_BYTES: u64 = 1 << 20;
/// Bytes of a description at most: it is repeated in every model call.
pub const MAX_DESCRIPTION: usize = 1024;
/// Bytes of a name at most; the agent types it back.
pub const MAX_NAME: usize = 64;

/// One skill: what the system prompt lists (`name`, `description`) and what `read_skill`
/// returns (`body`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub body: String,
}

/// A validated skills directory, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkillSet {
    skills: BTreeMap<String, Skill>,
}

#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{dir} holds no skills: put each in <name>.md")]
    Empty { dir: PathBuf },
    #[error("{dir} holds more than {max} entries: a skills directory holds {max} skills at most")]
    TooMany { dir: PathBuf, max: usize },
    #[error("{dir}: the skills exceed {max} bytes together")]
    TotalTooLarge { dir: PathBuf, max: u64 },
    #[error("{path} is a directory: skills are <name>.md files directly in the skills directory")]
    Subdirectory { path: PathBuf },
    #[error("{path} is a {kind}, not a regular file: skills are regular <name>.md files")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} is not a <name>.md file: a skills directory holds skills only")]
    NotMarkdown { path: PathBuf },
    #[error("{path} is larger than {max} bytes")]
    TooLarge { path: PathBuf, max: u64 },
    #[error("{path} is not UTF-8 text")]
    NotUtf8 { path: PathBuf },
    #[error("{path} has no front matter: it must start with a `---` line, then `name:` and `description:` lines, then `---`")]
    NoFrontMatter { path: PathBuf },
    #[error("{path}: the front matter opened on line 1 is never closed by a `---` line")]
    UnclosedFrontMatter { path: PathBuf },
    #[error("{path}:{line}: expected `key: value` in the front matter")]
    BadLine { path: PathBuf, line: usize },
    #[error("{path}:{line}: `{key}` is given twice")]
    DuplicateKey {
        path: PathBuf,
        line: usize,
        key: String,
    },
    #[error("{path}: the front matter has no `name`")]
    MissingName { path: PathBuf },
    #[error("{path}: name {name:?} is not the file's name: the file must be {name}.md, or the name {stem:?}")]
    NameMismatch {
        path: PathBuf,
        name: String,
        stem: String,
    },
    #[error("{path}: name {name:?} must be 1 to {max} ASCII letters, digits, `-` or `_`")]
    BadName {
        path: PathBuf,
        name: String,
        max: usize,
    },
    #[error("{path}: the front matter has no `description`")]
    MissingDescription { path: PathBuf },
    #[error("{path}: the description must be one line (block scalars `|` and `>` are not read)")]
    MultilineDescription { path: PathBuf },
    #[error("{path}: the description is longer than {max} bytes")]
    DescriptionTooLong { path: PathBuf, max: usize },
}

impl SkillSet {
    /// Reads and checks every skill in `dir`; the first problem rejects the whole set.
    pub fn load(dir: &Path) -> Result<SkillSet, SkillError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SkillError::Io { path, source }
        };
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            // Bounded before it is collected: a directory of a million files is refused
            // without listing it all.
            if entries.len() == MAX_SKILLS {
                return Err(SkillError::TooMany {
                    dir: dir.to_path_buf(),
                    max: MAX_SKILLS,
                });
            }
            entries.push(entry.map_err(io(dir))?.path());
        }
        entries.sort();
        let mut set = SkillSet::default();
        let mut total = 0;
        for path in entries {
            let text = read_skill_file(&path)?;
            total += text.len() as u64;
            if total > MAX_TOTAL_BYTES {
                return Err(SkillError::TotalTooLarge {
                    dir: dir.to_path_buf(),
                    max: MAX_TOTAL_BYTES,
                });
            }
            let skill = parse(&path, &text)?;
            set.skills.insert(skill.name.clone(), skill);
        }
        if set.skills.is_empty() {
            return Err(SkillError::Empty {
                dir: dir.to_path_buf(),
            });
        }
        Ok(set)
    }

    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.get(name)
    }

    /// The skills in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Skill> {
        self.skills.values()
    }

    pub fn len(&self) -> usize {
        self.skills.len()
    }

    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// SHA-256 (hex) over each skill in name order: for each of name, description and body,
    /// its length (8 bytes BE) then its bytes. Equal skills hash equal on every host, however
    /// their files were laid out (line endings and front-matter order aside, which the parse
    /// already settles).
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        for s in self.skills.values() {
            for part in [&s.name, &s.description, &s.body] {
                h.update((part.len() as u64).to_be_bytes());
                h.update(part.as_bytes());
            }
        }
        crate::digest::hex(&h.finalize())
    }
}

/// One entry of a skills directory, as text: a regular `<name>.md` file within the bounds.
fn read_skill_file(path: &Path) -> Result<String, SkillError> {
    let io = |source| SkillError::Io {
        path: path.to_path_buf(),
        source,
    };
    // symlink_metadata: a symlink is reported as itself, never followed.
    let ft = std::fs::symlink_metadata(path).map_err(io)?.file_type();
    if ft.is_dir() {
        return Err(SkillError::Subdirectory {
            path: path.to_path_buf(),
        });
    }
    if !ft.is_file() {
        return Err(SkillError::NotRegular {
            path: path.to_path_buf(),
            kind: crate::tree::kind_of(&ft),
        });
    }
    if path.extension().and_then(|e| e.to_str()) != Some("md") {
        return Err(SkillError::NotMarkdown {
            path: path.to_path_buf(),
        });
    }
    // O_NOFOLLOW: a file swapped for a symlink since it was looked at is refused, not
    // followed. The read is capped whatever the file's size was a moment ago.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io)?;
    let mut bytes = Vec::new();
    file.take(MAX_SKILL_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_SKILL_BYTES {
        return Err(SkillError::TooLarge {
            path: path.to_path_buf(),
            max: MAX_SKILL_BYTES,
        });
    }
    String::from_utf8(bytes).map_err(|_| SkillError::NotUtf8 {
        path: path.to_path_buf(),
    })
}

/// Parses the skill file at `path` (its stem is the skill's name) from its `text`.
pub fn parse(path: &Path, text: &str) -> Result<Skill, SkillError> {
    let p = || path.to_path_buf();
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(trim_eol) != Some("---") {
        return Err(SkillError::NoFrontMatter { path: p() });
    }
    let mut name = None;
    let mut description = None;
    let mut closed = false;
    // The key whose value an indented line continues.
    let mut last_key = "";
    for (i, raw) in lines.by_ref().enumerate() {
        let line_no = i + 2;
        let line = trim_eol(raw);
        if line == "---" {
            closed = true;
            break;
        }
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            // Part of the previous key's value: a nested map or a continued string. Another
            // key's is the author's business; ours are one line each.
            match last_key {
                "description" => return Err(SkillError::MultilineDescription { path: p() }),
                "name" => {
                    return Err(SkillError::BadLine {
                        path: p(),
                        line: line_no,
                    })
                }
                _ => continue,
            }
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(SkillError::BadLine {
                path: p(),
                line: line_no,
            });
        };
        let key = key.trim();
        last_key = key;
        let slot = match key {
            "name" => &mut name,
            "description" => &mut description,
            // Other keys (a license, say) are the author's business.
            _ => continue,
        };
        if slot.is_some() {
            return Err(SkillError::DuplicateKey {
                path: p(),
                line: line_no,
                key: key.to_string(),
            });
        }
        *slot = Some(unquote(value.trim()).to_string());
    }
    if !closed {
        return Err(SkillError::UnclosedFrontMatter { path: p() });
    }
    // Whatever follows the closing line, as written.
    let body: String = lines.collect();

    let name = name
        .filter(|n| !n.is_empty())
        .ok_or(SkillError::MissingName { path: p() })?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    if name != stem {
        return Err(SkillError::NameMismatch {
            path: p(),
            name,
            stem: stem.to_string(),
        });
    }
    let name_ok = name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !name_ok {
        return Err(SkillError::BadName {
            path: p(),
            name,
            max: MAX_NAME,
        });
    }
    let description = description
        .filter(|d| !d.is_empty())
        .ok_or(SkillError::MissingDescription { path: p() })?;
    if matches!(description.as_str(), "|" | ">" | "|-" | ">-" | "|+" | ">+") {
        return Err(SkillError::MultilineDescription { path: p() });
    }
    if description.len() > MAX_DESCRIPTION {
        return Err(SkillError::DescriptionTooLong {
            path: p(),
            max: MAX_DESCRIPTION,
        });
    }
    Ok(Skill {
        name,
        description,
        body,
    })
}

/// A line without its `\n` or `\r\n`.
fn trim_eol(line: &str) -> &str {
    let line = line.strip_suffix('\n').unwrap_or(line);
    line.strip_suffix('\r').unwrap_or(line)
}

/// A value without one pair of matching quotes around it.
fn unquote(v: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(file: &str, text: &str) -> Result<Skill, SkillError> {
        parse(Path::new(file), text)
    }

    #[test]
    fn reads_name_description_and_body() {
        let s = parsed(
            "skills/deploy.md",
            "---\r\nname: deploy\ndescription: \"Ship it: safely.\"\nlicense: MIT\n# note\n\n---\n# Deploy\nrun make\n",
        )
        .unwrap();
        assert_eq!(s.name, "deploy");
        assert_eq!(s.description, "Ship it: safely.");
        assert_eq!(s.body, "# Deploy\nrun make\n");
        // The body may itself hold `---` lines; only the first pair fences the front matter.
        let s = parsed("a.md", "---\nname: a\ndescription: d\n---\nx\n---\ny").unwrap();
        assert_eq!(s.body, "x\n---\ny");
        // Another key's nested value is skipped whole.
        let nested = "---\nmetadata:\n  author: x\n  tags: [a]\nname: a\ndescription: d\n---\n";
        assert_eq!(parsed("a.md", nested).unwrap().description, "d");
        let s = parsed("a.md", "---\nname: 'a'\ndescription: d\n---").unwrap();
        assert_eq!((s.name.as_str(), s.body.as_str()), ("a", ""));
    }

    #[test]
    fn each_malformed_skill_gets_its_own_error_naming_the_file() {
        type Case = (&'static str, &'static str, fn(&SkillError) -> bool);
        let cases: &[Case] = &[
            ("no front matter\n", "front matter", |e| {
                matches!(e, SkillError::NoFrontMatter { .. })
            }),
            ("---\nname: a\ndescription: d\n", "never closed", |e| {
                matches!(e, SkillError::UnclosedFrontMatter { .. })
            }),
            ("---\nname: a\njust words\n---\n", "a.md:3", |e| {
                matches!(e, SkillError::BadLine { line: 3, .. })
            }),
            (
                "---\nname: a\nname: a\ndescription: d\n---\n",
                "twice",
                |e| matches!(e, SkillError::DuplicateKey { line: 3, .. }),
            ),
            ("---\ndescription: d\n---\n", "no `name`", |e| {
                matches!(e, SkillError::MissingName { .. })
            }),
            ("---\nname: b\ndescription: d\n---\n", "\"b\"", |e| {
                matches!(e, SkillError::NameMismatch { .. })
            }),
            ("---\nname: a\n---\nbody", "no `description`", |e| {
                matches!(e, SkillError::MissingDescription { .. })
            }),
            (
                "---\nname: a\ndescription:\n---\n",
                "no `description`",
                |e| matches!(e, SkillError::MissingDescription { .. }),
            ),
            (
                "---\nname: a\ndescription: >\n  folded\n---\n",
                "one line",
                |e| matches!(e, SkillError::MultilineDescription { .. }),
            ),
            (
                "---\nname: a\ndescription: d\n  continued\n---\n",
                "one line",
                |e| matches!(e, SkillError::MultilineDescription { .. }),
            ),
        ];
        for (text, says, is) in cases {
            let e = parsed("dir/a.md", text).unwrap_err();
            let msg = e.to_string();
            assert!(is(&e), "{text:?}: {e:?}");
            assert!(msg.contains("dir/a.md") && msg.contains(says), "{msg}");
        }
        let long = format!("---\nname: a\ndescription: {}\n---\n", "d".repeat(1025));
        assert!(matches!(
            parsed("a.md", &long),
            Err(SkillError::DescriptionTooLong { max: 1024, .. })
        ));
        let bad = "---\nname: a b\ndescription: d\n---\n";
        assert!(matches!(
            parsed("a b.md", bad),
            Err(SkillError::BadName { .. })
        ));
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    fn skill_text(name: &str, body: &str) -> String {
        format!("---\nname: {name}\ndescription: about {name}\n---\n{body}")
    }

    #[test]
    fn a_directory_loads_in_name_order_and_its_digest_follows_the_content() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "zeta.md", &skill_text("zeta", "Z"));
        write(d.path(), "alpha.md", &skill_text("alpha", "A"));
        let set = SkillSet::load(d.path()).unwrap();
        let names: Vec<&str> = set.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["alpha", "zeta"]);
        assert_eq!(set.get("zeta").unwrap().body, "Z");
        assert!(set.get("beta").is_none());
        let digest = set.digest();
        assert_eq!(digest.len(), 64);
        assert_eq!(SkillSet::load(d.path()).unwrap().digest(), digest);
        write(d.path(), "zeta.md", &skill_text("zeta", "Z!"));
        assert_ne!(SkillSet::load(d.path()).unwrap().digest(), digest);
        // Lengths delimit the parts: moving bytes from a body to the next name shows.
        let a = SkillSet {
            skills: [("a", "ab"), ("c", "")].map(skill).into_iter().collect(),
        };
        let b = SkillSet {
            skills: [("a", "a"), ("bc", "")].map(skill).into_iter().collect(),
        };
        assert_ne!(a.digest(), b.digest());
    }

    fn skill((name, body): (&str, &str)) -> (String, Skill) {
        let s = Skill {
            name: name.into(),
            description: String::new(),
            body: body.into(),
        };
        (name.into(), s)
    }

    #[test]
    fn a_directory_with_anything_but_skills_is_refused_by_name() {
        let fresh = || {
            let d = tempfile::tempdir().unwrap();
            write(d.path(), "ok.md", &skill_text("ok", "fine"));
            d
        };
        let d = fresh();
        std::fs::create_dir(d.path().join("nested")).unwrap();
        let e = SkillSet::load(d.path()).unwrap_err();
        assert!(matches!(e, SkillError::Subdirectory { .. }), "{e}");
        assert!(e.to_string().contains("nested"), "{e}");

        let d = fresh();
        write(d.path(), "notes.txt", "x");
        let e = SkillSet::load(d.path()).unwrap_err();
        assert!(matches!(e, SkillError::NotMarkdown { .. }), "{e}");
        assert!(e.to_string().contains("notes.txt"), "{e}");

        let d = fresh();
        std::os::unix::fs::symlink(d.path().join("ok.md"), d.path().join("link.md")).unwrap();
        let e = SkillSet::load(d.path()).unwrap_err();
        assert!(
            matches!(
                e,
                SkillError::NotRegular {
                    kind: "symlink",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("link.md"), "{e}");

        let d = fresh();
        std::fs::write(d.path().join("bin.md"), [b'-', 0xff, 0xfe]).unwrap();
        let e = SkillSet::load(d.path()).unwrap_err();
        assert!(matches!(e, SkillError::NotUtf8 { .. }), "{e}");

        let d = fresh();
        let big = skill_text("big", &"x".repeat(MAX_SKILL_BYTES as usize));
        write(d.path(), "big.md", &big);
        let e = SkillSet::load(d.path()).unwrap_err();
        assert!(matches!(e, SkillError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("big.md"), "{e}");

        // Each file within its bound, together over theirs.
        let d = tempfile::tempdir().unwrap();
        let body = "x".repeat(MAX_SKILL_BYTES as usize - 100);
        for i in 0..=(MAX_TOTAL_BYTES / MAX_SKILL_BYTES) {
            let name = format!("s{i:02}");
            write(d.path(), &format!("{name}.md"), &skill_text(&name, &body));
        }
        let e = SkillSet::load(d.path()).unwrap_err();
        assert!(matches!(e, SkillError::TotalTooLarge { .. }), "{e}");

        let d = tempfile::tempdir().unwrap();
        for i in 0..=MAX_SKILLS {
            let name = format!("s{i:02}");
            write(d.path(), &format!("{name}.md"), &skill_text(&name, ""));
        }
        let e = SkillSet::load(d.path()).unwrap_err();
        assert!(matches!(e, SkillError::TooMany { max: 64, .. }), "{e}");

        let d = tempfile::tempdir().unwrap();
        let e = SkillSet::load(d.path()).unwrap_err();
        assert!(matches!(e, SkillError::Empty { .. }), "{e}");
        let e = SkillSet::load(&d.path().join("missing")).unwrap_err();
        assert!(matches!(e, SkillError::Io { .. }), "{e}");
    }
}
