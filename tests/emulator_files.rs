//! The emulator's envd over HTTP, its files: uploads and downloads (with their metadata), the
//! filesystem RPCs, and routes that never follow a symlink out of the sandbox.

mod support;

use std::io::Write;

use serde_json::{json, Value};
use support::emulator::*;
fn sandbox(emu: &Emu) -> Value {
    emu.create(json!({"templateID": "base", "timeout": 120}))
}

#[test]
fn files_go_up_and_come_down() {
    let emu = start();
    let sbx = sandbox(&emu);
    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let (status, info) = emu.upload(
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
        emu.download(&sbx, "/home/user/d/x.bin"),
        (200, bytes.clone())
    );
    assert_eq!(
        emu.download(&sbx, "d/x.bin").1,
        bytes,
        "relative to the home"
    );

    // Multipart, filename = the full path, two files at once.
    let multipart = b"--B0UND\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/m/one.txt\"\r\nContent-Type: text/plain\r\n\r\none\r\n--B0UND\r\nContent-Disposition: form-data; name=\"file\"; filename=\"two.txt\"\r\n\r\ntwo\r\n--B0UND--\r\n";
    let (status, info) = emu.upload(
        &sbx,
        "",
        "multipart/form-data; boundary=B0UND",
        &[],
        multipart,
    );
    assert_eq!(status, 200, "{info}");
    assert_eq!(info.as_array().unwrap().len(), 2);
    assert_eq!(emu.download(&sbx, "/home/user/m/one.txt").1, b"one");
    assert_eq!(emu.download(&sbx, "/home/user/two.txt").1, b"two");

    // Gzipped octet-stream.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"zipped").unwrap();
    let (status, _) = emu.upload(
        &sbx,
        "?path=/home/user/z.txt",
        "application/octet-stream",
        &[("Content-Encoding", "gzip")],
        &gz.finish().unwrap(),
    );
    assert_eq!(status, 200);
    assert_eq!(emu.download(&sbx, "/home/user/z.txt").1, b"zipped");

    assert_eq!(emu.download(&sbx, "/home/user/missing").0, 404);
    assert_eq!(emu.download(&sbx, "/home/user/d").0, 400);
    assert_eq!(emu.download(&sbx, "/etc/passwd").0, 400);
    // /tmp is the sandbox's own, as on E2B; the system directory is root's.
    let (status, _) = emu.upload(&sbx, "?path=/tmp/x", "application/octet-stream", &[], b"x");
    assert_eq!(status, 200);
    assert_eq!(emu.download(&sbx, "/tmp/x").1, b"x");
    let (status, _) = emu.upload(
        &sbx,
        "?path=/opt/wmo-e2b/x",
        "application/octet-stream",
        &[],
        b"x",
    );
    assert_eq!(status, 403);
    let (status, _) = emu.upload(
        &sbx,
        "?path=/opt/wmo-e2b/x&username=root",
        "application/octet-stream",
        &[],
        b"x",
    );
    assert_eq!(status, 200);
    let (status, _) = emu.upload(&sbx, "?path=/etc/x", "application/octet-stream", &[], b"x");
    assert_eq!(status, 400);
    let (status, _) = emu.upload(&sbx, "", "application/octet-stream", &[], b"x");
    assert_eq!(status, 400, "octet-stream needs a path");
    let (status, _) = emu.upload(&sbx, "?path=a", "text/plain", &[], b"x");
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
    emu.upload(
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
    // WatchDir is a server stream: called as unary it gets connect-go's 415; as a stream, a
    // 200 stream that ends `unimplemented`, which the SDK raises as its own exception.
    assert_eq!(fs("WatchDir", json!({"path": "/home/user"})).status, 415);
    let mut watch = emu.open_stream(
        &sbx,
        "filesystem.Filesystem/WatchDir",
        json!({"path": "/home/user"}),
        &[],
    );
    assert_eq!(watch.status, 200);
    let frames = watch.read_all();
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert!(frames[0].is_end_of_stream());
    assert_eq!(frames[0].msg["error"]["code"], "unimplemented");
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
        assert_eq!(emu.download(&sbx, inside), (200, b"inside\n".to_vec()));
    }
    let (status, body) = emu.download(&sbx, "/home/user/out");
    assert_eq!(status, 400);
    assert!(!String::from_utf8_lossy(&body).contains("TOP SECRET"));
    for path in ["out-write", "outdir/new.txt"] {
        let (status, _) = emu.upload(
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

/// Where a sandbox's home file lies on the host (the local sandbox's `root/`).
fn host_path(emu: &Emu, sbx: &Value, rel: &str) -> std::path::PathBuf {
    let id = sbx["sandboxID"].as_str().unwrap();
    let dir = std::fs::read_dir(emu.handle.sandboxes_dir())
        .unwrap()
        .flatten()
        .find(|d| d.file_name().to_string_lossy().replace('-', "") == id)
        .expect("the sandbox's directory");
    dir.path().join("root").join(rel)
}

fn set_xattr(path: &std::path::Path, name: &str, value: &str) {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and a buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr {name}: {}",
        std::io::Error::last_os_error()
    );
}

fn get_xattr(path: &std::path::Path, name: &str) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the given length.
    let n = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = usize::try_from(n).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Upload metadata (envd >= 0.6.2) is kept as `user.e2b.<key>` attributes, reported by
/// uploads, Stat, ListDir and Move, replaced whole by the next upload, and bounded.
#[test]
fn uploads_keep_metadata_as_extended_attributes() {
    let emu = start();
    let sbx = sandbox(&emu);
    let fs =
        |method: &str, body: Value| emu.rpc(&sbx, &format!("filesystem.Filesystem/{method}"), body);
    let octet = "application/octet-stream";
    let headers = [
        ("X-Metadata-Author", "mish"),
        ("x-metadata-PURPOSE", "up load"),
    ];
    let (status, info) = emu.upload(&sbx, "?path=/home/user/m/f.txt", octet, &headers, b"x");
    assert_eq!(status, 200, "{info}");
    let want = json!({"author": "mish", "purpose": "up load"});
    assert_eq!(info[0]["metadata"], want, "{info}");
    let on_disk = host_path(&emu, &sbx, "m/f.txt");
    assert_eq!(
        get_xattr(&on_disk, "user.e2b.author").as_deref(),
        Some("mish")
    );
    assert_eq!(
        fs("Stat", json!({"path": "m/f.txt"})).json()["entry"]["metadata"],
        want
    );
    let listed = fs("ListDir", json!({"path": "/home/user/m"})).json();
    assert_eq!(listed["entries"][0]["metadata"], want, "{listed}");

    // Renaming keeps the attributes; a symlink reports its target's.
    let moved = fs(
        "Move",
        json!({"source": "m/f.txt", "destination": "n/g.txt"}),
    )
    .json();
    assert_eq!(moved["entry"]["metadata"], want, "{moved}");
    emu.run(&sbx, "ln -s n/g.txt link");
    assert_eq!(
        fs("Stat", json!({"path": "link"})).json()["entry"]["metadata"],
        want
    );

    // An overwrite replaces the whole set; attributes outside `user.e2b.` are left alone, and
    // ones the sandbox set in the namespace itself are reported.
    let on_disk = host_path(&emu, &sbx, "n/g.txt");
    set_xattr(&on_disk, "user.other", "kept");
    let (_, info) = emu.upload(
        &sbx,
        "?path=n/g.txt",
        octet,
        &[("X-Metadata-Author", "alice")],
        b"y",
    );
    assert_eq!(info[0]["metadata"], json!({"author": "alice"}), "{info}");
    assert_eq!(get_xattr(&on_disk, "user.e2b.purpose"), None);
    assert_eq!(get_xattr(&on_disk, "user.other").as_deref(), Some("kept"));
    set_xattr(&on_disk, "user.e2b.tag", "from-inside");
    let stat = fs("Stat", json!({"path": "n/g.txt"})).json();
    assert_eq!(
        stat["entry"]["metadata"],
        json!({"author": "alice", "tag": "from-inside"})
    );
    let (_, info) = emu.upload(&sbx, "?path=n/g.txt", octet, &[], b"z");
    assert!(
        info[0].get("metadata").is_none(),
        "no headers clear it: {info}"
    );
    assert!(fs("Stat", json!({"path": "n/g.txt"})).json()["entry"]
        .get("metadata")
        .is_none());

    // A multipart upload puts the same metadata on every file.
    let multipart = b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/p/a\"\r\n\r\na\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/p/b\"\r\n\r\nb\r\n--B--\r\n";
    let (status, info) = emu.upload(
        &sbx,
        "",
        "multipart/form-data; boundary=B",
        &[("X-Metadata-K", "v")],
        multipart,
    );
    assert_eq!(status, 200, "{info}");
    assert_eq!(info[0]["metadata"], json!({"k": "v"}));
    assert_eq!(info[1]["metadata"], json!({"k": "v"}));

    // Bounded, printable ASCII: refused with E2B's error shape, before anything is written.
    let long_key = format!("X-Metadata-{}", "k".repeat(247));
    let big = "v".repeat(2100);
    let refused: [&[(&str, &str)]; 3] = [
        &[(long_key.as_str(), "v")],
        &[
            ("X-Metadata-A", big.as_str()),
            ("X-Metadata-B", big.as_str()),
        ],
        &[("X-Metadata-A", "tab\there")],
    ];
    for headers in refused {
        let (status, body) = emu.upload(&sbx, "?path=bad.txt", octet, headers, b"x");
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["code"], 400);
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("invalid metadata"),
            "{body}"
        );
    }
    assert_eq!(fs("Stat", json!({"path": "bad.txt"})).status, 404);
    let fits = format!("X-Metadata-{}", "k".repeat(246));
    assert_eq!(
        emu.upload(&sbx, "?path=ok.txt", octet, &[(fits.as_str(), "v")], b"x")
            .0,
        200
    );
}

/// A tree deeper than any stack: ListDir refuses it by its path bound, Remove takes it all.
#[test]
fn a_tree_of_any_depth_is_listed_within_a_bound_and_removed_whole() {
    let emu = start();
    let sbx = sandbox(&emu);
    let fs =
        |method: &str, body: Value| emu.rpc(&sbx, &format!("filesystem.Filesystem/{method}"), body);
    assert_eq!(
        fs("MakeDir", json!({"path": "/home/user/deep"})).status,
        200
    );
    // Built on the host, a level at a time relative to the last, so no path ever grows.
    let built = std::process::Command::new("perl")
        .args([
            "-e",
            "for (1..20000) { mkdir 'd' or die; chdir 'd' or die }",
        ])
        .current_dir(host_path(&emu, &sbx, "deep"))
        .status()
        .unwrap();
    assert!(built.success());

    let listed = fs(
        "ListDir",
        json!({"path": "/home/user/deep", "depth": 1_000_000}),
    );
    assert_eq!(listed.status, 429, "{}", listed.json());
    assert_eq!(listed.json()["code"], "resource_exhausted");
    let message = listed.json()["message"].as_str().unwrap().to_string();
    assert!(message.contains("longer than 4096 bytes"), "{message}");

    assert_eq!(fs("Remove", json!({"path": "/home/user/deep"})).status, 200);
    assert_eq!(fs("Stat", json!({"path": "/home/user/deep"})).status, 404);
}
