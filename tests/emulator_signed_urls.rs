//! Signed `/files` URLs (`download_url` / `upload_url`) against the emulator: the signature
//! stands in for the access token and names the sandbox, bound to its path, operation, user
//! and expiry.

mod support;

use serde_json::{json, Value};
use support::emulator::*;

/// The SDK's `get_signature`: `v1_` + unpadded base64 of SHA-256 over
/// `path:operation:user:token[:expiration]`.
fn sign(path: &str, op: &str, user: &str, token: &str, exp: Option<u64>) -> String {
    use base64::Engine;
    use sha2::Digest;
    let mut raw = format!("{path}:{op}:{user}:{token}");
    if let Some(e) = exp {
        raw.push_str(&format!(":{e}"));
    }
    let digest = sha2::Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// A plain request to a signed URL, as a browser or curl sends it: no token, no sandbox
/// header (unless `sandbox` names one). Answers the status and the body.
fn signed(
    emu: &Emu,
    method: &str,
    query: &[(&str, &str)],
    sandbox: Option<&Value>,
) -> (u16, Vec<u8>) {
    let url = format!("{}/files", emu.url);
    let resp = if method == "GET" {
        let mut req = emu.agent.get(&url);
        for (k, v) in query {
            req = req.query(*k, *v);
        }
        if let Some(s) = sandbox {
            req = req.header("E2b-Sandbox-Id", s["sandboxID"].as_str().unwrap());
        }
        req.call()
    } else {
        let mut req = emu
            .agent
            .post(&url)
            .header("Content-Type", "application/octet-stream");
        for (k, v) in query {
            req = req.query(*k, *v);
        }
        if let Some(s) = sandbox {
            req = req.header("E2b-Sandbox-Id", s["sandboxID"].as_str().unwrap());
        }
        req.send(&b"signed upload"[..])
    }
    .unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().read_to_vec().unwrap())
}

fn message(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    assert_eq!(v["code"], 401, "E2B's error shape: {v}");
    v["message"].as_str().unwrap_or("").to_string()
}

/// Signed download and upload URLs: the signature stands in for the token (and names the
/// sandbox, behind the one emulator URL), bound to its path, operation, user and expiry.
#[test]
fn signed_urls_stand_in_for_the_token() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base", "timeout": 120}));
    let other = emu.create(json!({"templateID": "base", "timeout": 120}));
    let token = sbx["envdAccessToken"].as_str().unwrap();
    emu.upload(
        &sbx,
        "?path=/home/user/s.txt",
        "application/octet-stream",
        &[],
        b"secret",
    );
    let path = "/home/user/s.txt";
    let read = sign(path, "read", "", token, None);
    assert_eq!(
        signed(&emu, "GET", &[("path", path), ("signature", &read)], None),
        (200, b"secret".to_vec())
    );
    assert_eq!(
        signed(
            &emu,
            "GET",
            &[("path", path), ("signature", &read)],
            Some(&sbx)
        )
        .0,
        200
    );

    // Signed upload: a write signature, the path (and user) as the SDK put them in the URL.
    let up = "uploads/new file.txt";
    let write = sign(up, "write", "user", token, None);
    let (status, body) = signed(
        &emu,
        "POST",
        &[("path", up), ("username", "user"), ("signature", &write)],
        None,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        emu.download(&sbx, "/home/user/uploads/new file.txt").1,
        b"signed upload"
    );

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let later = (now + 60).to_string();
    let expiring = sign(path, "read", "", token, Some(now + 60));
    let q = [
        ("path", path),
        ("signature", expiring.as_str()),
        ("signature_expiration", later.as_str()),
    ];
    assert_eq!(signed(&emu, "GET", &q, None).0, 200);
    let past = (now - 10).to_string();
    let expired = sign(path, "read", "", token, Some(now - 10));
    let q = [
        ("path", path),
        ("signature", expired.as_str()),
        ("signature_expiration", past.as_str()),
    ];
    let (status, body) = signed(&emu, "GET", &q, None);
    assert_eq!(
        (status, message(&body).as_str()),
        (401, "signature is already expired")
    );

    // Bound to what was signed: another path, the other operation, a changed expiry; and to
    // its sandbox (another sandbox's signature opens that sandbox, not this one).
    let as_write = sign(path, "write", "", token, None);
    let others = sign(
        path,
        "read",
        "",
        other["envdAccessToken"].as_str().unwrap(),
        None,
    );
    let wrong = [
        (
            vec![
                ("path", "/home/user/other.txt"),
                ("signature", read.as_str()),
            ],
            None,
        ),
        (vec![("path", path), ("signature", as_write.as_str())], None),
        (
            vec![
                ("path", path),
                ("signature", expiring.as_str()),
                ("signature_expiration", past.as_str()),
            ],
            None,
        ),
        (vec![("path", path), ("signature", "v1_forged")], None),
        (
            vec![("path", path), ("signature", others.as_str())],
            Some(&sbx),
        ),
    ];
    for (q, sandbox) in &wrong {
        for sandbox in [*sandbox, Some(&sbx)] {
            let (status, body) = signed(&emu, "GET", q, sandbox);
            assert_eq!(
                (status, message(&body).as_str()),
                (401, "invalid signature"),
                "{q:?}"
            );
        }
    }
    // A read signature does not upload.
    let (status, _) = signed(&emu, "POST", &[("path", path), ("signature", &read)], None);
    assert_eq!(status, 401);
    assert_eq!(emu.download(&sbx, path).1, b"secret");
    // The header, when sent, is what counts; without either, envd says what is missing.
    let bad_header = emu
        .agent
        .get(format!("{}/files", emu.url))
        .query("path", path)
        .query("signature", &read)
        .header("E2b-Sandbox-Id", sbx["sandboxID"].as_str().unwrap())
        .header("X-Access-Token", "wrong")
        .call()
        .unwrap();
    assert_eq!(bad_header.status().as_u16(), 401);
    let (status, body) = signed(&emu, "GET", &[("path", path)], Some(&sbx));
    assert_eq!(
        (status, message(&body).as_str()),
        (401, "missing signature query parameter")
    );
    let q = [
        ("path", path),
        ("signature", read.as_str()),
        ("signature_expiration", "soon"),
    ];
    assert_eq!(signed(&emu, "GET", &q, Some(&sbx)).0, 400);
}
