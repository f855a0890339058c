//! A small blocking HTTP/1.1 server: one thread per connection, keep-alive, `Content-Length`
//! and chunked request bodies, and chunked responses flushed chunk by chunk.
//!
//! Why not tiny_http: its chunked response encoder buffers 8 KiB before writing, so a Connect
//! stream's `start` envelope would sit in a buffer while the SDK waits for it, and dropping a
//! response writes the terminating chunk, so a stream could not be cut the way a dropped
//! connection cuts it. A thread per connection also keeps every request on its own thread:
//! no shared worker pool that could leave a request unanswered.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sync::lock;

/// Longest request head (request line and headers) we read.
const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;
/// Largest request body we hold in memory (file uploads are the big ones).
pub(super) const MAX_BODY_BYTES: usize = 256 << 20;
/// How long a keep-alive connection may sit idle: envd's 640 s. Longer than HTTP clients'
/// pool idle timeouts (about 90 s), so the client, not us, closes idle connections, which
/// avoids the race where we close a connection the client is just reusing.
const IDLE_TIMEOUT: Duration = Duration::from_secs(640);
/// Bound on receiving the rest of a request once it started.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one write to a client. A stream whose client stops reading stalls for this long
/// before we give up on it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(300);
/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(200);
/// Pause after a failed accept (out of file descriptors, say).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// Connections served at once; more are answered 503 and closed.
const MAX_CONNECTIONS: usize = 1024;
/// After answering a request whose body we did not read, how long and how much of that body
/// we still swallow before closing, so the close does not reset the connection (and lose
/// the answer) while the client is still sending.
const UNREAD_LINGER: Duration = Duration::from_secs(2);
const UNREAD_LINGER_BYTES: usize = 1 << 20;

/// One parsed request, its body read in full.
pub(super) struct Request {
    pub method: String,
    /// The percent-decoded path, without the query.
    pub path: String,
    /// Query pairs in order, decoded (`+` is a space).
    pub query: Vec<(String, String)>,
    /// Header names are lowercase.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first header called `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
pub(super) enum Body {
    Empty,
    Bytes(Vec<u8>),
    /// Sent from the file with this length, never loaded whole.
    File(File, u64),
}

/// A complete (non-streamed) response.
#[derive(Debug)]
pub(super) struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Response {
    pub fn empty(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Body::Empty,
        }
    }

    pub fn bytes(status: u16, content_type: &str, body: Vec<u8>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: Body::Bytes(body),
        }
    }

    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response::bytes(status, "application/json", value.to_string().into_bytes())
    }

    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.to_string(), value.into()));
        self
    }
}

/// Answers one request on its connection: either `send` a whole response or `stream` one.
pub(super) struct Responder<'a> {
    stream: &'a TcpStream,
    sent: bool,
    /// The status sent, for the access log.
    status: u16,
    /// The connection cannot carry another request (a stream was cut, or the peer is gone).
    close: bool,
}

impl<'a> Responder<'a> {
    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn send(&mut self, resp: Response) -> io::Result<()> {
        self.sent = true;
        self.status = resp.status;
        let mut head = status_line(resp.status);
        for (k, v) in &resp.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        let len = match &resp.body {
            Body::Empty => 0,
            Body::Bytes(b) => b.len() as u64,
            Body::File(_, len) => *len,
        };
        // 1xx, 204 and 304 responses carry no body and no length.
        if resp.status >= 200 && resp.status != 204 && resp.status != 304 {
            head.push_str(&format!("Content-Length: {len}\r\n"));
        }
        head.push_str("\r\n");
        let mut w = self.stream;
        let written = match resp.body {
            Body::Empty => w.write_all(head.as_bytes()),
            Body::Bytes(b) => {
                let mut all = head.into_bytes();
                all.extend_from_slice(&b);
                w.write_all(&all)
            }
            Body::File(file, len) => w.write_all(head.as_bytes()).and_then(|()| {
                let copied = io::copy(&mut file.take(len), &mut w)?;
                if copied == len {
                    Ok(())
                } else {
                    // The file shrank under us: the promised length cannot be met.
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the file shrank while it was sent",
                    ))
                }
            }),
        };
        if written.is_err() {
            self.close = true;
        }
        written.and_then(|()| w.flush())
    }

    /// Starts a chunked response; every `ChunkedWriter::send` reaches the client at once.
    pub fn stream(
        &mut self,
        status: u16,
        headers: &[(&str, &str)],
    ) -> io::Result<ChunkedWriter<'_, 'a>> {
        self.sent = true;
        self.status = status;
        let mut head = status_line(status);
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("Transfer-Encoding: chunked\r\n\r\n");
        let mut w = self.stream;
        if let Err(e) = w.write_all(head.as_bytes()).and_then(|()| w.flush()) {
            self.close = true;
            return Err(e);
        }
        Ok(ChunkedWriter {
            responder: self,
            finished: false,
        })
    }
}

/// The body of a chunked response. Dropping it unfinished cuts the connection, as a crashed
/// or disconnected server would.
pub(super) struct ChunkedWriter<'r, 'a> {
    responder: &'r mut Responder<'a>,
    finished: bool,
}

impl ChunkedWriter<'_, '_> {
    /// Writes one chunk and flushes it (one write call, `TCP_NODELAY` is on).
    pub fn send(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mut chunk = format!("{:x}\r\n", data.len()).into_bytes();
        chunk.extend_from_slice(data);
        chunk.extend_from_slice(b"\r\n");
        let mut w = self.responder.stream;
        let r = w.write_all(&chunk).and_then(|()| w.flush());
        if r.is_err() {
            self.responder.close = true;
        }
        r
    }

    /// Ends the body properly; the connection may carry the next request.
    pub fn finish(mut self) -> io::Result<()> {
        self.finished = true;
        let mut w = self.responder.stream;
        let r = w.write_all(b"0\r\n\r\n").and_then(|()| w.flush());
        if r.is_err() {
            self.responder.close = true;
        }
        r
    }
}

impl Drop for ChunkedWriter<'_, '_> {
    fn drop(&mut self) {
        if !self.finished {
            self.responder.close = true;
            let _ = self.responder.stream.shutdown(Shutdown::Both);
        }
    }
}

fn status_line(status: u16) -> String {
    format!("HTTP/1.1 {status} {}\r\n", reason(status))
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        507 => "Insufficient Storage",
        _ => "Status",
    }
}

/// What serves the requests.
pub(super) trait Handler: Send + Sync + 'static {
    /// Sees a request once its head is read, before its body (`head.body` is empty). An
    /// answer here is sent at once and the body is never read (a request that carried one
    /// then ends its connection); `None` lets the request through to `handle`.
    fn admit(&self, _head: &Request) -> Option<Response> {
        None
    }

    fn handle(&self, req: Request, out: &mut Responder<'_>);
}

/// The listening side: owns the open connections so `stop` can cut them all.
pub(super) struct Server {
    stopping: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    live: AtomicUsize,
}

impl Server {
    pub fn new() -> Arc<Server> {
        Arc::new(Server {
            stopping: AtomicBool::new(false),
            conns: Mutex::default(),
            next_conn: AtomicU64::new(0),
            live: AtomicUsize::new(0),
        })
    }

    pub fn connections(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Stops accepting and cuts every open connection; their threads end at their next read
    /// or write.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for (_, conn) in lock(&self.conns).drain() {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Accepts connections until `stop`, one thread each.
    pub fn accept_loop(self: &Arc<Server>, listener: &TcpListener, handler: &Arc<dyn Handler>) {
        // Non-blocking, so a connection aborted between poll and accept cannot park this
        // thread in accept (and `stop` behind it).
        let _ = listener.set_nonblocking(true);
        while !self.is_stopping() {
            if !wait_readable(listener.as_raw_fd(), ACCEPT_POLL) {
                continue;
            }
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                // EMFILE and the like: the connection waits in the backlog; pause so the
                // loop does not spin while the condition lasts.
                Err(_) => {
                    std::thread::sleep(ACCEPT_ERROR_PAUSE);
                    continue;
                }
            };
            if stream.set_nonblocking(false).is_err() {
                continue;
            }
            if self.is_stopping() {
                break;
            }
            self.admit(stream, handler);
        }
    }

    fn admit(self: &Arc<Server>, stream: TcpStream, handler: &Arc<dyn Handler>) {
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        if self.live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            self.live.fetch_sub(1, Ordering::SeqCst);
            refuse(&stream, 503, "too many connections");
            return;
        }
        let id = self.next_conn.fetch_add(1, Ordering::SeqCst);
        let Ok(registered) = stream.try_clone() else {
            self.live.fetch_sub(1, Ordering::SeqCst);
            return;
        };
        lock(&self.conns).insert(id, registered);
        let server = Arc::clone(self);
        let handler = Arc::clone(handler);
        let guard = ConnGuard {
            server: Arc::clone(self),
            id,
        };
        let spawned = std::thread::Builder::new()
            .name(format!("emu-conn-{id}"))
            .spawn(move || {
                let _guard = guard;
                serve(&server, stream, handler.as_ref());
            });
        // The closure (and its guard) is dropped on failure, which unregisters the connection.
        drop(spawned);
    }
}

/// Unregisters a connection however its thread ends (even by a panic).
struct ConnGuard {
    server: Arc<Server>,
    id: u64,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Some(conn) = lock(&self.server.conns).remove(&self.id) {
            let _ = conn.shutdown(Shutdown::Both);
        }
        self.server.live.fetch_sub(1, Ordering::SeqCst);
    }
}

fn refuse(stream: &TcpStream, status: u16, message: &str) {
    let body = serde_json::json!({"code": status, "message": message}).to_string();
    let text = format!(
        "{}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        status_line(status),
        body.len()
    );
    let mut w = stream;
    let _ = w.write_all(text.as_bytes());
    let _ = stream.shutdown(Shutdown::Both);
}

/// Whether `fd` became readable within `timeout`.
fn wait_readable(fd: libc::c_int, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    n > 0
}

/// Why a request could not be read.
enum ReadError {
    /// The peer closed (or the connection was cut) between requests: nothing to answer.
    Closed,
    /// Answer this status, then close.
    Bad(u16, &'static str),
}

/// Reads requests off one connection and answers them until it closes.
fn serve(server: &Server, stream: TcpStream, handler: &dyn Handler) {
    let mut conn = ConnReader {
        stream: &stream,
        buf: Vec::new(),
    };
    loop {
        if server.is_stopping() {
            return;
        }
        let (mut req, keep_alive, framing) = match read_head(&mut conn) {
            Ok(r) => r,
            Err(ReadError::Closed) => return,
            Err(ReadError::Bad(status, message)) => {
                refuse(&stream, status, message);
                return;
            }
        };
        let mut out = Responder {
            stream: &stream,
            sent: false,
            status: 0,
            close: false,
        };
        if let Some(resp) = handler.admit(&req) {
            // An unread body would be taken for the next request: such a connection ends.
            let unread = framing.has_body();
            let resp = if unread || !keep_alive {
                resp.with_header("Connection", "close")
            } else {
                resp
            };
            let _ = out.send(resp);
            if unread {
                close_unread(&stream);
                return;
            }
            if out.close || !keep_alive {
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
            continue;
        }
        req.body = match read_body(&mut conn, framing) {
            Ok(body) => body,
            Err(ReadError::Closed) => return,
            Err(ReadError::Bad(status, message)) => {
                refuse(&stream, status, message);
                return;
            }
        };
        handler.handle(req, &mut out);
        if !out.sent {
            let resp = Response::json(
                500,
                &serde_json::json!({"code": 500, "message": "the emulator sent no response"}),
            );
            let _ = out.send(resp);
        }
        if out.close || !keep_alive {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Ends a connection after answering a request whose body was not read: our side first (the
/// client sees the answer, then end of stream), then a bounded drain of what the client is
/// still sending, so closing with unread bytes does not reset the connection under the
/// answer.
fn close_unread(stream: &TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(UNREAD_LINGER));
    let until = std::time::Instant::now() + UNREAD_LINGER;
    let mut chunk = [0u8; 16 * 1024];
    let mut drained = 0;
    let mut r = stream;
    while drained < UNREAD_LINGER_BYTES && std::time::Instant::now() < until {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => drained += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// A connection's read side with the bytes read past the current request.
struct ConnReader<'a> {
    stream: &'a TcpStream,
    buf: Vec<u8>,
}

impl ConnReader<'_> {
    /// Reads more bytes into `buf`; `Ok(0)` at end of stream.
    fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let mut r = self.stream;
        loop {
            match r.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes exactly `n` bytes.
    fn take(&mut self, n: usize) -> Result<Vec<u8>, ReadError> {
        while self.buf.len() < n {
            match self.fill() {
                Ok(0) | Err(_) => return Err(ReadError::Closed),
                Ok(_) => {}
            }
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    /// Takes one CRLF-terminated line (without the CRLF), bounded.
    fn line(&mut self, max: usize) -> Result<Vec<u8>, ReadError> {
        loop {
            if let Some(i) = memchr::memmem::find(&self.buf, b"\r\n") {
                let mut line = self.take(i + 2)?;
                line.truncate(i);
                return Ok(line);
            }
            if self.buf.len() > max {
                return Err(ReadError::Bad(400, "malformed chunked body"));
            }
            match self.fill() {
                Ok(0) | Err(_) => return Err(ReadError::Closed),
                Ok(_) => {}
            }
        }
    }
}

/// How a request's body is framed.
struct Framing {
    chunked: bool,
    /// `Content-Length` (0 without one); unused when chunked.
    length: usize,
    /// `Expect: 100-continue`: the client waits for our go-ahead before sending the body.
    expects_continue: bool,
}

impl Framing {
    fn has_body(&self) -> bool {
        self.chunked || self.length > 0
    }
}

/// Reads a request's head; the body is left on the connection for `read_body`.
fn read_head(conn: &mut ConnReader<'_>) -> Result<(Request, bool, Framing), ReadError> {
    let _ = conn.stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let head_len = loop {
        if let Some(i) = memchr::memmem::find(&conn.buf, b"\r\n\r\n") {
            break i + 4;
        }
        if conn.buf.len() > MAX_HEAD_BYTES {
            return Err(ReadError::Bad(431, "request head too large"));
        }
        match conn.fill() {
            Ok(0) | Err(_) => return Err(ReadError::Closed),
            Ok(_) => {}
        }
        let _ = conn.stream.set_read_timeout(Some(REQUEST_READ_TIMEOUT));
    };
    let _ = conn.stream.set_read_timeout(Some(REQUEST_READ_TIMEOUT));
    let head = conn.take(head_len)?;
    let mut raw_headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut raw_headers);
    match parsed.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) | Err(_) => {
            return Err(ReadError::Bad(400, "malformed request head"))
        }
    }
    let method = parsed.method.unwrap_or("").to_string();
    let target = parsed.path.unwrap_or("/").to_string();
    let version = parsed.version.unwrap_or(1);
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).trim().to_string(),
            )
        })
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let connection = header("connection").unwrap_or("").to_ascii_lowercase();
    let keep_alive = if version >= 1 {
        !connection.contains("close")
    } else {
        connection.contains("keep-alive")
    };
    let chunked =
        header("transfer-encoding").is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    let length = match header("content-length") {
        None => None,
        Some(v) => match v.parse::<usize>() {
            Ok(n) => Some(n),
            Err(_) => return Err(ReadError::Bad(400, "invalid Content-Length")),
        },
    };
    if chunked && length.is_some() {
        return Err(ReadError::Bad(
            400,
            "both Transfer-Encoding and Content-Length",
        ));
    }
    if length.is_some_and(|n| n > MAX_BODY_BYTES) {
        return Err(ReadError::Bad(413, "request body too large"));
    }
    let framing = Framing {
        chunked,
        length: length.unwrap_or(0),
        expects_continue: header("expect").is_some_and(|e| e.eq_ignore_ascii_case("100-continue")),
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, q),
        None => (target.as_str(), ""),
    };
    Ok((
        Request {
            method,
            path: percent_decode(path, false),
            query: parse_query(query),
            headers,
            body: Vec::new(),
        },
        keep_alive,
        framing,
    ))
}

/// Reads the body of an admitted request (saying `100 Continue` first when asked, only now
/// that the request is admitted).
fn read_body(conn: &mut ConnReader<'_>, framing: Framing) -> Result<Vec<u8>, ReadError> {
    if framing.expects_continue {
        let mut w = conn.stream;
        let _ = w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    if framing.chunked {
        read_chunked(conn)
    } else {
        conn.take(framing.length)
    }
}

fn read_chunked(conn: &mut ConnReader<'_>) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let line = conn.line(1024)?;
        let text = String::from_utf8_lossy(&line);
        let size_text = text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| ReadError::Bad(400, "malformed chunk size"))?;
        if size == 0 {
            // Trailers, then the empty line.
            loop {
                if conn.line(MAX_HEAD_BYTES)?.is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len().saturating_add(size) > MAX_BODY_BYTES {
            return Err(ReadError::Bad(413, "request body too large"));
        }
        body.extend_from_slice(&conn.take(size)?);
        if !conn.line(2)?.is_empty() {
            return Err(ReadError::Bad(400, "malformed chunked body"));
        }
    }
}

/// Decodes `%XX` escapes (and `+` as a space when `plus` is set); invalid escapes stay as
/// they are, and invalid UTF-8 becomes U+FFFD.
pub(super) fn percent_decode(s: &str, plus: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Like `percent_decode`, but an invalid escape is an error (Go's `url.QueryUnescape`).
pub(super) fn query_unescape_strict(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let h = hex(*bytes.get(i + 1)?)?;
                let l = hex(*bytes.get(i + 2)?)?;
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (percent_decode(k, true), percent_decode(v, true)),
            None => (percent_decode(pair, true), String::new()),
        })
        .collect()
}

/// Binds `addr`.
pub(super) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b+c", true), "a b c");
        assert_eq!(percent_decode("a%20b+c", false), "a b+c");
        assert_eq!(percent_decode("100%", true), "100%");
        assert_eq!(percent_decode("%4", true), "%4");
        assert_eq!(percent_decode("%zz", true), "%zz");
        assert_eq!(query_unescape_strict("a%3Db"), Some("a=b".into()));
        assert_eq!(query_unescape_strict("a%3"), None);
    }

    #[test]
    fn query_pairs() {
        let q = parse_query("path=%2Fhome%2Fuser%2Fa+b&x&y=");
        assert_eq!(
            q,
            vec![
                ("path".into(), "/home/user/a b".into()),
                ("x".into(), String::new()),
                ("y".into(), String::new()),
            ]
        );
    }
}
