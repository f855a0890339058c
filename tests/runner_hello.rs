//! The bootstrap's hello check against runners that say hello in other ways than ours: a
//! stand-in `node` on the runner's PATH prints a canned hello, then waits on stdin.

use std::time::Duration;

use serde_json::{json, Value};
use wmo_e2b::channel::frame;
use wmo_e2b::runner::{bootstrap, BootstrapOpts, RunnerError};
use wmo_e2b::sandbox::{Backend, Role, RunOpts};

mod support;

use support::local_sandbox;

/// Bootstraps a runner whose `node` answers with `hello`, in a fresh local sandbox.
fn bootstrap_with_hello(hello: Value) -> Result<Value, RunnerError> {
    let dir = tempfile::tempdir().unwrap();
    let (backend, sb) = local_sandbox(&dir.path().join("state"));
    // The stand-in lives in the sandbox (a confined runner sees nothing of the host's temp
    // directories), in a `bin` beside the runner, first on its PATH.
    let bin = format!("{}/bin", sb.system_dir());
    let line = String::from_utf8(frame::encode(&hello)).unwrap();
    sb.write_file(
        &format!("{bin}/node"),
        format!("#!/bin/sh\nprintf '%s' '{line}'\nexec cat >/dev/null\n").as_bytes(),
    )
    .unwrap();
    let chmod = sb
        .run(
            "chmod 755 bin/node",
            &RunOpts {
                cwd: Some(sb.system_dir().to_string()),
                role: Role::System,
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert_eq!(chmod.exit_code, Some(0), "{}", chmod.stderr.to_text());
    let opts = BootstrapOpts {
        hello_timeout: Duration::from_secs(20),
        envs: vec![("PATH".to_string(), format!("{bin}:/usr/bin:/bin"))],
        ..BootstrapOpts::default()
    };
    let result = bootstrap(&sb, &opts).map(|started| Value::Object(started.hello));
    let _ = backend.kill(sb.id());
    result
}

#[test]
fn a_hello_without_protocol_is_the_reference_runners_version_1() {
    // The reference runner's hello (runner_stdio.ts): no `protocol` field at all.
    let reference = json!({"type": "hello", "node_version": "v22.4.0", "pi_version": "0.80.3",
                           "max_concurrent": 1, "transport": "stdio"});
    let hello = bootstrap_with_hello(reference).expect("the reference hello is accepted");
    assert_eq!(hello["pi_version"], "0.80.3");

    let ours = json!({"type": "hello", "protocol": 1, "transport": "stdio"});
    assert!(bootstrap_with_hello(ours).is_ok());
}

#[test]
fn a_hello_naming_another_protocol_is_refused() {
    for (protocol, found) in [
        (json!(2), "2"),
        (json!("1"), "\"1\""),
        (Value::Null, "null"),
    ] {
        let hello = json!({"type": "hello", "protocol": protocol});
        match bootstrap_with_hello(hello) {
            Err(RunnerError::Protocol { found: f }) => assert_eq!(f, found),
            Err(other) => panic!("expected a protocol error for {protocol}, got {other}"),
            Ok(h) => panic!("accepted a hello speaking protocol {protocol}: {h}"),
        }
    }
}

/// An idle runner holds few threads (V8's workers and libuv's pool cut to one each): counted
/// on the real runner, the descendant of the bootstrap's process named `node`.
#[test]
fn an_idle_runner_holds_at_most_five_threads() {
    let dir = tempfile::tempdir().unwrap();
    let (backend, sb) = local_sandbox(&dir.path().join("state"));
    let started = bootstrap(&sb, &BootstrapOpts::default()).expect("the runner starts");
    let mut todo = vec![started.channel.pid()];
    let mut node = None;
    while let Some(pid) = todo.pop() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "node" {
            node = Some(pid);
            break;
        }
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    let node = node.expect("the runner's node process");
    // Threads start lazily: give the runner a moment past its hello.
    std::thread::sleep(Duration::from_millis(500));
    let threads = std::fs::read_dir(format!("/proc/{node}/task"))
        .unwrap()
        .count();
    let _ = backend.kill(sb.id());
    assert!(threads <= 5, "an idle runner holds {threads} threads");
}
