//! The E2B backend's envd client (processes and their streams, files, health) against a fake
//! E2B on loopback (`fake_e2b`): streams cut at awkward places, silent, or ended by a dead
//! sandbox.

use std::time::{Duration, Instant};

use serde_json::json;
use wmo_e2b::sandbox::e2b::error::RpcStatus;
use wmo_e2b::sandbox::e2b::{E2bBackend, E2bConfig, E2bOptions};
use wmo_e2b::sandbox::{ErrorClass, ProcessEvent, RunOpts, Sandbox, SandboxError, SpawnOpts};

mod fake_e2b;

use fake_e2b::*;

// ---- envd: processes ------------------------------------------------------------------------

#[test]
fn run_reads_a_stream_cut_at_awkward_places() {
    let mut wire = start(412);
    wire.extend(stdout("hi\n"));
    wire.extend(keepalive());
    wire.extend(stderr("warn\n"));
    wire.extend(stdout("there\n"));
    wire.extend(end(
        json!({"exitCode": 3, "exited": true, "status": "exit status 3"}),
    ));
    wire.extend(end_of_stream(json!({})));
    let server = with_sandbox(move |req| {
        assert!(req.is("POST", "/process.Process/Start"));
        Reply::stream(cut(wire.clone(), &[1, 3, 7, 2, 11]))
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let out = sb
        .run(
            "echo hi",
            &RunOpts {
                envs: vec![("X".into(), "1".into()), ("X".into(), "2".into())],
                timeout: Duration::from_secs(7),
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert_eq!(out.exit_code, Some(3), "a non-zero exit is a result");
    assert!(!out.timed_out);
    assert_eq!(out.stdout.to_text(), "hi\nthere\n");
    assert_eq!(out.stderr.to_text(), "warn\n");

    let req = server.last("POST", "/process.Process/Start");
    assert_eq!(req.header("content-type"), Some("application/connect+json"));
    assert_eq!(req.header("connect-protocol-version"), Some("1"));
    assert_eq!(req.header("keepalive-ping-interval"), Some("1"));
    assert_eq!(req.header("connect-timeout-ms"), Some("7000"));
    assert_eq!(req.header("e2b-sandbox-id"), Some("isb1"));
    assert_eq!(req.header("e2b-sandbox-port"), Some("49983"));
    assert_eq!(req.header("x-access-token"), Some("token-isb1"));
    assert!(req.header("user-agent").unwrap().starts_with("wmo-e2b/"));
    // No `cwd` unless the caller names one, as the SDK sends it: envd then starts where
    // the template says for the user.
    assert_eq!(
        req.envelope_json(),
        json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
                           "envs": {"X": "2"}},
               "stdin": false})
    );
}

#[test]
fn run_bounds_output_and_reports_envd_timeouts() {
    let big = "x".repeat(5000);
    let mut wire = start(9);
    wire.extend(stdout(&big));
    wire.extend(end_of_stream(
        json!({"error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}}),
    ));
    let server = with_sandbox(move |req| {
        if req.path == "/process.Process/SendSignal" {
            return Reply::json(404, json!({"code": "not_found", "message": "gone"}));
        }
        Reply::stream(cut(wire.clone(), &[4096]))
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let out = sb
        .run(
            "sleep 100",
            &RunOpts {
                max_output: 100,
                timeout: Duration::from_secs(1),
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert!(out.timed_out);
    assert_eq!(out.exit_code, None);
    assert_eq!(out.stdout.head.len() + out.stdout.tail.len(), 100);
    assert_eq!(out.stdout.dropped, 4900);
}

#[test]
fn run_start_errors_are_classified_by_code() {
    let server = with_sandbox(|_| {
        Reply::stream(vec![Part::Bytes(end_of_stream(
            json!({"error": {"code": "invalid_argument", "message": "cwd '/nope' does not exist"}}),
        ))])
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let err = sb
        .run(
            "true",
            &RunOpts {
                cwd: Some("/nope".into()),
                ..RunOpts::default()
            },
        )
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::BadRequest);
    let status = source_of::<RpcStatus>(&err).unwrap();
    assert!(status.message.contains("/nope"));
}

#[test]
fn spawn_streams_events_without_a_process_deadline() {
    let mut wire = start(77);
    wire.extend(stdout("ready\n"));
    wire.extend(keepalive());
    wire.extend(stderr("log\n"));
    wire.extend(end(json!({"exitCode": -1, "status": "signal: killed"})));
    wire.extend(end_of_stream(json!({})));
    let server = with_sandbox(move |_| Reply::stream(cut(wire.clone(), &[2, 5])));
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb
        .spawn(
            "node runner.mjs",
            &SpawnOpts {
                cwd: Some("/home/user/run".into()),
                envs: Vec::new(),
                stdin: true,
                ..SpawnOpts::default()
            },
        )
        .unwrap();
    assert_eq!(p.pid, 77);
    let (out, err, last) = events_until_end(&p.events);
    assert_eq!(out, b"ready\n");
    assert_eq!(err, b"log\n");
    assert!(matches!(last, ProcessEvent::Exit(None)), "{last:?}");
    assert!(
        p.events.recv_timeout(WAIT).is_err(),
        "nothing after the exit"
    );

    let req = server.last("POST", "/process.Process/Start");
    assert_eq!(
        req.header("connect-timeout-ms"),
        None,
        "long-lived processes are not killed"
    );
    let body = req.envelope_json();
    assert_eq!(body["stdin"], true);
    assert_eq!(body["process"]["cwd"], "/home/user/run");
    assert!(body["process"].get("envs").is_none());
}

#[test]
fn streams_outlive_the_request_timeout() {
    let server = with_sandbox(|_| {
        let mut parts = vec![Part::Bytes(start(12))];
        for _ in 0..5 {
            parts.push(Part::Pause(500 * MS));
            parts.push(Part::Bytes(keepalive()));
        }
        let mut tail = stdout("late\n");
        tail.extend(end(json!({"exited": true})));
        tail.extend(end_of_stream(json!({})));
        parts.push(Part::Bytes(tail));
        Reply::stream(parts)
    });
    let b = backend(
        &server,
        E2bOptions {
            request_timeout: Duration::from_secs(1),
            ..options()
        },
    );
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.spawn("server", &SpawnOpts::default()).unwrap();
    let (out, _, last) = events_until_end(&p.events);
    assert_eq!(out, b"late\n");
    assert!(matches!(last, ProcessEvent::Exit(Some(0))), "{last:?}");
}

#[test]
fn a_stream_error_after_start_fails_the_process() {
    let mut wire = start(5);
    wire.extend(stdout("partial"));
    wire.extend(end_of_stream(
        json!({"error": {"code": "unavailable", "message": "envd is going away"}}),
    ));
    let server = with_sandbox(move |_| Reply::stream(cut(wire.clone(), &[3])));
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.spawn("x", &SpawnOpts::default()).unwrap();
    let (out, _, last) = events_until_end(&p.events);
    assert_eq!(out, b"partial");
    let ProcessEvent::Failed(e) = last else {
        panic!("expected a failure, got {last:?}")
    };
    assert_eq!(e.class(), ErrorClass::Transport);
}

#[test]
fn a_cut_stream_fails_the_process() {
    let mut wire = start(5);
    wire.extend(stdout("partial"));
    let mut cut_short = end(json!({}));
    cut_short.truncate(4);
    wire.extend(cut_short);
    let server = with_sandbox(move |_| Reply::stream(vec![Part::Bytes(wire.clone())]));
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.spawn("x", &SpawnOpts::default()).unwrap();
    let (_, _, last) = events_until_end(&p.events);
    assert!(
        matches!(last, ProcessEvent::Failed(ref e) if e.class() == ErrorClass::Transport),
        "{last:?}"
    );
}

#[test]
fn a_stream_cut_by_a_dead_sandbox_is_gone() {
    let server = with_sandbox(|req| {
        if req.path == "/health" {
            return Reply::json(
                502,
                json!({"code": 502, "message": "The sandbox was not found", "sandboxId": "isb1"}),
            );
        }
        let mut wire = start(5);
        wire.extend(stdout("partial"));
        wire.extend(&stdout("more")[..6]);
        Reply::stream(vec![Part::Bytes(wire)])
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.spawn("x", &SpawnOpts::default()).unwrap();
    let (_, _, last) = events_until_end(&p.events);
    assert!(
        matches!(last, ProcessEvent::Failed(SandboxError::Gone { ref id }) if id == "isb1"),
        "{last:?}"
    );
    let err = sb.run("x", &RunOpts::default()).unwrap_err();
    assert!(matches!(err, SandboxError::Gone { .. }), "{err:?}");
}

#[test]
fn a_silent_stream_is_a_transport_error_not_a_hang() {
    let server = with_sandbox(|req| {
        if req.path == "/health" {
            return Reply::empty(204);
        }
        Reply::stream(vec![
            Part::Bytes(start(6)),
            Part::Bytes(stdout("one")),
            Part::Hold(Duration::from_secs(30)),
        ])
    });
    // Keepalive 1 s: silence past 3 s fails the stream.
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let started = Instant::now();
    let p = sb.spawn("sleep 1000", &SpawnOpts::default()).unwrap();
    let (out, _, last) = events_until_end(&p.events);
    let waited = started.elapsed();
    assert_eq!(out, b"one");
    let ProcessEvent::Failed(e) = last else {
        panic!("expected a failure, got {last:?}")
    };
    assert_eq!(e.class(), ErrorClass::Transport);
    assert!(e.to_string().contains("sent nothing for"), "{e}");
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
}

#[test]
fn connect_reattaches_and_not_found_means_no_such_process() {
    let server = with_sandbox(|req| {
        let pid = req.envelope_json()["process"]["pid"].as_u64().unwrap();
        if pid == 8 {
            let mut wire = start(8);
            wire.extend(stdout("later\n"));
            wire.extend(end(json!({"exited": true})));
            wire.extend(end_of_stream(json!({})));
            Reply::stream(vec![Part::Bytes(wire)])
        } else {
            Reply::stream(vec![Part::Bytes(end_of_stream(
                json!({"error": {"code": "not_found", "message": "process with pid 9 not found"}}),
            ))])
        }
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.connect(8).unwrap();
    let (out, _, last) = events_until_end(&p.events);
    assert_eq!(out, b"later\n");
    assert!(matches!(last, ProcessEvent::Exit(Some(0))));
    assert_eq!(
        server
            .last("POST", "/process.Process/Connect")
            .header("connect-timeout-ms"),
        None
    );
    let err = sb.connect(9).err().unwrap();
    assert!(
        matches!(err, SandboxError::NoSuchProcess { pid: 9, .. }),
        "{err:?}"
    );
}

#[test]
fn stdin_signals_and_process_lists_are_unary_calls() {
    let server = with_sandbox(|req| {
        let body = req.json();
        let pid = body["process"]["pid"].as_u64();
        match (req.path.as_str(), pid) {
            (_, Some(404)) => Reply::json(
                404,
                json!({"code": "not_found", "message": "process with pid 404 not found"}),
            ),
            ("/process.Process/SendInput", _) => {
                assert_eq!(body["input"]["stdin"], "aGVsbG8K");
                Reply::json(200, json!({}))
            }
            ("/process.Process/CloseStdin", _) => Reply::json(200, json!({})),
            ("/process.Process/SendSignal", _) => {
                assert_eq!(body["signal"], "SIGNAL_SIGKILL");
                Reply::json(200, json!({}))
            }
            ("/process.Process/List", None) => Reply::json(
                200,
                json!({"processes": [{"pid": 3, "config": {"cmd": "/bin/bash",
                                                            "args": ["-l", "-c", "cat"]}}]}),
            ),
            _ => Reply::json(500, json!({"code": "internal", "message": "?"})),
        }
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    sb.send_stdin(3, b"hello\n").unwrap();
    let req = server.last("POST", "/process.Process/SendInput");
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(req.header("connect-protocol-version"), Some("1"));
    assert_eq!(req.header("x-access-token"), Some("token-isb1"));
    sb.close_stdin(3).unwrap();
    sb.kill_process(3).unwrap();
    let procs = sb.processes().unwrap();
    assert_eq!((procs[0].pid, procs[0].cmd.as_str()), (3, "cat"));
    for err in [
        sb.send_stdin(404, b"x").unwrap_err(),
        sb.close_stdin(404).unwrap_err(),
        sb.kill_process(404).unwrap_err(),
    ] {
        assert!(
            matches!(err, SandboxError::NoSuchProcess { pid: 404, .. }),
            "{err:?}"
        );
    }
}

// ---- envd: files and health -----------------------------------------------------------------

#[test]
fn files_are_read_and_written_raw() {
    let server = with_sandbox(|req| match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/files") => match req.query("path") {
            Some("/home/user/a b.txt") => Reply::bytes(200, b"\x00bytes\xff"),
            Some("/home/user/dir") => Reply::json(
                400,
                json!({"code": 400, "message": "path '/home/user/dir' is a directory"}),
            ),
            _ => Reply::json(404, json!({"code": 404, "message": "does not exist"})),
        },
        ("POST", "/files") => Reply::json(
            200,
            json!([{"path": req.query("path"), "name": "x", "type": "file"}]),
        ),
        ("GET", "/health") => Reply::empty(204),
        ("POST", "/filesystem.Filesystem/MakeDir") => match req.json()["path"].as_str() {
            Some("/home/user/new") => Reply::json(
                200,
                json!({"entry": {"name": "new", "type": "FILE_TYPE_DIRECTORY"}}),
            ),
            _ => Reply::json(
                409,
                json!({"code": "already_exists", "message": "directory already exists"}),
            ),
        },
        _ => Reply::empty(500),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    assert_eq!(
        sb.read_file("/home/user/a b.txt").unwrap(),
        b"\x00bytes\xff"
    );
    let get = server.last("GET", "/files");
    assert_eq!(get.header("e2b-sandbox-id"), Some("isb1"));
    assert_eq!(get.header("accept-encoding"), Some("identity"));

    let err = sb.read_file("/home/user/missing").unwrap_err();
    assert!(matches!(err, SandboxError::NotFound { ref path } if path == "/home/user/missing"));
    assert_eq!(err.class(), ErrorClass::BadRequest);
    assert_eq!(
        sb.read_file("/home/user/dir").unwrap_err().class(),
        ErrorClass::BadRequest
    );
    assert!(matches!(
        sb.read_file("rel").unwrap_err(),
        SandboxError::BadPath { .. }
    ));

    sb.write_file("/home/user/deep/new+file", b"payload\n")
        .unwrap();
    let post = server.last("POST", "/files");
    assert_eq!(post.query("path"), Some("/home/user/deep/new+file"));
    assert_eq!(
        post.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(post.header("x-access-token"), Some("token-isb1"));
    assert_eq!(post.body, b"payload\n");

    assert!(sb.health().unwrap());
    assert!(sb.make_dir("/home/user/new").unwrap());
    assert!(
        !sb.make_dir("/home/user/old").unwrap(),
        "an existing directory is fine"
    );
}

#[test]
fn old_envd_gets_multipart_uploads() {
    let server = Server::start(|req| match req.path.as_str() {
        "/v2/sandboxes" => Reply::json(
            201,
            json!({"sandboxID": "old1", "templateID": "t", "clientID": "c", "envdVersion": "0.5.6"}),
        ),
        "/files" => Reply::json(200, json!([{"path": "/p", "name": "p", "type": "file"}])),
        _ => Reply::empty(500),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    sb.write_file("/home/user/p", b"abc").unwrap();
    let post = server.last("POST", "/files");
    assert!(post
        .header("content-type")
        .unwrap()
        .starts_with("multipart/form-data; boundary="));
    let text = String::from_utf8(post.body.clone()).unwrap();
    assert!(text.contains("filename=\"/home/user/p\""));
    assert!(text.contains("\r\n\r\nabc\r\n"));
    assert_eq!(post.header("x-access-token"), None, "no token was issued");
}

#[test]
fn an_edge_proxy_502_means_the_sandbox_is_gone() {
    let server = with_sandbox(|req| {
        if req.path == "/health" || req.path == "/files" {
            Reply::json(
                502,
                json!({"code": 502, "message": "The sandbox was not found", "sandboxId": "isb1"}),
            )
        } else {
            Reply::json(
                502,
                json!({"code": 502, "message": "The sandbox is running but port is not open",
                       "port": 49983}),
            )
        }
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    assert!(!sb.health().unwrap());
    let err = sb.read_file("/home/user/x").unwrap_err();
    assert!(
        matches!(err, SandboxError::Gone { ref id } if id == "isb1"),
        "{err:?}"
    );
    let err = sb.processes().unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transport, "{err:?}");
}

#[test]
fn envd_auth_failures_are_auth_errors() {
    let server = with_sandbox(|_| {
        Reply::json(
            401,
            json!({"code": 401, "message": "unauthorized access, please provide a valid access token"}),
        )
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    assert_eq!(sb.processes().unwrap_err().class(), ErrorClass::Auth);
    assert_eq!(
        sb.spawn("x", &SpawnOpts::default()).err().unwrap().class(),
        ErrorClass::Auth
    );
}

#[test]
fn an_unreachable_server_is_a_transport_error() {
    // Bind and drop, so the port is (almost certainly) closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = E2bConfig {
        api_key: "k".into(),
        domain: "e2b.test".into(),
        api_base: format!("http://127.0.0.1:{port}"),
        sandbox_url: None,
    };
    let b = E2bBackend::new(config, options()).unwrap();
    let err = b.create_e2b(&spec()).err().unwrap();
    assert_eq!(err.class(), ErrorClass::Transport);
    assert_eq!(b.live_sandboxes(), 0);
}

#[test]
fn a_missing_key_names_the_variable() {
    let err = E2bConfig::from_lookup(|_| None).unwrap_err();
    assert!(err.to_string().contains("E2B_API_KEY"));
    let as_sandbox_error: SandboxError = err.into();
    assert_eq!(as_sandbox_error.class(), ErrorClass::Auth);
}
