use std::io::{Read, Write};

use super::*;

fn sh(script: &str) -> Spawn {
    let mut s = Spawn::new("/bin/sh");
    s.args(["-c", script]).env("PATH", "/usr/bin:/bin");
    s
}

fn output(mut child: Child) -> (String, ExitStatus) {
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_string(&mut out).unwrap();
    }
    (out, child.wait().unwrap())
}

#[test]
fn a_child_inherits_nothing_but_its_stdio() {
    // Descriptors of every kind this process may hold: inheritable ones too.
    let held: Vec<OwnedFd> = (0..50)
        .map(|_| {
            let (r, _w) = pipe().unwrap();
            // SAFETY: F_SETFD on a descriptor we own.
            unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFD, 0) };
            r
        })
        .collect();
    let child = sh("ls /proc/self/fd").stdout(Io::Piped).spawn().unwrap();
    let (out, status) = output(child);
    assert!(status.success());
    // ls's own descriptor for the directory it lists is the fourth.
    let fds: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fds, ["0", "1", "2", "3"], "held {}", held.len());
}

#[test]
fn stdio_environment_directory_and_group_are_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = sh("read line; read _ _ _ _ group _ </proc/$$/stat; \
         echo \"$line $A $(pwd) $group $$\"; echo err >&2");
    s.env("A", "first")
        .env("A", "second")
        .current_dir(dir.path())
        .new_process_group()
        .stdin(Io::Piped)
        .stdout(Io::Piped)
        .stderr(Io::Piped);
    let mut child = s.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let (out, status) = output(child);
    assert!(status.success());
    assert_eq!(err, "err\n");
    let words: Vec<&str> = out.split_whitespace().collect();
    let cwd = dir.path().canonicalize().unwrap();
    assert_eq!(words[..3], ["hello", "second", cwd.to_str().unwrap()]);
    // Its own group: the group id is its pid.
    assert_eq!(words[3], words[4]);
}

#[test]
fn a_child_gets_no_variable_it_was_not_given() {
    std::env::set_var("WMO_E2B_SPAWN_TEST_SECRET", "leak");
    let (out, _) = output(sh("env").stdout(Io::Piped).spawn().unwrap());
    let names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split('=').next())
        .filter(|n| *n != "PWD" && *n != "SHLVL" && *n != "_")
        .collect();
    assert_eq!(names, ["PATH"]);
}

#[test]
fn a_failed_exec_is_an_error_with_its_errno() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let err = Spawn::new(&missing).spawn().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    let err = Spawn::new("/bin/true")
        .current_dir(&missing)
        .spawn()
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    let err = Spawn::new("true").spawn().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(
        err.to_string().starts_with("true was not found on PATH"),
        "{err}"
    );
    let err = Spawn::new("/bin/true").args(["a\0b"]).spawn().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("remove it (a\0b)"), "{err}");
}

#[test]
fn signals_are_default_in_the_child_and_status_is_reported() {
    // Rust's runtime ignores SIGPIPE here, and every signal is blocked across the start;
    // the child has neither (SIGPIPE is signal 13: bit 12 of the masks).
    let (out, status) = output(
        sh("grep -E '^Sig(Blk|Ign)' /proc/self/status")
            .stdout(Io::Piped)
            .spawn()
            .unwrap(),
    );
    assert!(status.success());
    for line in out.lines() {
        let (name, mask) = line.split_once(':').unwrap();
        let mask = u64::from_str_radix(mask.trim(), 16).unwrap();
        match name {
            "SigBlk" => assert_eq!(mask, 0, "{out}"),
            _ => assert_eq!(mask & (1 << 12), 0, "{out}"),
        }
    }
    let (_, status) = output(sh("kill -TERM $$").spawn().unwrap());
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    let mut child = Spawn::new("/bin/sleep").args(["100"]).spawn().unwrap();
    child.kill().unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    // Reaped: a second wait returns the same status, and a kill does nothing.
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    child.kill().unwrap();
}

#[test]
fn many_starts_at_once_each_get_their_own_pipes() {
    let handles: Vec<_> = (0..4 * GROUPS)
        .map(|i| {
            std::thread::spawn(move || {
                let child = sh(&format!("echo {i}")).stdout(Io::Piped).spawn().unwrap();
                output(child)
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let (out, status) = h.join().unwrap();
        assert!(status.success());
        assert_eq!(out, format!("{i}\n"));
    }
}

/// A direct entry into this process's own namespaces, which root may join again; `None`
/// (said) for anyone else.
fn own_entry(argv: &[&str], namespaces: &str) -> Option<Entry> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: no namespace to join again");
        return None;
    }
    let open = |p: String| OwnedFd::from(std::fs::File::open(p).unwrap());
    Some(Entry {
        user: None,
        namespaces: ["ipc", "uts", "pid", "mnt"].map(|k| open(format!("{namespaces}/{k}"))),
        root: open("/".into()),
        own_network: false,
        drop_to: None,
        argv: argv.iter().map(OsString::from).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/".into(),
    })
}

#[test]
fn a_direct_entry_starts_the_command_itself_as_our_child() {
    let Some(entry) = own_entry(&["/bin/sh", "-c", "echo direct $PPID"], "/proc/self/ns") else {
        return;
    };
    let mut s = sh("echo helper");
    s.enter_directly(entry).stdout(Io::Piped);
    let child = s.spawn().unwrap();
    assert!(child.entered_directly());
    let (out, status) = output(child);
    assert!(status.success());
    assert_eq!(out, format!("direct {}\n", std::process::id()));
}

#[test]
fn a_direct_entry_that_fails_anywhere_falls_back_to_the_helper() {
    let dir = tempfile::tempdir().unwrap();
    for kind in ["ipc", "uts", "pid", "mnt"] {
        std::fs::write(dir.path().join(kind), "").unwrap();
    }
    let not_namespaces = dir.path().to_string_lossy().into_owned();
    // The start's child fails to join; then the command fails to exec.
    for (argv, namespaces) in [
        (&["/bin/echo", "direct"][..], not_namespaces.as_str()),
        (&["/nonexistent/program"][..], "/proc/self/ns"),
    ] {
        let Some(entry) = own_entry(argv, namespaces) else {
            return;
        };
        let mut s = sh("echo helper");
        s.enter_directly(entry).stdout(Io::Piped);
        let child = s.spawn().unwrap();
        assert!(!child.entered_directly(), "{argv:?}");
        let (out, status) = output(child);
        assert!(status.success());
        assert_eq!(out, "helper\n", "{argv:?}");
    }
}
