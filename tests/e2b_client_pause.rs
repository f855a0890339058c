//! The E2B backend's pausing against a fake E2B on loopback (`fake_e2b`): what a pause and
//! a pausing create send, how each answer reads, and that one sandbox is looked up by id.

use serde_json::json;
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ErrorClass, OnTimeout, PauseKind, Paused, RunState, SandboxError,
};

mod fake_e2b;

use fake_e2b::*;

#[test]
fn a_pause_sends_its_kind_and_reads_204_and_409() {
    let server = Server::start(|req| match req.path.as_str() {
        "/sandboxes/isbrun/pause" => Reply::empty(204),
        "/sandboxes/isbpaused/pause" => Reply::json(
            409,
            json!({"code": 409, "message": "Sandbox isbpaused is already paused"}),
        ),
        _ => Reply::json(
            404,
            json!({"code": 404, "message": "Sandbox isbgone not found"}),
        ),
    });
    let b = backend(&server, options());
    assert_eq!(b.pause("isbrun", PauseKind::Memory).unwrap(), Paused::Now);
    assert_eq!(
        server.last("POST", "/sandboxes/isbrun/pause").json(),
        json!({"memory": true})
    );
    assert_eq!(
        b.pause("isbrun", PauseKind::Filesystem).unwrap(),
        Paused::Now
    );
    assert_eq!(
        server.last("POST", "/sandboxes/isbrun/pause").json(),
        json!({"memory": false})
    );
    assert_eq!(
        b.pause("isbpaused", PauseKind::Memory).unwrap(),
        Paused::AlreadyPaused
    );
    let err = b.pause("isbgone", PauseKind::Memory).err().unwrap();
    assert_eq!(err.class(), ErrorClass::Gone, "{err}");
}

#[test]
fn a_pausing_create_asks_for_auto_pause_and_a_killing_one_does_not() {
    let server = with_sandbox(|_| Reply::empty(500));
    let b = backend(&server, options());
    for (on_timeout, memory) in [
        (OnTimeout::Pause(PauseKind::Memory), Some(true)),
        (OnTimeout::Pause(PauseKind::Filesystem), Some(false)),
        (OnTimeout::Kill, None),
    ] {
        b.create_e2b(&CreateSpec {
            on_timeout,
            ..spec()
        })
        .unwrap();
        let body = server.last("POST", "/v2/sandboxes").json();
        match memory {
            Some(memory) => {
                assert_eq!(body["autoPause"], true, "{body}");
                assert_eq!(body["autoPauseMemory"], memory, "{body}");
                // Resuming is the caller's (a connect); traffic alone wakes nothing.
                assert_eq!(body["autoResume"], json!({"enabled": false}), "{body}");
            }
            None => {
                for key in ["autoPause", "autoPauseMemory", "autoResume"] {
                    assert!(body.get(key).is_none(), "{key} sent for a kill: {body}");
                }
            }
        }
    }
}

#[test]
fn describe_reads_one_sandbox_and_its_state() {
    let server = Server::start(|req| match req.path.as_str() {
        "/sandboxes/isbp" => Reply::json(
            200,
            json!({"templateID": "base", "sandboxID": "isbp", "clientID": "6532622b",
                   "startedAt": "2026-12-01T10:00:00Z", "endAt": "2026-12-01T11:00:00Z",
                   "state": "paused", "envdVersion": "0.6.13", "cpuCount": 2,
                   "memoryMB": 512, "diskSizeMB": 1024,
                   "metadata": {"wmo-e2b.lease": "l1"}}),
        ),
        _ => Reply::json(404, json!({"code": 404, "message": "Sandbox not found"})),
    });
    let b = backend(&server, options());
    let s = b.describe("isbp").unwrap();
    assert_eq!(s.state, RunState::Paused);
    assert_eq!(
        s.metadata.get("wmo-e2b.lease").map(String::as_str),
        Some("l1")
    );
    assert_eq!(server.count("GET", "/sandboxes/isbp"), 1);
    assert_eq!(
        server.count("GET", "/v2/sandboxes"),
        0,
        "one sandbox is looked up by id, not by listing the team"
    );
    let err = b.describe("isbx").err().unwrap();
    assert!(matches!(
        err,
        SandboxError::Remote { .. } | SandboxError::Gone { .. }
    ));
    assert_eq!(err.class(), ErrorClass::Gone, "{err}");
}
