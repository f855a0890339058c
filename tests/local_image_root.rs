//! A sandbox whose task processes run on an image's root filesystem (`CreateSpec::image`):
//! tasks and the verifier see the image and nothing of the host's system directories; the
//! image is read-only to them where its root owns it; what a task writes over it is gone
//! after a reset; the unpacked tree on the host is never changed. The attacks: replace a
//! program the verifier runs, leave a file for the next task, write through to the host.
//!
//! The image is a small tree made here (busybox and a few files, owned as an unpacked image
//! owns them); pulling and unpacking real images is tested in `image_*`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use wmo_e2b::sandbox::{Backend, CreateSpec, ImageRoot, Role, RunOpts, Sandbox};

mod support;

use support::local::*;

/// Image roots take an id range of the sandbox's own, which only root gets.
fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    let root = unsafe { libc::geteuid() == 0 };
    if !root {
        eprintln!("not root: sandboxes have no id range of their own, and so no image root");
    }
    root
}

const MARKER: &str = "made by the image\n";

/// An unpacked image: busybox as `/bin/sh` and its applets, `/etc/marker` (root's), and a
/// working directory `/work` owned by the image's uid 1000.
fn image(dir: &Path) -> ImageRoot {
    let root = dir.join("rootfs");
    for d in ["bin", "etc", "work", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in [
        "sh", "cat", "echo", "id", "ls", "mkdir", "pwd", "rm", "test", "touch", "stat", "env",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/marker"), MARKER).unwrap();
    std::os::unix::fs::chown(root.join("work"), Some(1000), Some(1000)).unwrap();
    std::os::unix::fs::chown(root.join("tmp"), Some(0), Some(0)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    ImageRoot {
        id: "sha256:test".into(),
        rootfs: root,
        env: vec![
            ("PATH".into(), "/bin".into()),
            ("FROM_IMAGE".into(), "yes".into()),
            ("HOME".into(), "/root".into()),
        ],
        workdir: Some("/work".into()),
        uid: None,
        shell: "/bin/sh".into(),
    }
}

fn create_on(
    b: &wmo_e2b::sandbox::local::LocalBackend,
    image: &ImageRoot,
) -> std::sync::Arc<dyn Sandbox> {
    b.create(&CreateSpec {
        image: Some(image.clone()),
        ..spec()
    })
    .unwrap()
}

fn run_as(sb: &dyn Sandbox, role: Role, cmd: &str) -> (Option<i32>, String, String) {
    let out = sb
        .run(
            cmd,
            &RunOpts {
                role,
                ..RunOpts::default()
            },
        )
        .unwrap();
    (out.exit_code, out.stdout.to_text(), out.stderr.to_text())
}

#[test]
fn tasks_run_on_the_image_and_see_nothing_of_the_hosts_system() {
    if !is_root() {
        return;
    }
    let (_d, b) = backend();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let sb = create_on(&b, &img);
    let (code, out, err) = run_as(
        &*sb,
        Role::Task,
        "cat /etc/marker; pwd; id -u; echo $FROM_IMAGE $HOME $SHELL; \
         test -e /usr/bin/env || echo no-host-usr; test -e /opt/wmo-e2b || echo no-runner",
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!("{MARKER}/work\n1000\nyes /home/user /bin/sh\nno-host-usr\nno-runner\n")
    );
    // The verifier too: the image's shell and variables, its own identity and HOME.
    let (code, out, err) = run_as(
        &*sb,
        Role::Verify,
        "cat /etc/marker; id -u; echo $FROM_IMAGE $HOME",
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, format!("{MARKER}1001\nyes /verifier/home\n"));
    // The runner keeps the host's system and its own directory.
    let (code, out, _) = run_as(&*sb, Role::System, "test -e /etc/marker || echo host; pwd");
    assert_eq!(code, Some(0));
    assert_eq!(out, "host\n/opt/wmo-e2b\n");
}

#[test]
fn what_the_image_root_owns_no_task_can_change() {
    if !is_root() {
        return;
    }
    let (_d, b) = backend();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let sb = create_on(&b, &img);
    // The agent tries to replace what the verifier runs, and to plant files it reads.
    for attack in [
        "echo 'exit 0' > /bin/sh",
        "rm -f /bin/busybox",
        "echo forged > /etc/marker",
        "touch /etc/profile",
        "ln -sf /work /bin/cat",
    ] {
        let (code, _, _) = run_as(&*sb, Role::Task, attack);
        assert_ne!(code, Some(0), "`{attack}` worked");
    }
    let (_, out, _) = run_as(
        &*sb,
        Role::Verify,
        "cat /etc/marker; test -e /etc/profile || echo none",
    );
    assert_eq!(out, format!("{MARKER}none\n"));
    // The unpacked tree on the host is as the image made it.
    let bin = img.rootfs.join("bin/busybox");
    assert_eq!(
        std::fs::read(&bin).unwrap(),
        std::fs::read("/bin/busybox").unwrap()
    );
    assert_eq!(std::fs::metadata(&bin).unwrap().uid(), 0);
    assert_eq!(
        std::fs::read_to_string(img.rootfs.join("etc/marker")).unwrap(),
        MARKER
    );
}

#[test]
fn what_a_task_writes_over_the_image_is_gone_after_a_reset() {
    if !is_root() {
        return;
    }
    let (state, b) = backend();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let sb = create_on(&b, &img);
    sb.seal().unwrap();
    // Where the image lets the sandbox user write: in its working directory, and /tmp.
    let (code, _, err) = run_as(
        &*sb,
        Role::Task,
        "mkdir -p /work/left && echo 1 > /work/left/behind && touch /work/.hidden && \
         echo 2 > /tmp/x",
    );
    assert_eq!(code, Some(0), "{err}");
    let (_, out, _) = run_as(&*sb, Role::Verify, "cat /work/left/behind");
    assert_eq!(out, "1\n", "the verifier sees the agent's work");
    sb.reset().unwrap();
    let (code, out, _) = run_as(&*sb, Role::Task, "ls -A /work; ls -A /tmp");
    assert_eq!(code, Some(0));
    assert_eq!(out, "", "the next task finds nothing of the last");
    // Nothing reached the host's tree, and the replaced layer is gone from the host.
    assert!(std::fs::read_dir(img.rootfs.join("work"))
        .unwrap()
        .next()
        .is_none());
    let layers = state.path().join("sandboxes").join(sb.id()).join("layers");
    let left = std::fs::read_dir(&layers).unwrap().count();
    assert!(
        left <= 2,
        "{left} layers: the task's and the spare's at most"
    );
    let id = sb.id().to_string();
    b.kill(&id).unwrap();
    assert!(!sb_dir_exists(&b, &id));
}

#[test]
fn a_sandbox_without_an_image_keeps_the_hosts_system() {
    if !is_root() {
        return;
    }
    let (state, b) = backend();
    let sb = create(&b);
    let (code, _, _) = run_as(
        &*sb,
        Role::Task,
        "test -x /usr/bin/env && test ! -e /etc/marker",
    );
    assert_eq!(code, Some(0));
    sb.seal().unwrap();
    sb.reset().unwrap();
    let dir = state.path().join("sandboxes").join(sb.id());
    assert!(dir.join("meta.json").is_file());
    assert!(!dir.join("layers").exists(), "no layers without an image");
}
