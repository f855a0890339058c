//! Helpers for tests of the local backend itself: a backend on a fresh state directory,
//! sandboxes of it, and what the host's /proc says about their processes.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use tempfile::TempDir;
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ImageRoot, ProcessEvent, RunOpts, Sandbox, SandboxError,
};

use super::pid_alive;

pub const WAIT: Duration = Duration::from_secs(10);

pub fn backend() -> (TempDir, Arc<LocalBackend>) {
    let dir = tempfile::tempdir().unwrap();
    let b = LocalBackend::open(dir.path()).unwrap();
    (dir, b)
}

pub fn spec() -> CreateSpec {
    CreateSpec {
        timeout_secs: 300,
        internet: true,
        ..CreateSpec::default()
    }
}

pub fn create(b: &LocalBackend) -> Arc<dyn Sandbox> {
    b.create(&spec()).unwrap()
}

pub fn sh(sb: &dyn Sandbox, cmd: &str) -> wmo_e2b::sandbox::Output {
    sb.run(cmd, &RunOpts::default()).unwrap()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Host pids of running processes whose command line contains `marker`: a sandbox's own
/// pids (what `$!` says inside it) are not the host's.
pub fn running(marker: &str) -> Vec<u32> {
    super::proc_pids()
        .into_iter()
        .filter(|&pid| {
            pid_alive(pid)
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(marker)
                })
        })
        .collect()
}

pub fn start_time(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = s.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

#[derive(Default, Debug)]
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: Option<Option<i32>>,
}

/// Reads events until Exit (or the channel ends, or `within` passes).
pub fn collect(events: &Receiver<ProcessEvent>, within: Duration) -> Collected {
    let deadline = Instant::now() + within;
    let mut c = Collected::default();
    loop {
        match events.recv_deadline(deadline) {
            Ok(ProcessEvent::Stdout(d)) => c.stdout.extend(d),
            Ok(ProcessEvent::Stderr(d)) => c.stderr.extend(d),
            Ok(ProcessEvent::Exit(code)) => {
                c.exit = Some(code);
                return c;
            }
            Ok(ProcessEvent::Failed(e)) => panic!("process failed: {e}"),
            Err(_) => return c,
        }
    }
}

pub fn meta_json(state: &TempDir, id: &str) -> serde_json::Value {
    let p = state.path().join("sandboxes").join(id).join("meta.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

pub fn sb_dir_exists(b: &LocalBackend, id: &str) -> bool {
    b.sandboxes_dir().join(id).exists()
}

pub fn sh_err(sb: &dyn Sandbox) -> SandboxError {
    sb.run("true", &RunOpts::default()).unwrap_err()
}

pub const MARKER: &str = "made by the image\n";

/// An unpacked image, named `id`: busybox as `/bin/sh` and its applets, `/etc/marker` (root's), and a
/// working directory `/app` owned by the image's uid 1000.
pub fn busybox_image(dir: &Path, id: &str) -> ImageRoot {
    let root = dir.join("rootfs");
    for d in ["bin", "etc", "app", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in [
        "sh", "cat", "echo", "id", "ls", "mkdir", "pwd", "rm", "test", "touch", "stat", "env",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/marker"), MARKER).unwrap();
    std::os::unix::fs::chown(root.join("app"), Some(1000), Some(1000)).unwrap();
    std::os::unix::fs::chown(root.join("tmp"), Some(0), Some(0)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    ImageRoot {
        id: id.into(),
        rootfs: root,
        env: vec![
            ("PATH".into(), "/bin".into()),
            ("FROM_IMAGE".into(), "yes".into()),
            ("HOME".into(), "/root".into()),
        ],
        workdir: Some("/app".into()),
        user: 0,
        shell: "/bin/sh".into(),
        template: None,
    }
}

/// Whether sandboxes here can run on image roots: they take an id range of their own, which
/// only root gets (said when not).
pub fn image_roots_available() -> bool {
    super::is_root("sandboxes have no id range of their own, and so no image root")
}
