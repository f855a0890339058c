//! Answering one request on its connection: a whole response, or a chunked one whose every
//! chunk reaches the client at once.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};

use super::message::{status_line, Body, Response};

/// What a relay reads and writes at a time.
const RELAY_CHUNK: usize = 64 * 1024;

/// Answers one request on its connection: either `send` a whole response or `stream` one.
pub(in crate::emulator) struct Responder<'a> {
    stream: &'a TcpStream,
    sent: bool,
    /// The status sent, for the access log.
    status: u16,
    /// The connection cannot carry another request (a stream was cut, or the peer is gone).
    close: bool,
}

impl<'a> Responder<'a> {
    pub(super) fn new(stream: &'a TcpStream) -> Responder<'a> {
        Responder {
            stream,
            sent: false,
            status: 0,
            close: false,
        }
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    /// Whether a response (or the start of one) went out.
    pub fn sent(&self) -> bool {
        self.sent
    }

    /// Whether the connection must end after this request.
    pub(super) fn must_close(&self) -> bool {
        self.close
    }

    pub fn send(&mut self, resp: Response) -> io::Result<()> {
        self.sent = true;
        self.status = resp.status;
        match resp.body {
            Body::File(file, len) => {
                self.write(head_of(resp.status, &resp.headers, len).as_bytes())?;
                let copied = send_file(file, len, self.stream);
                if copied.is_err() {
                    self.close = true;
                }
                copied
            }
            body => self.write(&encoded(Response { body, ..resp })),
        }
    }

    /// Hands the connection over for a tunnel (`CONNECT`): nothing more is answered on it by
    /// the server, and it ends once the handler returns.
    pub fn take_over(&mut self) -> &'a TcpStream {
        self.sent = true;
        self.close = true;
        self.status = 200;
        self.stream
    }

    /// Starts a chunked response; every `ChunkedWriter::send` reaches the client at once.
    pub fn stream(
        &mut self,
        status: u16,
        headers: &[(&str, &str)],
    ) -> io::Result<ChunkedWriter<'_, 'a>> {
        self.sent = true;
        self.status = status;
        let mut head = head_lines(status, headers.iter().copied());
        head.push_str("Transfer-Encoding: chunked\r\n\r\n");
        self.write(head.as_bytes())?;
        Ok(ChunkedWriter {
            responder: self,
            finished: false,
        })
    }

    /// Passes what `from` sends (a whole HTTP response, head and body) to the client as it
    /// comes, until `from` ends; the connection ends after it. Nothing counts as sent until
    /// `from` has said something, so a relay that got nothing can still be answered.
    pub fn relay(&mut self, from: &mut dyn Read) -> io::Result<u64> {
        let mut buf = vec![0u8; RELAY_CHUNK];
        let mut total = 0u64;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) => return Ok(total),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if total == 0 => return Err(e),
                Err(e) => {
                    // Cut mid-answer: the client must see the cut, not a short answer.
                    self.close = true;
                    return Err(e);
                }
            };
            if total == 0 {
                self.sent = true;
                self.close = true;
                self.status = relayed_status(&buf[..n]);
            }
            self.write(&buf[..n])?;
            total += n as u64;
        }
    }

    /// Writes and flushes `bytes`; a failed write ends the connection after this request.
    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut w = self.stream;
        let written = w.write_all(bytes).and_then(|()| w.flush());
        if written.is_err() {
            self.close = true;
        }
        written
    }
}

/// The status a relayed response starts with (`HTTP/1.1 200 OK`), 0 when it does not.
fn relayed_status(head: &[u8]) -> u16 {
    head.split(|&b| b == b' ')
        .nth(1)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A whole response as it goes on the wire (a file body is left out: only `send` streams one).
pub(in crate::emulator) fn encoded(resp: Response) -> Vec<u8> {
    let body = match resp.body {
        Body::Bytes(b) => b,
        Body::Empty | Body::File(..) => Vec::new(),
    };
    let mut all = head_of(resp.status, &resp.headers, body.len() as u64).into_bytes();
    all.extend_from_slice(&body);
    all
}

/// The head of a response whose body is `len` bytes, blank line included.
fn head_of(status: u16, headers: &[(String, String)], len: u64) -> String {
    let mut head = head_lines(
        status,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    );
    // 1xx, 204 and 304 responses carry no body and no length.
    if status >= 200 && status != 204 && status != 304 {
        head.push_str(&format!("Content-Length: {len}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// The status line and one line per header, without the blank line that ends the head.
fn head_lines<'h>(status: u16, headers: impl Iterator<Item = (&'h str, &'h str)>) -> String {
    let mut head = status_line(status);
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head
}

/// Copies exactly `len` bytes of `file` to the client.
fn send_file(file: std::fs::File, len: u64, mut w: &TcpStream) -> io::Result<()> {
    let copied = io::copy(&mut file.take(len), &mut w)?;
    if copied == len {
        w.flush()
    } else {
        // The file shrank under us: the promised length cannot be met.
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the file shrank while it was sent",
        ))
    }
}

/// The body of a chunked response. Dropping it unfinished cuts the connection, as a crashed
/// or disconnected server would.
pub(in crate::emulator) struct ChunkedWriter<'r, 'a> {
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
        self.responder.write(&chunk)
    }

    /// Ends the body properly; the connection may carry the next request.
    pub fn finish(mut self) -> io::Result<()> {
        self.finished = true;
        self.responder.write(b"0\r\n\r\n")
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
