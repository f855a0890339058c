//! A sandbox whose task processes run on an image's root filesystem (`CreateSpec::image`):
//! tasks and the verifier see the image and nothing of the host's system directories; the
//! image is read-only to them where its root owns it; what a task writes over it is gone
//! after a reset; the unpacked tree on the host is never changed. The attacks: replace a
//! program the verifier runs, leave a file for the next task, write through to the host.
//!
//! The image is a small tree made here (busybox and a few files, owned as an unpacked image
//! owns them); pulling and unpacking real images is tested in `image_*`.

use std::os::unix::fs::MetadataExt;

use wmo_e2b::sandbox::{Backend, CreateSpec, ImageRoot, Role, RunOpts, Sandbox, SandboxError};

mod support;

use support::local::*;

/// A backend on a fresh state directory and an image made for the test (as root only).
struct Scene {
    state: tempfile::TempDir,
    b: std::sync::Arc<wmo_e2b::sandbox::local::LocalBackend>,
    _images: tempfile::TempDir,
    img: ImageRoot,
}

impl Scene {
    fn new() -> Option<Scene> {
        if !support::local::image_roots_available() {
            return None;
        }
        let (state, b) = backend();
        let images = tempfile::tempdir().unwrap();
        let img = busybox_image(images.path(), "sha256:test");
        Some(Scene {
            state,
            b,
            _images: images,
            img,
        })
    }

    fn create(&self) -> std::sync::Arc<dyn Sandbox> {
        self.b
            .create(&CreateSpec {
                image: Some(self.img.clone()),
                ..spec()
            })
            .unwrap()
    }
}

impl Drop for Scene {
    /// Kills what the test left running: a holder outlives a state directory its backend
    /// could not remove.
    fn drop(&mut self) {
        if let Ok(all) = self.b.list(&Default::default()) {
            for s in all {
                let _ = self.b.kill(&s.id);
            }
        }
    }
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
    let Some(scene) = Scene::new() else {
        return;
    };
    let sb = scene.create();
    let (code, out, err) = run_as(
        &*sb,
        Role::Task,
        "cat /etc/marker; pwd; id -u; echo $FROM_IMAGE $HOME $SHELL; \
         test -e /usr/bin/env || echo no-host-usr; test -e /opt/wmo-e2b || echo no-runner",
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!("{MARKER}/app\n1000\nyes /home/user /bin/sh\nno-host-usr\nno-runner\n")
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
    let Some(scene) = Scene::new() else {
        return;
    };
    let img = &scene.img;
    let sb = scene.create();
    // The agent tries to replace what the verifier runs, and to plant files it reads.
    for attack in [
        "echo 'exit 0' > /bin/sh",
        "rm -f /bin/busybox",
        "echo forged > /etc/marker",
        "touch /etc/profile",
        "ln -sf /app /bin/cat",
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
    let Some(scene) = Scene::new() else {
        return;
    };
    let (b, img) = (&scene.b, &scene.img);
    let sb = scene.create();
    sb.seal().unwrap();
    // Where the image lets the sandbox user write: in its working directory, and /tmp.
    let (code, _, err) = run_as(
        &*sb,
        Role::Task,
        "mkdir -p /app/left && echo 1 > /app/left/behind && touch /app/.hidden && \
         echo 2 > /tmp/x",
    );
    assert_eq!(code, Some(0), "{err}");
    let (_, out, _) = run_as(&*sb, Role::Verify, "cat /app/left/behind");
    assert_eq!(out, "1\n", "the verifier sees the agent's work");
    sb.reset().unwrap();
    let (code, out, _) = run_as(&*sb, Role::Task, "ls -A /app; ls -A /tmp");
    assert_eq!(code, Some(0));
    assert_eq!(out, "", "the next task finds nothing of the last");
    // Nothing reached the host's tree, and the replaced layer is gone from the host.
    assert!(std::fs::read_dir(img.rootfs.join("app"))
        .unwrap()
        .next()
        .is_none());
    let layers = scene
        .state
        .path()
        .join("sandboxes")
        .join(sb.id())
        .join("layers");
    let left = std::fs::read_dir(&layers)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .count();
    assert!(
        left <= 2,
        "{left} layers: the task's and the spare's at most"
    );
    let id = sb.id().to_string();
    b.kill(&id).unwrap();
    assert!(!sb_dir_exists(b, &id));
}

#[test]
fn a_sandbox_without_an_image_keeps_the_hosts_system() {
    if !support::local::image_roots_available() {
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
    b.kill(sb.id()).unwrap();
}

#[test]
fn the_working_directory_is_the_tasks_to_edit_and_its_edits_end_with_the_task() {
    let Some(scene) = Scene::new() else {
        return;
    };
    let img = &scene.img;
    // What the image's root owns in its working directory, as most images have it.
    let source = img.rootfs.join("app/main.txt");
    std::fs::write(&source, "original\n").unwrap();
    std::os::unix::fs::chown(img.rootfs.join("app"), Some(0), Some(0)).unwrap();
    let sb = scene.create();
    sb.seal().unwrap();
    let (code, out, err) = run_as(
        &*sb,
        Role::Task,
        "echo edited >> main.txt && cat main.txt && stat -c %u main.txt . && \
         touch new.txt && ! touch /etc/new.txt",
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "original\nedited\n1000\n1000\n");
    let (_, out, _) = run_as(&*sb, Role::Verify, "cat /app/main.txt");
    assert_eq!(
        out, "original\nedited\n",
        "the verifier sees the agent's work"
    );
    assert_eq!(std::fs::read_to_string(&source).unwrap(), "original\n");
    sb.reset().unwrap();
    let (_, out, _) = run_as(&*sb, Role::Task, "cat main.txt; ls");
    assert_eq!(out, "original\nmain.txt\n");
}

#[test]
fn a_working_directory_that_is_a_symlink_reaches_nothing_of_the_host() {
    let Some(scene) = Scene::new() else {
        return;
    };
    let (b, img) = (&scene.b, &scene.img);
    std::fs::remove_dir(img.rootfs.join("app")).unwrap();
    std::os::unix::fs::symlink("/etc", img.rootfs.join("app")).unwrap();
    let err = b
        .create(&CreateSpec {
            image: Some(img.clone()),
            ..spec()
        })
        .err()
        .expect("a sandbox whose working directory leads out of its image");
    let chain = wmo_e2b::errors::error_chain(&err);
    assert!(chain.contains("working directory /app"), "{chain}");
    let left = std::fs::read_dir(scene.state.path().join("sandboxes"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("lsb-"))
        .count();
    assert_eq!(left, 0, "the failed sandbox is gone");
}

#[test]
fn the_agents_work_on_the_image_survives_its_runner_being_stopped_for_the_verifier() {
    let Some(scene) = Scene::new() else {
        return;
    };
    let sb = scene.create();
    sb.seal().unwrap();
    let (code, _, err) = run_as(&*sb, Role::Task, "echo work > /app/out.txt");
    assert_eq!(code, Some(0), "{err}");
    // A harness that cannot be trusted: every process of the sandbox ends, its namespaces
    // start again, and the verifier still judges what the agent made.
    sb.stop_agent(true).unwrap();
    let (_, out, _) = run_as(&*sb, Role::Verify, "cat /app/out.txt");
    assert_eq!(out, "work\n");
    sb.reset().unwrap();
    let (_, out, _) = run_as(&*sb, Role::Task, "ls -A /app");
    assert_eq!(out, "");
}

/// The files tools reach an image's own paths as the task's bash does: its working directory
/// read and written, its root read but never written, a name taken literally.
#[test]
fn read_file_and_write_file_reach_the_images_paths_as_the_task_does() {
    let Some(scene) = Scene::new() else {
        return;
    };
    let sb = scene.create();
    sb.seal().unwrap();
    assert_eq!(
        sb.read_file("/etc/marker").unwrap(),
        support::local::MARKER.as_bytes()
    );
    let odd = "/app/sub dir/a;$(touch pwned)'\".txt";
    sb.write_file(odd, b"written\n").unwrap();
    assert_eq!(sb.read_file(odd).unwrap(), b"written\n");
    let (code, out, err) = run_as(&*sb, Role::Task, "cat '/app/sub dir/'a*; ls -A /app /tmp");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out, "written\n/app:\nsub dir\n\n/tmp:\n",
        "no staging file is left"
    );
    let refused = sb.write_file("/etc/marker", b"forged").unwrap_err();
    assert_eq!(
        refused.class(),
        wmo_e2b::sandbox::ErrorClass::BadRequest,
        "{refused}"
    );
    assert_eq!(
        sb.read_file("/etc/marker").unwrap(),
        support::local::MARKER.as_bytes()
    );
    let missing = sb.read_file("/app/missing").unwrap_err();
    assert!(
        matches!(missing, SandboxError::NotFound { .. }),
        "{missing}"
    );
    // The home and /tmp are still the host's to serve.
    sb.write_file("/tmp/t.txt", b"t").unwrap();
    assert_eq!(sb.read_file("/tmp/t.txt").unwrap(), b"t");
}
