//! `project snapshot`: harvest a directory of the project as a bounded source tree.
//!
//! One walk runs inside the sandbox (a short Node.js script: the runner guarantees Node is
//! there) and emits JSON. Bounds are enforced in the sandbox, so a huge tree is never shipped,
//! and checked again on the host, which does not trust the walker's output. Anything that is
//! not a regular file rejects the snapshot by name.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{Project, ProjectError};
use crate::sandbox::shell_quote;
use crate::sandbox::RunOpts;
use crate::tree::TreeBounds;

const WALKER: &str = r#"
const fs = require("fs"), path = require("path");
const [root, maxFiles, maxBytes, maxPath] = process.argv.slice(1);
const fail = (m) => { process.stderr.write(m + "\n"); process.exit(2); };
let st, at = "";
// Every component of the root itself, from the home: a symlink anywhere on the way is refused,
// never followed (it could lead out of the project, to the system's files).
for (const part of root.split("/")) {
  at = at ? at + "/" + part : part;
  try { st = fs.lstatSync(at); } catch (e) { fail("source directory does not exist: " + root); }
  if (st.isSymbolicLink()) fail(at + " is a symlink; a snapshot never follows one: " + root);
}
if (!st.isDirectory()) fail("not a directory: " + root);
const files = [], rejected = [];
let total = 0;
const kind = (s) => s.isSymbolicLink() ? "symlink" : s.isFIFO() ? "fifo" : s.isSocket() ? "socket" : "special file";
function walk(dir, rel) {
  for (const n of fs.readdirSync(dir).sort()) {
    const p = path.join(dir, n), r = rel ? rel + "/" + n : n, s = fs.lstatSync(p);
    // A directory's path is bounded as a file's: that bounds how deep this recursion goes.
    if (Buffer.byteLength(r) > +maxPath) fail("path is longer than " + maxPath + " bytes: " + r);
    if (s.isDirectory()) { walk(p, r); continue; }
    if (!s.isFile()) { rejected.push({ path: r, kind: kind(s) }); continue; }
    if (files.length >= +maxFiles) fail("directory holds more than " + maxFiles + " files");
    if (total + s.size > +maxBytes) fail("directory holds more than " + maxBytes + " bytes");
    const b = fs.readFileSync(p);
    total += b.length;
    if (total > +maxBytes) fail("directory holds more than " + maxBytes + " bytes");
    files.push({ path: r, content_base64: b.toString("base64") });
  }
}
walk(root, "");
process.stdout.write(JSON.stringify({ files, rejected }));
"#;

#[derive(Deserialize)]
struct WalkOutput {
    files: Vec<WalkFile>,
    rejected: Vec<Rejected>,
}

#[derive(Deserialize)]
struct WalkFile {
    path: String,
    content_base64: String,
}

#[derive(Deserialize)]
struct Rejected {
    path: String,
    kind: String,
}

/// A harvested tree: path to UTF-8 text, sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub files: BTreeMap<String, String>,
}

impl Snapshot {
    pub fn total_bytes(&self) -> usize {
        self.files.values().map(String::len).sum()
    }

    /// SHA-256 over each file in path order: path length (4 bytes BE), path, content length
    /// (8 bytes BE), content. Equal trees hash equal on every host.
    pub fn tree_hash(&self) -> String {
        let mut h = Sha256::new();
        for (path, content) in &self.files {
            h.update((path.len() as u32).to_be_bytes());
            h.update(path.as_bytes());
            h.update((content.len() as u64).to_be_bytes());
            h.update(content.as_bytes());
        }
        crate::digest::hex(&h.finalize())
    }

    /// Writes the tree under `out`, atomically: a sibling temp dir renamed into place.
    pub fn write_to(&self, out: &Path) -> std::io::Result<()> {
        if out.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} already exists; pick a new directory", out.display()),
            ));
        }
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent)?;
        let name = out
            .file_name()
            .map_or_else(|| "snapshot".into(), |n| n.to_string_lossy().into_owned());
        let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
        let _ = crate::deep_remove::remove_tree(&tmp);
        let written = (|| {
            for (rel, content) in &self.files {
                let path = tmp.join(rel);
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(&path, content)?;
            }
            std::fs::create_dir_all(&tmp)?;
            std::fs::rename(&tmp, out)
        })();
        if written.is_err() {
            let _ = crate::deep_remove::remove_tree(&tmp);
        }
        written
    }
}

/// A path the host accepts in a snapshot: relative, canonical, no `..`, no backslash.
fn canonical(path: &str, max: usize) -> bool {
    !path.is_empty()
        && path.len() <= max
        && !path.contains('\\')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

impl Project {
    /// Harvests `dir` (a project path, or "." for the whole workspace).
    pub fn snapshot(&self, dir: &str, bounds: TreeBounds) -> Result<Snapshot, ProjectError> {
        // Home-relative (the walker's working directory is home): see `runner::bootstrap`.
        let root = if dir == "." {
            super::WORKSPACE_DIR.to_string()
        } else {
            format!("{}/{}", super::WORKSPACE_DIR, super::project_path(dir)?)
        };
        let cmd = format!(
            "node -e {} {} {} {} {}",
            shell_quote(WALKER),
            shell_quote(&root),
            bounds.max_files,
            bounds.max_bytes,
            bounds.max_path
        );
        // Room for base64 of every byte plus per-file overhead: anything beyond is a walker
        // that broke its own bounds.
        let room =
            (bounds.max_bytes as usize) * 4 / 3 + bounds.max_files * (bounds.max_path + 64) + 4096;
        let out = self
            .sandbox()
            .run(
                &cmd,
                &RunOpts {
                    cwd: Some(self.sandbox().home().to_string()),
                    timeout: Duration::from_secs(120),
                    max_output: room * 2,
                    ..RunOpts::default()
                },
            )
            .map_err(ProjectError::sandbox("walk the snapshot directory"))?;
        if out.exit_code != Some(0) {
            return Err(ProjectError::Snapshot(
                out.stderr.to_text().trim().to_string(),
            ));
        }
        if out.stdout.dropped > 0 {
            return Err(ProjectError::Snapshot(
                "the walker's output exceeded its bounds".into(),
            ));
        }
        let walk: WalkOutput = serde_json::from_slice(&[out.stdout.head, out.stdout.tail].concat())
            .map_err(|e| {
                ProjectError::Snapshot(format!("the walker's output is not valid JSON: {e}"))
            })?;
        if !walk.rejected.is_empty() {
            let names: Vec<String> = walk
                .rejected
                .iter()
                .map(|r| format!("{} ({})", r.path, r.kind))
                .collect();
            return Err(ProjectError::Snapshot(format!(
                "{} entr{} cannot be part of a source tree: {}; replace them with regular files",
                names.len(),
                if names.len() == 1 { "y" } else { "ies" },
                names.join(", ")
            )));
        }
        if walk.files.len() > bounds.max_files {
            return Err(ProjectError::Snapshot(format!(
                "directory holds more than {} files",
                bounds.max_files
            )));
        }
        let mut files = BTreeMap::new();
        let mut total: u64 = 0;
        for f in walk.files {
            if !canonical(&f.path, bounds.max_path) {
                return Err(ProjectError::Snapshot(format!(
                    "path {:?} is not a canonical relative path of at most {} bytes",
                    f.path, bounds.max_path
                )));
            }
            let bytes = STANDARD.decode(&f.content_base64).map_err(|_| {
                ProjectError::Snapshot(format!("{}: content is not base64", f.path))
            })?;
            total += bytes.len() as u64;
            if total > bounds.max_bytes {
                return Err(ProjectError::Snapshot(format!(
                    "directory holds more than {} bytes",
                    bounds.max_bytes
                )));
            }
            let text = String::from_utf8(bytes).map_err(|_| {
                ProjectError::Snapshot(format!("file {} is not valid UTF-8 text", f.path))
            })?;
            files.insert(f.path, text);
        }
        Ok(Snapshot { files })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_hash_is_stable_and_content_sensitive() {
        let mut a = Snapshot {
            files: BTreeMap::new(),
        };
        a.files.insert("a".into(), "1".into());
        let b = a.clone();
        assert_eq!(a.tree_hash(), b.tree_hash());
        let mut c = a.clone();
        c.files.insert("a".into(), "2".into());
        assert_ne!(a.tree_hash(), c.tree_hash());
        // Path/content boundaries are part of the hash.
        let mut d = Snapshot {
            files: BTreeMap::new(),
        };
        d.files.insert("ab".into(), "".into());
        let mut e = Snapshot {
            files: BTreeMap::new(),
        };
        e.files.insert("a".into(), "b".into());
        assert_ne!(d.tree_hash(), e.tree_hash());
    }

    #[test]
    fn canonical_paths_only() {
        assert!(canonical("src/a.rs", 100));
        for bad in ["", "/a", "a//b", "./a", "a/../b", "a\\b", "a/"] {
            assert!(!canonical(bad, 100), "{bad:?}");
        }
        assert!(!canonical("abcdef", 3));
    }
}
