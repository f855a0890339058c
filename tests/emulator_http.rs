//! The emulator's HTTP server: keep-alive, chunked bodies, garbage, and a request without the
//! key refused before its body is read.

mod support;

use std::time::Duration;

use support::emulator::*;

/// Sends raw bytes on one connection, half-closes it, and reads everything the server sends
/// until it closes.
fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(request).unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = Vec::new();
    let _ = conn.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn http_keep_alive_chunked_bodies_and_garbage() {
    let emu = start();
    let addr = emu.handle.addr();
    // Two requests on one connection, the first with a chunked body.
    let body = r#"{"templateID":"base","timeout":30}"#;
    let (a, b) = body.split_at(10);
    let request = format!(
        "POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n\
         GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\nConnection: close\r\n\r\n",
        a.len(),
        b.len()
    );
    let answer = raw_exchange(addr, request.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 201 "), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 2, "{answer}");
    assert!(answer.contains("HTTP/1.1 200 "), "{answer}");

    let answer = raw_exchange(addr, b"NOT HTTP AT ALL\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    let answer = raw_exchange(
        addr,
        b"POST /v2/sandboxes HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
}

/// Sends a request head on a fresh connection (keeping our side open, as a client about to
/// send its body would) and reads the answer until the server closes, or gives up after a
/// few seconds of silence.
fn head_only_exchange(addr: std::net::SocketAddr, head: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.write_all(head.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = conn.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn an_unauthenticated_request_is_refused_before_its_body_is_read() {
    let emu = start();
    let addr = emu.handle.addr();
    // 200 MB announced (under the 256 MiB cap), none sent: only a refusal from the head
    // alone can answer it.
    for (key, extra) in [
        ("e2b_wrong", "Content-Length: 200000000\r\n"),
        (
            "e2b_wrong",
            "Content-Length: 200000000\r\nExpect: 100-continue\r\n",
        ),
        ("e2b_wrong", "Transfer-Encoding: chunked\r\n"),
        ("", "Content-Length: 200000000\r\n"),
    ] {
        let key_header = if key.is_empty() {
            String::new()
        } else {
            format!("X-API-Key: {key}\r\n")
        };
        let answer = head_only_exchange(
            addr,
            &format!(
                "POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\n{key_header}{extra}Content-Type: application/json\r\n\r\n"
            ),
        );
        assert!(answer.starts_with("HTTP/1.1 401 "), "{extra}: {answer:?}");
        assert!(answer.contains("Connection: close"), "{answer}");
        assert!(answer.contains("Invalid API key"), "{answer}");
    }
    // Without a body the connection stays usable: the next request on it is answered.
    let answer = raw_exchange(
        addr,
        format!(
            "GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: wrong\r\n\r\n\
             GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
    assert!(answer.contains("HTTP/1.1 200 "), "{answer}");
    // The key's owner still sends bodies, 100-continue included.
    let body = r#"{"templateID":"base","timeout":30}"#;
    let answer = raw_exchange(
        addr,
        format!(
            "POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\nExpect: 100-continue\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 100 "), "{answer}");
    assert!(answer.contains("HTTP/1.1 201 "), "{answer}");
    assert_eq!(emu.handle.stats().sandboxes, 1);
}

#[test]
fn a_tunnel_needs_a_certificate_and_a_sandbox_host() {
    let emu = start();
    let addr = emu.handle.addr();
    let answer = raw_exchange(
        addr,
        b"CONNECT 8000-abc123.e2b.app:443 HTTP/1.1\r\nHost: 8000-abc123.e2b.app:443\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 501 "), "{answer}");
    assert!(answer.contains("--tls-cert"), "{answer}");
    // A sandbox host that names no live sandbox, over plain HTTP: the proxy's own answer.
    let answer = raw_exchange(
        addr,
        b"GET / HTTP/1.1\r\nHost: 8000-abc123.e2b.app\r\nConnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 502 "), "{answer}");
    assert!(answer.contains("The sandbox was not found"), "{answer}");
}
