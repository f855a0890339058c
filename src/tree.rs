//! Source trees read from the host: bounded and validated before anything is sent anywhere.
//!
//! A tree is a map of relative path to UTF-8 text. Anything that is not a regular file
//! (a symlink, socket, fifo, device) rejects the whole tree by name rather than leaving it
//! silently thinner, and so do non-UTF-8 content, over-long paths and exceeded bounds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Limits on a tree.
#[derive(Debug, Clone, Copy)]
pub struct TreeBounds {
    pub max_files: usize,
    pub max_bytes: u64,
    /// Longest relative path, in bytes.
    pub max_path: usize,
}

impl Default for TreeBounds {
    fn default() -> Self {
        TreeBounds {
            max_files: 1024,
            max_bytes: 8 << 20,
            max_path: 512,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is a {kind}, not a regular file: trees hold regular files only")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} is not UTF-8 text")]
    NotUtf8 { path: PathBuf },
    #[error("{path}: the path is longer than {max} bytes")]
    PathTooLong { path: PathBuf, max: usize },
    #[error("{path}: the path is not valid UTF-8")]
    BadPathName { path: PathBuf },
    #[error("{root} holds more than {max} files")]
    TooManyFiles { root: PathBuf, max: usize },
    #[error("{root} holds more than {max} bytes")]
    TooManyBytes { root: PathBuf, max: u64 },
    #[error("{root} has no {file}")]
    Missing { root: PathBuf, file: String },
}

/// Reads every regular file under `root`, sorted by path.
pub fn read_tree(root: &Path, bounds: TreeBounds) -> Result<BTreeMap<String, String>, TreeError> {
    let mut files = BTreeMap::new();
    let mut total: u64 = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let io = |source| TreeError::Io {
            path: dir.clone(),
            source,
        };
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(io)?
            .collect::<Result<_, _>>()
            .map_err(io)?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            // symlink_metadata: a symlink is reported as itself, never followed.
            let meta = std::fs::symlink_metadata(&path).map_err(|source| TreeError::Io {
                path: path.clone(),
                source,
            })?;
            let ft = meta.file_type();
            if ft.is_dir() {
                // A directory's path is bounded as a file's is: that bounds the depth walked.
                let rel_len = path.strip_prefix(root).map_or(0, |p| p.as_os_str().len());
                if rel_len > bounds.max_path {
                    return Err(TreeError::PathTooLong {
                        path,
                        max: bounds.max_path,
                    });
                }
                stack.push(path);
                continue;
            }
            if !ft.is_file() {
                return Err(TreeError::NotRegular {
                    path,
                    kind: kind_of(&ft),
                });
            }
            let rel = path
                .strip_prefix(root)
                .ok()
                .and_then(|p| p.to_str())
                .ok_or_else(|| TreeError::BadPathName { path: path.clone() })?
                .to_string();
            if rel.len() > bounds.max_path {
                return Err(TreeError::PathTooLong {
                    path,
                    max: bounds.max_path,
                });
            }
            if files.len() >= bounds.max_files {
                return Err(TreeError::TooManyFiles {
                    root: root.to_path_buf(),
                    max: bounds.max_files,
                });
            }
            total += meta.len();
            if total > bounds.max_bytes {
                return Err(TreeError::TooManyBytes {
                    root: root.to_path_buf(),
                    max: bounds.max_bytes,
                });
            }
            let bytes = std::fs::read(&path).map_err(|source| TreeError::Io {
                path: path.clone(),
                source,
            })?;
            let text = String::from_utf8(bytes).map_err(|_| TreeError::NotUtf8 { path })?;
            files.insert(rel, text);
        }
    }
    Ok(files)
}

pub(crate) fn kind_of(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

/// A user harness directory: a tree whose entry point is `agent.mjs`.
pub fn read_harness(dir: &Path, bounds: TreeBounds) -> Result<BTreeMap<String, String>, TreeError> {
    let files = read_tree(dir, bounds)?;
    if !files.contains_key("agent.mjs") {
        return Err(TreeError::Missing {
            root: dir.to_path_buf(),
            file: "agent.mjs (exporting runEpisode(ctx))".into(),
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src/lib")).unwrap();
        std::fs::write(
            d.path().join("agent.mjs"),
            "export async function runEpisode() {}",
        )
        .unwrap();
        std::fs::write(d.path().join("src/lib/util.mjs"), "export const x = 1;").unwrap();
        d
    }

    #[test]
    fn reads_a_sorted_tree() {
        let d = tree();
        let files = read_harness(d.path(), TreeBounds::default()).unwrap();
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            vec!["agent.mjs", "src/lib/util.mjs"]
        );
    }

    #[test]
    fn rejects_by_name() {
        let d = tree();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("src/link")).unwrap();
        let e = read_tree(d.path(), TreeBounds::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("src/link") && e.contains("symlink"), "{e}");

        let d = tree();
        std::fs::write(d.path().join("bin.dat"), [0xff, 0xfe, 0x00]).unwrap();
        let e = read_tree(d.path(), TreeBounds::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("bin.dat") && e.contains("UTF-8"), "{e}");

        let d = tree();
        let fifo = d.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_tree(d.path(), TreeBounds::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("pipe") && e.contains("fifo"), "{e}");

        let d = tree();
        let small = TreeBounds {
            max_files: 1,
            ..TreeBounds::default()
        };
        assert!(matches!(
            read_tree(d.path(), small),
            Err(TreeError::TooManyFiles { .. })
        ));
        let tiny = TreeBounds {
            max_bytes: 10,
            ..TreeBounds::default()
        };
        assert!(matches!(
            read_tree(d.path(), tiny),
            Err(TreeError::TooManyBytes { .. })
        ));
        let short = TreeBounds {
            max_path: 8,
            ..TreeBounds::default()
        };
        assert!(matches!(
            read_tree(d.path(), short),
            Err(TreeError::PathTooLong { .. })
        ));

        // Empty directories nested past the path bound: refused by the bound, not walked.
        let d = tree();
        let deep: PathBuf = std::iter::repeat_n("d", 1000).collect();
        std::fs::create_dir_all(d.path().join(deep)).unwrap();
        assert!(matches!(
            read_tree(d.path(), TreeBounds::default()),
            Err(TreeError::PathTooLong { max: 512, .. })
        ));

        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("main.mjs"), "").unwrap();
        let e = read_harness(d.path(), TreeBounds::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("agent.mjs"), "{e}");
    }
}
