//! The emulator's envd over HTTP: Start/Connect streams, stdin, signals, timeouts,
//! keepalives, dropped streams, files and filesystem RPCs, and envd auth.

#[path = "emulator_common.rs"]
mod common;

use std::io::Write;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

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

fn upload(
    emu: &Emu,
    sbx: &Value,
    query: &str,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> (u16, Value) {
    let mut req = emu
        .agent
        .post(format!("{}/files{query}", emu.url))
        .header("E2b-Sandbox-Id", sbx["sandboxID"].as_str().unwrap())
        .header("X-Access-Token", sbx["envdAccessToken"].as_str().unwrap())
        .header("Content-Type", content_type);
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let resp = req.send(body).unwrap();
    let status = resp.status().as_u16();
    let v = resp.into_body().read_json().unwrap_or(Value::Null);
    (status, v)
}

fn download(emu: &Emu, sbx: &Value, path: &str) -> (u16, Vec<u8>) {
    let resp = emu
        .agent
        .get(format!("{}/files", emu.url))
        .query("path", path)
        .header("E2b-Sandbox-Id", sbx["sandboxID"].as_str().unwrap())
        .header("X-Access-Token", sbx["envdAccessToken"].as_str().unwrap())
        .call()
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().read_to_vec().unwrap())
}

#[test]
fn files_go_up_and_come_down() {
    let emu = start();
    let sbx = sandbox(&emu);
    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let (status, info) = upload(
        &emu,
        &sbx,
        "?path=%2Fhome%2Fuser%2Fd%2Fx.bin",
        "application/octet-stream",
        &[],
        &bytes,
    );
    assert_eq!(status, 200);
    assert_eq!(
        info,
        json!([{"path": "/home/user/d/x.bin", "name": "x.bin", "type": "file"}])
    );
    assert_eq!(
        download(&emu, &sbx, "/home/user/d/x.bin"),
        (200, bytes.clone())
    );
    assert_eq!(
        download(&emu, &sbx, "d/x.bin").1,
        bytes,
        "relative to the home"
    );

    // Multipart, filename = the full path, two files at once.
    let multipart = b"--B0UND\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/m/one.txt\"\r\nContent-Type: text/plain\r\n\r\none\r\n--B0UND\r\nContent-Disposition: form-data; name=\"file\"; filename=\"two.txt\"\r\n\r\ntwo\r\n--B0UND--\r\n";
    let (status, info) = upload(
        &emu,
        &sbx,
        "",
        "multipart/form-data; boundary=B0UND",
        &[],
        multipart,
    );
    assert_eq!(status, 200, "{info}");
    assert_eq!(info.as_array().unwrap().len(), 2);
    assert_eq!(download(&emu, &sbx, "/home/user/m/one.txt").1, b"one");
    assert_eq!(download(&emu, &sbx, "/home/user/two.txt").1, b"two");

    // Gzipped octet-stream.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"zipped").unwrap();
    let (status, _) = upload(
        &emu,
        &sbx,
        "?path=/home/user/z.txt",
        "application/octet-stream",
        &[("Content-Encoding", "gzip")],
        &gz.finish().unwrap(),
    );
    assert_eq!(status, 200);
    assert_eq!(download(&emu, &sbx, "/home/user/z.txt").1, b"zipped");

    assert_eq!(download(&emu, &sbx, "/home/user/missing").0, 404);
    assert_eq!(download(&emu, &sbx, "/home/user/d").0, 400);
    assert_eq!(download(&emu, &sbx, "/etc/passwd").0, 400);
    // /tmp is the sandbox's own, as on E2B; the system directory is root's.
    let (status, _) = upload(
        &emu,
        &sbx,
        "?path=/tmp/x",
        "application/octet-stream",
        &[],
        b"x",
    );
    assert_eq!(status, 200);
    assert_eq!(download(&emu, &sbx, "/tmp/x").1, b"x");
    let (status, _) = upload(
        &emu,
        &sbx,
        "?path=/opt/wmo-e2b/x",
        "application/octet-stream",
        &[],
        b"x",
    );
    assert_eq!(status, 403);
    let (status, _) = upload(
        &emu,
        &sbx,
        "?path=/opt/wmo-e2b/x&username=root",
        "application/octet-stream",
        &[],
        b"x",
    );
    assert_eq!(status, 200);
    let (status, _) = upload(
        &emu,
        &sbx,
        "?path=/etc/x",
        "application/octet-stream",
        &[],
        b"x",
    );
    assert_eq!(status, 400);
    let (status, _) = upload(&emu, &sbx, "", "application/octet-stream", &[], b"x");
    assert_eq!(status, 400, "octet-stream needs a path");
    let (status, _) = upload(&emu, &sbx, "?path=a", "text/plain", &[], b"x");
    assert_eq!(status, 400);
}

#[test]
fn filesystem_rpcs() {
    let emu = start();
    let sbx = sandbox(&emu);
    let fs =
        |method: &str, body: Value| emu.rpc(&sbx, &format!("filesystem.Filesystem/{method}"), body);
    let r = fs("MakeDir", json!({"path": "/home/user/a/b"}));
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["entry"]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(r.json()["entry"]["path"], "/home/user/a/b");
    let again = fs("MakeDir", json!({"path": "/home/user/a/b"}));
    assert_eq!(again.status, 409);
    assert_eq!(again.json()["code"], "already_exists");
    upload(
        &emu,
        &sbx,
        "?path=/home/user/a/b/f.txt",
        "application/octet-stream",
        &[],
        b"12345",
    );

    let stat = fs("Stat", json!({"path": "/home/user/a/b/f.txt"})).json();
    let e = &stat["entry"];
    assert_eq!(e["name"], "f.txt");
    assert_eq!(e["type"], "FILE_TYPE_FILE");
    assert_eq!(e["size"], "5", "int64 is a string");
    assert!(e["mode"].as_u64().is_some());
    assert!(e["permissions"].as_str().unwrap().starts_with('-'));
    assert!(e["modifiedTime"].as_str().unwrap().ends_with('Z'));
    let missing = fs("Stat", json!({"path": "/home/user/nope"}));
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["code"], "not_found");

    let one = fs("ListDir", json!({"path": "/home/user/a"})).json();
    let paths: Vec<&str> = one["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, vec!["/home/user/a/b"]);
    let two = fs("ListDir", json!({"path": "/home/user/a", "depth": 2})).json();
    assert_eq!(two["entries"].as_array().unwrap().len(), 2);
    assert_eq!(
        fs("ListDir", json!({"path": "/home/user/a/b/f.txt"})).status,
        400
    );

    let moved = fs(
        "Move",
        json!({"source": "/home/user/a/b/f.txt", "destination": "/home/user/c/g.txt"}),
    );
    assert_eq!(moved.status, 200);
    assert_eq!(moved.json()["entry"]["path"], "/home/user/c/g.txt");
    assert_eq!(
        fs(
            "Move",
            json!({"source": "/home/user/nope", "destination": "x"})
        )
        .status,
        404
    );

    assert_eq!(fs("Remove", json!({"path": "/home/user/a"})).status, 200);
    assert_eq!(
        fs("Remove", json!({"path": "/home/user/a"})).status,
        200,
        "missing is fine"
    );
    assert_eq!(fs("Stat", json!({"path": "/home/user/a"})).status, 404);
    assert_eq!(fs("Stat", json!({"path": "/etc"})).status, 400);
    assert_eq!(fs("WatchDir", json!({"path": "/home/user"})).status, 501);
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

/// Symlinks made in the sandbox work as on E2B while they stay in it; one that leads to the
/// host (which the sandbox cannot see, but can name) is refused by every file route.
#[test]
fn file_routes_never_follow_a_symlink_out_of_the_sandbox() {
    let emu = start();
    let sbx = sandbox(&emu);
    // Not under /tmp or /home/user: in the sandbox those are its own, so a link there stays
    // inside (the checkout itself may be under /tmp).
    let base = [env!("CARGO_TARGET_TMPDIR"), "/var/tmp"]
        .into_iter()
        .find(|b| !b.starts_with("/tmp") && !b.starts_with("/home/user"))
        .unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "TOP SECRET").unwrap();
    let target = dir.path().join("host.txt");
    std::fs::write(&target, "untouched").unwrap();
    emu.run(
        &sbx,
        &format!(
            "echo inside > real.txt && ln -s real.txt rel && ln -s /home/user/real.txt abs \
             && ln -s {} out && ln -s {} out-write && ln -s {} outdir",
            secret.display(),
            target.display(),
            dir.path().display()
        ),
    );
    for inside in ["/home/user/rel", "/home/user/abs"] {
        assert_eq!(download(&emu, &sbx, inside), (200, b"inside\n".to_vec()));
    }
    let (status, body) = download(&emu, &sbx, "/home/user/out");
    assert_eq!(status, 400);
    assert!(!String::from_utf8_lossy(&body).contains("TOP SECRET"));
    for path in ["out-write", "outdir/new.txt"] {
        let (status, _) = upload(
            &emu,
            &sbx,
            &format!("?path=/home/user/{path}"),
            "application/octet-stream",
            &[],
            b"pwned",
        );
        assert_eq!(status, 400, "{path}");
    }
    let fs =
        |method: &str, body: Value| emu.rpc(&sbx, &format!("filesystem.Filesystem/{method}"), body);
    assert_eq!(
        fs("ListDir", json!({"path": "/home/user/outdir"})).status,
        400
    );
    assert_eq!(
        fs("MakeDir", json!({"path": "/home/user/outdir/made"})).status,
        400
    );
    let stat = fs("Stat", json!({"path": "/home/user/out"})).json();
    assert_eq!(stat["entry"]["type"], "FILE_TYPE_SYMLINK", "{stat}");
    // The link's own size (its target's length), never the host file's.
    assert_ne!(stat["entry"]["size"], "10", "{stat}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(left.len(), 2, "{left:?}");
}
