//! Pausing through the E2B client against `wmo-e2b emulator` (in process): a memory pause
//! keeps a background process, which goes on after the connect that resumes it; a
//! filesystem pause keeps the files and loses the process; a paused sandbox lists as
//! paused and is killed like any other.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wmo_e2b::sandbox::e2b::HOME;
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ErrorClass, Killed, Metadata, PauseKind, Paused, RunOpts, RunState,
    Sandbox, SpawnOpts,
};

mod support;

use support::emulator::{serve, Served};
use support::{eventually, wait_for};

const WAIT: Duration = Duration::from_secs(20);

/// The emulator and our client of it.
struct Env(Served);

impl std::ops::Deref for Env {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl Env {
    fn start() -> Env {
        Env(serve())
    }

    /// The host directory behind the sandbox's home (E2B ids are local ids without the
    /// dash): read behind the emulator's back, since a paused sandbox's envd answers nothing.
    fn home_of(&self, sb: &dyn Sandbox) -> PathBuf {
        let local = sb.id().replacen("lsb", "lsb-", 1);
        let sandboxes = self.emulator.sandboxes_dir();
        sandboxes.join(local).join("root")
    }

    fn create(&self) -> Arc<dyn Sandbox> {
        let mut metadata = Metadata::new();
        metadata.insert("test".into(), "e2b-pause".into());
        self.backend
            .create(&CreateSpec {
                timeout_secs: 300,
                metadata,
                internet: true,
                ..CreateSpec::default()
            })
            .unwrap()
    }

    fn listed_state(&self, id: &str) -> Option<RunState> {
        self.backend
            .list(&Metadata::new())
            .unwrap()
            .into_iter()
            .find(|s| s.id == id)
            .map(|s| s.state)
    }
}

/// The count a counter wrote last into `home/count`.
fn count(home: &std::path::Path) -> u64 {
    std::fs::read_to_string(home.join("count"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

const COUNTER: &str = "i=0; while :; do i=$((i+1)); echo $i > /home/user/count; sleep 0.05; done";

#[test]
fn a_memory_pause_keeps_a_background_process_across_the_resume() {
    let env = Env::start();
    let b = &env.backend;
    let sb = env.create();
    let home = env.home_of(&*sb);
    let p = sb.spawn(COUNTER, &SpawnOpts::default()).unwrap();
    wait_for("the counter", WAIT, || count(&home) > 2);

    assert_eq!(b.pause(sb.id(), PauseKind::Memory).unwrap(), Paused::Now);
    assert_eq!(
        b.pause(sb.id(), PauseKind::Memory).unwrap(),
        Paused::AlreadyPaused
    );
    assert_eq!(env.listed_state(sb.id()), Some(RunState::Paused));
    let frozen = count(&home);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(count(&home), frozen, "it counted while paused");
    // Its envd answers as for a gone sandbox, as E2B's proxy does.
    let err = sb.run("true", &RunOpts::default()).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Gone, "{err:?}");

    let again = b.connect(sb.id()).unwrap();
    assert_eq!(env.listed_state(sb.id()), Some(RunState::Running));
    assert!(
        eventually(WAIT, || count(&home) > frozen + 2),
        "the counter did not go on"
    );
    assert!(again.processes().unwrap().iter().any(|i| i.pid == p.pid));
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
}

#[test]
fn a_filesystem_pause_keeps_the_files_and_loses_the_process() {
    let env = Env::start();
    let b = &env.backend;
    let sb = env.create();
    sb.write_file(&format!("{HOME}/kept.txt"), b"kept\n")
        .unwrap();
    let p = sb.spawn("sleep 1000", &SpawnOpts::default()).unwrap();

    assert_eq!(
        b.pause(sb.id(), PauseKind::Filesystem).unwrap(),
        Paused::Now
    );
    assert_eq!(env.listed_state(sb.id()), Some(RunState::Paused));
    let again = b.connect(sb.id()).unwrap();
    assert_eq!(
        again.read_file(&format!("{HOME}/kept.txt")).unwrap(),
        b"kept\n"
    );
    assert!(again.processes().unwrap().iter().all(|i| i.pid != p.pid));
    // The pattern does not match the command line of the shell that runs it.
    let out = again.run("pgrep -f 'sleep 10[0]0' || echo none", &RunOpts::default());
    assert_eq!(out.unwrap().stdout.to_text(), "none\n");
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
}

/// The end of a process the pause killed is no reason to wake the sandbox: once its stream
/// has ended, the sandbox still reads as paused (the emulator's check of whether a sandbox
/// is gone used to resume it).
#[test]
fn a_process_ended_by_a_filesystem_pause_leaves_the_sandbox_paused() {
    let env = Env::start();
    let b = &env.backend;
    let sb = env.create();
    let p = sb.spawn("sleep 1000", &SpawnOpts::default()).unwrap();
    assert_eq!(
        b.pause(sb.id(), PauseKind::Filesystem).unwrap(),
        Paused::Now
    );
    // Everything the stream still brings, to its end.
    let deadline = std::time::Instant::now() + WAIT;
    while p.events.recv_deadline(deadline).is_ok() {}
    assert!(
        std::time::Instant::now() < deadline,
        "the stream never ended"
    );
    assert_eq!(env.listed_state(sb.id()), Some(RunState::Paused));
    assert_eq!(b.describe(sb.id()).unwrap().state, RunState::Paused);
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
}

#[test]
fn a_paused_sandbox_is_killed_like_any_other() {
    let env = Env::start();
    let b = &env.backend;
    let sb = env.create();
    let home = env.home_of(&*sb);
    assert_eq!(b.pause(sb.id(), PauseKind::Memory).unwrap(), Paused::Now);
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
    assert!(!home.exists());
    assert_eq!(env.listed_state(sb.id()), None);
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::AlreadyGone);
    let err = b.pause(sb.id(), PauseKind::Memory).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Gone, "{err:?}");
}
