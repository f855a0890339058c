//! The local backend against the real OS: kills and sweeps (from this process or another),
//! listing, and what a sandbox's processes can and cannot hold or outlive.
//!
//! Every test owns a fresh state directory. Waits are bounded polls for a condition.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ErrorClass, Killed, Metadata, Network, Role, RunOpts, Sandbox,
    SandboxError, SpawnOpts,
};

mod support;

use support::local::*;
use support::{eventually, pid_alive, session_of};

#[test]
fn open_sweeps_what_another_process_left_expired() {
    let state = tempfile::tempdir().unwrap();
    let id = "lsb-00112233445566ff";
    let dir = state.path().join("sandboxes").join(id);
    std::fs::create_dir_all(dir.join("root")).unwrap();
    std::fs::create_dir_all(dir.join("procs")).unwrap();
    let meta = serde_json::json!({
        "id": id, "created": now_secs() - 100, "deadline": now_secs() - 10,
        "metadata": {}, "template": null, "internet": true, "owner_pid": 1,
    });
    std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
    // A process "another wmo-e2b" started: its own group, recorded with its start time.
    let mut child = Command::new("sleep")
        .arg("100")
        .process_group(0)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    std::fs::write(
        dir.join("procs").join(pid.to_string()),
        format!("{}\nsleep 100", start_time(pid)),
    )
    .unwrap();

    let b = LocalBackend::open(state.path()).unwrap();
    assert!(!dir.exists());
    let mut status = None;
    assert!(eventually(WAIT, || {
        status = child.try_wait().unwrap();
        status.is_some()
    }));
    assert_eq!(status.and_then(|s| s.code()), None, "killed by a signal");
    assert!(matches!(b.connect(id), Err(SandboxError::Gone { .. })));
    assert_eq!(b.kill(id).unwrap(), Killed::AlreadyGone);
}

#[test]
fn open_leaves_a_process_whose_pid_was_reused_alone() {
    let state = tempfile::tempdir().unwrap();
    let id = "lsb-00112233445566ee";
    let dir = state.path().join("sandboxes").join(id);
    std::fs::create_dir_all(dir.join("procs")).unwrap();
    let meta = serde_json::json!({
        "id": id, "created": 1, "deadline": 2,
        "metadata": {}, "template": null, "internet": true, "owner_pid": 1,
    });
    std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
    let mut child = Command::new("sleep")
        .arg("100")
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id();
    // Same pid, another start time: the record names a process that no longer exists.
    std::fs::write(
        dir.join("procs").join(pid.to_string()),
        format!("{}\nsleep 100", start_time(pid) + 1),
    )
    .unwrap();
    let _b = LocalBackend::open(state.path()).unwrap();
    assert!(!dir.exists());
    assert!(child.try_wait().unwrap().is_none(), "a stranger was killed");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn list_filters_by_metadata_and_skips_corrupt_meta() {
    let (state, b) = backend();
    let md = |v: &str| -> Metadata { BTreeMap::from([("team".to_string(), v.to_string())]) };
    let a = b
        .create(&CreateSpec {
            metadata: md("a"),
            template: Some("base".into()),
            ..spec()
        })
        .unwrap();
    let other = b
        .create(&CreateSpec {
            metadata: md("b"),
            ..spec()
        })
        .unwrap();
    // A torn meta.json, as a crash or a person might leave it.
    let torn = state.path().join("sandboxes/lsb-0123456789abcdef");
    std::fs::create_dir_all(&torn).unwrap();
    std::fs::write(torn.join("meta.json"), b"{\"id\": \"lsb-01").unwrap();

    let only_a = b.list(&md("a")).unwrap();
    assert_eq!(only_a.len(), 1);
    assert_eq!(only_a[0].id, a.id());
    assert_eq!(only_a[0].template.as_deref(), Some("base"));
    assert_eq!(only_a[0].metadata, md("a"));
    let all: Vec<String> = b
        .list(&Metadata::new())
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.contains(&other.id().to_string()));
}

#[test]
fn killed_sandbox_is_gone_everywhere() {
    let (_d, b) = backend();
    let sb = create(&b);
    let id = sb.id().to_string();
    let home = sb.home().to_string();
    assert_eq!(b.kill(&id).unwrap(), Killed::Now);
    assert_eq!(b.kill(&id).unwrap(), Killed::AlreadyGone);
    assert!(!Path::new(&home).exists());

    let gone = |r: Result<(), SandboxError>| {
        let e = r.unwrap_err();
        assert!(matches!(e, SandboxError::Gone { .. }), "{e:?}");
        assert_eq!(e.class(), ErrorClass::Gone);
    };
    gone(sb.run("true", &RunOpts::default()).map(drop));
    gone(sb.spawn("true", &SpawnOpts::default()).map(drop));
    gone(sb.processes().map(drop));
    gone(sb.read_file(&format!("{home}/x")).map(drop));
    gone(sb.write_file(&format!("{home}/x"), b"x"));
    gone(sb.set_timeout(10));
    gone(sb.set_internet(true));
    gone(b.connect(&id).map(drop));
    assert!(b.list(&Metadata::new()).unwrap().is_empty());
    assert!(!Path::new(&home).exists(), "a call recreated the sandbox");

    let bad = b.kill("../../etc").unwrap_err();
    assert_eq!(bad.class(), ErrorClass::BadRequest);
}

#[test]
fn a_handle_drop_does_not_kill_the_sandbox() {
    let (_d, b) = backend();
    let sb = create(&b);
    let id = sb.id().to_string();
    let p = sb.spawn("sleep 30", &SpawnOpts::default()).unwrap();
    drop(sb);
    let again = b.connect(&id).unwrap();
    assert!(again.processes().unwrap().iter().any(|i| i.pid == p.pid));
    assert!(pid_alive(p.pid));
    b.kill(&id).unwrap();
    assert!(!pid_alive(p.pid));
}

#[test]
fn another_backend_kills_processes_this_one_started() {
    let (state, b) = backend();
    let sb = create(&b);
    let p = sb.spawn("sleep 30", &SpawnOpts::default()).unwrap();
    let other = LocalBackend::open(state.path()).unwrap();
    let seen = other.connect(sb.id()).unwrap();
    assert!(seen.processes().unwrap().iter().any(|i| i.pid == p.pid));
    assert_eq!(other.kill(sb.id()).unwrap(), Killed::Now);
    assert!(!pid_alive(p.pid));
    assert_eq!(collect(&p.events, WAIT).exit, Some(None));
    assert!(matches!(sh_err(&*sb), SandboxError::Gone { .. }));
}

#[test]
fn locked_network_shows_only_loopback() {
    let (state, b) = backend();
    let sb = create(&b);
    sb.set_internet(false).unwrap();
    assert_eq!(meta_json(&state, sb.id())["internet"], false);
    // /proc/net follows the reader's network namespace (/sys/class/net follows the mount's).
    let out = sh(&*sb, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr.to_text());
    assert_eq!(out.stdout.to_text(), "lo\n");
    let p = sb
        .spawn("cat /proc/net/dev", &SpawnOpts::default())
        .unwrap();
    let c = collect(&p.events, WAIT);
    assert_eq!(c.exit, Some(Some(0)), "{}", text(&c.stderr));
    let ifaces: Vec<String> = text(&c.stdout)
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(|s| s.trim().to_string()))
        .collect();
    assert_eq!(ifaces, ["lo"]);

    let locked_at_create = b
        .create(&CreateSpec {
            internet: false,
            ..spec()
        })
        .unwrap();
    let out = sh(
        &*locked_at_create,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    );
    assert_eq!(out.stdout.to_text(), "lo\n");
}

#[test]
fn no_process_survives_kill() {
    let (_d, b) = backend();
    let sb = create(&b);
    // Detached three ways: left behind, in its own session, and double-forked.
    let p = sb
        .spawn(
            "sleep 100.103 & setsid sleep 100.104 & (sleep 100.105 &); echo started",
            &SpawnOpts::default(),
        )
        .unwrap();
    let c = collect(&p.events, WAIT);
    assert_eq!(c.exit, Some(Some(0)));
    let markers = ["sleep 100.103", "sleep 100.104", "sleep 100.105"];
    assert!(
        eventually(WAIT, || markers.iter().all(|m| !running(m).is_empty())),
        "the background children should outlive their parent"
    );
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
    // kill confirms every process is gone before it returns.
    for m in markers {
        assert!(running(m).is_empty(), "{m} survived the kill");
    }
}

#[test]
fn concurrent_stdin_writers_do_not_block_each_other() {
    let (_d, b) = backend();
    let sb = create(&b);
    let opts = SpawnOpts {
        stdin: true,
        ..SpawnOpts::default()
    };
    // A process that never reads its stdin, and one that does.
    let stuck = sb.spawn("sleep 30", &opts).unwrap();
    let reader = sb.spawn("wc -c", &opts).unwrap();
    let sb2 = Arc::clone(&sb);
    let stuck_pid = stuck.pid;
    // Fills the stuck process's pipe and blocks (bounded by the stdin write timeout).
    let blocked = std::thread::spawn(move || sb2.send_stdin(stuck_pid, &vec![b'x'; 1 << 20]));
    let big = vec![b'y'; 4 << 20];
    sb.send_stdin(reader.pid, &big).unwrap();
    sb.close_stdin(reader.pid).unwrap();
    let c = collect(&reader.events, WAIT);
    assert_eq!(c.exit, Some(Some(0)));
    assert_eq!(text(&c.stdout).trim(), (4 << 20).to_string());
    // Killing the stuck process ends the blocked write with a transport error.
    sb.kill_process(stuck_pid).unwrap();
    let r = blocked.join().unwrap();
    assert!(r.is_err_and(|e| e.is_transport()));
}

/// Variables the caller sets reach the command but none of the stages that start it with
/// privileges (a loader variable there would run sandbox-written code as root).
#[test]
fn caller_variables_reach_only_the_command() {
    let (_d, b) = backend();
    let sb = create(&b);
    let out = sb
        .run(
            "echo \"$FROM_CALLER\"",
            &RunOpts {
                envs: vec![
                    ("FROM_CALLER".into(), "yes".into()),
                    ("LD_PRELOAD".into(), "/nonexistent/preload.so".into()),
                ],
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr.to_text());
    assert_eq!(out.stdout.to_text(), "yes\n");
    // The loader complains once per program it starts with the variable: only bash.
    let stderr = out.stderr.to_text();
    assert_eq!(stderr.matches("preload.so").count(), 1, "{stderr}");
}

/// Makes the process the named test runs in the reaper of every orphan below it, and one
/// that never reaps: like a container whose PID 1 is not an init. A subreaper is
/// process-wide and a test harness may run tests as threads of one process (`cargo test`
/// does), where it would keep other tests' namespaces from ending: so the test runs again in
/// a process of its own, and `false` tells the caller it has nothing left to do here.
fn alone_where_orphans_are_never_reaped(test: &str) -> bool {
    const ALONE: &str = "WMO_E2B_TEST_ALONE";
    if std::env::var_os(ALONE).is_some() {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        return true;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads", "1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{test} in a process of its own: {said}"
    );
    assert!(said.contains("1 passed"), "{test} did not run: {said}");
    false
}

/// A command that entered a namespace from outside is reaped by its launcher there; were the
/// launcher killed first, the command would be left to a reaper that may never come, and the
/// namespace could not be proven dead.
#[test]
fn a_sandbox_dies_where_nobody_reaps_orphans() {
    if !alone_where_orphans_are_never_reaped("a_sandbox_dies_where_nobody_reaps_orphans") {
        return;
    }
    let (_d, b) = backend();
    let sb = create(&b);
    let _task = sb.spawn("sleep 100.201", &SpawnOpts::default()).unwrap();
    let _system = sb
        .spawn(
            "sleep 100.202",
            &SpawnOpts {
                role: Role::System,
                ..SpawnOpts::default()
            },
        )
        .unwrap();
    let markers = ["sleep 100.201", "sleep 100.202"];
    assert!(eventually(WAIT, || markers
        .iter()
        .all(|m| !running(m).is_empty())));
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
    for m in markers {
        assert!(running(m).is_empty(), "{m} survived the kill");
    }
}

#[test]
fn a_reset_ends_running_task_commands_where_nobody_reaps_orphans() {
    if !alone_where_orphans_are_never_reaped(
        "a_reset_ends_running_task_commands_where_nobody_reaps_orphans",
    ) {
        return;
    }
    let (_d, b) = backend();
    let sb = create(&b);
    let system = SpawnOpts {
        role: Role::System,
        ..SpawnOpts::default()
    };
    let _runner = sb.spawn("sleep 100.211", &system).unwrap();
    sb.seal().unwrap();
    let _task = sb.spawn("sleep 100.212", &SpawnOpts::default()).unwrap();
    assert!(eventually(WAIT, || !running("sleep 100.212").is_empty()));
    sb.reset().unwrap();
    assert!(
        running("sleep 100.212").is_empty(),
        "the task command survived"
    );
    assert!(
        !running("sleep 100.211").is_empty(),
        "the reset ended a system process"
    );
    assert_eq!(sh(&*sb, "echo ok").stdout.to_text(), "ok\n");
}

/// The PID 1 (as the host numbers it) of the task namespace a sandbox has recorded.
fn task_namespace_init(state: &Path, id: &str) -> u64 {
    let path = state
        .join("sandboxes")
        .join(id)
        .join("ns")
        .join("task.json");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["init"].as_u64().unwrap()
}

/// A reset keeps a task namespace no task process ever entered (nothing of a task can be in
/// it) and replaces one that a task command left something in (a `/dev/shm` file; in a user
/// namespace, any command), even one long ended, even one another wmo-e2b process ran.
#[test]
fn a_reset_keeps_a_task_namespace_only_when_nothing_of_a_task_is_in_it() {
    let (state, b) = backend();
    let sb = create(&b);
    let system = SpawnOpts {
        role: Role::System,
        ..SpawnOpts::default()
    };
    let runner = sb.spawn("sleep 30", &system).unwrap();
    sb.seal().unwrap();
    let untouched = task_namespace_init(state.path(), sb.id());
    sb.reset().unwrap();
    assert_eq!(
        task_namespace_init(state.path(), sb.id()),
        untouched,
        "a namespace nothing ran in was replaced"
    );

    let leave = |sb: &dyn Sandbox, word: &str| {
        let out = sh(sb, &format!("echo {word}; touch /dev/shm/{word}"));
        assert_eq!(out.stdout.to_text(), format!("{word}\n"));
    };
    leave(&*sb, "ok");
    sb.reset().unwrap();
    let entered_here = task_namespace_init(state.path(), sb.id());
    assert_ne!(
        entered_here, untouched,
        "a namespace a command ran in was kept"
    );
    assert!(
        eventually(WAIT, || !pid_alive(untouched as u32)),
        "the replaced namespace still runs"
    );

    let other = LocalBackend::open(state.path()).unwrap();
    let seen = other.connect(sb.id()).unwrap();
    leave(&*seen, "there");
    sb.reset().unwrap();
    assert_ne!(
        task_namespace_init(state.path(), sb.id()),
        entered_here,
        "a namespace another process ran a command in was kept"
    );
    assert!(pid_alive(runner.pid), "the reset ended a system process");
}

/// A reset that died between dropping the old task namespace's record and renaming the
/// spare's into its place leaves the sandbox usable: the next process to look for its task
/// namespace finishes the promotion.
#[test]
fn a_promotion_cut_short_is_finished_by_the_next_reader() {
    let (state, b) = backend();
    // Spares are made only where a reset cannot keep its task namespace: in a user
    // namespace, and on an image.
    // SAFETY: geteuid cannot fail and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    if root && !image_roots_available() {
        eprintln!("skipped: as root only a sandbox on an image has a spare");
        return;
    }
    let images = tempfile::tempdir().unwrap();
    let sb = match root {
        true => b
            .create(&CreateSpec {
                image: Some(busybox_image(images.path(), "sha256:test")),
                ..spec()
            })
            .unwrap(),
        false => create(&b),
    };
    let ns = state.path().join("sandboxes").join(sb.id()).join("ns");
    assert!(eventually(WAIT, || ns.join("spare.json").exists()));
    let spare: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ns.join("spare.json")).unwrap()).unwrap();
    // The reset's first steps: the task namespace ended, its record dropped.
    let old = task_namespace_init(state.path(), sb.id());
    // SAFETY: kill(2) of the old task namespace's PID 1, which this test's sandbox owns.
    unsafe { libc::kill(old as libc::pid_t, libc::SIGKILL) };
    assert!(eventually(WAIT, || !pid_alive(old as u32)));
    std::fs::remove_file(ns.join("task.json")).unwrap();

    let other = LocalBackend::open(state.path()).unwrap();
    let seen = other.connect(sb.id()).unwrap();
    assert_eq!(sh(&*seen, "echo ok").stdout.to_text(), "ok\n");
    assert_eq!(
        task_namespace_init(state.path(), sb.id()),
        spare["init"].as_u64().unwrap(),
        "the spare did not become the task namespace"
    );
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
}

/// Whatever path a command takes in (entering its holder's namespaces, or a bwrap of its own
/// when the network is locked), it runs as the sandbox user with no capability it could use
/// or regain, and holds no fd but its stdio: not even one this process inherited from its own
/// parent without close-on-exec.
#[test]
fn a_command_holds_no_privilege_and_no_fd_of_ours() {
    let (_d, b) = backend();
    let inherited = std::fs::File::open("/dev/null").unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&inherited);
    // SAFETY: clears close-on-exec on an fd this test owns.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
    // No pipeline while the shell's fds are listed: it holds a pipe's ends for a moment.
    let report = "id -u; id -g; id -G; ls /proc/$$/fd > /tmp/fds; tr '\\n' ' ' < /tmp/fds; \
                  echo; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/$$/status";
    for internet in [true, false] {
        let sb = b.create(&CreateSpec { internet, ..spec() }).unwrap();
        for role in [Role::Task, Role::System] {
            let out = sb
                .run(
                    report,
                    &RunOpts {
                        role,
                        ..RunOpts::default()
                    },
                )
                .unwrap();
            let text = out.stdout.to_text();
            let lines: Vec<&str> = text.lines().collect();
            let what = format!(
                "internet {internet}, {role:?}: {text}{}",
                out.stderr.to_text()
            );
            assert_eq!(
                lines.get(..3),
                Some(&["1000", "1000", "1000"][..]),
                "{what}"
            );
            assert_eq!(lines.get(3).map(|l| l.trim()), Some("0 1 2"), "{what}");
            for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
                assert!(
                    lines.contains(&format!("{cap}:\t0000000000000000").as_str()),
                    "{cap} not empty ({what})"
                );
            }
            assert!(lines.contains(&"NoNewPrivs:\t1"), "{what}");
        }
    }
    drop(inherited);
}

/// A process whose low fds are taken still starts sandboxes: the namespace fds a nested
/// holder's bwrap is handed by number land where its launcher's own fds (its stdio) cannot
/// overwrite them.
#[test]
fn sandboxes_start_whatever_fds_this_process_holds() {
    // Take every free fd below 8, so the next ones opened are 8, 9, 10...
    let mut held = Vec::new();
    loop {
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        held.push(f);
        if fd >= 7 {
            break;
        }
    }
    let (_d, b) = backend();
    for _ in 0..3 {
        let sb = create(&b);
        assert_eq!(sh(&*sb, "echo ok").stdout.to_text(), "ok\n");
        sb.seal().unwrap();
        sb.reset().unwrap();
        assert_eq!(sh(&*sb, "echo again").stdout.to_text(), "again\n");
        assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
    }
    drop(held);
}

/// Killing one command (a tool call past its deadline) leaves nothing for a reaper that never
/// comes: the next reset still proves the sandbox clean.
#[test]
fn a_killed_command_leaves_the_sandbox_resettable_where_nobody_reaps_orphans() {
    if !alone_where_orphans_are_never_reaped(
        "a_killed_command_leaves_the_sandbox_resettable_where_nobody_reaps_orphans",
    ) {
        return;
    }
    let (_d, b) = backend();
    let sb = create(&b);
    sb.seal().unwrap();
    let p = sb.spawn("sleep 100.221", &SpawnOpts::default()).unwrap();
    assert!(eventually(WAIT, || !running("sleep 100.221").is_empty()));
    sb.kill_process(p.pid).unwrap();
    assert_eq!(collect(&p.events, WAIT).exit, Some(None));
    let out = sb
        .run(
            "sleep 100.222",
            &RunOpts {
                timeout: Duration::from_millis(300),
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert!(out.timed_out);
    sb.reset().unwrap();
    assert_eq!(sh(&*sb, "echo ok").stdout.to_text(), "ok\n");
}

/// A sandbox's process records live on a tmpfs (each command's record is no inode of the
/// disk) and go with the sandbox; a boot that emptied the tmpfs leaves the sandbox working:
/// no record reads as none, and the next command's record makes their directory anew.
#[test]
fn process_records_live_on_a_tmpfs_and_go_with_their_sandbox() {
    let (state, b) = backend();
    let sb = create(&b);
    let procs = state.path().join("sandboxes").join(sb.id()).join("procs");
    let Ok(records) = std::fs::read_link(&procs) else {
        eprintln!("skipped: no tmpfs for process records here");
        return;
    };
    assert!(records.starts_with("/dev/shm"), "{records:?}");
    let sleeper = sb.spawn("sleep 30", &SpawnOpts::default()).unwrap();
    assert!(records.join(sleeper.pid.to_string()).is_file());
    assert!(sb.processes().unwrap().iter().any(|p| p.pid == sleeper.pid));
    sb.kill_process(sleeper.pid).unwrap();

    // What a boot leaves: the link, pointing nowhere.
    std::fs::remove_dir_all(&records).unwrap();
    assert!(sb.processes().unwrap().is_empty());
    assert_eq!(sh(&*sb, "echo ok").stdout.to_text(), "ok\n");
    assert!(
        records.is_dir(),
        "the next record did not make its directory"
    );

    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
    assert!(!records.exists(), "the records outlived their sandbox");
}

/// The sandbox's PID 1 is this program's own, holds nothing a process of the sandbox may
/// read, and reaps what the sandbox orphans: a background process whose shell has exited
/// leaves no zombie behind.
#[test]
fn the_sandboxs_pid_1_is_ours_and_reaps_its_orphans() {
    let (_d, b) = backend();
    let sb = create(&b);
    let system = RunOpts {
        role: Role::System,
        ..RunOpts::default()
    };
    let run = |cmd: &str| sb.run(cmd, &system).unwrap().stdout.to_text();
    assert_eq!(
        run("tr '\\0' ' ' < /proc/1/cmdline"),
        "/run/wmo-e2b/init --wmo-e2b-sandbox-helper init "
    );
    assert_eq!(
        run("cat /proc/1/environ >/dev/null 2>&1 || echo refused"),
        "refused\n"
    );
    // Orphans that exit at once, and one that outlives its shell by a moment.
    run("for i in 1 2 3; do (sleep 0.0$i &); done; (sleep 0.3 &); echo started");
    let zombies = "n=0; for s in /proc/[0-9]*/stat; do \
                   case \"$(cut -d')' -f2 \"$s\" 2>/dev/null)\" in ' Z'*) n=$((n+1));; esac; \
                   done; echo $n";
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(run(zombies), "0\n", "an orphan was left unreaped");
}

/// Nothing of a sandbox outlives its `meta.json` for long, even with no wmo-e2b process left
/// to kill it: the watcher leading the sandbox holder's session kills it, and with its PID 1
/// goes every process of its namespace (the task holder's session and slirp4netns, as root,
/// live there; without root the task holder has a watcher of its own).
#[test]
fn a_sandbox_whose_directory_vanishes_ends_with_every_process_of_it() {
    let (state, b) = backend();
    // A network of its own where the host allows one: slirp4netns has a watcher too.
    let own = wmo_e2b::sandbox::local::network_unavailable(Default::default()).is_none();
    let network = match own {
        true => Network::Internet,
        false => Network::default(),
    };
    let sb = b.create(&CreateSpec { network, ..spec() }).unwrap();
    let dir = state.path().join("sandboxes").join(sb.id());
    let record = |name: &str, field: &str| -> Option<u32> {
        let text = std::fs::read(dir.join("ns").join(name)).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
        u32::try_from(v[field].as_u64()?).ok()
    };
    let system = SpawnOpts {
        role: Role::System,
        ..SpawnOpts::default()
    };
    let runner = sb.spawn("sleep 300", &system).unwrap();
    let task = sb.spawn("sleep 301", &SpawnOpts::default()).unwrap();
    // slirp4netns, where the sandbox has a network of its own: a session of its own.
    let slirp: Vec<u32> = running("slirp4netns")
        .into_iter()
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                c.split('\0')
                    .any(|a| record("sandbox.json", "init") == a.parse().ok())
            })
        })
        .collect();
    assert_eq!(slirp.len(), usize::from(own), "{slirp:?}");
    // Every process of each holder's session (its watcher, its bwraps, its PID 1 and what
    // that runs) and of slirp4netns's, wherever it lives.
    let sessions: Vec<u32> = ["sandbox.json", "task.json"]
        .iter()
        .filter_map(|f| record(f, "group"))
        .chain(slirp.iter().copied())
        .collect();
    assert_eq!(sessions.len(), 2 + usize::from(own), "{sessions:?}");
    let mut pids = vec![runner.pid, task.pid];
    for session in &sessions {
        let members = support::proc_pids()
            .into_iter()
            .filter(|&p| session_of(p) == Some(*session))
            .collect::<Vec<_>>();
        assert!(!members.is_empty(), "session {session} has no process");
        pids.extend(members);
    }
    assert!(pids.iter().all(|&p| pid_alive(p)));

    std::fs::remove_file(dir.join("meta.json")).unwrap();
    assert!(
        eventually(Duration::from_secs(20), || pids
            .iter()
            .all(|&p| !pid_alive(p))),
        "still running: {:?}",
        pids.iter().filter(|&&p| pid_alive(p)).collect::<Vec<_>>()
    );
}
