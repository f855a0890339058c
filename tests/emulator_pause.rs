//! The emulator's pause and resume on the wire (`../shared/docs/e2b-wire.md` §2.1–§2.6):
//! the statuses of pause, connect and resume, what info and list report of a paused sandbox,
//! a pause at the timeout and a wake by envd traffic, and no paused sandbox outliving the
//! emulator.

use std::time::Duration;

use serde_json::{json, Value};

mod support;

use support::emulator::{output, start, Emu};
use support::wait_for;

const WAIT: Duration = Duration::from_secs(15);

fn id(sbx: &Value) -> &str {
    sbx["sandboxID"].as_str().unwrap()
}

fn state(emu: &Emu, sbx: &Value) -> Value {
    emu.api("GET", &format!("/sandboxes/{}", id(sbx)), None)
        .json()["state"]
        .clone()
}

fn pause(emu: &Emu, sbx: &Value, body: Value) -> u16 {
    emu.api("POST", &format!("/sandboxes/{}/pause", id(sbx)), Some(body))
        .status
}

/// The stdout of `cmd` run through envd.
fn run(emu: &Emu, sbx: &Value, cmd: &str) -> String {
    output(&emu.run(sbx, cmd), "stdout")
}

#[test]
fn pause_connect_and_resume_answer_as_e2b_does() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base", "timeout": 120}));
    let sid = id(&sbx).to_string();
    assert_eq!(pause(&emu, &sbx, json!({})), 204);
    assert_eq!(pause(&emu, &sbx, json!({"memory": true})), 409);
    let info = emu.api("GET", &format!("/sandboxes/{sid}"), None).json();
    assert_eq!(info["state"], "paused");
    assert_eq!(
        info["lifecycle"],
        json!({"autoResume": false, "onTimeout": "kill"})
    );
    // What needs a running sandbox finds none.
    let timeout = json!({"timeout": 60});
    let set = emu.api("POST", &format!("/sandboxes/{sid}/timeout"), Some(timeout));
    assert_eq!(set.status, 404);
    let net = json!({"allow_internet_access": true});
    let net = emu.api("PUT", &format!("/sandboxes/{sid}/network"), Some(net));
    assert_eq!(net.status, 404);
    let envd = emu.rpc(&sbx, "process.Process/List", json!({}));
    assert_eq!(envd.status, 502);
    assert_eq!(envd.json()["message"], "The sandbox was not found");

    let connect = format!("/v2/sandboxes/{sid}/connect");
    assert_eq!(emu.api("POST", &connect, Some(json!({}))).status, 201);
    assert_eq!(emu.api("POST", &connect, Some(json!({}))).status, 200);
    assert_eq!(run(&emu, &sbx, "echo up"), "up\n");
    let resume = format!("/sandboxes/{sid}/resume");
    assert_eq!(emu.api("POST", &resume, Some(json!({}))).status, 409);

    let strict = json!({"memory": false, "requireHealthyGuest": true});
    assert_eq!(pause(&emu, &sbx, strict), 204);
    let resumed = emu.api("POST", &resume, Some(json!({"timeout": 60})));
    assert_eq!(resumed.status, 201);
    assert_eq!(resumed.json()["sandboxID"], sid);
    let v1 = format!("/sandboxes/{sid}/connect");
    assert_eq!(
        emu.api("POST", &v1, Some(json!({"timeout": 30}))).status,
        200
    );

    assert_eq!(pause(&emu, &sbx, json!({"memory": "no"})), 400);
    let missing = emu.api("POST", "/sandboxes/nope/pause", Some(json!({})));
    assert_eq!(missing.status, 404);
    assert_eq!(pause(&emu, &sbx, json!({})), 204);
    let killed = emu.api("DELETE", &format!("/sandboxes/{sid}"), None);
    assert_eq!(killed.status, 204);
    assert_eq!(
        emu.api("GET", &format!("/sandboxes/{sid}"), None).status,
        404
    );
}

#[test]
fn a_memory_connect_restores_and_memory_false_reboots() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base", "timeout": 120}));
    let sid = id(&sbx).to_string();
    run(
        &emu,
        &sbx,
        "echo kept > kept.txt; setsid sleep 1234 >/dev/null 2>&1 < /dev/null &",
    );
    // The pattern does not match the command line of the shell that runs it.
    let sleeping = "pgrep -f 'sleep 123[4]' >/dev/null && echo sleeping || echo none";
    wait_for("the sleeper", WAIT, || {
        run(&emu, &sbx, sleeping) == "sleeping\n"
    });
    let connect = format!("/v2/sandboxes/{sid}/connect");

    assert_eq!(pause(&emu, &sbx, json!({})), 204);
    assert_eq!(emu.api("POST", &connect, Some(json!({}))).status, 201);
    assert_eq!(run(&emu, &sbx, sleeping), "sleeping\n");

    assert_eq!(pause(&emu, &sbx, json!({})), 204);
    let reboot = emu.api("POST", &connect, Some(json!({"memory": false})));
    assert_eq!(reboot.status, 201);
    assert_eq!(run(&emu, &sbx, sleeping), "none\n");
    assert_eq!(run(&emu, &sbx, "cat kept.txt"), "kept\n");
}

#[test]
fn lists_filter_by_state_and_page() {
    let emu = start();
    let made: Vec<Value> = (0..3)
        .map(|_| emu.create(json!({"templateID": "base", "metadata": {"suite": "pause-list"}})))
        .collect();
    for sbx in &made[1..] {
        assert_eq!(pause(&emu, sbx, json!({})), 204);
    }
    let list = |query: &str| {
        emu.api(
            "GET",
            &format!("/v2/sandboxes?metadata=suite%3Dpause-list{query}"),
            None,
        )
    };

    let mut paused = Vec::new();
    let mut token = String::new();
    for _ in 0..5 {
        let page = list(&format!("&state=paused&limit=1{token}"));
        assert_eq!(page.status, 200);
        assert_eq!(
            page.header("x-total-running"),
            None,
            "only paused ones were asked for"
        );
        for item in page.json().as_array().unwrap() {
            assert_eq!(item["state"], "paused");
            paused.push(item["sandboxID"].as_str().unwrap().to_string());
        }
        match page.header("x-next-token") {
            Some(t) => token = format!("&nextToken={t}"),
            None => break,
        }
    }
    paused.sort();
    let mut want: Vec<String> = made[1..].iter().map(|s| id(s).to_string()).collect();
    want.sort();
    assert_eq!(paused, want);

    let running = list("&state=running");
    assert_eq!(running.header("x-total-running"), Some("1"));
    let items = running.json();
    assert_eq!(items.as_array().unwrap().len(), 1);
    assert_eq!(items[0]["sandboxID"], id(&made[0]));
    let both = list("&state=running,paused");
    assert_eq!(both.json().as_array().unwrap().len(), 3);
    assert_eq!(both.header("x-total-running"), Some("1"));
    assert_eq!(list("").json().as_array().unwrap().len(), 3);
    let v1 = emu
        .api("GET", "/sandboxes?metadata=suite%3Dpause-list", None)
        .json();
    assert_eq!(
        v1.as_array().unwrap().len(),
        1,
        "v1 lists running ones only"
    );
    let stats = emu.api("GET", "/_emulator/stats", None).json();
    assert_eq!(
        (stats["sandboxes"].clone(), stats["paused"].clone()),
        (json!(3), json!(2))
    );
}

#[test]
fn a_timeout_pauses_and_traffic_wakes_only_when_asked_to() {
    let emu = start();
    let woken = emu.create(json!({
        "templateID": "base", "timeout": 1,
        "autoPause": true, "autoResume": {"enabled": true},
    }));
    let asleep = emu.create(json!({
        "templateID": "base", "timeout": 1, "autoPause": true, "autoPauseMemory": false,
    }));
    for sbx in [&woken, &asleep] {
        wait_for("a pause at the timeout", WAIT, || {
            state(&emu, sbx) == "paused"
        });
    }
    let info = emu
        .api("GET", &format!("/sandboxes/{}", id(&woken)), None)
        .json();
    assert_eq!(
        info["lifecycle"],
        json!({"autoResume": true, "onTimeout": "pause"})
    );

    assert_eq!(run(&emu, &woken, "echo awake"), "awake\n");
    assert_eq!(state(&emu, &woken), "running");
    assert_eq!(
        emu.rpc(&asleep, "process.Process/List", json!({})).status,
        502
    );
    let connect = format!("/v2/sandboxes/{}/connect", id(&asleep));
    assert_eq!(
        emu.api("POST", &connect, Some(json!({"timeout": 60})))
            .status,
        201
    );
    assert_eq!(run(&emu, &asleep, "echo up"), "up\n");

    let refused = emu.api(
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "base", "autoResume": {"enabled": true}})),
    );
    assert_eq!(refused.status, 400);
}

#[test]
fn stopping_the_emulator_kills_its_paused_sandboxes() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base"}));
    assert_eq!(pause(&emu, &sbx, json!({})), 204);
    let dir = emu.handle.sandboxes_dir();
    let report = emu.handle.stop();
    assert_eq!(report.killed, [id(&sbx).to_string()]);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
}
