//! What a task leaves for the next one on a reused local sandbox, tried as an attacker
//! would: extended attributes and modes on the home and `/tmp` themselves and on a file that
//! outlives the reset; SysV IPC objects, POSIX message queues and `/dev/shm` files. None may
//! reach the next task or another sandbox.

use std::process::Command;

use wmo_e2b::sandbox::Sandbox;

mod support;

use support::local::*;

/// Sets or lists `user.*` extended attributes: `set PATH...` sets `user.left` on each path,
/// `list PATH...` prints each path's attribute names.
const XATTRS: &str = r#"
import os, sys
for p in sys.argv[2:]:
    if sys.argv[1] == "set":
        os.setxattr(p, "user.left", b"by task 1")
    else:
        print(p, sorted(os.listxattr(p)))
"#;

fn run_ok(sb: &dyn Sandbox, cmd: &str) -> String {
    let out = sh(sb, cmd);
    assert_eq!(out.exit_code, Some(0), "{cmd}: {}", out.stderr.to_text());
    out.stdout.to_text()
}

#[test]
fn a_reset_removes_xattrs_and_modes_a_task_left_on_the_roots_and_files() {
    let (_state, b) = backend();
    let sb = create(&b);
    run_ok(&*sb, "echo sealed > /home/user/kept");
    sb.seal().unwrap();
    let paths = "/home/user /tmp /home/user/kept";
    let clean = run_ok(
        &*sb,
        &format!("python3 -c '{XATTRS}' list {paths}; stat -c '%n %a %u' {paths}"),
    );

    run_ok(
        &*sb,
        &format!(
            "python3 -c '{XATTRS}' set {paths} && chmod 700 /home/user && chmod 777 /tmp && \
             chmod 600 /home/user/kept"
        ),
    );
    sb.reset().expect("the reset restores the roots' metadata");

    let after = run_ok(
        &*sb,
        &format!("python3 -c '{XATTRS}' list {paths}; stat -c '%n %a %u' {paths}"),
    );
    assert_eq!(after, clean, "what task 1 left");
    assert!(!after.contains("user.left"), "{after}");
}

/// Creates (`make [KIND...]`, every kind when none is named) or looks for (`find`) a SysV
/// shared memory segment, message queue and semaphore set under one key, a POSIX message
/// queue and a `/dev/shm` file; prints the ones it sees.
const IPC: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
KEY, NAME = 0x5EED0E2B, b"/wmo-e2b-left"
kinds = sys.argv[2:] or ["shm", "msg", "sem", "mqueue", "devshm"]
make = lambda kind: sys.argv[1] == "make" and kind in kinds
creat = lambda kind: 0o1000 | 0o600 if make(kind) else 0
seen = []
if libc.shmget(KEY, 4096, creat("shm")) >= 0: seen.append("shm")
if libc.msgget(KEY, creat("msg")) >= 0: seen.append("msg")
if libc.semget(KEY, 1, creat("sem")) >= 0: seen.append("sem")
mq_flags = os.O_CREAT | os.O_RDWR if make("mqueue") else os.O_RDONLY
if libc.mq_open(NAME, mq_flags, 0o600, None) >= 0: seen.append("mqueue")
if make("devshm"):
    open("/dev/shm/wmo-e2b-left", "w").write("left")
if os.path.exists("/dev/shm/wmo-e2b-left"): seen.append("devshm")
print(" ".join(seen))
"#;

fn ipc(sb: &dyn Sandbox, what: &str) -> String {
    run_ok(sb, &format!("python3 -c '{IPC}' {what}"))
        .trim()
        .to_owned()
}

#[test]
fn ipc_objects_a_task_made_reach_no_next_task_other_sandbox_or_host() {
    let (_state, b) = backend();
    let (first, other) = (create(&b), create(&b));
    first.seal().unwrap();

    assert_eq!(ipc(&*first, "make"), "shm msg sem mqueue devshm");
    assert_eq!(
        ipc(&*first, "find"),
        "shm msg sem mqueue devshm",
        "the probe"
    );
    assert_eq!(ipc(&*other, "find"), "", "another sandbox");
    first.reset().unwrap();
    assert_eq!(ipc(&*first, "find"), "", "the next task");
    let host = Command::new("python3")
        .args(["-c", IPC, "find"])
        .output()
        .unwrap();
    assert!(host.status.success(), "{host:?}");
    let seen = text(&host.stdout);
    for object in ["shm", "msg", "sem", "mqueue", "devshm"] {
        assert!(!seen.contains(object), "the host sees {object}: {seen}");
    }
}

/// The namespaces a task process runs in, as the kernel names them, and when their PID 1
/// started: the kernel gives a freed namespace's number to the next one made.
fn task_namespaces(sb: &dyn Sandbox) -> String {
    run_ok(
        sb,
        "readlink /proc/self/ns/mnt /proc/self/ns/ipc /proc/self/ns/pid; \
         cut -d ' ' -f 22 /proc/1/stat",
    )
}

/// As root, a reset keeps the task namespace (no new mount namespace, no `pivot_root`, no
/// holder) once a sweep proves it empty, detached processes and all; a task that left any one
/// kind of object there gets a fresh one, and the next task finds nothing either way.
#[test]
fn a_reset_keeps_a_task_namespace_only_when_it_is_proven_empty() {
    if !support::is_root("only root's sandboxes sweep their task namespace") {
        return;
    }
    let (_state, b) = backend();
    let sb = create(&b);
    sb.seal().unwrap();
    let first = task_namespaces(&*sb);
    run_ok(
        &*sb,
        "setsid sleep 6061 & nohup sleep 6062 >/dev/null 2>&1 & \
         (sleep 6063 &) ; python3 -c 'import os; os.fork() or os.setsid() or os.system(\"sleep 6064 &\")'",
    );
    assert!(!running("sleep 606").is_empty(), "the task's processes run");
    sb.reset().unwrap();
    assert!(
        running("sleep 606").is_empty(),
        "{:?}",
        running("sleep 606")
    );
    assert_eq!(
        task_namespaces(&*sb),
        first,
        "a namespace proven empty is kept"
    );

    for kind in ["shm", "msg", "sem", "mqueue", "devshm"] {
        let before = task_namespaces(&*sb);
        assert_eq!(ipc(&*sb, &format!("make {kind}")), kind);
        sb.reset().unwrap();
        assert_eq!(ipc(&*sb, "find"), "", "{kind} reached the next task");
        assert_ne!(
            task_namespaces(&*sb),
            before,
            "a namespace holding {kind} was kept"
        );
    }
}
