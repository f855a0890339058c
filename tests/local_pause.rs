//! Pausing local sandboxes against the real OS: a memory pause stops every process of the
//! sandbox and a resume continues them; a filesystem pause ends them and keeps the files; a
//! paused sandbox has no deadline, a sandbox may pause at its deadline, and a paused one is
//! killed like any other.
//!
//! Processes are checked through the host's /proc: those of a sandbox are the ones in its
//! holders' PID namespaces. Waits are bounded polls for a condition.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wmo_e2b::sandbox::local::{Isolation, IsolationChoice, LocalBackend, LocalOptions, Resume};
use wmo_e2b::sandbox::local::{LocalSandbox, Resumed};
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ErrorClass, Killed, Metadata, OnTimeout, PauseKind, Paused, RunState,
    Sandbox, SandboxError, SpawnOpts,
};

mod support;

use support::local::*;
use support::{eventually, pid_alive, read_until, wait_for};

/// Starts a counter in `sb`, detached (`setsid`, its output to nowhere), that writes the next
/// number to /tmp/count every 50 ms; returns the marker its command line carries. Waits for
/// its first count: until then it may not have left the command's group, which ends with the
/// command.
fn start_counter(sb: &dyn Sandbox) -> String {
    let marker = format!("counter-{}", sb.id());
    let cmd = format!(
        "rm -f /tmp/count; setsid bash -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; \
         sleep 0.05; done # {marker}' >/dev/null 2>&1 < /dev/null &
         for _ in $(seq 500); do [ -s /tmp/count ] && break; sleep 0.01; done"
    );
    assert_eq!(sh(sb, &cmd).exit_code, Some(0));
    marker
}

fn create_local(b: &LocalBackend, spec: CreateSpec) -> Arc<LocalSandbox> {
    b.create_local(&spec).unwrap()
}

/// The count the sandbox's counter wrote last (0 before its first).
fn count(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("tmp/count"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

fn counting(dir: &Path) -> bool {
    let before = count(dir);
    eventually(WAIT, || count(dir) > before + 2)
}

/// PID 1 of each namespace the sandbox in `dir` holds, as the host numbers them.
fn holders(dir: &Path) -> Vec<u32> {
    ["sandbox.json", "task.json", "spare.json"]
        .iter()
        .filter_map(|f| std::fs::read(dir.join("ns").join(f)).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .filter_map(|v| v["init"].as_u64().map(|p| p as u32))
        .collect()
}

fn pid_ns(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// The state letter (`/proc/<pid>/stat` field 3) of every process in the namespaces of
/// `holders`.
fn states_in(holders: &[u32]) -> Vec<(u32, char)> {
    let spaces: Vec<PathBuf> = holders.iter().filter_map(|&h| pid_ns(h)).collect();
    let mut out = Vec::new();
    for pid in support::proc_pids() {
        if !pid_ns(pid).is_some_and(|ns| spaces.contains(&ns)) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some(state) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
        {
            out.push((pid, state));
        }
    }
    out
}

/// Fails unless the sandbox has processes and every one is stopped (or a zombie).
fn assert_all_stopped(holders: &[u32]) {
    let states = states_in(holders);
    assert!(states.len() >= 4, "too few processes seen: {states:?}");
    let running = still_running(&states);
    assert!(
        running.is_empty(),
        "still running: {running:?} of {states:?}"
    );
}

fn still_running(states: &[(u32, char)]) -> Vec<(u32, char)> {
    states
        .iter()
        .filter(|(_, s)| !matches!(s, 'T' | 't' | 'Z'))
        .copied()
        .collect()
}

fn listed_state(b: &LocalBackend, id: &str) -> Option<RunState> {
    b.list(&Metadata::new())
        .unwrap()
        .into_iter()
        .find(|s| s.id == id)
        .map(|s| s.state)
}

fn assert_paused_error(e: SandboxError) {
    assert!(matches!(e, SandboxError::Paused { .. }), "{e:?}");
    assert_eq!(e.class(), ErrorClass::Gone);
}

#[test]
fn a_memory_pause_stops_every_process_and_a_resume_continues_them() {
    let (state, b) = backend();
    let sb = create_local(&b, spec());
    let dir = sb.dir().to_path_buf();
    let id = sb.id().to_string();
    sb.seal().unwrap();
    sh(&*sb, "echo kept > /tmp/outside-the-seal");
    let counter = start_counter(&*sb);
    // A background process whose output its handle keeps reading across the pause.
    let ticker = sb
        .spawn(
            "for i in $(seq 1 400); do echo tick-$i; sleep 0.05; done",
            &SpawnOpts::default(),
        )
        .unwrap();
    read_until(&ticker.events, "tick-2\n", WAIT);
    assert!(counting(&dir), "the counter never ran");

    assert_eq!(b.pause(&id, PauseKind::Memory).unwrap(), Paused::Now);
    let held = holders(&dir);
    assert_eq!(held.len(), 2, "{held:?}");
    assert_all_stopped(&held);
    assert_eq!(running(&counter).len(), 1, "the counter is gone");
    let frozen = count(&dir);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(count(&dir), frozen, "the counter counted while paused");
    while let Ok(event) = ticker.events.try_recv() {
        drop(event);
    }
    assert!(
        ticker
            .events
            .recv_timeout(Duration::from_millis(300))
            .is_err(),
        "output arrived while paused"
    );
    let m = meta_json(&state, &id);
    assert_eq!(m["paused"]["kind"], "memory", "{m}");
    assert_eq!(m["paused"]["timeout"], 300, "{m}");
    assert_eq!(listed_state(&b, &id), Some(RunState::Paused));
    assert_eq!(b.run_state(&id).unwrap(), RunState::Paused);
    assert_paused_error(sh_err(&*sb));
    assert_paused_error(sb.read_file("/tmp/outside-the-seal").unwrap_err());

    let again = b.connect(&id).unwrap();
    assert!(counting(&dir), "the counter did not continue");
    assert!(count(&dir) > frozen);
    // Every process goes on where it was: the ticker continues from where it stopped.
    let more = read_until(&ticker.events, "tick-", WAIT);
    assert!(!more.contains("tick-1\n"), "{more}");
    assert!(held.iter().all(|&h| pid_alive(h)), "the holders changed");
    assert_eq!(again.read_file("/tmp/outside-the-seal").unwrap(), b"kept\n");
    assert_eq!(sh(&*sb, "echo back").stdout.to_text(), "back\n");
    assert_eq!(b.run_state(&id).unwrap(), RunState::Running);
    let m = meta_json(&state, &id);
    assert!(m.get("paused").is_none(), "{m}");
    let deadline = m["deadline"].as_u64().unwrap();
    assert!(
        (now_secs() + 298..=now_secs() + 301).contains(&deadline),
        "{m}"
    );
    b.kill(&id).unwrap();
}

#[test]
fn a_filesystem_pause_keeps_the_files_and_ends_the_processes() {
    let (_state, b) = backend();
    let sb = create_local(&b, spec());
    let dir = sb.dir().to_path_buf();
    let id = sb.id().to_string();
    sh(&*sb, "echo in-home > note.txt; echo in-tmp > /tmp/t.txt");
    let counter = start_counter(&*sb);
    let p = sb.spawn("sleep 1000", &SpawnOpts::default()).unwrap();
    assert!(counting(&dir));
    let before = holders(&dir);

    assert_eq!(b.pause(&id, PauseKind::Filesystem).unwrap(), Paused::Now);
    assert!(running(&counter).is_empty(), "the counter survived");
    assert!(!pid_alive(p.pid));
    assert_eq!(
        collect(&p.events, WAIT).exit,
        Some(None),
        "killed by a signal"
    );
    assert!(before.iter().all(|&h| !pid_alive(h)), "a holder survived");
    assert!(holders(&dir).is_empty());
    assert_eq!(
        std::fs::read(dir.join("root/note.txt")).unwrap(),
        b"in-home\n"
    );
    assert_eq!(listed_state(&b, &id), Some(RunState::Paused));
    assert_paused_error(sh_err(&*sb));

    let again = b.connect(&id).unwrap();
    // A reboot: new holders, the files as they were, none of the old processes.
    let after = holders(&dir);
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.iter().all(|h| !before.contains(h)));
    let out = sh(&*again, "cat note.txt /tmp/t.txt");
    assert_eq!(out.stdout.to_text(), "in-home\nin-tmp\n");
    let last = count(&dir);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(count(&dir), last, "the counter came back");
    assert!(running(&counter).is_empty());
    // The old handle serves again too.
    assert_eq!(sh(&*sb, "echo back").stdout.to_text(), "back\n");
    b.kill(&id).unwrap();
}

#[test]
fn pausing_twice_says_already_paused() {
    let (_state, b) = backend();
    for kind in [PauseKind::Memory, PauseKind::Filesystem] {
        let sb = create(&b);
        assert_eq!(b.pause(sb.id(), kind).unwrap(), Paused::Now);
        assert_eq!(b.pause(sb.id(), kind).unwrap(), Paused::AlreadyPaused);
        let other = match kind {
            PauseKind::Memory => PauseKind::Filesystem,
            PauseKind::Filesystem => PauseKind::Memory,
        };
        assert_eq!(b.pause(sb.id(), other).unwrap(), Paused::AlreadyPaused);
        b.kill(sb.id()).unwrap();
        let e = b.pause(sb.id(), kind).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Gone, "{e:?}");
    }
}

#[test]
fn a_paused_sandbox_outlives_its_deadline() {
    let (state, b) = backend();
    let sb = create_local(
        &b,
        CreateSpec {
            timeout_secs: 1,
            ..spec()
        },
    );
    let id = sb.id().to_string();
    let counter = start_counter(&*sb);
    assert_eq!(b.pause(&id, PauseKind::Memory).unwrap(), Paused::Now);
    // Past the deadline, with the watcher ticking every 250 ms.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(b.sweep_expired(), 0);
    let other = LocalBackend::open(state.path()).unwrap();
    assert!(sb_dir_exists(&b, &id), "swept while paused");
    assert_eq!(listed_state(&other, &id), Some(RunState::Paused));
    assert_eq!(running(&counter).len(), 1);

    // Resumed with the timeout it was created with, from now.
    let (_again, resumed) = other.resume_local(&id, Resume::AsPaused).unwrap();
    assert_eq!(resumed, Resumed::Now);
    assert!(counting(sb.dir()));
    let deadline = meta_json(&state, &id)["deadline"].as_u64().unwrap();
    assert!(deadline <= now_secs() + 2, "{deadline}");
    let (_, again) = other.resume_local(&id, Resume::AsPaused).unwrap();
    assert_eq!(again, Resumed::WasRunning);
    // And it dies at that deadline, as before.
    wait_for("the resumed sandbox to die", WAIT, || {
        !sb_dir_exists(&b, &id) && running(&counter).is_empty()
    });
}

#[test]
fn a_sandbox_made_to_pause_at_its_deadline_pauses_instead_of_dying() {
    let (state, b) = backend();
    let sb = create_local(
        &b,
        CreateSpec {
            timeout_secs: 1,
            on_timeout: OnTimeout::Pause(PauseKind::Memory),
            ..spec()
        },
    );
    let id = sb.id().to_string();
    let dir = sb.dir().to_path_buf();
    start_counter(&*sb);
    assert!(counting(&dir));
    wait_for("the watcher to pause it", WAIT, || {
        listed_state(&b, &id) == Some(RunState::Paused)
    });
    // The pause is recorded before the processes are stopped (a pause cut short is then
    // still found and undone), so the stop may still be under way when the state reads paused.
    wait_for("its processes to stop", WAIT, || {
        still_running(&states_in(&holders(&dir))).is_empty()
    });
    assert_all_stopped(&holders(&dir));
    assert_eq!(meta_json(&state, &id)["paused"]["kind"], "memory");
    let frozen = count(&dir);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(count(&dir), frozen);
    b.connect(&id).unwrap();
    assert!(counting(&dir));
    b.kill(&id).unwrap();
}

#[test]
fn the_sweep_pauses_what_nobody_watched_past_its_deadline() {
    let state = tempfile::tempdir().unwrap();
    let id;
    let dir;
    let counter;
    {
        let b = LocalBackend::open(state.path()).unwrap();
        let sb = create_local(
            &b,
            CreateSpec {
                // Room for the first commands before it, even where a start is slow
                // (without root, in a user namespace).
                timeout_secs: 3,
                on_timeout: OnTimeout::Pause(PauseKind::Filesystem),
                ..spec()
            },
        );
        id = sb.id().to_string();
        dir = sb.dir().to_path_buf();
        sh(&*sb, "echo kept > kept.txt");
        counter = start_counter(&*sb);
        // The backend (and its watcher) goes; the sandbox stays, as after a CLI command.
    }
    // Past the deadline, which is rounded up to a whole second.
    std::thread::sleep(Duration::from_millis(4500));
    assert_eq!(running(&counter).len(), 1, "died with its backend");
    let b = LocalBackend::open(state.path()).unwrap();
    assert!(dir.exists(), "killed instead of paused");
    assert!(running(&counter).is_empty(), "a filesystem pause left it");
    assert_eq!(listed_state(&b, &id), Some(RunState::Paused));
    let again = b.connect(&id).unwrap();
    assert_eq!(again.read_file("/home/user/kept.txt").unwrap(), b"kept\n");
    b.kill(&id).unwrap();
}

#[test]
fn killing_a_paused_sandbox_leaves_no_process() {
    let (_state, b) = backend();
    for kind in [PauseKind::Memory, PauseKind::Filesystem] {
        let sb = create_local(&b, spec());
        let dir = sb.dir().to_path_buf();
        let counter = start_counter(&*sb);
        let p = sb.spawn("sleep 1000", &SpawnOpts::default()).unwrap();
        let held = holders(&dir);
        assert_eq!(b.pause(sb.id(), kind).unwrap(), Paused::Now);
        assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
        assert!(!dir.exists());
        assert!(running(&counter).is_empty(), "{kind:?}");
        assert!(!pid_alive(p.pid), "{kind:?}");
        assert!(
            held.iter().all(|&h| !pid_alive(h)),
            "{kind:?}: a holder lives"
        );
        let c = collect(&p.events, WAIT);
        let why = String::from_utf8_lossy(&c.stderr);
        assert_eq!(c.exit, Some(None), "{kind:?}: {why}");
        assert_eq!(b.kill(sb.id()).unwrap(), Killed::AlreadyGone);
    }
}

#[test]
fn a_reboot_ends_what_a_memory_pause_kept() {
    let (_state, b) = backend();
    let sb = create_local(&b, spec());
    let id = sb.id().to_string();
    sh(&*sb, "echo kept > kept.txt");
    let counter = start_counter(&*sb);
    b.pause(&id, PauseKind::Memory).unwrap();
    let (again, resumed) = b.resume_local(&id, Resume::Reboot).unwrap();
    assert_eq!(resumed, Resumed::Now);
    assert!(running(&counter).is_empty());
    assert_eq!(again.read_file("/home/user/kept.txt").unwrap(), b"kept\n");
    assert_eq!(sh(&*again, "echo up").stdout.to_text(), "up\n");
    b.kill(&id).unwrap();
}

#[test]
fn a_pause_by_another_process_is_seen_by_every_handle() {
    let (state, b) = backend();
    let sb = create(&b);
    let id = sb.id().to_string();
    let other = LocalBackend::open(state.path()).unwrap();
    assert_eq!(other.pause(&id, PauseKind::Memory).unwrap(), Paused::Now);
    assert_paused_error(sh_err(&*sb));
    assert_eq!(
        b.pause(&id, PauseKind::Memory).unwrap(),
        Paused::AlreadyPaused
    );
    assert_eq!(listed_state(&b, &id), Some(RunState::Paused));
    b.connect(&id).unwrap();
    assert_eq!(sh(&*sb, "echo back").stdout.to_text(), "back\n");
    b.kill(&id).unwrap();
}

#[test]
fn nothing_runs_after_a_pause_that_raced_new_commands() {
    let (_state, b) = backend();
    let sb = create_local(&b, spec());
    let dir = sb.dir().to_path_buf();
    let starters: Vec<_> = (0..4)
        .map(|_| {
            let sb = Arc::clone(&sb);
            std::thread::spawn(move || {
                for started in 0..500 {
                    if let Err(e) = sb.spawn("sleep 600", &SpawnOpts::default()) {
                        assert_paused_error(e);
                        return started;
                    }
                }
                500
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(b.pause(sb.id(), PauseKind::Memory).unwrap(), Paused::Now);
    let started: Vec<usize> = starters.into_iter().map(|s| s.join().unwrap()).collect();
    assert!(started.iter().all(|&n| n > 0 && n < 500), "{started:?}");
    // A start that raced the pause has had time to put its command inside.
    std::thread::sleep(Duration::from_millis(200));
    assert_all_stopped(&holders(&dir));
    b.kill(sb.id()).unwrap();
}

#[test]
fn reset_refuses_a_paused_sandbox_and_works_after_the_resume() {
    let (_state, b) = backend();
    for kind in [PauseKind::Memory, PauseKind::Filesystem] {
        let sb = create(&b);
        sb.seal().unwrap();
        sh(&*sb, "echo dirt > dirt.txt");
        b.pause(sb.id(), kind).unwrap();
        assert_paused_error(sb.reset().unwrap_err());
        b.connect(sb.id()).unwrap();
        sb.reset().unwrap();
        assert_eq!(sh(&*sb, "ls").stdout.to_text(), "", "{kind:?}");
        b.kill(sb.id()).unwrap();
    }
}

#[test]
fn without_namespaces_only_the_filesystem_pauses() {
    let state = tempfile::tempdir().unwrap();
    let options = LocalOptions {
        isolation: IsolationChoice::None,
        ..LocalOptions::default()
    };
    let b = LocalBackend::open_with(state.path(), options).unwrap();
    assert_eq!(b.isolation(), Isolation::None);
    let memory_at_deadline = CreateSpec {
        on_timeout: OnTimeout::Pause(PauseKind::Memory),
        ..spec()
    };
    let e = b.create(&memory_at_deadline).err().unwrap();
    assert_eq!(e.class(), ErrorClass::Unsupported, "{e:?}");
    let sb = create(&b);
    let e = b.pause(sb.id(), PauseKind::Memory).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Unsupported, "{e:?}");
    let p = sb.spawn("sleep 1000", &SpawnOpts::default()).unwrap();
    sh(&*sb, "echo kept > kept.txt");
    assert_eq!(
        b.pause(sb.id(), PauseKind::Filesystem).unwrap(),
        Paused::Now
    );
    assert!(!pid_alive(p.pid));
    let again = b.connect(sb.id()).unwrap();
    assert_eq!(sh(&*again, "cat kept.txt").stdout.to_text(), "kept\n");
    b.kill(sb.id()).unwrap();
}
