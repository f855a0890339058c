//! The emulator's envd over HTTP, its processes: Start/Connect streams, stdin, signals,
//! timeouts, keepalives, dropped streams, and envd auth.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::emulator::*;
use support::{eventually, pid_alive};
fn sandbox(emu: &Emu) -> Value {
    emu.create(json!({"templateID": "base", "timeout": 120}))
}

fn pid_of(frame: &Frame) -> u32 {
    frame.msg["event"]["start"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("not a start event: {:?}", frame.msg)) as u32
}

#[test]
fn start_streams_start_data_end_and_end_of_stream() {
    let emu = start();
    let sbx = sandbox(&emu);
    let mut s = emu.open_stream(
        &sbx,
        "process.Process/Start",
        start_body("echo out; echo err >&2", false),
        &[],
    );
    assert_eq!(s.status, 200);
    assert_eq!(s.content_type, "application/connect+json");
    let frames = s.read_all();
    assert!(pid_of(&frames[0]) > 0);
    assert_eq!(output(&frames, "stdout"), "out\n");
    assert_eq!(output(&frames, "stderr"), "err\n");
    let end = end_event(&frames).unwrap();
    // ProtoJSON omits the zero exit code.
    assert_eq!(end, json!({"exited": true, "status": "exit status 0"}));
    let last = frames.last().unwrap();
    assert!(last.is_end_of_stream());
    assert_eq!(last.msg, json!({}));
    assert!(frames[..frames.len() - 1].iter().all(|f| f.flag == 0));

    let frames = emu.run(&sbx, "exit 3");
    let end = end_event(&frames).unwrap();
    assert_eq!(end["exitCode"], 3);
    assert_eq!(end["error"], "exit status 3");
    assert_eq!(frames.last().unwrap().msg, json!({}));
}

#[test]
fn start_honours_cwd_envs_and_sandbox_env_vars() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base", "timeout": 60, "envVars": {"GLOBAL": "g"}}));
    let r = emu.rpc(
        &sbx,
        "filesystem.Filesystem/MakeDir",
        json!({"path": "/home/user/sub"}),
    );
    assert_eq!(r.status, 200);
    let body = json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "pwd; echo $FOO $GLOBAL $E2B_SANDBOX; touch here"],
                    "envs": {"FOO": "bar"}, "cwd": "/home/user/sub"},
        "stdin": false,
    });
    let frames = emu
        .open_stream(&sbx, "process.Process/Start", body, &[])
        .read_all();
    let out = output(&frames, "stdout");
    let mut lines = out.lines();
    assert!(lines.next().unwrap().ends_with("/sub"), "{out}");
    assert_eq!(lines.next(), Some("bar g true"));
    // A command's own envs win over the sandbox's, for that command only.
    let echo = "echo \"${FOO-unset} $GLOBAL\"";
    let scoped = json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", echo], "envs": {"GLOBAL": "mine"}},
        "stdin": false,
    });
    let frames = emu
        .open_stream(&sbx, "process.Process/Start", scoped, &[])
        .read_all();
    assert_eq!(output(&frames, "stdout"), "unset mine\n");
    assert_eq!(output(&emu.run(&sbx, echo), "stdout"), "unset g\n");
    let r = emu.rpc(
        &sbx,
        "filesystem.Filesystem/Stat",
        json!({"path": "sub/here"}),
    );
    assert_eq!(r.status, 200, "a file made in cwd is in the sandbox home");

    let bad = json!({"process": {"cmd": "/bin/true", "cwd": "/home/user/nope"}});
    let frames = emu
        .open_stream(&sbx, "process.Process/Start", bad, &[])
        .read_all();
    assert_eq!(frames.len(), 1);
    assert!(frames[0].is_end_of_stream());
    assert_eq!(frames[0].msg["error"]["code"], "invalid_argument");
    let escape = json!({"process": {"cmd": "/bin/true", "cwd": "/etc"}});
    let frames = emu
        .open_stream(&sbx, "process.Process/Start", escape, &[])
        .read_all();
    assert_eq!(frames[0].msg["error"]["code"], "invalid_argument");
}

#[test]
fn send_input_and_close_stdin() {
    let emu = start();
    let sbx = sandbox(&emu);
    let mut s = emu.open_stream(&sbx, "process.Process/Start", start_body("cat", true), &[]);
    let pid = pid_of(&s.next_event().unwrap());
    let r = emu.rpc(
        &sbx,
        "process.Process/SendInput",
        json!({"process": {"pid": pid}, "input": {"stdin": "aGVsbG8K"}}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({}));
    let data = s.next_event().unwrap();
    assert_eq!(output(&[data], "stdout"), "hello\n");
    let list = emu.rpc(&sbx, "process.Process/List", json!({})).json();
    assert_eq!(list["processes"][0]["pid"], pid);
    assert_eq!(list["processes"][0]["config"]["cmd"], "/bin/bash");
    assert_eq!(
        list["processes"][0]["config"]["args"],
        json!(["-l", "-c", "cat"])
    );
    let r = emu.rpc(
        &sbx,
        "process.Process/CloseStdin",
        json!({"process": {"pid": pid}}),
    );
    assert_eq!(r.status, 200);
    let rest = s.read_all();
    assert_eq!(end_event(&rest).unwrap()["exited"], true);
    // Ended: no longer listed, and input to it is not_found.
    let list = emu.rpc(&sbx, "process.Process/List", json!({})).json();
    assert_eq!(list, json!({}));
    let r = emu.rpc(
        &sbx,
        "process.Process/SendInput",
        json!({"process": {"pid": pid}, "input": {"stdin": "eA=="}}),
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["code"], "not_found");

    // Without stdin, input is refused.
    let mut s = emu.open_stream(
        &sbx,
        "process.Process/Start",
        start_body("sleep 5", false),
        &[],
    );
    let pid = pid_of(&s.next_event().unwrap());
    let r = emu.rpc(
        &sbx,
        "process.Process/SendInput",
        json!({"process": {"pid": pid}, "input": {"stdin": "eA=="}}),
    );
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["code"], "internal");
}

#[test]
fn connect_reattaches_and_send_signal_kills() {
    let emu = start();
    let sbx = sandbox(&emu);
    let mut s = emu.open_stream(
        &sbx,
        "process.Process/Start",
        start_body("while true; do echo tick; sleep 0.1; done", false),
        &[],
    );
    let pid = pid_of(&s.next_event().unwrap());
    drop(s);
    assert!(pid_alive(pid), "a dropped stream does not stop the process");
    let mut c = emu.open_stream(
        &sbx,
        "process.Process/Connect",
        json!({"process": {"pid": pid}}),
        &[],
    );
    assert_eq!(c.status, 200);
    assert_eq!(pid_of(&c.next_event().unwrap()), pid);
    let data = c.next_event().unwrap();
    assert!(output(&[data], "stdout").contains("tick"));
    let r = emu.rpc(
        &sbx,
        "process.Process/SendSignal",
        json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
    );
    assert_eq!(r.status, 200);
    let rest = c.read_all();
    let end = end_event(&rest).unwrap();
    assert_eq!(end["exitCode"], -1);
    assert!(end.get("exited").is_none());
    assert!(!pid_alive(pid));
    let r = emu.rpc(
        &sbx,
        "process.Process/SendSignal",
        json!({"process": {"pid": pid}, "signal": 9}),
    );
    assert_eq!(r.status, 404);

    // Within the retention window a Connect replays start and end.
    let frames = emu
        .open_stream(
            &sbx,
            "process.Process/Connect",
            json!({"process": {"pid": pid}}),
            &[],
        )
        .read_all();
    assert_eq!(pid_of(&frames[0]), pid);
    assert_eq!(end_event(&frames).unwrap()["exitCode"], -1);
    assert_eq!(frames.last().unwrap().msg, json!({}));

    let frames = emu
        .open_stream(
            &sbx,
            "process.Process/Connect",
            json!({"process": {"pid": 1}}),
            &[],
        )
        .read_all();
    assert_eq!(frames[0].msg["error"]["code"], "not_found");
}

#[test]
fn start_timeout_kills_the_process() {
    let emu = start();
    let sbx = sandbox(&emu);
    let mut s = emu.open_stream(
        &sbx,
        "process.Process/Start",
        start_body("sleep 60", false),
        &[("Connect-Timeout-Ms", "400")],
    );
    let pid = pid_of(&s.next_event().unwrap());
    let rest = s.read_all();
    let last = rest.last().unwrap();
    assert!(last.is_end_of_stream());
    assert_eq!(last.msg["error"]["code"], "deadline_exceeded");
    assert!(eventually(Duration::from_secs(5), || !pid_alive(pid)));
}

#[test]
fn idle_streams_get_keepalives() {
    let emu = start();
    let sbx = sandbox(&emu);
    let mut s = emu.open_stream(
        &sbx,
        "process.Process/Start",
        start_body("sleep 2.5", false),
        &[("Keepalive-Ping-Interval", "1")],
    );
    let frames = s.read_all();
    let keepalives = frames
        .iter()
        .filter(|f| f.msg["event"].get("keepalive").is_some())
        .count();
    assert!(keepalives >= 1, "{frames:?}");
    assert!(end_event(&frames).is_some());
}

#[test]
fn dropped_streams_are_cut_and_the_process_lives_on() {
    let emu = start_with("drop-stream=1".parse().unwrap(), 5);
    let sbx = sandbox(&emu);
    let mut s = emu.open_stream(
        &sbx,
        "process.Process/Start",
        start_body(
            "for i in 1 2 3 4 5 6; do echo $i; sleep 0.05; done; sleep 0.5; echo done > finished",
            false,
        ),
        &[],
    );
    let frames = s.read_all();
    let pid = pid_of(&frames[0]);
    assert!(frames.iter().all(|f| !f.is_end_of_stream()), "{frames:?}");
    assert!(end_event(&frames).is_none());
    assert!(frames.len() <= 3);
    // The process finishes its work although its stream was cut.
    let done = || {
        emu.rpc(
            &sbx,
            "filesystem.Filesystem/Stat",
            json!({"path": "/home/user/finished"}),
        )
        .status
            == 200
    };
    assert!(eventually(Duration::from_secs(10), done));
    assert!(eventually(Duration::from_secs(5), || !pid_alive(pid)));
    assert_eq!(emu.handle.stats().faults.drop_stream, 1);
}

#[test]
fn envd_checks_the_access_token_and_the_sandbox() {
    let emu = start();
    let sbx = sandbox(&emu);
    let mut forged = sbx.clone();
    forged["envdAccessToken"] = json!("wrong");
    let r = emu.rpc(&forged, "process.Process/List", json!({}));
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["code"], 401);
    let mut unknown = sbx.clone();
    unknown["sandboxID"] = json!("lsb0000000000000000");
    let r = emu.rpc(&unknown, "process.Process/List", json!({}));
    assert_eq!(r.status, 502);
    // Health needs no token.
    let health = emu
        .agent
        .get(format!("{}/health", emu.url))
        .header("E2b-Sandbox-Id", sbx["sandboxID"].as_str().unwrap())
        .call()
        .unwrap();
    assert_eq!(health.status().as_u16(), 204);
    // A v1 sandbox without `secure` needs no token at all.
    let open = emu
        .api(
            "POST",
            "/sandboxes",
            Some(json!({"templateID": "base", "timeout": 30})),
        )
        .json();
    assert_eq!(
        emu.rpc(&open, "process.Process/List", json!({})).status,
        200
    );
}

#[test]
fn stream_input_feeds_stdin_in_order() {
    let emu = start();
    let sbx = sandbox(&emu);
    let mut s = emu.open_stream(&sbx, "process.Process/Start", start_body("cat", true), &[]);
    let pid = pid_of(&s.next_event().unwrap());
    let mut body = envelope(
        0,
        json!({"start": {"process": {"pid": pid}}})
            .to_string()
            .as_bytes(),
    );
    for chunk in ["b25lCg==", "dHdvCg=="] {
        body.extend(envelope(
            0,
            json!({"data": {"input": {"stdin": chunk}}})
                .to_string()
                .as_bytes(),
        ));
    }
    body.extend(envelope(0, json!({"keepalive": {}}).to_string().as_bytes()));
    let resp = emu
        .agent
        .post(format!("{}/process.Process/StreamInput", emu.url))
        .header("E2b-Sandbox-Id", sbx["sandboxID"].as_str().unwrap())
        .header("X-Access-Token", sbx["envdAccessToken"].as_str().unwrap())
        .header("Content-Type", "application/connect+json")
        .send(&body[..])
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let bytes = resp.into_body().read_to_vec().unwrap();
    // One empty message, then a clean end of stream.
    assert_eq!(bytes, [envelope(0, b"{}"), envelope(2, b"{}")].concat());
    emu.rpc(
        &sbx,
        "process.Process/CloseStdin",
        json!({"process": {"pid": pid}}),
    );
    let frames = s.read_all();
    assert_eq!(output(&frames, "stdout"), "one\ntwo\n");
}

/// Names of this process's threads (the emulator runs in it).
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Killing a sandbox while commands run in it ends their streams as E2B's do when the
/// connection to a dead sandbox ends (`unavailable`, which the SDK resolves by a health
/// probe into "the sandbox was killed"), promptly, with its processes and their followers
/// gone.
#[test]
fn killing_the_sandbox_ends_its_streams_with_unavailable() {
    let emu = start();
    let sbx = sandbox(&emu);
    let id = sbx["sandboxID"].as_str().unwrap().to_string();
    let mut foreground = emu.open_stream(
        &sbx,
        "process.Process/Start",
        start_body("sleep 600", false),
        &[("Connect-Timeout-Ms", "600000")],
    );
    let sleeper = pid_of(&foreground.next_event().unwrap());
    let mut background =
        emu.open_stream(&sbx, "process.Process/Start", start_body("cat", true), &[]);
    let cat = pid_of(&background.next_event().unwrap());
    let mut attached = emu.open_stream(
        &sbx,
        "process.Process/Connect",
        json!({"process": {"pid": cat}}),
        &[],
    );
    assert_eq!(pid_of(&attached.next_event().unwrap()), cat);

    let t = std::time::Instant::now();
    assert_eq!(
        emu.api("DELETE", &format!("/sandboxes/{id}"), None).status,
        204
    );
    for (name, s) in [
        ("foreground", &mut foreground),
        ("background", &mut background),
        ("connected", &mut attached),
    ] {
        let rest = s.read_all();
        assert_eq!(end_event(&rest), None, "{name}: no end to report");
        let last = rest
            .last()
            .unwrap_or_else(|| panic!("{name}: cut without an end of stream"));
        assert!(last.is_end_of_stream(), "{name}: {:?}", last.msg);
        assert_eq!(
            last.msg["error"]["code"], "unavailable",
            "{name}: {}",
            last.msg
        );
        // Not the proxy's "was not found", which the SDK would read as a timeout instead.
        let message = last.msg["error"]["message"].as_str().unwrap();
        assert!(!message.contains("was not found"), "{message}");
    }
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(!pid_alive(sleeper) && !pid_alive(cat));
    let followers = |names: &[String]| {
        names
            .iter()
            .any(|n| *n == format!("emu-proc-{sleeper}") || *n == format!("emu-proc-{cat}"))
    };
    assert!(eventually(Duration::from_secs(5), || !followers(
        &thread_names()
    )));
    let health = emu
        .agent
        .get(format!("{}/health", emu.url))
        .header("E2b-Sandbox-Id", id.as_str())
        .call()
        .unwrap();
    assert_eq!(
        health.status().as_u16(),
        502,
        "the SDK's probe: the sandbox is gone"
    );
    assert_eq!(emu.handle.stats().sandboxes, 0);
}
