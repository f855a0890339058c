//! The local backend against the real OS: processes, pipes, files, deadlines, kills.
//!
//! Every test owns a fresh state directory. Waits are bounded polls for a condition.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use tempfile::TempDir;
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ErrorClass, Killed, Metadata, ProcessEvent, Role, RunOpts, Sandbox,
    SandboxError, SpawnOpts,
};

const WAIT: Duration = Duration::from_secs(10);

fn backend() -> (TempDir, Arc<LocalBackend>) {
    let dir = tempfile::tempdir().unwrap();
    let b = LocalBackend::open(dir.path()).unwrap();
    (dir, b)
}

fn spec() -> CreateSpec {
    CreateSpec {
        timeout_secs: 300,
        internet: true,
        ..CreateSpec::default()
    }
}

fn create(b: &LocalBackend) -> Arc<dyn Sandbox> {
    b.create(&spec()).unwrap()
}

fn sh(sb: &dyn Sandbox, cmd: &str) -> wmo_e2b::sandbox::Output {
    sb.run(cmd, &RunOpts::default()).unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Polls `cond` until it holds or `within` passes.
fn poll_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A process is alive if /proc knows it and it is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().chars().next());
        !matches!(state, Some(Some('Z' | 'X')))
    })
}

/// Host pids of running processes whose command line contains `marker`: a sandbox's own
/// pids (what `$!` says inside it) are not the host's.
fn running(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            alive(pid)
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(marker)
                })
        })
        .collect()
}

fn start_time(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = s.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

#[derive(Default, Debug)]
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<Option<i32>>,
}

/// Reads events until Exit (or the channel ends, or `within` passes).
fn collect(events: &Receiver<ProcessEvent>, within: Duration) -> Collected {
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

/// Reads stdout events until the accumulated stdout contains `needle`.
fn read_until(events: &Receiver<ProcessEvent>, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    let mut out = Vec::new();
    while !text(&out).contains(needle) {
        match events.recv_deadline(deadline) {
            Ok(ProcessEvent::Stdout(d)) => out.extend(d),
            Ok(ProcessEvent::Stderr(_)) => {}
            Ok(other) => panic!(
                "unexpected {other:?} before {needle:?}; got {:?}",
                text(&out)
            ),
            Err(e) => panic!("no {needle:?} ({e}); got {:?}", text(&out)),
        }
    }
    text(&out)
}

fn meta_json(state: &TempDir, id: &str) -> serde_json::Value {
    let p = state.path().join("sandboxes").join(id).join("meta.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn run_reports_output_and_exit_code() {
    let (_d, b) = backend();
    let sb = create(&b);
    let out = sh(&*sb, "echo out; echo err >&2; exit 3");
    assert_eq!(out.exit_code, Some(3));
    assert_eq!(out.stdout.to_text(), "out\n");
    assert_eq!(out.stderr.to_text(), "err\n");
    assert!(!out.timed_out);

    let killed = sh(&*sb, "kill -9 $$");
    assert_eq!(killed.exit_code, None);
    assert!(!killed.timed_out);
}

#[test]
fn run_honours_cwd_envs_and_home() {
    let (_d, b) = backend();
    let sb = b
        .create(&CreateSpec {
            envs: vec![("FROM_SPEC".into(), "s".into())],
            ..spec()
        })
        .unwrap();
    let home = sb.home().to_string();
    assert!(home.starts_with('/'), "{home}");
    assert_eq!(sh(&*sb, "pwd").stdout.to_text(), format!("{home}\n"));
    sh(&*sb, "mkdir sub");
    let out = sb
        .run(
            "pwd; echo $FROM_SPEC $FROM_OPTS; echo $HOME",
            &RunOpts {
                cwd: Some(format!("{home}/sub")),
                envs: vec![("FROM_OPTS".into(), "o".into())],
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert_eq!(out.stdout.to_text(), format!("{home}/sub\ns o\n{home}\n"));

    let missing = sb.run(
        "true",
        &RunOpts {
            cwd: Some(format!("{home}/nope")),
            ..RunOpts::default()
        },
    );
    assert!(
        matches!(missing, Err(SandboxError::NotFound { .. })),
        "{missing:?}"
    );
}

#[test]
fn run_truncates_to_head_and_tail() {
    let (_d, b) = backend();
    let sb = create(&b);
    let total: u64 = sh(&*sb, "seq 1 10000 | wc -c")
        .stdout
        .to_text()
        .trim()
        .parse()
        .unwrap();
    let out = sb
        .run(
            "seq 1 10000",
            &RunOpts {
                max_output: 100,
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert_eq!(out.stdout.head.len(), 50);
    assert_eq!(out.stdout.tail.len(), 50);
    assert_eq!(out.stdout.dropped, total - 100);
    let t = out.stdout.to_text();
    assert!(t.starts_with("1\n2\n3\n"), "{t}");
    assert!(t.ends_with("9999\n10000\n"), "{t}");
    assert!(
        t.contains(&format!("[{} bytes truncated]", total - 100)),
        "{t}"
    );
}

#[test]
fn run_timeout_kills_the_whole_group() {
    let (_d, b) = backend();
    let sb = create(&b);
    let started = Instant::now();
    let out = sb
        .run(
            "sleep 30.101 & sleep 30",
            &RunOpts {
                timeout: Duration::from_millis(500),
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert!(out.timed_out);
    assert_eq!(out.exit_code, None);
    assert!(started.elapsed() < WAIT, "took {:?}", started.elapsed());
    assert!(
        poll_until(WAIT, || running("sleep 30.101").is_empty()),
        "the background child survived"
    );
}

#[test]
fn run_returns_when_a_background_child_holds_the_pipes() {
    let (_d, b) = backend();
    let sb = create(&b);
    let started = Instant::now();
    let out = sh(&*sb, "sleep 30.102 & echo started");
    assert_eq!(out.exit_code, Some(0));
    assert!(!out.timed_out);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(out.stdout.to_text(), "started\n");
    assert!(
        poll_until(WAIT, || running("sleep 30.102").is_empty()),
        "the background child survived its run"
    );
}

#[test]
fn spawn_echoes_stdin_and_exits_when_it_closes() {
    let (_d, b) = backend();
    let sb = create(&b);
    let p = sb
        .spawn(
            "cat",
            &SpawnOpts {
                stdin: true,
                ..SpawnOpts::default()
            },
        )
        .unwrap();
    sb.send_stdin(p.pid, b"hello\n").unwrap();
    assert_eq!(read_until(&p.events, "hello\n"), "hello\n");
    sb.close_stdin(p.pid).unwrap();
    let rest = collect(&p.events, WAIT);
    assert_eq!(rest.exit, Some(Some(0)));
    assert!(rest.stdout.is_empty());
    // Exactly one Exit: the channel ends after it.
    assert!(matches!(
        p.events.recv_timeout(WAIT),
        Err(RecvTimeoutError::Disconnected)
    ));
    assert!(matches!(
        sb.send_stdin(p.pid, b"late"),
        Err(SandboxError::NoSuchProcess { .. })
    ));
}

#[test]
fn spawn_streams_large_output_intact() {
    let (_d, b) = backend();
    let sb = create(&b);
    let p = sb
        .spawn(
            "head -c 20000000 /dev/zero; echo done >&2",
            &SpawnOpts::default(),
        )
        .unwrap();
    let c = collect(&p.events, Duration::from_secs(60));
    assert_eq!(c.exit, Some(Some(0)));
    assert_eq!(c.stdout.len(), 20_000_000);
    assert!(c.stdout.iter().all(|&b| b == 0));
    assert_eq!(text(&c.stderr), "done\n");
}

#[test]
fn connect_reattaches_to_a_running_process() {
    let (_d, b) = backend();
    let sb = create(&b);
    let p = sb
        .spawn(
            "cat",
            &SpawnOpts {
                stdin: true,
                ..SpawnOpts::default()
            },
        )
        .unwrap();
    sb.send_stdin(p.pid, b"one\n").unwrap();
    read_until(&p.events, "one\n");

    // Another handle on the same sandbox, as a second caller in this process would get.
    let again = b.connect(sb.id()).unwrap();
    let q = again.connect(p.pid).unwrap();
    assert_eq!(q.pid, p.pid);
    // The first subscriber is cut off.
    assert!(poll_until(WAIT, || matches!(
        p.events.try_recv(),
        Err(crossbeam_channel::TryRecvError::Disconnected)
    )));
    again.send_stdin(p.pid, b"two\n").unwrap();
    assert_eq!(read_until(&q.events, "two\n"), "two\n");
    again.close_stdin(p.pid).unwrap();
    assert_eq!(collect(&q.events, WAIT).exit, Some(Some(0)));

    assert!(matches!(
        sb.connect(p.pid),
        Err(SandboxError::NoSuchProcess { .. })
    ));
    assert!(matches!(
        sb.connect(1),
        Err(SandboxError::NoSuchProcess { .. })
    ));
}

#[test]
fn processes_lists_running_ones_and_kill_process_ends_them() {
    let (_d, b) = backend();
    let sb = create(&b);
    let p = sb.spawn("sleep 30", &SpawnOpts::default()).unwrap();
    let done = sb.spawn("true", &SpawnOpts::default()).unwrap();
    assert_eq!(collect(&done.events, WAIT).exit, Some(Some(0)));

    let listed = sb.processes().unwrap();
    assert!(
        listed.iter().any(|i| i.pid == p.pid && i.cmd == "sleep 30"),
        "{listed:?}"
    );
    assert!(!listed.iter().any(|i| i.pid == done.pid), "{listed:?}");

    sb.kill_process(p.pid).unwrap();
    assert!(!alive(p.pid));
    assert_eq!(collect(&p.events, WAIT).exit, Some(None));
    assert!(!sb.processes().unwrap().iter().any(|i| i.pid == p.pid));
    assert!(matches!(
        sb.kill_process(p.pid),
        Err(SandboxError::NoSuchProcess { .. })
    ));
}

#[test]
fn files_are_read_written_and_contained() {
    let (_d, b) = backend();
    let sb = create(&b);
    let home = sb.home().to_string();
    let file = format!("{home}/a/b/c.txt");
    sb.write_file(&file, b"contents").unwrap();
    assert_eq!(sb.read_file(&file).unwrap(), b"contents");
    assert_eq!(sh(&*sb, "cat a/b/c.txt").stdout.to_text(), "contents");

    let missing = sb.read_file(&format!("{home}/nope")).unwrap_err();
    assert!(
        matches!(missing, SandboxError::NotFound { .. }),
        "{missing:?}"
    );
    assert_eq!(missing.class(), ErrorClass::BadRequest);

    for bad in [
        "/etc/wmo-e2b-test".to_string(),
        format!("{home}/../escape"),
        format!("{home}/a/../../escape"),
        "relative/path".to_string(),
        home.clone(),
        format!("{home}x/sibling"),
    ] {
        let err = sb.write_file(&bad, b"x").unwrap_err();
        assert!(
            matches!(err, SandboxError::BadPath { .. }),
            "{bad}: {err:?}"
        );
        assert_eq!(err.class(), ErrorClass::BadRequest);
    }
    assert!(!Path::new(&home).parent().unwrap().join("escape").exists());
}

#[test]
fn set_timeout_moves_the_deadline() {
    let (state, b) = backend();
    let sb = b
        .create(&CreateSpec {
            timeout_secs: 100,
            ..spec()
        })
        .unwrap();
    let before = meta_json(&state, sb.id());
    let d1 = before["deadline"].as_u64().unwrap();
    assert!(d1 >= now_secs() + 99 && d1 <= now_secs() + 101, "{before}");
    sb.set_timeout(1000).unwrap();
    let after = meta_json(&state, sb.id());
    let d2 = after["deadline"].as_u64().unwrap();
    assert!(d2 >= now_secs() + 999 && d2 <= now_secs() + 1001, "{after}");
    assert_eq!(after["id"], before["id"]);
    assert_eq!(after["created"], before["created"]);
    assert_eq!(after["internet"], true);
    assert!(after["owner_pid"].as_u64().is_some());
}

#[test]
fn a_sandbox_dies_at_its_deadline() {
    let (_d, b) = backend();
    let sb = b
        .create(&CreateSpec {
            timeout_secs: 1,
            ..spec()
        })
        .unwrap();
    let p = sb.spawn("sleep 100", &SpawnOpts::default()).unwrap();
    let id = sb.id().to_string();
    let listed = |b: &LocalBackend| b.list(&Metadata::new()).unwrap().iter().any(|s| s.id == id);
    assert!(listed(&b));
    // The watcher kills it, not a call on it: poll only the process and the directory.
    assert!(
        poll_until(WAIT, || !alive(p.pid)),
        "process outlived its sandbox"
    );
    assert!(poll_until(WAIT, || !sb_dir_exists(&b, &id)));
    assert!(!listed(&b));
    assert_eq!(collect(&p.events, WAIT).exit, Some(None));
    assert!(matches!(sh_err(&*sb), SandboxError::Gone { .. }));
}

fn sb_dir_exists(b: &LocalBackend, id: &str) -> bool {
    b.sandboxes_dir().join(id).exists()
}

fn sh_err(sb: &dyn Sandbox) -> SandboxError {
    sb.run("true", &RunOpts::default()).unwrap_err()
}

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
    assert!(poll_until(WAIT, || {
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
    assert!(alive(p.pid));
    b.kill(&id).unwrap();
    assert!(!alive(p.pid));
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
    assert!(!alive(p.pid));
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
        poll_until(WAIT, || markers.iter().all(|m| !running(m).is_empty())),
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

/// Makes this test process the reaper of every orphan below it, and one that never reaps:
/// like a container whose PID 1 is not an init. (nextest runs each test in a process of its
/// own.)
fn orphans_are_never_reaped_here() {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

/// A command that entered a namespace from outside is reaped by its launcher there; were the
/// launcher killed first, the command would be left to a reaper that may never come, and the
/// namespace could not be proven dead.
#[test]
fn a_sandbox_dies_where_nobody_reaps_orphans() {
    orphans_are_never_reaped_here();
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
    assert!(poll_until(WAIT, || markers
        .iter()
        .all(|m| !running(m).is_empty())));
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
    for m in markers {
        assert!(running(m).is_empty(), "{m} survived the kill");
    }
}

#[test]
fn a_reset_ends_running_task_commands_where_nobody_reaps_orphans() {
    orphans_are_never_reaped_here();
    let (_d, b) = backend();
    let sb = create(&b);
    let system = SpawnOpts {
        role: Role::System,
        ..SpawnOpts::default()
    };
    let _runner = sb.spawn("sleep 100.211", &system).unwrap();
    sb.seal().unwrap();
    let _task = sb.spawn("sleep 100.212", &SpawnOpts::default()).unwrap();
    assert!(poll_until(WAIT, || !running("sleep 100.212").is_empty()));
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
/// holder's bwrap is handed by number land where its launcher's own fds (its stdio, the
/// watcher's fd 9) cannot overwrite them.
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
    orphans_are_never_reaped_here();
    let (_d, b) = backend();
    let sb = create(&b);
    sb.seal().unwrap();
    let p = sb.spawn("sleep 100.221", &SpawnOpts::default()).unwrap();
    assert!(poll_until(WAIT, || !running("sleep 100.221").is_empty()));
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
