//! The local backend against the real OS: commands, processes and their pipes, files,
//! deadlines.
//!
//! Every test owns a fresh state directory. Waits are bounded polls for a condition.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use wmo_e2b::channel::StdioChannel;
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::sink::EVENT_BUFFER;
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ErrorClass, Metadata, RunOpts, SandboxError, SpawnOpts,
};

mod support;

use support::local::*;
use support::{eventually, pid_alive, read_until, spawn_with_stdin};

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
        eventually(WAIT, || running("sleep 30.101").is_empty()),
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
        eventually(WAIT, || running("sleep 30.102").is_empty()),
        "the background child survived its run"
    );
}

#[test]
fn spawn_echoes_stdin_and_exits_when_it_closes() {
    let (_d, b) = backend();
    let sb = create(&b);
    let p = spawn_with_stdin(sb.as_ref(), "cat");
    sb.send_stdin(p.pid, b"hello\n").unwrap();
    assert_eq!(read_until(&p.events, "hello\n", WAIT), "hello\n");
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
    let p = spawn_with_stdin(sb.as_ref(), "cat");
    sb.send_stdin(p.pid, b"one\n").unwrap();
    read_until(&p.events, "one\n", WAIT);

    // Another handle on the same sandbox, as a second caller in this process would get.
    let again = b.connect(sb.id()).unwrap();
    let q = again.connect(p.pid).unwrap();
    assert_eq!(q.pid, p.pid);
    // The first subscriber is cut off.
    assert!(eventually(WAIT, || matches!(
        p.events.try_recv(),
        Err(crossbeam_channel::TryRecvError::Disconnected)
    )));
    again.send_stdin(p.pid, b"two\n").unwrap();
    assert_eq!(read_until(&q.events, "two\n", WAIT), "two\n");
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
    assert!(!pid_alive(p.pid));
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
        eventually(WAIT, || !pid_alive(p.pid)),
        "process outlived its sandbox"
    );
    assert!(eventually(WAIT, || !sb_dir_exists(&b, &id)));
    assert!(!listed(&b));
    assert_eq!(collect(&p.events, WAIT).exit, Some(None));
    assert!(matches!(sh_err(&*sb), SandboxError::Gone { .. }));
}

/// The names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .collect()
}

/// How many threads this process has once the ones a new sandbox starts in the background
/// (its spare namespace) are done: the same count twice, 20 ms apart, none of those among
/// them.
fn our_threads() -> usize {
    let transient = |n: &String| n.starts_with("lsb-spare");
    let mut last = usize::MAX;
    let deadline = Instant::now() + WAIT;
    loop {
        let names = thread_names();
        if (names.len() == last && !names.iter().any(transient)) || Instant::now() > deadline {
            return names.len();
        }
        last = names.len();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// At a thousand live sandboxes threads are the host's cost: a background process costs one
/// (its pipes and its exit watched together, and a framed channel's frames cut there too), a
/// foreground command none, and a process's thread ends with it.
#[test]
fn a_background_process_costs_one_thread_and_a_command_none() {
    let (_d, b) = backend();
    let sb = create(&b);
    let before = our_threads();
    let cat = spawn_with_stdin(&*sb, "cat");
    assert_eq!(our_threads(), before + 1, "a background process");
    let stdin = SpawnOpts {
        stdin: true,
        ..SpawnOpts::default()
    };
    let channel = StdioChannel::spawn(sb.clone(), "cat", &stdin, None).unwrap();
    assert_eq!(our_threads(), before + 2, "a framed channel");
    let done = AtomicBool::new(false);
    let most = std::thread::scope(|s| {
        // Counts from a thread of its own: one more.
        let sampler = s.spawn(|| {
            let mut most = 0;
            while !done.load(Ordering::SeqCst) {
                most = most.max(thread_names().len());
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        });
        let out = sh(&*sb, "sleep 0.3; echo ran; echo also >&2");
        assert_eq!(out.stdout.to_text(), "ran\n");
        assert_eq!(out.stderr.to_text(), "also\n");
        done.store(true, Ordering::SeqCst);
        sampler.join().unwrap()
    });
    assert_eq!(most, before + 3, "a foreground command");
    sb.close_stdin(cat.pid).unwrap();
    sb.close_stdin(channel.pid()).unwrap();
    let c = collect(&cat.events, WAIT);
    assert_eq!(c.exit, Some(Some(0)));
    assert!(
        eventually(WAIT, || our_threads() == before),
        "the threads of ended processes are gone: {} left over",
        our_threads() - before
    );
}

/// A subscriber that stops reading holds up the output (backpressure), never the reaping:
/// a kill of the process still confirms it gone.
#[test]
fn a_process_nobody_reads_is_still_reaped_when_killed() {
    let (_d, b) = backend();
    let sb = create(&b);
    // Far more than the event buffer and the pipe hold, so its delivery blocks.
    let p = sb
        .spawn("head -c 100000000 /dev/zero", &SpawnOpts::default())
        .unwrap();
    assert!(
        eventually(WAIT, || p.events.len() == EVENT_BUFFER),
        "the subscriber's buffer never filled: {} of {EVENT_BUFFER}",
        p.events.len()
    );
    sb.kill_process(p.pid).unwrap();
    assert!(
        sb.processes().unwrap().iter().all(|i| i.pid != p.pid),
        "the killed process is still listed"
    );
}

/// A process that escaped a command's group and still writes to the pipes it inherited
/// outlives the command's return: its writes are read and dropped, never a broken pipe.
#[test]
fn an_escaped_process_keeps_writing_after_its_command_returns() {
    let (_d, b) = backend();
    let sb = create(&b);
    let out = sh(
        &*sb,
        "setsid bash -c 'touch ~/escaped; sleep 0.6; echo late; echo later >&2; touch ~/survived' & \
         until [ -e ~/escaped ]; do sleep 0.01; done; echo started",
    );
    assert_eq!(out.stdout.to_text(), "started\n");
    let marker = format!("{}/survived", sb.home());
    assert!(
        eventually(WAIT, || sb.read_file(&marker).is_ok()),
        "the escaped process died writing to its inherited pipe"
    );
}

/// `empty_dir` makes a directory empty from the host, whatever a task left at its path: a
/// symlink out (removed, never followed) or a tree its owner may not read; the new directory
/// is the sandbox user's. The home itself and paths outside it are refused.
#[test]
fn empty_dir_replaces_whatever_a_task_left_without_following_it() {
    let (_state, b) = backend();
    let sb = create(&b);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("kept"), "host").unwrap();
    let home = sb.home().to_string();
    let ws = format!("{home}/workspace");
    let planted = sh(
        &*sb,
        &format!(
            "ln -s {} workspace && mkdir -p deep/a/b && touch deep/a/b/f && chmod 000 deep/a",
            outside.path().display()
        ),
    );
    assert_eq!(planted.exit_code, Some(0), "{}", planted.stderr.to_text());
    assert!(
        sb.empty_dir(&ws).unwrap(),
        "the local backend makes it itself"
    );
    assert!(sb.empty_dir(&format!("{home}/deep")).unwrap());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("kept")).unwrap(),
        "host"
    );
    let seen = sh(
        &*sb,
        "stat -c '%U %a %F' workspace deep && ls -A workspace deep && touch workspace/mine",
    );
    assert_eq!(seen.exit_code, Some(0), "{}", seen.stderr.to_text());
    assert_eq!(
        seen.stdout.to_text(),
        "user 775 directory\nuser 775 directory\ndeep:\n\nworkspace:\n"
    );
    assert!(matches!(
        sb.empty_dir(&home),
        Err(SandboxError::BadPath { .. })
    ));
    assert!(sb.empty_dir("/etc/wmo-e2b-never").is_err());
    assert!(!Path::new("/etc/wmo-e2b-never").exists());
}

/// As root, a sandbox command is started straight into its sandbox: this process's own
/// child is the command itself (no helper or launcher between), in the sandbox's namespaces,
/// and already holds no privilege it could regain. (Without root the helper starts it.)
#[test]
fn a_command_is_our_own_child_in_the_sandbox_with_nothing_to_regain() {
    if !support::is_root("commands start through the helper") {
        return;
    }
    let (_d, b) = backend();
    let sb = create(&b);
    let p = sb.spawn("exec sleep 30", &SpawnOpts::default()).unwrap();
    let exe = |pid: u32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    assert_ne!(
        exe(p.pid),
        exe(std::process::id()),
        "a helper stands between"
    );
    assert!(
        eventually(WAIT, || exe(p.pid).is_some_and(|e| e.ends_with("sleep"))),
        "{:?}",
        exe(p.pid)
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid)).unwrap();
    let field = |name: &str| {
        let line = status.lines().find_map(|l| l.strip_prefix(name));
        line.unwrap_or_else(|| panic!("{name} in {status}")).trim()
    };
    assert_eq!(field("PPid:"), std::process::id().to_string());
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2");
    for caps in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(caps), "0000000000000000", "{caps}");
    }
    assert_ne!(field("Uid:").split_whitespace().next(), Some("0"));
    let ns = |pid: String, kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok();
    for kind in ["pid", "mnt", "ipc", "uts"] {
        assert_ne!(
            ns(p.pid.to_string(), kind),
            ns("self".into(), kind),
            "{kind}"
        );
    }
    sb.kill_process(p.pid).unwrap();
    assert_eq!(collect(&p.events, WAIT).exit, Some(None));
}

/// Until its exec, a command started straight into its sandbox shares this process's memory,
/// whose environment holds the host's variables (a model key among them, in a real run) and
/// whose command line may hold a key (the emulator's). A task that watches every new process
/// of its namespace, reading each one's environment and command line as fast as it can while
/// the host starts hundreds of commands, never reads either of ours.
#[test]
fn a_task_never_reads_the_host_memory_a_starting_command_shares() {
    if !support::is_root("commands start through the helper") {
        return;
    }
    // Set by cargo and nextest for every test process, and by nothing in a sandbox; and the
    // test binary's path, which only our command line holds.
    assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
    let program = std::env::current_exe().unwrap();
    assert!(program.to_string_lossy().contains("/deps/"), "{program:?}");
    let (_d, b) = backend();
    let sb = create(&b);
    let watcher = sb
        .spawn(
            "exec python3 -c '
import os, sys
seen, leaks = set(), set()
me = str(os.getpid())
while not os.path.exists(\"stop\"):
    for p in os.listdir(\"/proc\"):
        if not p.isdigit() or p == me:
            continue
        try:
            with open(\"/proc/%s/cmdline\" % p, \"rb\") as f:
                if b\"/deps/\" in f.read():
                    leaks.add(p)
            with open(\"/proc/%s/environ\" % p, \"rb\") as f:
                env = f.read()
        except OSError:
            continue
        seen.add(p)
        if b\"CARGO\" in env:
            leaks.add(p)
print(\"seen\", len(seen), \"leaks\", len(leaks), flush=True)
'",
            &SpawnOpts::default(),
        )
        .unwrap();
    for _ in 0..400 {
        assert_eq!(sh(&*sb, "sleep 0.001").exit_code, Some(0));
    }
    sh(&*sb, "touch stop");
    let out = read_until(&watcher.events, "leaks", WAIT);
    let words: Vec<&str> = out.split_whitespace().collect();
    let [_, seen, _, leaks] = words[..] else {
        panic!("{out}");
    };
    // It read the environments of the commands themselves, once they had exec'd.
    assert!(seen.parse::<u32>().unwrap() >= 50, "{out}");
    assert_eq!(leaks, "0", "{out}");
}
