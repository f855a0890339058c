//! envd as the real cloud needs it, against a fake E2B on loopback (`fake_e2b`): idempotent
//! calls repeated on the server's hints (never a call whose effect may have happened, never
//! past the edge's word that the sandbox is gone), file transfers bounded by idleness, not
//! in total, and envd too old to drive refused at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use wmo_e2b::sandbox::e2b::{E2bOptions, EnvdRefused, MIN_ENVD};
use wmo_e2b::sandbox::{Backend, ErrorClass, Sandbox, SandboxError, SpawnOpts};

mod fake_e2b;

use fake_e2b::*;

/// Answers the `n`-th request (0-based) to anything but a create with `script(n)`.
fn scripted(script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Server {
    let seen = Arc::new(AtomicUsize::new(0));
    with_sandbox(move |_| script(seen.fetch_add(1, Ordering::SeqCst)))
}

fn busy(status: u16) -> Reply {
    Reply::json(status, json!({"code": status, "message": "busy"})).with_header("Retry-After", "0")
}

fn gone() -> Reply {
    Reply::json(
        502,
        json!({"code": 502, "message": "The sandbox was not found", "sandboxId": "isb1"}),
    )
}

#[test]
fn reads_process_lists_and_health_are_repeated_on_the_servers_hints() {
    let server = scripted(|n| match n {
        0 => busy(429),
        1 => busy(503),
        2 => Reply::bytes(200, b"content"),
        3 => Reply::json(
            502,
            json!({"code": 502, "message": "The sandbox is running but port is not open",
                   "port": 49983}),
        ),
        4 => Reply::json(200, json!({})),
        5 => busy(504),
        _ => Reply::empty(204),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    assert_eq!(sb.read_file("/home/user/f").unwrap(), b"content");
    assert!(sb.processes().unwrap().is_empty());
    assert!(sb.health().unwrap());
    assert_eq!(server.count("GET", "/files"), 3);
    assert_eq!(server.count("POST", "/process.Process/List"), 2);
    assert_eq!(server.count("GET", "/health"), 2);
    assert_eq!(b.counters().envd_retries, 4);
}

#[test]
fn a_repeat_waits_the_servers_retry_after() {
    let server = scripted(|n| match n {
        0 => Reply::json(503, json!({"code": 503, "message": "busy"}))
            .with_header("Retry-After", "1"),
        _ => Reply::bytes(200, b"late"),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let started = Instant::now();
    assert_eq!(sb.read_file("/home/user/f").unwrap(), b"late");
    assert!(started.elapsed() >= Duration::from_secs(1));
}

#[test]
fn the_edge_saying_the_sandbox_is_gone_is_final() {
    let server = scripted(|_| gone());
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let err = sb.read_file("/home/user/f").unwrap_err();
    assert!(matches!(err, SandboxError::Gone { .. }), "{err:?}");
    assert!(!sb.health().unwrap());
    let err = sb.processes().unwrap_err();
    assert_eq!(err.class(), ErrorClass::Gone, "{err:?}");
    assert_eq!(server.count("GET", "/files"), 1);
    assert_eq!(server.count("GET", "/health"), 1);
    assert_eq!(server.count("POST", "/process.Process/List"), 1);
    assert_eq!(b.counters().envd_retries, 0);
}

#[test]
fn should_retry_false_and_the_schedules_end_stop_a_repeat() {
    let server = scripted(|n| match n {
        0 => busy(503).with_header("Should-Retry", "false"),
        _ => busy(503),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let err = sb.read_file("/home/user/a").unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transport, "{err:?}");
    assert_eq!(server.count("GET", "/files"), 1, "Should-Retry: false");
    sb.read_file("/home/user/b").unwrap_err();
    assert_eq!(
        server.count("GET", "/files"),
        5,
        "one attempt, then four: the default three repeats"
    );
}

#[test]
fn calls_whose_effect_may_have_happened_are_sent_once() {
    let server = scripted(|_| busy(503));
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    sb.send_stdin(3, b"rm -rf x\n").unwrap_err();
    sb.kill_process(3).unwrap_err();
    sb.write_file("/home/user/f", b"data").unwrap_err();
    sb.spawn("server &", &SpawnOpts::default()).err().unwrap();
    assert_eq!(server.count("POST", "/process.Process/SendInput"), 1);
    assert_eq!(server.count("POST", "/process.Process/SendSignal"), 1);
    assert_eq!(server.count("POST", "/files"), 1);
    assert_eq!(server.count("POST", "/process.Process/Start"), 1);
    assert_eq!(b.counters().envd_retries, 0);
}

/// A body sent in `chunks` pieces with `pause` between them.
fn trickle(data: &[u8], chunks: usize, pause: Duration) -> Reply {
    let step = data.len().div_ceil(chunks);
    let mut parts = Vec::new();
    for piece in data.chunks(step) {
        parts.push(Part::Bytes(piece.to_vec()));
        parts.push(Part::Pause(pause));
    }
    Reply {
        status: 200,
        headers: vec![("Content-Type".into(), "application/octet-stream".into())],
        body: Body::Chunked(parts),
    }
}

#[test]
fn file_transfers_are_bounded_by_idleness_not_in_total() {
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let served = data.clone();
    let server = with_sandbox(move |req| match req.query("path") {
        // 2.4 s in all, never 300 ms without a byte.
        Some("/home/user/slow") => trickle(&served, 8, Duration::from_millis(300)),
        Some("/home/user/stalled") => Reply {
            status: 200,
            headers: Vec::new(),
            body: Body::Chunked(vec![
                Part::Bytes(b"first".to_vec()),
                Part::Hold(Duration::from_secs(3)),
            ]),
        },
        _ => Reply::empty(500),
    });
    let b = backend(
        &server,
        E2bOptions {
            request_timeout: Duration::from_secs(1),
            transfer_idle: Duration::from_secs(1),
            retry: wmo_e2b::sandbox::e2b::RetryPolicy {
                retries: 0,
                ..options().retry
            },
            ..options()
        },
    );
    let sb = b.create_e2b(&spec()).unwrap();
    let started = Instant::now();
    assert_eq!(sb.read_file("/home/user/slow").unwrap(), data);
    assert!(started.elapsed() > Duration::from_secs(2), "it did trickle");

    let started = Instant::now();
    let err = sb.read_file("/home/user/stalled").unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transport, "{err:?}");
    assert!(
        err.to_string().contains("sent nothing for 1.000 s"),
        "the idle limit is named: {err}"
    );
    assert!(started.elapsed() < Duration::from_millis(2500));
}

#[test]
fn a_sandbox_with_too_old_an_envd_is_killed_and_refused() {
    let server = Server::start(|req| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/v2/sandboxes") => {
            let mut answer = created("isbold");
            answer["envdVersion"] = json!("0.2.1");
            Reply::json(201, answer)
        }
        ("DELETE", "/sandboxes/isbold") => Reply::empty(204),
        ("POST", "/v2/sandboxes/isbold/connect") => {
            let mut answer = created("isbold");
            answer["envdVersion"] = json!("0.2.1");
            Reply::json(200, answer)
        }
        _ => Reply::empty(500),
    });
    let b = backend(&server, options());
    let custom = wmo_e2b::sandbox::CreateSpec {
        template: Some("legacy-tpl".into()),
        ..spec()
    };
    let err = b.create_e2b(&custom).err().unwrap();
    assert_eq!(err.class(), ErrorClass::BadRequest, "no retry cures it");
    assert!(matches!(
        source_of::<EnvdRefused>(&err),
        Some(EnvdRefused::TooOld { .. })
    ));
    let text = err.to_string();
    assert!(
        text.contains("legacy-tpl")
            && text.contains("0.2.1")
            && text.contains(&MIN_ENVD.to_string()),
        "{text}"
    );
    assert_eq!(
        server.count("DELETE", "/sandboxes/isbold"),
        1,
        "killed at once"
    );
    assert_eq!(server.count("POST", "/v2/sandboxes"), 1, "not retried");
    assert_eq!(b.live_sandboxes(), 0, "its slot is free again");
    assert_eq!(b.counters().envd_refusals, 1);

    // Someone else's sandbox is refused too, but left alone.
    let err = b.connect("isbold").err().unwrap();
    assert_eq!(err.class(), ErrorClass::BadRequest);
    assert_eq!(server.count("DELETE", "/sandboxes/isbold"), 1);
}

#[test]
fn envd_older_than_close_stdin_is_told_without_a_call() {
    let server = Server::start(|req| match req.path.as_str() {
        "/v2/sandboxes" => {
            let mut answer = created("isb5");
            answer["envdVersion"] = json!("0.5.0");
            Reply::json(201, answer)
        }
        _ => Reply::json(200, json!({})),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let err = sb.close_stdin(3).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Unsupported, "{err:?}");
    assert!(err.to_string().contains("0.5.2"), "{err}");
    assert_eq!(server.count("POST", "/process.Process/CloseStdin"), 0);
    sb.send_stdin(3, b"x").unwrap();
}
