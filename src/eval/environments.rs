//! The task environments of a run, made before any sandbox starts: each image a task names
//! (or `--image` gives the tasks that name none) pulled into the store, unpacked once, and
//! described as the root its sandboxes' task processes run on. A run whose images cannot
//! all be had stops here, before it spends anything.

use std::collections::BTreeMap;
use std::path::Path;

use crate::image::store::StoreLock;
use crate::image::{self, ImageError, Reference, RegistryConfig, Store};
use crate::sandbox::ImageRoot;
use crate::task::{EnvironmentSpec, Task};

/// Why an environment could not be made.
#[derive(Debug, thiserror::Error)]
pub enum EnvironmentError {
    #[error("image {reference}: {source}")]
    Image {
        reference: String,
        #[source]
        source: ImageError,
    },
    #[error("image {reference}: cannot unpack it: {source}")]
    Unpack {
        reference: String,
        #[source]
        source: image::unpack::UnpackError,
    },
    #[error("cannot open the image store: {0}")]
    Store(#[source] image::store::StoreError),
}

/// The environments of a run's tasks, by the reference that names each.
#[derive(Debug, Default)]
pub struct Environments {
    roots: BTreeMap<String, Made>,
    /// The store's shared lock, held while the run may still start sandboxes on its roots:
    /// no prune removes them under it.
    _store: Option<StoreLock>,
    /// The environment of tasks that name none (`--image`).
    default: Option<String>,
}

#[derive(Debug)]
struct Made {
    root: ImageRoot,
    /// The content digest the reference resolved to (what provenance records).
    digest: String,
}

impl Environments {
    /// Pulls and unpacks every image in `references` into `store`; `default` (one of them)
    /// is the environment of tasks that name none.
    pub fn make(
        references: &[String],
        default: Option<&str>,
        store: &Store,
        config: &RegistryConfig,
    ) -> Result<Environments, EnvironmentError> {
        let store_lock = match references.is_empty() {
            true => None,
            false => Some(store.pull_lock().map_err(EnvironmentError::Store)?),
        };
        let mut roots = BTreeMap::new();
        for reference in references {
            if roots.contains_key(reference) {
                continue;
            }
            roots.insert(reference.clone(), make_one(reference, store, config)?);
        }
        Ok(Environments {
            roots,
            _store: store_lock,
            default: default.map(str::to_string),
        })
    }

    /// The root `task`'s commands run on; `None`: the sandbox's own system.
    pub fn of(&self, task: &Task) -> Option<&ImageRoot> {
        self.roots.get(self.reference_of(task)?).map(|m| &m.root)
    }

    /// The image `task` runs on as `reference@digest`, for its record's provenance.
    pub fn pinned(&self, task: &Task) -> Option<String> {
        let reference = self.reference_of(task)?;
        let made = self.roots.get(reference)?;
        Some(format!("{reference}@{}", made.digest))
    }

    fn reference_of<'a>(&'a self, task: &'a Task) -> Option<&'a String> {
        match &task.environment {
            Some(EnvironmentSpec::Image(r)) => Some(r),
            _ => self.default.as_ref(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }
}

fn make_one(
    reference: &str,
    store: &Store,
    config: &RegistryConfig,
) -> Result<Made, EnvironmentError> {
    let image_error = |source| EnvironmentError::Image {
        reference: reference.to_string(),
        source,
    };
    let parsed = Reference::parse(reference).map_err(|e| image_error(e.into()))?;
    let pulled = image::pull(&parsed, store, config).map_err(image_error)?;
    let rootfs =
        image::unpacked_root(&pulled, store).map_err(|source| EnvironmentError::Unpack {
            reference: reference.to_string(),
            source,
        })?;
    let config = &pulled.config;
    let env = config
        .env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(Made {
        root: ImageRoot {
            id: pulled.manifest_digest.as_str().to_string(),
            workdir: config.working_dir.clone().filter(|w| is_dir_in(&rootfs, w)),
            shell: shell_of(&rootfs).to_string(),
            user: user_of(&rootfs, config.user.as_deref()),
            env,
            rootfs,
        },
        digest: pulled.digest.as_str().to_string(),
    })
}

/// The image's bash if it has one, else its `sh` (every image a task can run has that).
fn shell_of(rootfs: &Path) -> &'static str {
    // Looked at, not followed: a symlink (to busybox, say) is the program as the image runs it.
    match std::fs::symlink_metadata(rootfs.join("bin/bash")) {
        Ok(_) => "/bin/bash",
        Err(_) => "/bin/sh",
    }
}

/// The uid of the image's `User` (`uid`, `uid:gid`, or a name its `/etc/passwd` gives);
/// its root when it names none, or none this can read.
fn user_of(rootfs: &Path, user: Option<&str>) -> u32 {
    let name = user.map_or("", |u| u.split(':').next().unwrap_or(""));
    if name.is_empty() {
        return 0;
    }
    if let Ok(uid) = name.parse() {
        return uid;
    }
    // Read through no symlink and bounded: the file is the image's.
    let passwd = rootfs.join("etc/passwd");
    let plain = ["etc", "etc/passwd"]
        .iter()
        .all(|p| std::fs::symlink_metadata(rootfs.join(p)).is_ok_and(|m| !m.is_symlink()));
    let text = plain
        .then(|| std::fs::File::open(&passwd).ok())
        .flatten()
        .and_then(|f| {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::Read::take(f, 1 << 20), &mut text)
                .ok()
                .map(|_| text)
        })
        .unwrap_or_default();
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&name))
        .and_then(|f| f.get(2)?.parse().ok())
        .unwrap_or(0)
}

/// Whether `dir` (absolute, as the image names it) is a directory of the image, through no
/// symlink: commands start there only when it is (as a container's working directory the
/// runtime would make, which an image root cannot).
fn is_dir_in(rootfs: &Path, dir: &str) -> bool {
    let mut at = rootfs.to_path_buf();
    for part in dir.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if part == ".." {
            return false;
        }
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_working_directory_counts_only_when_the_image_has_it_through_no_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("app/src")).unwrap();
        std::os::unix::fs::symlink("/etc", tmp.path().join("escape")).unwrap();
        assert!(is_dir_in(tmp.path(), "/app/src"));
        assert!(is_dir_in(tmp.path(), "/"));
        assert!(!is_dir_in(tmp.path(), "/missing"));
        assert!(!is_dir_in(tmp.path(), "/escape"));
        assert!(!is_dir_in(tmp.path(), "/app/../app"));
    }

    #[test]
    fn the_user_is_a_uid_a_name_the_image_knows_or_root() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("etc")).unwrap();
        std::fs::write(
            tmp.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1234:1234::/home/app:/bin/sh\n",
        )
        .unwrap();
        assert_eq!(user_of(tmp.path(), None), 0);
        assert_eq!(user_of(tmp.path(), Some("")), 0);
        assert_eq!(user_of(tmp.path(), Some("2000:3000")), 2000);
        assert_eq!(user_of(tmp.path(), Some("app")), 1234);
        assert_eq!(user_of(tmp.path(), Some("app:app")), 1234);
        assert_eq!(user_of(tmp.path(), Some("nobody-here")), 0);
    }

    #[test]
    fn the_shell_is_bash_when_the_image_has_it() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("bin")).unwrap();
        assert_eq!(shell_of(tmp.path()), "/bin/sh");
        std::os::unix::fs::symlink("busybox", tmp.path().join("bin/bash")).unwrap();
        assert_eq!(shell_of(tmp.path()), "/bin/bash");
    }
}
