//! HTTPS to a sandbox's port: a client (through `HTTPS_PROXY` set to the emulator) asks to
//! `CONNECT <port>-<id>.<domain>:443`, the emulator answers as that host with the
//! certificate it was given (`--tls-cert`, `--tls-key`), and the bytes inside the TLS session
//! are relayed to the sandbox's port, as E2B's proxy serves `https://<port>-<id>.<domain>`.
//!
//! The first request's head is read inside the session, for the traffic access token, and
//! passed on as it came; everything after is relayed both ways untouched (keep-alive and
//! protocol upgrades included) until either side ends or stays silent past the idle bound.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

use rustls::ServerConnection;

use super::edge::{self, Target, UPSTREAM_IDLE};
use super::http::{encoded, Request, Responder, Response};
use super::state::Shared;

/// How long the TLS handshake and the first request's head may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most a first request's head may be.
const MAX_HEAD: usize = 64 * 1024;
/// What is read at a time, either way.
const CHUNK: usize = 64 * 1024;

/// Answers a `CONNECT`.
pub(super) fn connect(shared: &Shared, req: Request, out: &mut Responder<'_>) {
    let Some(tls) = shared.config.tls.clone() else {
        let _ = out.send(Response::error(
            501,
            "HTTPS to a sandbox's port needs the emulator started with --tls-cert and --tls-key",
        ));
        return;
    };
    let Some(target) = edge::from_host(&req.target) else {
        let _ = out.send(Response::error(
            400,
            format!(
                "CONNECT {:?} names no sandbox host (<port>-<sandboxID>.<domain>)",
                req.target
            ),
        ));
        return;
    };
    let client = out.take_over();
    let mut w = client;
    if w.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let Ok(conn) = ServerConnection::new(tls.0) else {
        return;
    };
    let _ = serve(shared, &target, client, conn);
}

/// The TLS session on `client`: the first head read, the sandbox's port opened, then the
/// relay.
fn serve(
    shared: &Shared,
    target: &Target,
    mut client: &TcpStream,
    mut conn: ServerConnection,
) -> io::Result<()> {
    client.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut client)?;
    }
    let first = read_head(&mut conn, client)?;
    let token = token_of(&first);
    let mut upstream = match edge::open(shared, target, token.as_deref()) {
        Ok(up) => up,
        Err(refused) => {
            conn.writer().write_all(&encoded(refused))?;
            return close(&mut conn, client);
        }
    };
    upstream.write_all(&first)?;
    pump(&mut conn, client, &mut upstream)
}

/// Plaintext from the client until a request head is whole (the head and whatever followed
/// it in the same records).
fn read_head(conn: &mut ServerConnection, mut client: &TcpStream) -> io::Result<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        // The handshake may have read the request already.
        drain_plaintext(conn, &mut buf, &mut |bytes| {
            got.extend_from_slice(bytes);
            Ok(())
        })?;
        if memchr::memmem::find(&got, b"\r\n\r\n").is_some() {
            break;
        }
        if got.len() > MAX_HEAD {
            return Err(io::Error::other("the request head is too large"));
        }
        if conn.read_tls(&mut client)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        conn.process_new_packets().map_err(io::Error::other)?;
    }
    Ok(got)
}

/// `e2b-traffic-access-token` of the head that starts `bytes`.
fn token_of(bytes: &[u8]) -> Option<String> {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    req.parse(bytes).ok()?;
    req.headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("e2b-traffic-access-token"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .map(|v| v.trim().to_string())
}

/// Relays both ways until one side ends, fails or is silent for `UPSTREAM_IDLE`.
fn pump(
    conn: &mut ServerConnection,
    mut client: &TcpStream,
    upstream: &mut TcpStream,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut client_open = true;
    loop {
        while conn.wants_write() {
            conn.write_tls(&mut client)?;
        }
        let (from_client, from_upstream) = readable(client_open.then_some(client), upstream)?;
        if !from_client && !from_upstream {
            return Ok(());
        }
        if from_client {
            if conn.read_tls(&mut client)? == 0 {
                client_open = false;
                let _ = upstream.shutdown(std::net::Shutdown::Write);
            } else {
                let state = conn.process_new_packets().map_err(io::Error::other)?;
                drain_plaintext(conn, &mut buf, &mut |bytes| upstream.write_all(bytes))?;
                if state.peer_has_closed() {
                    client_open = false;
                    let _ = upstream.shutdown(std::net::Shutdown::Write);
                }
            }
        }
        if from_upstream {
            let n = match upstream.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return close(conn, client);
            }
            conn.writer().write_all(&buf[..n])?;
        }
    }
}

/// Hands every decrypted byte the session holds to `sink`.
fn drain_plaintext(
    conn: &mut ServerConnection,
    buf: &mut [u8],
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    loop {
        match conn.reader().read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => sink(&buf[..n])?,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Ends the session properly: the client sees the end of the answer, not a cut.
fn close(conn: &mut ServerConnection, mut client: &TcpStream) -> io::Result<()> {
    conn.send_close_notify();
    while conn.wants_write() {
        conn.write_tls(&mut client)?;
    }
    Ok(())
}

/// Which of the two has bytes (or its end) to read, waiting at most `UPSTREAM_IDLE`.
fn readable(client: Option<&TcpStream>, upstream: &TcpStream) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: client.map_or(-1, AsRawFd::as_raw_fd),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: upstream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = libc::c_int::try_from(UPSTREAM_IDLE.as_millis()).unwrap_or(libc::c_int::MAX);
    loop {
        // SAFETY: two valid pollfds for the duration of the call (a negative fd is skipped).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if n >= 0 {
            let ready =
                |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
            return Ok((ready(&fds[0]), ready(&fds[1])));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}
