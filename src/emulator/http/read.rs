//! Reading requests off a connection: the head (bounded, parsed with httparse), then the body
//! (`Content-Length` or chunked, bounded) once the request is admitted.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::message::Request;
use super::query::{parse_query, percent_decode};

/// Longest request head (request line and headers) we read.
const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;
/// Largest request body we hold in memory (file uploads are the big ones).
pub(in crate::emulator) const MAX_BODY_BYTES: usize = 256 << 20;
/// How long a keep-alive connection may sit idle: envd's 640 s. Longer than HTTP clients'
/// pool idle timeouts (about 90 s), so the client, not us, closes idle connections, which
/// avoids the race where we close a connection the client is just reusing.
const IDLE_TIMEOUT: Duration = Duration::from_secs(640);
/// Bound on receiving the rest of a request once it started.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a request could not be read.
pub(super) enum ReadError {
    /// The peer closed (or the connection was cut) between requests: nothing to answer.
    Closed,
    /// Answer this status, then close.
    Bad(u16, &'static str),
}

/// A connection's read side with the bytes read past the current request.
pub(super) struct ConnReader<'a> {
    stream: &'a TcpStream,
    buf: Vec<u8>,
}

impl<'a> ConnReader<'a> {
    pub fn new(stream: &'a TcpStream) -> ConnReader<'a> {
        ConnReader {
            stream,
            buf: Vec::new(),
        }
    }

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

    /// Reads more bytes into `buf`; a request cut short is `Closed`.
    fn more(&mut self) -> Result<(), ReadError> {
        match self.fill() {
            Ok(0) | Err(_) => Err(ReadError::Closed),
            Ok(_) => Ok(()),
        }
    }

    /// Takes exactly `n` bytes.
    fn take(&mut self, n: usize) -> Result<Vec<u8>, ReadError> {
        while self.buf.len() < n {
            self.more()?;
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
            self.more()?;
        }
    }
}

/// How a request's body is framed.
pub(super) struct Framing {
    chunked: bool,
    /// `Content-Length` (0 without one); unused when chunked.
    length: usize,
    /// `Expect: 100-continue`: the client waits for our go-ahead before sending the body.
    expects_continue: bool,
}

impl Framing {
    pub fn has_body(&self) -> bool {
        self.chunked || self.length > 0
    }
}

/// Reads a request's head; the body is left on the connection for `read_body`. Also says
/// whether the connection may carry another request.
pub(super) fn read_head(conn: &mut ConnReader<'_>) -> Result<(Request, bool, Framing), ReadError> {
    let _ = conn.stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let head_len = loop {
        if let Some(i) = memchr::memmem::find(&conn.buf, b"\r\n\r\n") {
            break i + 4;
        }
        if conn.buf.len() > MAX_HEAD_BYTES {
            return Err(ReadError::Bad(431, "request head too large"));
        }
        conn.more()?;
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
    let target = parsed.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let req = Request {
        method: parsed.method.unwrap_or("").to_string(),
        target: target.to_string(),
        path: percent_decode(path, false),
        query: parse_query(query),
        headers: parsed
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).trim().to_string(),
                )
            })
            .collect(),
        body: Vec::new(),
    };
    let connection = req.header("connection").unwrap_or("").to_ascii_lowercase();
    let keep_alive = if parsed.version.unwrap_or(1) >= 1 {
        !connection.contains("close")
    } else {
        connection.contains("keep-alive")
    };
    let chunked = req
        .header("transfer-encoding")
        .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    let length = match req.header("content-length") {
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
        expects_continue: req
            .header("expect")
            .is_some_and(|e| e.eq_ignore_ascii_case("100-continue")),
    };
    Ok((req, keep_alive, framing))
}

/// Reads the body of an admitted request (saying `100 Continue` first when asked, only now
/// that the request is admitted).
pub(super) fn read_body(conn: &mut ConnReader<'_>, framing: Framing) -> Result<Vec<u8>, ReadError> {
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
