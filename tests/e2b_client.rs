//! The E2B backend's control plane (create, rate gate and slots, kill, list, connect,
//! timeouts) against a fake E2B on loopback (`fake_e2b`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use wmo_e2b::sandbox::e2b::error::ApiStatus;
use wmo_e2b::sandbox::e2b::{CreateRejected, E2bOptions, HOME};
use wmo_e2b::sandbox::{Backend, CreateSpec, ErrorClass, Killed, Metadata, Sandbox, SandboxError};

mod fake_e2b;

use fake_e2b::*;

#[test]
fn create_sends_the_sdk_body_and_headers_on_v2() {
    let server = with_sandbox(|_| Reply::empty(500));
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    assert_eq!(sb.id(), "isb1");
    assert_eq!(sb.home(), HOME);
    assert_eq!(sb.envd_version(), Some("0.6.13"));
    assert_eq!(sb.envd_base(), server.url);

    let req = server.last("POST", "/v2/sandboxes");
    assert_eq!(req.header("x-api-key"), Some("e2b_test_key"));
    assert!(req.header("user-agent").unwrap().starts_with("wmo-e2b/"));
    assert!(req
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    let body = req.json();
    assert_eq!(body["templateID"], "base");
    assert_eq!(body["timeout"], 120);
    assert_eq!(body["metadata"], json!({"wmo-e2b.run": "r1"}));
    assert_eq!(body["envVars"], json!({"A": "1"}));
    assert_eq!(body["allow_internet_access"], false);
    assert!(
        body.get("secure").is_none(),
        "v2 sandboxes are always secure"
    );
    assert_eq!(b.counters().creates, 1);
    assert_eq!(b.live_sandboxes(), 1);
}

/// A router's answer for a path it does not serve (Go's default), unlike the API's own JSON.
fn no_route() -> Reply {
    Reply {
        status: 404,
        headers: vec![("Content-Type".into(), "text/plain; charset=utf-8".into())],
        body: Body::Full(b"404 page not found".to_vec()),
    }
}

#[test]
fn create_falls_back_to_v1_once_v2_is_missing() {
    let server = Server::start(|req| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/v2/sandboxes") => no_route(),
        ("POST", "/sandboxes") => Reply::json(201, created("isb2")),
        _ => Reply::empty(500),
    });
    let b = backend(&server, options());
    let custom = CreateSpec {
        template: Some("my-tpl".into()),
        ..spec()
    };
    assert_eq!(b.create_e2b(&custom).unwrap().id(), "isb2");
    let body = server.last("POST", "/sandboxes").json();
    assert_eq!(body["secure"], true);
    assert_eq!(body["templateID"], "my-tpl");
    b.create_e2b(&spec()).unwrap();
    assert_eq!(
        server.count("POST", "/v2/sandboxes"),
        1,
        "v2 is not tried again"
    );
    assert_eq!(server.count("POST", "/sandboxes"), 2);
}

#[test]
fn capacity_errors_are_retried_and_counted() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&attempts);
    let server = Server::start(move |_| match seen.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::json(429, json!({"code": 429, "message": "Rate limit exceeded"})),
        1 => Reply::json(
            503,
            json!({"code": 503, "message": "Failed to place sandbox: not enough capacity",
                   "error_code": "sandbox_capacity_unavailable"}),
        ),
        _ => Reply::json(201, created("isb3")),
    });
    let b = backend(&server, options());
    assert_eq!(b.create_e2b(&spec()).unwrap().id(), "isb3");
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let c = b.counters();
    assert_eq!((c.creates, c.create_retries), (1, 2));
}

#[test]
fn capacity_retries_stop_after_four_attempts() {
    let server = Server::start(|_| Reply::json(503, json!({"code": 503, "message": "busy"})));
    let b = backend(&server, options());
    let err = b.create_e2b(&spec()).err().unwrap();
    assert_eq!(err.class(), ErrorClass::Capacity);
    let status = source_of::<ApiStatus>(&err).expect("the answer is the source");
    assert_eq!(status.status, 503);
    assert_eq!(server.count("POST", "/v2/sandboxes"), 4);
    assert_eq!(b.counters().create_retries, 3);
    assert_eq!(b.live_sandboxes(), 0, "a failed create gives its slot back");
}

#[test]
fn a_create_that_may_have_made_its_sandbox_says_so_whatever_its_last_attempt_got() {
    // The first attempt's 502 may have followed the work (as E2B's gateway can); the repeats
    // are rate-limited. The create failed, but not cleanly: its sandbox may exist.
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&attempts);
    let server = Server::start(move |_| match seen.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::json(502, json!({"code": 502, "message": "bad gateway"})),
        _ => Reply::json(429, json!({"code": 429, "message": "Rate limit exceeded"})),
    });
    let b = backend(&server, options());
    let mut keyed = spec();
    keyed
        .metadata
        .insert("wmo-e2b.lease".into(), "ls-0123456789abcdef01234567".into());
    let err = b.create_e2b(&keyed).err().unwrap();
    assert!(
        matches!(err, SandboxError::CreateUnconfirmed { .. }),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Capacity, "the last answer's class");
    assert_eq!(attempts.load(Ordering::SeqCst), 4);

    // Refusals alone leave no doubt.
    let server = Server::start(|_| Reply::json(429, json!({"code": 429, "message": "slow"})));
    let err = backend(&server, options())
        .create_e2b(&keyed)
        .err()
        .unwrap();
    assert!(matches!(err, SandboxError::Remote { .. }), "{err:?}");
}

#[test]
fn other_create_errors_fail_at_once() {
    for (status, class) in [(400, ErrorClass::BadRequest), (401, ErrorClass::Auth)] {
        let server =
            Server::start(move |_| Reply::json(status, json!({"code": status, "message": "no"})));
        let b = backend(&server, options());
        let err = b.create_e2b(&spec()).err().unwrap();
        assert_eq!(err.class(), class);
        assert_eq!(server.count("POST", "/v2/sandboxes"), 1, "{status}");
    }
}

#[test]
fn the_rate_gate_refuses_fast_past_its_bound() {
    let server = with_sandbox(|_| Reply::empty(500));
    let b = backend(
        &server,
        E2bOptions {
            create_rate: 0.5,
            create_wait: Duration::from_secs(1),
            ..options()
        },
    );
    b.create_e2b(&spec()).unwrap();
    let started = Instant::now();
    let err = b.create_e2b(&spec()).err().unwrap();
    assert!(started.elapsed() < Duration::from_millis(500), "fails fast");
    assert_eq!(err.class(), ErrorClass::Capacity);
    assert!(matches!(
        source_of::<CreateRejected>(&err),
        Some(CreateRejected::RateWait { .. })
    ));
    assert_eq!(server.count("POST", "/v2/sandboxes"), 1, "not retried");
    assert_eq!(b.counters().create_rejections, 1);
}

#[test]
fn backends_of_one_account_share_the_rate_gate() {
    let server = with_sandbox(|_| Reply::empty(500));
    let slow = E2bOptions {
        create_rate: 0.5,
        create_wait: Duration::from_secs(1),
        ..options()
    };
    let first = backend(&server, slow.clone());
    let second = backend(&server, slow);
    first.create_e2b(&spec()).unwrap();
    let err = second.create_e2b(&spec()).err().unwrap();
    assert!(matches!(
        source_of::<CreateRejected>(&err),
        Some(CreateRejected::RateWait { .. })
    ));
}

#[test]
fn the_slot_cap_bounds_live_sandboxes_until_a_kill() {
    let server = with_sandbox(|req| {
        if req.method == "DELETE" {
            Reply::empty(204)
        } else {
            Reply::empty(500)
        }
    });
    let b = backend(
        &server,
        E2bOptions {
            max_sandboxes: 1,
            slot_wait: 50 * MS,
            ..options()
        },
    );
    let first = b.create_e2b(&spec()).unwrap();
    let err = b.create_e2b(&spec()).err().unwrap();
    assert_eq!(err.class(), ErrorClass::Capacity);
    assert!(matches!(
        source_of::<CreateRejected>(&err),
        Some(CreateRejected::NoSlot { max: 1, .. })
    ));
    assert_eq!(b.kill(first.id()).unwrap(), Killed::Now);
    assert_eq!(b.live_sandboxes(), 0);
    b.create_e2b(&spec()).unwrap();
}

#[test]
fn kill_reports_gone_and_retries_transient_errors() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&attempts);
    let server = Server::start(move |req| match req.path.as_str() {
        "/sandboxes/gone1" => Reply::json(404, json!({"code": 404, "message": "doesn't exist"})),
        "/sandboxes/flaky1" => match seen.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => Reply::json(503, json!({"code": 503, "message": "busy"})),
            _ => Reply::empty(204),
        },
        "/sandboxes/denied1" => Reply::json(401, json!({"code": 401, "message": "bad key"})),
        _ => Reply::json(500, json!({"code": 500, "message": "boom"})),
    });
    let b = backend(&server, options());
    assert_eq!(b.kill("gone1").unwrap(), Killed::AlreadyGone);
    assert_eq!(b.kill("flaky1").unwrap(), Killed::Now);
    assert_eq!(b.counters().kill_retries, 2);

    // A kill is idempotent and an unproven one leaves a sandbox running: its 500 is
    // repeated too, on the same bounded schedule (four attempts), and no more.
    let err = b.kill("broken1").unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transport);
    assert_eq!(server.count("DELETE", "/sandboxes/broken1"), 4);
    let err = b.kill("denied1").unwrap_err();
    assert_eq!(err.class(), ErrorClass::Auth);
    assert_eq!(server.count("DELETE", "/sandboxes/denied1"), 1);
    let err = b.kill("a/b").unwrap_err();
    assert_eq!(err.class(), ErrorClass::BadRequest);
    assert_eq!(b.counters().kills, 2);
}

#[test]
fn list_follows_next_tokens_and_filters_by_metadata() {
    let server = Server::start(|req| {
        assert!(req.is("GET", "/v2/sandboxes"));
        let item = |id: &str| {
            json!({"sandboxID": id, "templateID": "tpl0", "alias": "base", "clientID": "x",
                   "metadata": {"pool": "eval"}, "startedAt": "2026-08-21T20:00:22.5Z",
                   "endAt": "2026-08-21T20:05:22Z", "state": "running", "cpuCount": 2,
                   "memoryMB": 512, "diskSizeMB": 1024, "envdVersion": "0.6.13"})
        };
        match req.query("nextToken") {
            None => Reply::json(200, json!([item("a1"), item("a2")]))
                .with_header("X-Next-Token", "tok/1="),
            Some("tok/1=") => Reply::json(200, json!([item("a2"), item("a3")])),
            Some(other) => panic!("unexpected token {other}"),
        }
    });
    let b = backend(&server, options());
    let mut filter = Metadata::new();
    filter.insert("pool".into(), "eval".into());
    filter.insert("slot".into(), "3".into());
    let got = b.list(&filter).unwrap();
    let ids: Vec<_> = got.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["a1", "a2", "a3"], "pages joined, overlap dropped");
    assert_eq!(got[0].template.as_deref(), Some("base"));
    assert_eq!(got[0].created, 1_787_342_422);
    assert_eq!(got[0].deadline, 1_787_342_722);
    assert_eq!(
        got[0].metadata.get("pool").map(String::as_str),
        Some("eval")
    );

    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    for req in &reqs {
        assert_eq!(req.query("metadata"), Some("pool=eval&slot=3"));
        assert_eq!(req.query("state"), Some("running,paused"));
        assert_eq!(req.query("limit"), Some("100"));
        assert_eq!(req.header("x-api-key"), Some("e2b_test_key"));
    }
}

#[test]
fn connect_falls_back_to_v1_and_404_means_gone() {
    let server = Server::start(|req| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/sandboxes/live1/connect") => {
            assert_eq!(req.json()["timeout"], 300);
            Reply::json(200, created("live1"))
        }
        (_, path) if path.starts_with("/v2/") => no_route(),
        _ => Reply::json(404, json!({"code": 404, "message": "not found"})),
    });
    let b = backend(&server, options());
    assert_eq!(b.connect("live1").unwrap().id(), "live1");
    assert_eq!(server.count("POST", "/v2/sandboxes/live1/connect"), 1);
    let err = b.connect("dead1").err().unwrap();
    assert!(
        matches!(err, SandboxError::Gone { ref id } if id == "dead1"),
        "{err:?}"
    );
}

#[test]
fn a_missing_sandbox_on_v2_is_v2s_answer_not_a_reason_to_try_v1() {
    let server = Server::start(|req| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/v2/sandboxes/dead1/connect") => Reply::json(
            404,
            json!({"code": 404, "message": "Sandbox \"dead1\" doesn't exist or you don't have access to it"}),
        ),
        ("POST", "/v2/sandboxes") => Reply::json(
            404,
            json!({"code": 404, "message": "template 'nope' not found"}),
        ),
        ("POST", "/v2/sandboxes/live1/connect") => Reply::json(200, created("live1")),
        _ => Reply::json(500, json!({"code": 500, "message": "v1 must not be asked"})),
    });
    let b = backend(&server, options());
    let err = b.connect("dead1").err().unwrap();
    assert!(
        matches!(err, SandboxError::Gone { ref id } if id == "dead1"),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Gone);
    assert_eq!(server.count("POST", "/sandboxes/dead1/connect"), 0);
    // v2 is still the way: the next connect does not go to v1 either.
    assert_eq!(b.connect("live1").unwrap().id(), "live1");
    assert_eq!(server.count("POST", "/sandboxes/live1/connect"), 0);

    // A create's v2 404 (an unknown template) is the answer too.
    let err = b.create_e2b(&spec()).err().unwrap();
    assert_eq!(err.class(), ErrorClass::BadRequest, "{err}");
    let status = source_of::<ApiStatus>(&err).expect("v2's answer is the source");
    assert!(status.message.contains("template 'nope'"), "{status}");
    assert_eq!(server.count("POST", "/sandboxes"), 0);
}

#[test]
fn timeout_network_and_info_reach_the_control_plane() {
    let server = with_sandbox(|req| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/sandboxes/isb1/timeout") | ("PUT", "/sandboxes/isb1/network") => {
            Reply::empty(204)
        }
        ("GET", "/sandboxes/isb1") => Reply::json(
            200,
            json!({"sandboxID": "isb1", "templateID": "tpl0", "clientID": "x",
                   "startedAt": "1970-01-01T00:00:10Z", "endAt": "1970-01-01T00:01:10Z",
                   "state": "running", "envdVersion": "0.6.13", "cpuCount": 2,
                   "memoryMB": 512, "diskSizeMB": 1024}),
        ),
        _ => Reply::json(404, json!({"code": 404, "message": "Sandbox not found"})),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    sb.set_timeout(600).unwrap();
    assert_eq!(
        server.last("POST", "/sandboxes/isb1/timeout").json(),
        json!({"timeout": 600})
    );
    sb.set_internet(true).unwrap();
    assert_eq!(
        server.last("PUT", "/sandboxes/isb1/network").json(),
        json!({"allow_internet_access": true})
    );
    let info = b.info("isb1").unwrap();
    assert_eq!(
        (info.started, info.end, info.state.as_str()),
        (10, 70, "running")
    );
    let err = b.info("other1").unwrap_err();
    assert!(matches!(err, SandboxError::Gone { .. }));
}
