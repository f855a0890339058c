//! The emulator's control plane over HTTP: auth, create, list, kill, timeouts, connect,
//! fault injection, concurrency, and a clean stop.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use support::emulator::*;
use support::{eventually, pid_alive};
use wmo_e2b::emulator::FaultSpec;

const REQUIRED_LISTED: &[&str] = &[
    "templateID",
    "sandboxID",
    "clientID",
    "startedAt",
    "endAt",
    "cpuCount",
    "memoryMB",
    "diskSizeMB",
    "state",
    "envdVersion",
];

#[test]
fn requests_without_the_key_are_refused() {
    let emu = start();
    for key in [None, Some("e2b_wrong")] {
        let r = emu.api_as(
            key,
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        );
        assert_eq!(r.status, 401);
        let body = r.json();
        assert_eq!(body["code"], 401);
        assert!(body["message"].is_string());
        assert_eq!(emu.api_as(key, "GET", "/v2/sandboxes", None).status, 401);
    }
    // Nothing was created by the refused calls.
    assert_eq!(emu.handle.stats().sandboxes, 0);
}

#[test]
fn create_answers_201_with_the_sandbox_shape() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base", "timeout": 60, "metadata": {"a": "b"}}));
    assert_eq!(sbx["templateID"], "base");
    assert_eq!(sbx["clientID"], "6532622b");
    assert_eq!(sbx["envdVersion"], "0.6.13");
    let id = sbx["sandboxID"].as_str().unwrap();
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
        "{id}"
    );
    assert!(sbx["envdAccessToken"]
        .as_str()
        .is_some_and(|t| t.len() >= 16));

    // v1: a token only when asked for one.
    let v1 = emu.api(
        "POST",
        "/sandboxes",
        Some(json!({"templateID": "base", "timeout": 60})),
    );
    assert_eq!(v1.status, 201);
    assert!(v1.json().get("envdAccessToken").is_none());
    let v1s = emu.api(
        "POST",
        "/sandboxes",
        Some(json!({"templateID": "base", "timeout": 60, "secure": true})),
    );
    assert!(v1s.json()["envdAccessToken"].is_string());

    let detail = emu.api("GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(detail.status, 200);
    let d = detail.json();
    for key in REQUIRED_LISTED {
        assert!(d.get(*key).is_some(), "detail lacks {key}: {d}");
    }
    assert_eq!(d["state"], "running");
    assert_eq!(d["metadata"], json!({"a": "b"}));

    for bad in [
        json!({}),
        json!({"templateID": "base", "timeout": -1}),
        json!({"templateID": "base", "metadata": {"k": 1}}),
        json!({"templateID": "base", "network": {"denyOut": ["10.0.0.0/8"]}}),
    ] {
        let r = emu.api("POST", "/v2/sandboxes", Some(bad.clone()));
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(r.json()["code"], 400);
    }
}

#[test]
fn list_filters_by_metadata_and_pages() {
    let emu = start();
    let mut ids = BTreeSet::new();
    for i in 0..5 {
        let s = emu.create(json!({"templateID": "base", "timeout": 60,
            "metadata": {"suite": "paging", "i": i.to_string()}}));
        ids.insert(s["sandboxID"].as_str().unwrap().to_string());
    }
    emu.create(json!({"templateID": "base", "timeout": 60, "metadata": {"suite": "other"}}));

    // Encoded as the Python SDK encodes it: pct(k=v) as one query value.
    let mut seen = BTreeSet::new();
    let mut token: Option<String> = None;
    let mut pages = Vec::new();
    loop {
        let mut path = "/v2/sandboxes?metadata=suite%3Dpaging&limit=2".to_string();
        if let Some(t) = &token {
            path.push_str(&format!("&nextToken={t}"));
        }
        let r = emu.api("GET", &path, None);
        assert_eq!(r.status, 200);
        let items = r.json();
        let items = items.as_array().unwrap().clone();
        for item in &items {
            for key in REQUIRED_LISTED {
                assert!(item.get(*key).is_some(), "{key} missing in {item}");
            }
            assert_eq!(item["metadata"]["suite"], "paging");
            assert!(seen.insert(item["sandboxID"].as_str().unwrap().to_string()));
        }
        pages.push(items.len());
        token = r.header("x-next-token").map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, vec![2, 2, 1]);
    assert_eq!(seen, ids);

    // Two filters are ANDed; the v1 list filters the same way.
    let r = emu.api("GET", "/v2/sandboxes?metadata=suite%3Dpaging%26i%3D3", None);
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    assert!(r.header("x-next-token").is_none());
    let r = emu.api("GET", "/sandboxes?metadata=suite%3Dother", None);
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    // Nothing here is paused (see emulator_pause.rs).
    let r = emu.api("GET", "/v2/sandboxes?state=paused", None);
    assert_eq!(r.json(), json!([]));
    assert_eq!(emu.api("GET", "/v2/sandboxes?limit=0", None).status, 400);
    assert_eq!(
        emu.api("GET", "/v2/sandboxes?nextToken=garbage", None)
            .status,
        400
    );
}

#[test]
fn kill_answers_204_then_404_and_envd_forgets_the_sandbox() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base", "timeout": 60}));
    let id = sbx["sandboxID"].as_str().unwrap();
    assert_eq!(emu.rpc(&sbx, "process.Process/List", json!({})).status, 200);
    assert_eq!(
        emu.api("DELETE", &format!("/sandboxes/{id}"), None).status,
        204
    );
    let again = emu.api("DELETE", &format!("/sandboxes/{id}"), None);
    assert_eq!(again.status, 404);
    assert_eq!(again.json()["code"], 404);
    assert_eq!(
        emu.api("GET", &format!("/sandboxes/{id}"), None).status,
        404
    );
    let gone = emu.rpc(&sbx, "process.Process/List", json!({}));
    assert_eq!(gone.status, 502);
    assert_eq!(gone.json()["message"], "The sandbox was not found");
    assert_eq!(gone.json()["sandboxId"], id);
}

#[test]
fn sandboxes_die_at_their_timeout() {
    let emu = start();
    let short = emu.create(json!({"templateID": "base", "timeout": 2}));
    let id = short["sandboxID"].as_str().unwrap().to_string();
    let mut s = emu.open_stream(
        &short,
        "process.Process/Start",
        start_body("sleep 600", false),
        &[],
    );
    let pid = s.next_event().unwrap().msg["event"]["start"]["pid"]
        .as_u64()
        .unwrap() as u32;
    let long = emu.create(json!({"templateID": "base", "timeout": 60}));
    let long_id = long["sandboxID"].as_str().unwrap().to_string();
    // Shortened by set_timeout, which overwrites the deadline.
    let r = emu.api(
        "POST",
        &format!("/sandboxes/{long_id}/timeout"),
        Some(json!({"timeout": 1})),
    );
    assert_eq!(r.status, 204);
    let dead = |id: &str| emu.api("GET", &format!("/sandboxes/{id}"), None).status == 404;
    assert!(eventually(Duration::from_secs(10), || dead(&id) && dead(&long_id)));
    // The sandbox's processes died with it (a sandbox reads as gone from the moment its
    // directory is buried; the kill of its processes follows); its open stream ended as E2B's
    // does when the connection to a dead sandbox ends: no `end` event, an `unavailable` error.
    assert!(
        eventually(Duration::from_secs(10), || !pid_alive(pid)),
        "process {pid} outlived its sandbox"
    );
    let rest = s.read_all();
    assert_eq!(end_event(&rest), None);
    let last = rest.last().unwrap();
    assert!(last.is_end_of_stream());
    assert_eq!(last.msg["error"]["code"], "unavailable", "{}", last.msg);
    assert_eq!(
        emu.api(
            "POST",
            &format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 5}))
        )
        .status,
        404
    );
}

#[test]
fn connect_extends_and_unknown_ids_are_404() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base", "timeout": 30}));
    let id = sbx["sandboxID"].as_str().unwrap();
    for path in [
        format!("/sandboxes/{id}/connect"),
        format!("/v2/sandboxes/{id}/connect"),
    ] {
        let r = emu.api("POST", &path, Some(json!({"timeout": 600})));
        assert_eq!(r.status, 200);
        let c = r.json();
        assert_eq!(c["sandboxID"], id);
        assert_eq!(c["envdAccessToken"], sbx["envdAccessToken"]);
    }
    let d = emu.api("GET", &format!("/sandboxes/{id}"), None).json();
    let end = d["endAt"].as_str().unwrap().to_string();
    // A shorter connect never shortens the lifetime.
    emu.api(
        "POST",
        &format!("/v2/sandboxes/{id}/connect"),
        Some(json!({"timeout": 5})),
    );
    let d2 = emu.api("GET", &format!("/sandboxes/{id}"), None).json();
    assert_eq!(d2["endAt"].as_str().unwrap(), end);
    let r = emu.api(
        "POST",
        "/v2/sandboxes/lsb0000000000000000/connect",
        Some(json!({})),
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["code"], 404);
    // Resume of a running sandbox is a conflict (pausing: see emulator_pause.rs).
    assert_eq!(
        emu.api("POST", &format!("/sandboxes/{id}/resume"), None)
            .status,
        409
    );
}

/// The status sequence of `n` creates against an emulator with `faults` and `seed`.
fn create_statuses(faults: &str, seed: u64, n: usize) -> (Vec<u16>, Vec<Reply>) {
    let spec: FaultSpec = faults.parse().unwrap();
    let emu = start_with(spec, seed);
    let replies: Vec<Reply> = (0..n)
        .map(|_| {
            emu.api(
                "POST",
                "/v2/sandboxes",
                Some(json!({"templateID": "base", "timeout": 30})),
            )
        })
        .collect();
    let statuses = replies.iter().map(|r| r.status).collect();
    let stats = emu.handle.stats();
    let count = |s: u16| replies.iter().filter(|r| r.status == s).count() as u64;
    assert_eq!(stats.faults.create_429, count(429));
    assert_eq!(stats.faults.create_503, count(503));
    (statuses, replies)
}

#[test]
fn fault_injection_is_deterministic_per_seed() {
    let faults = "create-429=0.3,create-503=0.2";
    let (a, replies) = create_statuses(faults, 42, 24);
    let (b, _) = create_statuses(faults, 42, 24);
    assert_eq!(a, b, "same seed, same faults");
    let (c, _) = create_statuses(faults, 43, 24);
    assert_ne!(a, c, "another seed, other faults");
    for s in [201, 429, 503] {
        assert!(a.contains(&s), "{s} never happened in {a:?}");
    }
    for r in &replies {
        match r.status {
            429 => {
                assert_eq!(r.header("retry-after"), Some("1"));
                assert_eq!(
                    r.json(),
                    json!({"code": 429, "message": "Rate limit exceeded"})
                );
            }
            503 => {
                assert_eq!(r.json()["error_code"], "sandbox_capacity_unavailable");
                assert_eq!(r.json()["code"], 503);
            }
            _ => assert_eq!(r.status, 201),
        }
    }
}

#[test]
fn kill_fail_leaves_the_sandbox_running() {
    let emu = start_with("kill-fail=1".parse().unwrap(), 1);
    let sbx = emu.create(json!({"templateID": "base", "timeout": 60}));
    let id = sbx["sandboxID"].as_str().unwrap();
    let r = emu.api("DELETE", &format!("/sandboxes/{id}"), None);
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["code"], 500);
    assert_eq!(
        emu.api("GET", &format!("/sandboxes/{id}"), None).status,
        200
    );
    assert_eq!(emu.handle.stats().faults.kill_fail, 1);
}

#[test]
fn create_delay_is_applied() {
    let emu = start_with("create-delay-ms=300".parse().unwrap(), 1);
    let t = std::time::Instant::now();
    emu.create(json!({"templateID": "base", "timeout": 30}));
    assert!(t.elapsed() >= Duration::from_millis(300));
}

#[test]
fn thirty_two_concurrent_clients_are_all_answered() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base", "timeout": 120}));
    let id = sbx["sandboxID"].as_str().unwrap().to_string();
    let url = emu.url.clone();
    let results: Vec<Vec<u16>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let (sbx, id, url) = (sbx.clone(), id.clone(), url.clone());
                s.spawn(move || {
                    // Each client has its own agent, so its own keep-alive connections.
                    let client = Client::new(&url);
                    let mut statuses = Vec::new();
                    for j in 0..12 {
                        let status = match (i + j) % 4 {
                            0 => client.api("GET", "/v2/sandboxes", None).status,
                            1 => client.api("GET", &format!("/sandboxes/{id}"), None).status,
                            2 => client.rpc(&sbx, "process.Process/List", json!({})).status,
                            _ => {
                                let frames = client.run(&sbx, &format!("echo {i}-{j}"));
                                assert_eq!(output(&frames, "stdout"), format!("{i}-{j}\n"));
                                200
                            }
                        };
                        statuses.push(status);
                    }
                    // And a create/kill of its own.
                    let mine = client.create(json!({"templateID": "base", "timeout": 60}));
                    let mine = mine["sandboxID"].as_str().unwrap();
                    statuses.push(
                        client
                            .api("DELETE", &format!("/sandboxes/{mine}"), None)
                            .status,
                    );
                    statuses
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for statuses in results {
        assert!(
            statuses.iter().all(|s| [200, 204].contains(s)),
            "{statuses:?}"
        );
    }
}

#[test]
fn stopping_kills_every_sandbox_and_process() {
    let emu = start();
    let dir = emu.handle.sandboxes_dir();
    let mut pids = Vec::new();
    for _ in 0..3 {
        let sbx = emu.create(json!({"templateID": "base", "timeout": 300}));
        let mut s = emu.open_stream(
            &sbx,
            "process.Process/Start",
            start_body("sleep 600", false),
            &[],
        );
        let first = s.next_event().unwrap();
        let pid = first.msg["event"]["start"]["pid"].as_u64().unwrap() as u32;
        assert!(pid_alive(pid));
        pids.push(pid);
        // The stream stays open: stop must cut it too.
        std::mem::forget(s);
    }
    let Emu { handle, .. } = emu;
    let report = handle.stop();
    assert_eq!(report.killed.len(), 3, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    for pid in pids {
        assert!(!pid_alive(pid), "process {pid} outlived the emulator");
    }
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn the_command_serves_until_sigterm_and_cleans_up() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wmo-e2b"))
        .args(["emulator", "--api-key", KEY, "--json", "--state-dir"])
        .arg(&state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["type"], "listening");
    assert_eq!(first["api_key"], KEY);
    let client = Client::new(first["url"].as_str().unwrap());
    let sbx = client.create(json!({"templateID": "base", "timeout": 300}));
    let mut s = client.open_stream(
        &sbx,
        "process.Process/Start",
        start_body("sleep 600", false),
        &[],
    );
    let pid = s.next_event().unwrap().msg["event"]["start"]["pid"]
        .as_u64()
        .unwrap() as u32;

    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let last: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(last, json!({"type": "stopped", "killed": 1, "failed": []}));
    assert!(child.wait().unwrap().success());
    assert!(!pid_alive(pid));
    let left = std::fs::read_dir(state.join("sandboxes")).unwrap().count();
    assert_eq!(left, 0);
}

/// Without `--api-key` the emulator makes a random key of its own and prints it, so no
/// example key a task could guess opens its API.
#[test]
fn without_a_key_the_command_makes_a_random_one() {
    use std::io::BufRead;
    let mut keys = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wmo-e2b"))
            .args(["emulator", "--json", "--state-dir"])
            .arg(dir.path().join("state"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first: serde_json::Value =
            serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        let key = first["api_key"].as_str().unwrap().to_string();
        let url = first["url"].as_str().unwrap().to_string();
        let status = |k: &str| match agent()
            .get(&format!("{url}/sandboxes"))
            .header("X-API-Key", k)
            .call()
        {
            Ok(r) => r.status().as_u16(),
            Err(ureq::Error::StatusCode(c)) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(status(&key), 200);
        assert_eq!(status(KEY), 401);
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        assert!(child.wait().unwrap().success());
        assert!(key.starts_with("e2b_") && key.len() == 44, "{key}");
        keys.push(key);
    }
    assert_ne!(keys[0], keys[1]);
}
