//! A pulled image as the root filesystem a task's commands run on: unpacked once into the
//! store, with what its config asks of those commands (variables, working directory, user,
//! shell) read against the unpacked tree.

use std::path::Path;

use super::pull::PulledImage;
use super::store::Store;
use super::unpack::UnpackError;
use super::unpacked::unpacked_root;
use crate::sandbox::ImageRoot;

/// `pulled` unpacked (unless it already is) and described as a task root.
pub fn task_root(pulled: &PulledImage, store: &Store) -> Result<ImageRoot, UnpackError> {
    let rootfs = unpacked_root(pulled, store)?;
    let config = &pulled.config;
    let env = config.env_pairs();
    Ok(ImageRoot {
        id: pulled.manifest_digest.as_str().to_string(),
        workdir: config.working_dir.clone().filter(|w| is_dir_in(&rootfs, w)),
        shell: shell_of(&rootfs).to_string(),
        user: user_of(&rootfs, config.user.as_deref()),
        env,
        rootfs,
        template: None,
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
