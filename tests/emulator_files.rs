//! The emulator's envd over HTTP, its files: uploads and downloads, the filesystem RPCs,
//! and routes that never follow a symlink out of the sandbox.

mod support;

use std::io::Write;

use serde_json::{json, Value};
use support::emulator::*;
fn sandbox(emu: &Emu) -> Value {
    emu.create(json!({"templateID": "base", "timeout": 120}))
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
