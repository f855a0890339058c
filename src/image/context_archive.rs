//! The entries of a build context that a `COPY` source names, as a gzipped tar with paths
//! relative to the context: what a template build uploads for the step. The same content
//! makes the same bytes (no times, no owners; entries sorted), symlinks stay links, nothing
//! is followed out of the context, and it is bounded as a build context is.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use flate2::write::GzEncoder;
use flate2::Compression;

use super::build_key::MAX_CONTEXT_ENTRIES;

/// Bytes of file content one archive holds (it is built in memory).
pub const MAX_ARCHIVE_BYTES: u64 = 512 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("COPY {source_path:?}: {why}")]
    Source { source_path: String, why: String },
    #[error("COPY {source_path:?}: {}: {err}", path.display())]
    Io {
        source_path: String,
        path: std::path::PathBuf,
        err: std::io::Error,
    },
}

/// The archive of what `source` (a path or pattern relative to `context`) names.
pub fn context_archive(context: &Path, source: &str) -> Result<Vec<u8>, ArchiveError> {
    let fail = |why: String| ArchiveError::Source {
        source_path: source.to_string(),
        why,
    };
    if source.starts_with('/') || source.split('/').any(|p| p == "..") {
        return Err(fail("names a path outside the build context".into()));
    }
    let matches = crate::glob::matching(context, source).map_err(fail)?;
    let mut tar = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::default()));
    let (mut entries, mut bytes) = (0u64, 0u64);
    // Depth first, children sorted; a stack rather than recursion (a deep tree is input).
    let mut stack: Vec<std::path::PathBuf> = matches.into_iter().rev().collect();
    while let Some(path) = stack.pop() {
        let io = |err| ArchiveError::Io {
            source_path: source.to_string(),
            path: path.clone(),
            err,
        };
        entries += 1;
        if entries > MAX_CONTEXT_ENTRIES {
            return Err(fail(format!(
                "names more than {MAX_CONTEXT_ENTRIES} entries"
            )));
        }
        let meta = fs::symlink_metadata(&path).map_err(io)?;
        let name = path
            .strip_prefix(context)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mode = meta.permissions().mode() & 0o7777;
        let mut header = tar::Header::new_ustar();
        header.set_mode(mode);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_size(0);
        if meta.is_dir() {
            let mut children: Vec<_> = fs::read_dir(&path)
                .map_err(io)?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()
                .map_err(io)?;
            children.sort();
            stack.extend(children.into_iter().rev());
            if name.is_empty() {
                continue;
            }
            header.set_entry_type(tar::EntryType::Directory);
            tar.append_data(&mut header, format!("{name}/"), std::io::empty())
                .map_err(io)?;
        } else if meta.file_type().is_symlink() {
            let target = fs::read_link(&path).map_err(io)?;
            header.set_entry_type(tar::EntryType::Symlink);
            tar.append_link(&mut header, &name, &target).map_err(io)?;
        } else if meta.is_file() {
            bytes += meta.len();
            if bytes > MAX_ARCHIVE_BYTES {
                return Err(fail(format!("holds more than {MAX_ARCHIVE_BYTES} bytes")));
            }
            let mut content = Vec::new();
            fs::File::open(&path)
                .and_then(|f| f.take(meta.len()).read_to_end(&mut content))
                .map_err(io)?;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(content.len() as u64);
            tar.append_data(&mut header, &name, &content[..])
                .map_err(io)?;
        }
        // Devices, sockets and fifos are no files to copy.
    }
    let finish = |err| ArchiveError::Io {
        source_path: source.to_string(),
        path: context.to_path_buf(),
        err,
    };
    let mut gz = tar.into_inner().map_err(finish)?;
    gz.flush().map_err(finish)?;
    gz.finish().map_err(finish)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(gz: &[u8]) -> Vec<String> {
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(gz));
        archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn a_source_is_archived_with_paths_from_the_context_the_same_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = dir.path();
        fs::create_dir_all(ctx.join("app/sub")).unwrap();
        fs::write(ctx.join("app/a.txt"), "a").unwrap();
        fs::write(ctx.join("app/sub/b.txt"), "b").unwrap();
        fs::write(ctx.join("top.txt"), "t").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ctx.join("app/link")).unwrap();
        let one = context_archive(ctx, "app").unwrap();
        assert_eq!(
            names(&one),
            ["app/", "app/a.txt", "app/link", "app/sub/", "app/sub/b.txt"]
        );
        assert_eq!(one, context_archive(ctx, "app").unwrap());
        assert_eq!(names(&context_archive(ctx, "*.txt").unwrap()), ["top.txt"]);
        let all = names(&context_archive(ctx, ".").unwrap());
        assert!(all.contains(&"top.txt".to_string()) && !all.contains(&"/".to_string()));
        fs::write(ctx.join("app/a.txt"), "changed").unwrap();
        assert_ne!(one, context_archive(ctx, "app").unwrap());
    }

    #[test]
    fn a_source_outside_the_context_or_naming_nothing_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/passwd", "missing.txt"] {
            assert!(context_archive(dir.path(), bad).is_err(), "{bad}");
        }
    }
}
