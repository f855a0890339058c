//! A fake E2B for the E2B backend's tests: a small HTTP/1.1 server on loopback that answers
//! each request with a canned reply and records what it was sent, and the helpers that build
//! those replies. Streams are written in chunks cut at awkward places, with pauses, to
//! exercise the envelope reader.
//!
//! One thread per connection, one request per connection (`Connection: close`), so a stream
//! that hangs never holds up another request.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use wmo_e2b::sandbox::e2b::envelope;

#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    /// Percent-decoded once, as a server's query parser would.
    pub query: Vec<(String, String)>,
    /// Names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Req {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON request body")
    }

    /// The JSON inside a streaming request's single envelope.
    pub fn envelope_json(&self) -> Value {
        let mut body = &self.body[..];
        let e = envelope::read_envelope(&mut body, envelope::MAX_MESSAGE)
            .unwrap()
            .expect("one envelope");
        assert_eq!(e.flags, 0);
        assert!(body.is_empty(), "exactly one envelope");
        serde_json::from_slice(&e.payload).unwrap()
    }

    pub fn is(&self, method: &str, path: &str) -> bool {
        self.method == method && self.path == path
    }
}

pub enum Part {
    Bytes(Vec<u8>),
    Pause(Duration),
    /// Keep the connection open, sending nothing, for this long; then drop it.
    Hold(Duration),
}

pub enum Body {
    Full(Vec<u8>),
    Chunked(Vec<Part>),
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Reply {
    pub fn json(status: u16, v: Value) -> Reply {
        Reply {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: Body::Full(v.to_string().into_bytes()),
        }
    }

    pub fn empty(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Body::Full(Vec::new()),
        }
    }

    pub fn bytes(status: u16, data: &[u8]) -> Reply {
        Reply {
            status,
            headers: vec![("Content-Type".into(), "application/octet-stream".into())],
            body: Body::Full(data.to_vec()),
        }
    }

    /// A Connect stream answer, sent chunk by chunk.
    pub fn stream(parts: Vec<Part>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("Content-Type".into(), "application/connect+json".into())],
            body: Body::Chunked(parts),
        }
    }

    pub fn with_header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.into(), v.into()));
        self
    }
}

type Handler = dyn Fn(&Req) -> Reply + Send + Sync;

pub struct Server {
    pub url: String,
    log: Arc<Mutex<Vec<Req>>>,
}

impl Server {
    pub fn start(handler: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let accept_log = Arc::clone(&log);
        // The accept loop ends with the test process.
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let handler = Arc::clone(&handler);
                let log = Arc::clone(&accept_log);
                std::thread::spawn(move || serve(conn, &*handler, &log));
            }
        });
        Server { url, log }
    }

    pub fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }

    pub fn count(&self, method: &str, path: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.is(method, path))
            .count()
    }

    pub fn last(&self, method: &str, path: &str) -> Req {
        self.requests()
            .into_iter()
            .rev()
            .find(|r| r.is(method, path))
            .unwrap_or_else(|| panic!("no {method} {path} request"))
    }
}

fn serve(conn: TcpStream, handler: &Handler, log: &Mutex<Vec<Req>>) {
    let Some(req) = read_request(&conn) else {
        return;
    };
    log.lock().unwrap().push(req.clone());
    let reply = handler(&req);
    let _ = write_reply(conn, reply);
}

fn read_request(conn: &TcpStream) -> Option<Req> {
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut words = line.split_whitespace();
    let method = words.next()?.to_string();
    let target = words.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    Some(Req {
        method,
        path: path.to_string(),
        query,
        headers,
        body,
    })
}

pub fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn write_reply(mut conn: TcpStream, reply: Reply) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} Fake\r\nConnection: close\r\n", reply.status);
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match reply.body {
        Body::Full(data) => {
            head.push_str(&format!("Content-Length: {}\r\n\r\n", data.len()));
            conn.write_all(head.as_bytes())?;
            conn.write_all(&data)?;
        }
        Body::Chunked(parts) => {
            head.push_str("Transfer-Encoding: chunked\r\n\r\n");
            conn.write_all(head.as_bytes())?;
            conn.flush()?;
            for part in parts {
                match part {
                    Part::Bytes(data) => {
                        conn.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
                        conn.write_all(&data)?;
                        conn.write_all(b"\r\n")?;
                        conn.flush()?;
                    }
                    Part::Pause(d) => std::thread::sleep(d),
                    Part::Hold(d) => {
                        std::thread::sleep(d);
                        return Ok(());
                    }
                }
            }
            conn.write_all(b"0\r\n\r\n")?;
        }
    }
    conn.flush()
}

// ---- replies and the backend under test ------------------------------------------------------

use crossbeam_channel::Receiver;
use serde_json::json;
use wmo_e2b::sandbox::e2b::envelope::{encode, FLAG_END_STREAM};
use wmo_e2b::sandbox::e2b::{E2bBackend, E2bConfig, E2bOptions, RetryPolicy};
use wmo_e2b::sandbox::{CreateSpec, Metadata, ProcessEvent, SandboxError};

pub const WAIT: std::time::Duration = std::time::Duration::from_secs(10);
pub const MS: std::time::Duration = std::time::Duration::from_millis(1);

pub fn config(server: &Server) -> E2bConfig {
    E2bConfig {
        api_key: "e2b_test_key".into(),
        domain: "e2b.test".into(),
        api_base: server.url.clone(),
        sandbox_url: Some(server.url.clone()),
    }
}

/// Options with test-sized waits: no real 1-3-9 s retries.
pub fn options() -> E2bOptions {
    E2bOptions {
        create_rate: 1000.0,
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        keepalive: Duration::from_secs(1),
        retry: RetryPolicy {
            base: MS,
            cap: MS,
            ..RetryPolicy::default()
        },
        ..E2bOptions::default()
    }
}

pub fn backend(server: &Server, options: E2bOptions) -> Arc<E2bBackend> {
    E2bBackend::new(config(server), options).unwrap()
}

pub fn created(id: &str) -> Value {
    json!({
        "sandboxID": id,
        "templateID": "tpl0base",
        "clientID": "6532622b",
        "envdVersion": "0.6.13",
        "envdAccessToken": format!("token-{id}"),
    })
}

pub fn spec() -> CreateSpec {
    let mut metadata = Metadata::new();
    metadata.insert("wmo-e2b.run".into(), "r1".into());
    CreateSpec {
        template: None,
        timeout_secs: 120,
        metadata,
        envs: vec![("A".into(), "1".into())],
        internet: false,
        on_timeout: wmo_e2b::sandbox::OnTimeout::Kill,
        limits: Default::default(),
        network: Default::default(),
        image: None,
    }
}

/// A server whose v2 create works and whose other answers come from `rest`.
pub fn with_sandbox(rest: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Server {
    Server::start(move |req| {
        if req.is("POST", "/v2/sandboxes") {
            Reply::json(201, created("isb1"))
        } else {
            rest(req)
        }
    })
}

pub fn envelope(v: Value) -> Vec<u8> {
    encode(0, v.to_string().as_bytes())
}

pub fn end_of_stream(v: Value) -> Vec<u8> {
    encode(FLAG_END_STREAM, v.to_string().as_bytes())
}

pub fn start(pid: u32) -> Vec<u8> {
    envelope(json!({"event": {"start": {"pid": pid}}}))
}

pub fn stdout(text: &str) -> Vec<u8> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(text);
    envelope(json!({"event": {"data": {"stdout": b64}}}))
}

pub fn stderr(text: &str) -> Vec<u8> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(text);
    envelope(json!({"event": {"data": {"stderr": b64}}}))
}

pub fn keepalive() -> Vec<u8> {
    envelope(json!({"event": {"keepalive": {}}}))
}

pub fn end(v: Value) -> Vec<u8> {
    envelope(json!({"event": {"end": v}}))
}

/// Cuts `wire` into chunks of the given sizes (cycled), with a short pause after each, so
/// envelope headers and bodies straddle chunk and read boundaries.
pub fn cut(wire: Vec<u8>, sizes: &[usize]) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at >= wire.len() {
            break;
        }
        let to = (at + size).min(wire.len());
        parts.push(Part::Bytes(wire[at..to].to_vec()));
        parts.push(Part::Pause(MS));
        at = to;
    }
    parts
}

pub fn events_until_end(rx: &Receiver<ProcessEvent>) -> (Vec<u8>, Vec<u8>, ProcessEvent) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        match rx.recv_timeout(WAIT).expect("an event within the wait") {
            ProcessEvent::Stdout(b) => out.extend(b),
            ProcessEvent::Stderr(b) => err.extend(b),
            last => return (out, err, last),
        }
    }
}

pub fn source_of<T: std::error::Error + 'static>(e: &SandboxError) -> Option<&T> {
    std::error::Error::source(e).and_then(|s| s.downcast_ref::<T>())
}
