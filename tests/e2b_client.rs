//! The E2B backend against a fake E2B: a small HTTP/1.1 server on loopback that answers each
//! request with a canned reply and records what it was sent. Streams are written in chunks cut
//! at awkward places, with pauses, to exercise the envelope reader.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use serde_json::{json, Value};
use wmo_e2b::sandbox::e2b::envelope::{encode, FLAG_END_STREAM};
use wmo_e2b::sandbox::e2b::error::{ApiStatus, RpcStatus};
use wmo_e2b::sandbox::e2b::{CreateRejected, E2bBackend, E2bConfig, E2bOptions, HOME};
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ErrorClass, Killed, Metadata, ProcessEvent, RunOpts, Sandbox,
    SandboxError, SpawnOpts,
};

use fake::{Part, Reply, Req, Server};

const WAIT: Duration = Duration::from_secs(10);
const MS: Duration = Duration::from_millis(1);

mod fake {
    //! The fake server. One thread per connection, one request per connection
    //! (`Connection: close`), so a stream that hangs never holds up another request.

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
}

// ---- helpers ------------------------------------------------------------------------------

fn config(server: &Server) -> E2bConfig {
    E2bConfig {
        api_key: "e2b_test_key".into(),
        domain: "e2b.test".into(),
        api_base: server.url.clone(),
        sandbox_url: Some(server.url.clone()),
    }
}

/// Options with test-sized waits: no real 1-3-9 s retries.
fn options() -> E2bOptions {
    E2bOptions {
        create_rate: 1000.0,
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        keepalive: Duration::from_secs(1),
        create_retry_delays: vec![MS; 3],
        kill_retry_delays: vec![MS; 2],
        ..E2bOptions::default()
    }
}

fn backend(server: &Server, options: E2bOptions) -> Arc<E2bBackend> {
    E2bBackend::new(config(server), options).unwrap()
}

fn created(id: &str) -> Value {
    json!({
        "sandboxID": id,
        "templateID": "tpl0base",
        "clientID": "6532622b",
        "envdVersion": "0.6.13",
        "envdAccessToken": format!("token-{id}"),
    })
}

fn spec() -> CreateSpec {
    let mut metadata = Metadata::new();
    metadata.insert("wmo-e2b.run".into(), "r1".into());
    CreateSpec {
        template: None,
        timeout_secs: 120,
        metadata,
        envs: vec![("A".into(), "1".into())],
        internet: false,
    }
}

/// A server whose v2 create works and whose other answers come from `rest`.
fn with_sandbox(rest: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Server {
    Server::start(move |req| {
        if req.is("POST", "/v2/sandboxes") {
            Reply::json(201, created("isb1"))
        } else {
            rest(req)
        }
    })
}

fn envelope(v: Value) -> Vec<u8> {
    encode(0, v.to_string().as_bytes())
}

fn end_of_stream(v: Value) -> Vec<u8> {
    encode(FLAG_END_STREAM, v.to_string().as_bytes())
}

fn start(pid: u32) -> Vec<u8> {
    envelope(json!({"event": {"start": {"pid": pid}}}))
}

fn stdout(text: &str) -> Vec<u8> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(text);
    envelope(json!({"event": {"data": {"stdout": b64}}}))
}

fn stderr(text: &str) -> Vec<u8> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(text);
    envelope(json!({"event": {"data": {"stderr": b64}}}))
}

fn keepalive() -> Vec<u8> {
    envelope(json!({"event": {"keepalive": {}}}))
}

fn end(v: Value) -> Vec<u8> {
    envelope(json!({"event": {"end": v}}))
}

/// Cuts `wire` into chunks of the given sizes (cycled), with a short pause after each, so
/// envelope headers and bodies straddle chunk and read boundaries.
fn cut(wire: Vec<u8>, sizes: &[usize]) -> Vec<Part> {
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

fn events_until_end(rx: &Receiver<ProcessEvent>) -> (Vec<u8>, Vec<u8>, ProcessEvent) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        match rx.recv_timeout(WAIT).expect("an event within the wait") {
            ProcessEvent::Stdout(b) => out.extend(b),
            ProcessEvent::Stderr(b) => err.extend(b),
            last => return (out, err, last),
        }
    }
}

fn source_of<T: std::error::Error + 'static>(e: &SandboxError) -> Option<&T> {
    std::error::Error::source(e).and_then(|s| s.downcast_ref::<T>())
}

// ---- control plane --------------------------------------------------------------------------

#[test]
fn create_sends_the_sdk_body_and_headers_on_v2() {
    let server = with_sandbox(|_| Reply::empty(500));
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    assert_eq!(sb.id(), "isb1");
    assert_eq!(sb.home(), HOME);
    assert_eq!(sb.envd_version(), Some("0.6.13"));
    assert_eq!(sb.envd_base(), server.url);

    let req = server.last("POST", "/v2/sandboxes");
    assert_eq!(req.header("x-api-key"), Some("e2b_test_key"));
    assert!(req.header("user-agent").unwrap().starts_with("wmo-e2b/"));
    assert!(req
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    let body = req.json();
    assert_eq!(body["templateID"], "base");
    assert_eq!(body["timeout"], 120);
    assert_eq!(body["metadata"], json!({"wmo-e2b.run": "r1"}));
    assert_eq!(body["envVars"], json!({"A": "1"}));
    assert_eq!(body["allow_internet_access"], false);
    assert!(
        body.get("secure").is_none(),
        "v2 sandboxes are always secure"
    );
    assert_eq!(b.counters().creates, 1);
    assert_eq!(b.live_sandboxes(), 1);
}

#[test]
fn create_falls_back_to_v1_once_v2_is_missing() {
    let server = Server::start(|req| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/v2/sandboxes") => Reply::json(404, json!({"code": 404, "message": "no route"})),
        ("POST", "/sandboxes") => Reply::json(201, created("isb2")),
        _ => Reply::empty(500),
    });
    let b = backend(&server, options());
    let custom = CreateSpec {
        template: Some("my-tpl".into()),
        ..spec()
    };
    assert_eq!(b.create_e2b(&custom).unwrap().id(), "isb2");
    let body = server.last("POST", "/sandboxes").json();
    assert_eq!(body["secure"], true);
    assert_eq!(body["templateID"], "my-tpl");
    b.create_e2b(&spec()).unwrap();
    assert_eq!(
        server.count("POST", "/v2/sandboxes"),
        1,
        "v2 is not tried again"
    );
    assert_eq!(server.count("POST", "/sandboxes"), 2);
}

#[test]
fn capacity_errors_are_retried_and_counted() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&attempts);
    let server = Server::start(move |_| match seen.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::json(429, json!({"code": 429, "message": "Rate limit exceeded"})),
        1 => Reply::json(
            503,
            json!({"code": 503, "message": "Failed to place sandbox: not enough capacity",
                   "error_code": "sandbox_capacity_unavailable"}),
        ),
        _ => Reply::json(201, created("isb3")),
    });
    let b = backend(&server, options());
    assert_eq!(b.create_e2b(&spec()).unwrap().id(), "isb3");
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let c = b.counters();
    assert_eq!((c.creates, c.create_retries), (1, 2));
}

#[test]
fn capacity_retries_stop_after_four_attempts() {
    let server = Server::start(|_| Reply::json(503, json!({"code": 503, "message": "busy"})));
    let b = backend(&server, options());
    let err = b.create_e2b(&spec()).err().unwrap();
    assert_eq!(err.class(), ErrorClass::Capacity);
    let status = source_of::<ApiStatus>(&err).expect("the answer is the source");
    assert_eq!(status.status, 503);
    assert_eq!(server.count("POST", "/v2/sandboxes"), 4);
    assert_eq!(b.counters().create_retries, 3);
    assert_eq!(b.live_sandboxes(), 0, "a failed create gives its slot back");
}

#[test]
fn other_create_errors_fail_at_once() {
    for (status, class) in [(400, ErrorClass::BadRequest), (401, ErrorClass::Auth)] {
        let server =
            Server::start(move |_| Reply::json(status, json!({"code": status, "message": "no"})));
        let b = backend(&server, options());
        let err = b.create_e2b(&spec()).err().unwrap();
        assert_eq!(err.class(), class);
        assert_eq!(server.count("POST", "/v2/sandboxes"), 1, "{status}");
    }
}

#[test]
fn the_rate_gate_refuses_fast_past_its_bound() {
    let server = with_sandbox(|_| Reply::empty(500));
    let b = backend(
        &server,
        E2bOptions {
            create_rate: 0.5,
            create_wait: Duration::from_secs(1),
            ..options()
        },
    );
    b.create_e2b(&spec()).unwrap();
    let started = Instant::now();
    let err = b.create_e2b(&spec()).err().unwrap();
    assert!(started.elapsed() < Duration::from_millis(500), "fails fast");
    assert_eq!(err.class(), ErrorClass::Capacity);
    assert!(matches!(
        source_of::<CreateRejected>(&err),
        Some(CreateRejected::RateWait { .. })
    ));
    assert_eq!(server.count("POST", "/v2/sandboxes"), 1, "not retried");
    assert_eq!(b.counters().create_rejections, 1);
}

#[test]
fn backends_of_one_account_share_the_rate_gate() {
    let server = with_sandbox(|_| Reply::empty(500));
    let slow = E2bOptions {
        create_rate: 0.5,
        create_wait: Duration::from_secs(1),
        ..options()
    };
    let first = backend(&server, slow.clone());
    let second = backend(&server, slow);
    first.create_e2b(&spec()).unwrap();
    let err = second.create_e2b(&spec()).err().unwrap();
    assert!(matches!(
        source_of::<CreateRejected>(&err),
        Some(CreateRejected::RateWait { .. })
    ));
}

#[test]
fn the_slot_cap_bounds_live_sandboxes_until_a_kill() {
    let server = with_sandbox(|req| {
        if req.method == "DELETE" {
            Reply::empty(204)
        } else {
            Reply::empty(500)
        }
    });
    let b = backend(
        &server,
        E2bOptions {
            max_sandboxes: 1,
            slot_wait: 50 * MS,
            ..options()
        },
    );
    let first = b.create_e2b(&spec()).unwrap();
    let err = b.create_e2b(&spec()).err().unwrap();
    assert_eq!(err.class(), ErrorClass::Capacity);
    assert!(matches!(
        source_of::<CreateRejected>(&err),
        Some(CreateRejected::NoSlot { max: 1, .. })
    ));
    assert_eq!(b.kill(first.id()).unwrap(), Killed::Now);
    assert_eq!(b.live_sandboxes(), 0);
    b.create_e2b(&spec()).unwrap();
}

#[test]
fn kill_reports_gone_and_retries_transient_errors() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&attempts);
    let server = Server::start(move |req| match req.path.as_str() {
        "/sandboxes/gone1" => Reply::json(404, json!({"code": 404, "message": "doesn't exist"})),
        "/sandboxes/flaky1" => match seen.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => Reply::json(503, json!({"code": 503, "message": "busy"})),
            _ => Reply::empty(204),
        },
        "/sandboxes/denied1" => Reply::json(401, json!({"code": 401, "message": "bad key"})),
        _ => Reply::json(500, json!({"code": 500, "message": "boom"})),
    });
    let b = backend(&server, options());
    assert_eq!(b.kill("gone1").unwrap(), Killed::AlreadyGone);
    assert_eq!(b.kill("flaky1").unwrap(), Killed::Now);
    assert_eq!(b.counters().kill_retries, 2);

    let err = b.kill("broken1").unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transport);
    assert_eq!(server.count("DELETE", "/sandboxes/broken1"), 3);
    let err = b.kill("denied1").unwrap_err();
    assert_eq!(err.class(), ErrorClass::Auth);
    assert_eq!(server.count("DELETE", "/sandboxes/denied1"), 1);
    let err = b.kill("a/b").unwrap_err();
    assert_eq!(err.class(), ErrorClass::BadRequest);
    assert_eq!(b.counters().kills, 2);
}

#[test]
fn list_follows_next_tokens_and_filters_by_metadata() {
    let server = Server::start(|req| {
        assert!(req.is("GET", "/v2/sandboxes"));
        let item = |id: &str| {
            json!({"sandboxID": id, "templateID": "tpl0", "alias": "base", "clientID": "x",
                   "metadata": {"pool": "eval"}, "startedAt": "2026-08-21T20:00:22.5Z",
                   "endAt": "2026-08-21T20:05:22Z", "state": "running", "cpuCount": 2,
                   "memoryMB": 512, "diskSizeMB": 1024, "envdVersion": "0.6.13"})
        };
        match req.query("nextToken") {
            None => Reply::json(200, json!([item("a1"), item("a2")]))
                .with_header("X-Next-Token", "tok/1="),
            Some("tok/1=") => Reply::json(200, json!([item("a2"), item("a3")])),
            Some(other) => panic!("unexpected token {other}"),
        }
    });
    let b = backend(&server, options());
    let mut filter = Metadata::new();
    filter.insert("pool".into(), "eval".into());
    filter.insert("slot".into(), "3".into());
    let got = b.list(&filter).unwrap();
    let ids: Vec<_> = got.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["a1", "a2", "a3"], "pages joined, overlap dropped");
    assert_eq!(got[0].template.as_deref(), Some("base"));
    assert_eq!(got[0].created, 1_787_342_422);
    assert_eq!(got[0].deadline, 1_787_342_722);
    assert_eq!(
        got[0].metadata.get("pool").map(String::as_str),
        Some("eval")
    );

    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    for req in &reqs {
        assert_eq!(req.query("metadata"), Some("pool=eval&slot=3"));
        assert_eq!(req.query("state"), Some("running"));
        assert_eq!(req.query("limit"), Some("100"));
        assert_eq!(req.header("x-api-key"), Some("e2b_test_key"));
    }
}

#[test]
fn connect_falls_back_to_v1_and_404_means_gone() {
    let server = Server::start(|req| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/sandboxes/live1/connect") => {
            assert_eq!(req.json()["timeout"], 300);
            Reply::json(200, created("live1"))
        }
        _ => Reply::json(404, json!({"code": 404, "message": "not found"})),
    });
    let b = backend(&server, options());
    assert_eq!(b.connect("live1").unwrap().id(), "live1");
    assert_eq!(server.count("POST", "/v2/sandboxes/live1/connect"), 1);
    let err = b.connect("dead1").err().unwrap();
    assert!(
        matches!(err, SandboxError::Gone { ref id } if id == "dead1"),
        "{err:?}"
    );
}

#[test]
fn timeout_network_and_info_reach_the_control_plane() {
    let server = with_sandbox(|req| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/sandboxes/isb1/timeout") | ("PUT", "/sandboxes/isb1/network") => {
            Reply::empty(204)
        }
        ("GET", "/sandboxes/isb1") => Reply::json(
            200,
            json!({"sandboxID": "isb1", "templateID": "tpl0", "clientID": "x",
                   "startedAt": "1970-01-01T00:00:10Z", "endAt": "1970-01-01T00:01:10Z",
                   "state": "running", "envdVersion": "0.6.13", "cpuCount": 2,
                   "memoryMB": 512, "diskSizeMB": 1024}),
        ),
        _ => Reply::json(404, json!({"code": 404, "message": "Sandbox not found"})),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    sb.set_timeout(600).unwrap();
    assert_eq!(
        server.last("POST", "/sandboxes/isb1/timeout").json(),
        json!({"timeout": 600})
    );
    sb.set_internet(true).unwrap();
    assert_eq!(
        server.last("PUT", "/sandboxes/isb1/network").json(),
        json!({"allow_internet_access": true})
    );
    let info = b.info("isb1").unwrap();
    assert_eq!(
        (info.started, info.end, info.state.as_str()),
        (10, 70, "running")
    );
    let err = b.info("other1").unwrap_err();
    assert!(matches!(err, SandboxError::Gone { .. }));
}

// ---- envd: processes ------------------------------------------------------------------------

#[test]
fn run_reads_a_stream_cut_at_awkward_places() {
    let mut wire = start(412);
    wire.extend(stdout("hi\n"));
    wire.extend(keepalive());
    wire.extend(stderr("warn\n"));
    wire.extend(stdout("there\n"));
    wire.extend(end(
        json!({"exitCode": 3, "exited": true, "status": "exit status 3"}),
    ));
    wire.extend(end_of_stream(json!({})));
    let server = with_sandbox(move |req| {
        assert!(req.is("POST", "/process.Process/Start"));
        Reply::stream(cut(wire.clone(), &[1, 3, 7, 2, 11]))
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let out = sb
        .run(
            "echo hi",
            &RunOpts {
                envs: vec![("X".into(), "1".into()), ("X".into(), "2".into())],
                timeout: Duration::from_secs(7),
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert_eq!(out.exit_code, Some(3), "a non-zero exit is a result");
    assert!(!out.timed_out);
    assert_eq!(out.stdout.to_text(), "hi\nthere\n");
    assert_eq!(out.stderr.to_text(), "warn\n");

    let req = server.last("POST", "/process.Process/Start");
    assert_eq!(req.header("content-type"), Some("application/connect+json"));
    assert_eq!(req.header("connect-protocol-version"), Some("1"));
    assert_eq!(req.header("keepalive-ping-interval"), Some("1"));
    assert_eq!(req.header("connect-timeout-ms"), Some("7000"));
    assert_eq!(req.header("e2b-sandbox-id"), Some("isb1"));
    assert_eq!(req.header("e2b-sandbox-port"), Some("49983"));
    assert_eq!(req.header("x-access-token"), Some("token-isb1"));
    assert!(req.header("user-agent").unwrap().starts_with("wmo-e2b/"));
    assert_eq!(
        req.envelope_json(),
        json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
                           "cwd": HOME, "envs": {"X": "2"}},
               "stdin": false})
    );
}

#[test]
fn run_bounds_output_and_reports_envd_timeouts() {
    let big = "x".repeat(5000);
    let mut wire = start(9);
    wire.extend(stdout(&big));
    wire.extend(end_of_stream(
        json!({"error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}}),
    ));
    let server = with_sandbox(move |req| {
        if req.path == "/process.Process/SendSignal" {
            return Reply::json(404, json!({"code": "not_found", "message": "gone"}));
        }
        Reply::stream(cut(wire.clone(), &[4096]))
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let out = sb
        .run(
            "sleep 100",
            &RunOpts {
                max_output: 100,
                timeout: Duration::from_secs(1),
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert!(out.timed_out);
    assert_eq!(out.exit_code, None);
    assert_eq!(out.stdout.head.len() + out.stdout.tail.len(), 100);
    assert_eq!(out.stdout.dropped, 4900);
}

#[test]
fn run_start_errors_are_classified_by_code() {
    let server = with_sandbox(|_| {
        Reply::stream(vec![Part::Bytes(end_of_stream(
            json!({"error": {"code": "invalid_argument", "message": "cwd '/nope' does not exist"}}),
        ))])
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let err = sb
        .run(
            "true",
            &RunOpts {
                cwd: Some("/nope".into()),
                ..RunOpts::default()
            },
        )
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::BadRequest);
    let status = source_of::<RpcStatus>(&err).unwrap();
    assert!(status.message.contains("/nope"));
}

#[test]
fn spawn_streams_events_without_a_process_deadline() {
    let mut wire = start(77);
    wire.extend(stdout("ready\n"));
    wire.extend(keepalive());
    wire.extend(stderr("log\n"));
    wire.extend(end(json!({"exitCode": -1, "status": "signal: killed"})));
    wire.extend(end_of_stream(json!({})));
    let server = with_sandbox(move |_| Reply::stream(cut(wire.clone(), &[2, 5])));
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb
        .spawn(
            "node runner.mjs",
            &SpawnOpts {
                cwd: Some("/home/user/run".into()),
                envs: Vec::new(),
                stdin: true,
                ..SpawnOpts::default()
            },
        )
        .unwrap();
    assert_eq!(p.pid, 77);
    let (out, err, last) = events_until_end(&p.events);
    assert_eq!(out, b"ready\n");
    assert_eq!(err, b"log\n");
    assert!(matches!(last, ProcessEvent::Exit(None)), "{last:?}");
    assert!(
        p.events.recv_timeout(WAIT).is_err(),
        "nothing after the exit"
    );

    let req = server.last("POST", "/process.Process/Start");
    assert_eq!(
        req.header("connect-timeout-ms"),
        None,
        "long-lived processes are not killed"
    );
    let body = req.envelope_json();
    assert_eq!(body["stdin"], true);
    assert_eq!(body["process"]["cwd"], "/home/user/run");
    assert!(body["process"].get("envs").is_none());
}

#[test]
fn streams_outlive_the_request_timeout() {
    let server = with_sandbox(|_| {
        let mut parts = vec![Part::Bytes(start(12))];
        for _ in 0..5 {
            parts.push(Part::Pause(500 * MS));
            parts.push(Part::Bytes(keepalive()));
        }
        let mut tail = stdout("late\n");
        tail.extend(end(json!({"exited": true})));
        tail.extend(end_of_stream(json!({})));
        parts.push(Part::Bytes(tail));
        Reply::stream(parts)
    });
    let b = backend(
        &server,
        E2bOptions {
            request_timeout: Duration::from_secs(1),
            ..options()
        },
    );
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.spawn("server", &SpawnOpts::default()).unwrap();
    let (out, _, last) = events_until_end(&p.events);
    assert_eq!(out, b"late\n");
    assert!(matches!(last, ProcessEvent::Exit(Some(0))), "{last:?}");
}

#[test]
fn a_stream_error_after_start_fails_the_process() {
    let mut wire = start(5);
    wire.extend(stdout("partial"));
    wire.extend(end_of_stream(
        json!({"error": {"code": "unavailable", "message": "envd is going away"}}),
    ));
    let server = with_sandbox(move |_| Reply::stream(cut(wire.clone(), &[3])));
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.spawn("x", &SpawnOpts::default()).unwrap();
    let (out, _, last) = events_until_end(&p.events);
    assert_eq!(out, b"partial");
    let ProcessEvent::Failed(e) = last else {
        panic!("expected a failure, got {last:?}")
    };
    assert_eq!(e.class(), ErrorClass::Transport);
}

#[test]
fn a_cut_stream_fails_the_process() {
    let mut wire = start(5);
    wire.extend(stdout("partial"));
    let mut cut_short = end(json!({}));
    cut_short.truncate(4);
    wire.extend(cut_short);
    let server = with_sandbox(move |_| Reply::stream(vec![Part::Bytes(wire.clone())]));
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.spawn("x", &SpawnOpts::default()).unwrap();
    let (_, _, last) = events_until_end(&p.events);
    assert!(
        matches!(last, ProcessEvent::Failed(ref e) if e.class() == ErrorClass::Transport),
        "{last:?}"
    );
}

#[test]
fn a_stream_cut_by_a_dead_sandbox_is_gone() {
    let server = with_sandbox(|req| {
        if req.path == "/health" {
            return Reply::json(
                502,
                json!({"code": 502, "message": "The sandbox was not found", "sandboxId": "isb1"}),
            );
        }
        let mut wire = start(5);
        wire.extend(stdout("partial"));
        wire.extend(&stdout("more")[..6]);
        Reply::stream(vec![Part::Bytes(wire)])
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.spawn("x", &SpawnOpts::default()).unwrap();
    let (_, _, last) = events_until_end(&p.events);
    assert!(
        matches!(last, ProcessEvent::Failed(SandboxError::Gone { ref id }) if id == "isb1"),
        "{last:?}"
    );
    let err = sb.run("x", &RunOpts::default()).unwrap_err();
    assert!(matches!(err, SandboxError::Gone { .. }), "{err:?}");
}

#[test]
fn a_silent_stream_is_a_transport_error_not_a_hang() {
    let server = with_sandbox(|req| {
        if req.path == "/health" {
            return Reply::empty(204);
        }
        Reply::stream(vec![
            Part::Bytes(start(6)),
            Part::Bytes(stdout("one")),
            Part::Hold(Duration::from_secs(30)),
        ])
    });
    // Keepalive 1 s: silence past 3 s fails the stream.
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let started = Instant::now();
    let p = sb.spawn("sleep 1000", &SpawnOpts::default()).unwrap();
    let (out, _, last) = events_until_end(&p.events);
    let waited = started.elapsed();
    assert_eq!(out, b"one");
    let ProcessEvent::Failed(e) = last else {
        panic!("expected a failure, got {last:?}")
    };
    assert_eq!(e.class(), ErrorClass::Transport);
    assert!(e.to_string().contains("sent nothing for"), "{e}");
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
}

#[test]
fn connect_reattaches_and_not_found_means_no_such_process() {
    let server = with_sandbox(|req| {
        let pid = req.envelope_json()["process"]["pid"].as_u64().unwrap();
        if pid == 8 {
            let mut wire = start(8);
            wire.extend(stdout("later\n"));
            wire.extend(end(json!({"exited": true})));
            wire.extend(end_of_stream(json!({})));
            Reply::stream(vec![Part::Bytes(wire)])
        } else {
            Reply::stream(vec![Part::Bytes(end_of_stream(
                json!({"error": {"code": "not_found", "message": "process with pid 9 not found"}}),
            ))])
        }
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    let p = sb.connect(8).unwrap();
    let (out, _, last) = events_until_end(&p.events);
    assert_eq!(out, b"later\n");
    assert!(matches!(last, ProcessEvent::Exit(Some(0))));
    assert_eq!(
        server
            .last("POST", "/process.Process/Connect")
            .header("connect-timeout-ms"),
        None
    );
    let err = sb.connect(9).err().unwrap();
    assert!(
        matches!(err, SandboxError::NoSuchProcess { pid: 9, .. }),
        "{err:?}"
    );
}

#[test]
fn stdin_signals_and_process_lists_are_unary_calls() {
    let server = with_sandbox(|req| {
        let body = req.json();
        let pid = body["process"]["pid"].as_u64();
        match (req.path.as_str(), pid) {
            (_, Some(404)) => Reply::json(
                404,
                json!({"code": "not_found", "message": "process with pid 404 not found"}),
            ),
            ("/process.Process/SendInput", _) => {
                assert_eq!(body["input"]["stdin"], "aGVsbG8K");
                Reply::json(200, json!({}))
            }
            ("/process.Process/CloseStdin", _) => Reply::json(200, json!({})),
            ("/process.Process/SendSignal", _) => {
                assert_eq!(body["signal"], "SIGNAL_SIGKILL");
                Reply::json(200, json!({}))
            }
            ("/process.Process/List", None) => Reply::json(
                200,
                json!({"processes": [{"pid": 3, "config": {"cmd": "/bin/bash",
                                                            "args": ["-l", "-c", "cat"]}}]}),
            ),
            _ => Reply::json(500, json!({"code": "internal", "message": "?"})),
        }
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    sb.send_stdin(3, b"hello\n").unwrap();
    let req = server.last("POST", "/process.Process/SendInput");
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(req.header("connect-protocol-version"), Some("1"));
    assert_eq!(req.header("x-access-token"), Some("token-isb1"));
    sb.close_stdin(3).unwrap();
    sb.kill_process(3).unwrap();
    let procs = sb.processes().unwrap();
    assert_eq!((procs[0].pid, procs[0].cmd.as_str()), (3, "cat"));
    for err in [
        sb.send_stdin(404, b"x").unwrap_err(),
        sb.close_stdin(404).unwrap_err(),
        sb.kill_process(404).unwrap_err(),
    ] {
        assert!(
            matches!(err, SandboxError::NoSuchProcess { pid: 404, .. }),
            "{err:?}"
        );
    }
}

// ---- envd: files and health -----------------------------------------------------------------

#[test]
fn files_are_read_and_written_raw() {
    let server = with_sandbox(|req| match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/files") => match req.query("path") {
            Some("/home/user/a b.txt") => Reply::bytes(200, b"\x00bytes\xff"),
            Some("/home/user/dir") => Reply::json(
                400,
                json!({"code": 400, "message": "path '/home/user/dir' is a directory"}),
            ),
            _ => Reply::json(404, json!({"code": 404, "message": "does not exist"})),
        },
        ("POST", "/files") => Reply::json(
            200,
            json!([{"path": req.query("path"), "name": "x", "type": "file"}]),
        ),
        ("GET", "/health") => Reply::empty(204),
        ("POST", "/filesystem.Filesystem/MakeDir") => match req.json()["path"].as_str() {
            Some("/home/user/new") => Reply::json(
                200,
                json!({"entry": {"name": "new", "type": "FILE_TYPE_DIRECTORY"}}),
            ),
            _ => Reply::json(
                409,
                json!({"code": "already_exists", "message": "directory already exists"}),
            ),
        },
        _ => Reply::empty(500),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    assert_eq!(
        sb.read_file("/home/user/a b.txt").unwrap(),
        b"\x00bytes\xff"
    );
    let get = server.last("GET", "/files");
    assert_eq!(get.header("e2b-sandbox-id"), Some("isb1"));
    assert_eq!(get.header("accept-encoding"), Some("identity"));

    let err = sb.read_file("/home/user/missing").unwrap_err();
    assert!(matches!(err, SandboxError::NotFound { ref path } if path == "/home/user/missing"));
    assert_eq!(err.class(), ErrorClass::BadRequest);
    assert_eq!(
        sb.read_file("/home/user/dir").unwrap_err().class(),
        ErrorClass::BadRequest
    );
    assert!(matches!(
        sb.read_file("rel").unwrap_err(),
        SandboxError::BadPath { .. }
    ));

    sb.write_file("/home/user/deep/new+file", b"payload\n")
        .unwrap();
    let post = server.last("POST", "/files");
    assert_eq!(post.query("path"), Some("/home/user/deep/new+file"));
    assert_eq!(
        post.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(post.header("x-access-token"), Some("token-isb1"));
    assert_eq!(post.body, b"payload\n");

    assert!(sb.health().unwrap());
    assert!(sb.make_dir("/home/user/new").unwrap());
    assert!(
        !sb.make_dir("/home/user/old").unwrap(),
        "an existing directory is fine"
    );
}

#[test]
fn old_envd_gets_multipart_uploads() {
    let server = Server::start(|req| match req.path.as_str() {
        "/v2/sandboxes" => Reply::json(
            201,
            json!({"sandboxID": "old1", "templateID": "t", "clientID": "c", "envdVersion": "0.5.6"}),
        ),
        "/files" => Reply::json(200, json!([{"path": "/p", "name": "p", "type": "file"}])),
        _ => Reply::empty(500),
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    sb.write_file("/home/user/p", b"abc").unwrap();
    let post = server.last("POST", "/files");
    assert!(post
        .header("content-type")
        .unwrap()
        .starts_with("multipart/form-data; boundary="));
    let text = String::from_utf8(post.body.clone()).unwrap();
    assert!(text.contains("filename=\"/home/user/p\""));
    assert!(text.contains("\r\n\r\nabc\r\n"));
    assert_eq!(post.header("x-access-token"), None, "no token was issued");
}

#[test]
fn an_edge_proxy_502_means_the_sandbox_is_gone() {
    let server = with_sandbox(|req| {
        if req.path == "/health" || req.path == "/files" {
            Reply::json(
                502,
                json!({"code": 502, "message": "The sandbox was not found", "sandboxId": "isb1"}),
            )
        } else {
            Reply::json(
                502,
                json!({"code": 502, "message": "The sandbox is running but port is not open",
                       "port": 49983}),
            )
        }
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    assert!(!sb.health().unwrap());
    let err = sb.read_file("/home/user/x").unwrap_err();
    assert!(
        matches!(err, SandboxError::Gone { ref id } if id == "isb1"),
        "{err:?}"
    );
    let err = sb.processes().unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transport, "{err:?}");
}

#[test]
fn envd_auth_failures_are_auth_errors() {
    let server = with_sandbox(|_| {
        Reply::json(
            401,
            json!({"code": 401, "message": "unauthorized access, please provide a valid access token"}),
        )
    });
    let b = backend(&server, options());
    let sb = b.create_e2b(&spec()).unwrap();
    assert_eq!(sb.processes().unwrap_err().class(), ErrorClass::Auth);
    assert_eq!(
        sb.spawn("x", &SpawnOpts::default()).err().unwrap().class(),
        ErrorClass::Auth
    );
}

#[test]
fn an_unreachable_server_is_a_transport_error() {
    // Bind and drop, so the port is (almost certainly) closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = E2bConfig {
        api_key: "k".into(),
        domain: "e2b.test".into(),
        api_base: format!("http://127.0.0.1:{port}"),
        sandbox_url: None,
    };
    let b = E2bBackend::new(config, options()).unwrap();
    let err = b.create_e2b(&spec()).err().unwrap();
    assert_eq!(err.class(), ErrorClass::Transport);
    assert_eq!(b.live_sandboxes(), 0);
}

#[test]
fn a_missing_key_names_the_variable() {
    let err = E2bConfig::from_lookup(|_| None).unwrap_err();
    assert!(err.to_string().contains("E2B_API_KEY"));
    let as_sandbox_error: SandboxError = err.into();
    assert_eq!(as_sandbox_error.class(), ErrorClass::Auth);
}
