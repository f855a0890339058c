//! The system call filter of local sandbox commands, as an attacker meets it: a key a task
//! adds to its uid's keyring (the host's keyring of that uid when we are root), new
//! namespaces and mounts; and what must keep working under it (`ptrace` of a task's own
//! children).

use std::process::Command;

use wmo_e2b::sandbox::local::isolation::SANDBOX_UID;

mod support;

use support::local::*;

/// Adds (`add`) or looks up (`find`) a `user` key named argv[2] in the user keyring of the
/// caller's uid, with raw system calls; prints `added`/`found` or the errno's name.
const KEYRING: &str = r#"
import ctypes, errno, os, platform, sys
nr = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
USER_KEYRING, SEARCH = -4, 10
what, name = sys.argv[1], sys.argv[2].encode()
if len(sys.argv) > 3:
    os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[3]))
if what == "add":
    r = libc.syscall(nr[0], b"user", name, b"secret", 6, USER_KEYRING)
    word = "added"
else:
    r = libc.syscall(nr[1], SEARCH, USER_KEYRING, b"user", name, 0)
    word = "found"
print(word if r > 0 else errno.errorcode[ctypes.get_errno()])
"#;

fn keyring(sb: &dyn wmo_e2b::sandbox::Sandbox, what: &str, name: &str) -> String {
    let cmd = format!("python3 -c '{KEYRING}' {what} {name}");
    let out = sh(sb, &cmd);
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr.to_text());
    out.stdout.to_text().trim().to_owned()
}

/// The attack: a task adds a key to its uid's keyring. With no filter the key outlives the
/// task and is found by the next task on the same sandbox, by another sandbox, and (we are
/// root, so the sandbox's uid is the host's) by the host's own user of that uid.
#[test]
fn a_key_a_task_adds_reaches_no_other_task_sandbox_or_host_user() {
    let (_state, b) = backend();
    let (first, other) = (create(&b), create(&b));
    first.seal().unwrap();
    let name = format!("wmo-e2b-test-key-{}", std::process::id());

    let added = keyring(&*first, "add", &name);
    first.reset().unwrap();
    assert_ne!(keyring(&*first, "find", &name), "found", "the next task");
    assert_ne!(keyring(&*other, "find", &name), "found", "another sandbox");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let host = Command::new("python3")
            .args(["-c", KEYRING, "find", &name, &SANDBOX_UID.to_string()])
            .output()
            .unwrap();
        assert!(host.status.success(), "{host:?}");
        assert_ne!(text(&host.stdout).trim(), "found", "the host's user");
    }
    assert_eq!(added, "EPERM");
}

#[test]
fn a_task_makes_no_namespace_and_no_mount() {
    let (_state, b) = backend();
    let sb = create(&b);
    for cmd in [
        "unshare -U true",
        "unshare -Urm true",
        "unshare -Urm mount -t tmpfs x /tmp",
        "mkdir -p /tmp/x && mount -t tmpfs x /tmp/x",
    ] {
        let out = sh(&*sb, cmd);
        assert_ne!(out.exit_code, Some(0), "{cmd} ran");
    }
    let mounts = sh(&*sb, "grep -c ' /tmp/x ' /proc/self/mounts");
    assert_eq!(mounts.stdout.to_text().trim(), "0");
}

/// Under the filter a task still traces its own children, as `gdb` and `strace` do.
#[test]
fn a_task_traces_its_own_children() {
    let (_state, b) = backend();
    let sb = create(&b);
    if sh(&*sb, "command -v strace").exit_code != Some(0) {
        eprintln!("skipped: strace is not installed");
        return;
    }
    let out = sh(&*sb, "strace -f -o /dev/null sh -c 'true; true'");
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr.to_text());
}

/// A thread is started with `clone` (or `clone3`, which answers ENOSYS so libc falls back):
/// threaded programs still run.
#[test]
fn threads_still_start() {
    let (_state, b) = backend();
    let sb = create(&b);
    let out = sh(
        &*sb,
        "python3 -c 'import threading; t = threading.Thread(target=print, args=(\"ok\",)); \
         t.start(); t.join()'",
    );
    assert_eq!(out.stdout.to_text(), "ok\n", "{}", out.stderr.to_text());
}
