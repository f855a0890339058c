//! The E2B backend end to end against `wmo-e2b emulator` (in process, on 127.0.0.1:0): the
//! same client that talks to E2B cloud, through the emulator's control plane and envd.

use std::time::{Duration, Instant};

use wmo_e2b::sandbox::e2b::HOME;
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ErrorClass, Killed, Metadata, ProcessEvent, RunOpts, SandboxError,
    SpawnOpts,
};

mod support;

use support::emulator::serve;
use support::{read_until, spawn_with_stdin};

const WAIT: Duration = Duration::from_secs(20);

fn spec(run: &str) -> CreateSpec {
    let mut metadata = Metadata::new();
    metadata.insert("wmo-e2b.run".into(), run.into());
    metadata.insert("wmo-e2b.kind".into(), "test".into());
    CreateSpec {
        template: None,
        timeout_secs: 300,
        metadata,
        envs: vec![("FROM_CREATE".into(), "yes".into())],
        internet: true,
        on_timeout: wmo_e2b::sandbox::OnTimeout::Kill,
        limits: Default::default(),
        network: Default::default(),
        image: None,
    }
}

#[test]
fn create_run_spawn_stdin_list_and_kill() {
    let env = serve();
    let b = &env.backend;
    let sb = b.create(&spec("e2e-1")).unwrap();
    assert_eq!(sb.home(), HOME);

    // Foreground: output, exit codes and the create-time environment.
    let out = sb.run("echo hi", &RunOpts::default()).unwrap();
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout.to_text(), "hi\n");
    let out = sb
        .run(
            "echo $FROM_CREATE $X >&2; exit 3",
            &RunOpts {
                envs: vec![("X".into(), "x".into())],
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert_eq!(out.exit_code, Some(3));
    assert_eq!(out.stderr.to_text(), "yes x\n");

    // Files.
    let path = format!("{HOME}/dir/note.txt");
    sb.write_file(&path, b"from the client\n").unwrap();
    assert_eq!(sb.read_file(&path).unwrap(), b"from the client\n");
    // Relative to the working directory (home): the emulator maps /home/user only for envd's
    // own paths, while commands see the local sandbox's real directory.
    let out = sb.run("cat dir/note.txt", &RunOpts::default()).unwrap();
    assert_eq!(out.stdout.to_text(), "from the client\n");
    let err = sb.read_file(&format!("{HOME}/missing")).unwrap_err();
    assert!(matches!(err, SandboxError::NotFound { .. }), "{err:?}");

    // Background with stdin.
    let p = spawn_with_stdin(sb.as_ref(), "cat");
    sb.send_stdin(p.pid, b"ping\n").unwrap();
    assert_eq!(read_until(&p.events, "ping\n", WAIT), "ping\n");
    assert!(sb.processes().unwrap().iter().any(|i| i.pid == p.pid));
    sb.close_stdin(p.pid).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        match p.events.recv_deadline(deadline) {
            Ok(ProcessEvent::Exit(code)) => {
                assert_eq!(code, Some(0));
                break;
            }
            Ok(ProcessEvent::Stdout(_) | ProcessEvent::Stderr(_)) => {}
            other => panic!("{other:?}"),
        }
    }

    // A killed process ends its stream; a gone one is NoSuchProcess.
    let sleeper = sb.spawn("sleep 1000", &SpawnOpts::default()).unwrap();
    sb.kill_process(sleeper.pid).unwrap();
    match sleeper.events.recv_timeout(WAIT) {
        Ok(ProcessEvent::Exit(_)) => {}
        other => panic!("{other:?}"),
    }

    // List by metadata finds it (and only it).
    let mut filter = Metadata::new();
    filter.insert("wmo-e2b.run".into(), "e2e-1".into());
    let listed = b.list(&filter).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, sb.id());
    filter.insert("wmo-e2b.run".into(), "other".into());
    assert!(b.list(&filter).unwrap().is_empty());

    // Kill, then everything says gone.
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::AlreadyGone);
    assert_eq!(b.live_sandboxes(), 0);
    let err = sb.run("true", &RunOpts::default()).unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    let err = b.connect(sb.id()).err().unwrap();
    assert_eq!(err.class(), ErrorClass::Gone, "{err:?}");
    assert_eq!(b.counters().creates, 1);
}

#[test]
fn connect_by_id_and_reattach_by_pid() {
    let env = serve();
    let b = &env.backend;
    let first = b.create(&spec("e2e-2")).unwrap();
    let p = first
        .spawn(
            "while true; do echo tick; sleep 0.2; done",
            &SpawnOpts::default(),
        )
        .unwrap();
    read_until(&p.events, "tick", WAIT);

    let again = b.connect(first.id()).unwrap();
    let attached = again.connect(p.pid).unwrap();
    read_until(&attached.events, "tick", WAIT);
    again.kill_process(p.pid).unwrap();
    let err = again.connect(999_999).err().unwrap();
    assert!(
        matches!(err, SandboxError::NoSuchProcess { pid: 999_999, .. }),
        "{err:?}"
    );
    again.set_timeout(120).unwrap();
    b.kill(first.id()).unwrap();
}

#[test]
fn run_timeouts_are_results() {
    let env = serve();
    let sb = env.backend.create(&spec("e2e-3")).unwrap();
    let started = Instant::now();
    let out = sb
        .run(
            "echo before; sleep 30",
            &RunOpts {
                timeout: Duration::from_secs(1),
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.exit_code, None);
    assert!(started.elapsed() < Duration::from_secs(15));
    env.backend.kill(sb.id()).unwrap();
}
