//! The key of an image build: what its result depends on, hashed. The Dockerfile's bytes,
//! every entry of the build context (its relative path, kind, mode and content; a symlink by
//! its target's text, never followed) in sorted order, and the build arguments. Two builds
//! of one key would make the same image, so a key is built once per machine.
//!
//! The context is read whole, including what a `.dockerignore` leaves out: that can only
//! make a key change when the image would not, never the other way round.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::reference::Digest;

/// Entries (files, directories, symlinks) a build context may hold.
pub const MAX_CONTEXT_ENTRIES: u64 = 100_000;
/// Bytes of file content a build context may hold.
pub const MAX_CONTEXT_BYTES: u64 = 2 << 30;
/// Bytes of a Dockerfile.
pub const MAX_DOCKERFILE: u64 = 1 << 20;
/// Build arguments a build may have, and the bytes of one.
pub const MAX_BUILD_ARGS: usize = 256;
const MAX_BUILD_ARG_BYTES: usize = 64 << 10;

/// Why a build's inputs cannot be read: all of them the user's to fix.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("build context {} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("Dockerfile {} is larger than {max} bytes", path.display())]
    DockerfileTooLarge { path: PathBuf, max: u64 },
    #[error("build context {} holds more than {max} {what}", context.display())]
    ContextTooLarge {
        context: PathBuf,
        what: &'static str,
        max: u64,
    },
    #[error("{} changed while it was read", path.display())]
    Changed { path: PathBuf },
    #[error("build argument {arg:?}: {why}")]
    BuildArg { arg: String, why: &'static str },
}

/// The build arguments of `K=V` strings, checked; a later one of the same name wins, as
/// with the builders.
pub fn parse_build_args(args: &[String]) -> Result<Vec<(String, String)>, KeyError> {
    if args.len() > MAX_BUILD_ARGS {
        return Err(KeyError::BuildArg {
            arg: format!("{} arguments", args.len()),
            why: "too many build arguments",
        });
    }
    let mut parsed: std::collections::BTreeMap<String, String> = Default::default();
    for arg in args {
        let bad = |why| KeyError::BuildArg {
            arg: crate::terminal::escape(arg).chars().take(200).collect(),
            why,
        };
        let (name, value) = arg.split_once('=').ok_or_else(|| bad("not NAME=VALUE"))?;
        let shaped = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !shaped {
            return Err(bad("its name is not a variable's name"));
        }
        if arg.len() > MAX_BUILD_ARG_BYTES || value.contains('\0') {
            return Err(bad("a value holds no NUL and at most 64 KiB"));
        }
        parsed.insert(name.to_string(), value.to_string());
    }
    Ok(parsed.into_iter().collect())
}

/// The Dockerfile's bytes, bounded.
pub fn read_dockerfile(path: &Path) -> Result<Vec<u8>, KeyError> {
    let read = |source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(read)?;
    if !meta.is_file() {
        return Err(KeyError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let mut bytes = Vec::new();
    File::open(path)
        .map_err(read)?
        .take(MAX_DOCKERFILE + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_DOCKERFILE {
        return Err(KeyError::DockerfileTooLarge {
            path: path.to_path_buf(),
            max: MAX_DOCKERFILE,
        });
    }
    Ok(bytes)
}

/// The key of building `dockerfile` (its bytes) in `context` with `args` (sorted, as
/// [`parse_build_args`] gives them).
pub fn build_key(
    dockerfile: &[u8],
    context: &Path,
    args: &[(String, String)],
) -> Result<Digest, KeyError> {
    let entries = walk(context)?;
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    part(b"wmo-e2b build key v1");
    part(dockerfile);
    part(&(entries.len() as u64).to_be_bytes());
    for entry in &entries {
        let path = context.join(&entry.rel);
        part(entry.rel.as_bytes());
        part(&[entry.kind as u8]);
        part(&entry.mode.to_be_bytes());
        match entry.kind {
            Kind::File => part(&hash_file(&path, entry.size)?),
            Kind::Symlink => {
                let target = fs::read_link(&path).map_err(|source| KeyError::Read {
                    path: path.clone(),
                    source,
                })?;
                part(target.as_os_str().as_bytes());
            }
            Kind::Dir | Kind::Other => {}
        }
    }
    part(&(args.len() as u64).to_be_bytes());
    for (name, value) in args {
        part(name.as_bytes());
        part(value.as_bytes());
    }
    Ok(Digest::from_sha256(h.finalize().into()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    /// A FIFO, socket or device: named, never opened.
    Other = 4,
}

struct Entry {
    /// Relative to the context, `/`-separated, as bytes (a path need not be UTF-8).
    rel: OsString,
    kind: Kind,
    mode: u32,
    size: u64,
}

/// Every entry under `context`, sorted by path, bounded; symlinks are not followed.
fn walk(context: &Path) -> Result<Vec<Entry>, KeyError> {
    let read = |path: &Path| {
        let path = path.to_path_buf();
        move |source| KeyError::Read { path, source }
    };
    let meta = fs::metadata(context).map_err(read(context))?;
    if !meta.is_dir() {
        return Err(KeyError::NotADirectory {
            path: context.to_path_buf(),
        });
    }
    let too_large = |what, max| KeyError::ContextTooLarge {
        context: context.to_path_buf(),
        what,
        max,
    };
    let mut entries = Vec::new();
    let mut bytes: u64 = 0;
    let mut pending: Vec<OsString> = vec![OsString::new()];
    while let Some(dir_rel) = pending.pop() {
        let dir = context.join(&dir_rel);
        for item in fs::read_dir(&dir).map_err(read(&dir))? {
            let item = item.map_err(read(&dir))?;
            let mut rel = dir_rel.clone();
            if !rel.is_empty() {
                rel.push("/");
            }
            rel.push(item.file_name());
            let path = context.join(&rel);
            let meta = fs::symlink_metadata(&path).map_err(read(&path))?;
            let ft = meta.file_type();
            let kind = if ft.is_symlink() {
                Kind::Symlink
            } else if ft.is_dir() {
                Kind::Dir
            } else if ft.is_file() {
                Kind::File
            } else {
                Kind::Other
            };
            if entries.len() as u64 >= MAX_CONTEXT_ENTRIES {
                return Err(too_large("entries", MAX_CONTEXT_ENTRIES));
            }
            if kind == Kind::File {
                bytes = bytes.saturating_add(meta.len());
                if bytes > MAX_CONTEXT_BYTES {
                    return Err(too_large("bytes", MAX_CONTEXT_BYTES));
                }
            }
            if kind == Kind::Dir {
                pending.push(rel.clone());
            }
            entries.push(Entry {
                rel,
                kind,
                mode: meta.mode() & 0o7777,
                size: meta.len(),
            });
        }
    }
    entries.sort_by(|a, b| a.rel.as_bytes().cmp(b.rel.as_bytes()));
    Ok(entries)
}

/// A regular file's sha256, its length as listed: a file that grows or shrinks meanwhile
/// is an error, never a key of content that was never whole.
fn hash_file(path: &Path, size: u64) -> Result<[u8; 32], KeyError> {
    let read = |source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    };
    // Listed as a regular file: opened as one, through no symlink put there since.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(read)?;
    if !file.metadata().map_err(read)?.is_file() {
        return Err(KeyError::Changed {
            path: path.to_path_buf(),
        });
    }
    let mut h = Sha256::new();
    let mut seen: u64 = 0;
    let mut block = vec![0u8; 1 << 16];
    let mut limited = file.take(size + 1);
    loop {
        match limited.read(&mut block) {
            Ok(0) => break,
            Ok(n) => {
                seen += n as u64;
                h.update(&block[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read(e)),
        }
    }
    if seen != size {
        return Err(KeyError::Changed {
            path: path.to_path_buf(),
        });
    }
    Ok(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn key(dir: &Path, args: &[(String, String)]) -> Digest {
        build_key(b"FROM x\n", dir, args).unwrap()
    }

    #[test]
    fn the_key_changes_with_content_path_mode_link_and_args_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let ctx = tmp.path();
        fs::create_dir(ctx.join("sub")).unwrap();
        fs::write(ctx.join("sub/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ctx.join("out")).unwrap();
        let base = key(ctx, &[]);
        assert_eq!(base, key(ctx, &[]));
        assert_ne!(base, build_key(b"FROM y\n", ctx, &[]).unwrap());
        let arg = [("A".to_string(), "1".to_string())];
        assert_ne!(base, key(ctx, &arg));

        fs::write(ctx.join("sub/a.txt"), "b").unwrap();
        let content = key(ctx, &[]);
        assert_ne!(base, content);
        fs::set_permissions(ctx.join("sub/a.txt"), fs::Permissions::from_mode(0o755)).unwrap();
        let mode = key(ctx, &[]);
        assert_ne!(content, mode);
        fs::remove_file(ctx.join("out")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", ctx.join("out")).unwrap();
        assert_ne!(mode, key(ctx, &[]));
        let link = key(ctx, &[]);
        fs::create_dir(ctx.join("empty")).unwrap();
        assert_ne!(link, key(ctx, &[]));
    }

    #[test]
    fn a_symlinked_directory_is_hashed_as_a_link_never_walked() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret"), "1").unwrap();
        let ctx = tmp.path().join("ctx");
        fs::create_dir(&ctx).unwrap();
        std::os::unix::fs::symlink(&outside, ctx.join("link")).unwrap();
        let before = key(&ctx, &[]);
        fs::write(outside.join("secret"), "2").unwrap();
        assert_eq!(before, key(&ctx, &[]));
    }

    #[test]
    fn build_args_are_checked_and_the_last_of_a_name_wins() {
        let parsed =
            parse_build_args(&["B=2".into(), "A=x=y".into(), "B=3".into(), "C=".into()]).unwrap();
        let want = [("A", "x=y"), ("B", "3"), ("C", "")];
        assert_eq!(parsed, want.map(|(k, v)| (k.to_string(), v.to_string())));
        for bad in ["noequals", "1A=x", "A-B=x", "=x"] {
            assert!(parse_build_args(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_context_past_its_bound_or_a_missing_dockerfile_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_dockerfile(&tmp.path().join("Dockerfile")),
            Err(KeyError::Read { .. })
        ));
        assert!(matches!(
            read_dockerfile(tmp.path()),
            Err(KeyError::NotAFile { .. })
        ));
        assert!(matches!(
            build_key(b"", &tmp.path().join("nope"), &[]),
            Err(KeyError::Read { .. })
        ));
        let sparse = File::create(tmp.path().join("big")).unwrap();
        sparse.set_len(MAX_CONTEXT_BYTES + 1).unwrap();
        match build_key(b"", tmp.path(), &[]) {
            Err(KeyError::ContextTooLarge { what, max, .. }) => {
                assert_eq!((what, max), ("bytes", MAX_CONTEXT_BYTES))
            }
            other => panic!("{other:?}"),
        }
    }
}
