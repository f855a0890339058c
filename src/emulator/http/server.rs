//! The listening side: the accept loop, one thread per connection, and each connection's
//! request loop (keep-alive, admission before the body is read, bounded lingering).

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::message::{Request, Response};
use super::read::{read_body, read_head, ConnReader, ReadError};
use super::respond::Responder;
use crate::sync::lock;

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

/// What serves the requests.
pub(in crate::emulator) trait Handler: Send + Sync + 'static {
    /// Sees a request once its head is read, before its body (`head.body` is empty). An
    /// answer here is sent at once and the body is never read (a request that carried one
    /// then ends its connection); `None` lets the request through to `handle`.
    fn admit(&self, _head: &Request) -> Option<Response> {
        None
    }

    fn handle(&self, req: Request, out: &mut Responder<'_>);
}

/// The listening side: owns the open connections so `stop` can cut them all.
pub(in crate::emulator) struct Server {
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

/// Answers `status` and ends the connection.
fn refuse(stream: &TcpStream, status: u16, message: &str) {
    let resp = Response::error(status, message).with_header("Connection", "close");
    let _ = Responder::new(stream).send(resp);
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

/// Reads requests off one connection and answers them until it closes.
fn serve(server: &Server, stream: TcpStream, handler: &dyn Handler) {
    let mut conn = ConnReader::new(&stream);
    loop {
        if server.is_stopping() {
            return;
        }
        let (mut req, keep_alive, framing) = match read_head(&mut conn) {
            Ok(r) => r,
            Err(e) => return end_unreadable(&stream, e),
        };
        let mut out = Responder::new(&stream);
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
        } else {
            req.body = match read_body(&mut conn, framing) {
                Ok(body) => body,
                Err(e) => return end_unreadable(&stream, e),
            };
            handler.handle(req, &mut out);
            if !out.sent() {
                let _ = out.send(Response::error(500, "the emulator sent no response"));
            }
        }
        if out.must_close() || !keep_alive {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Ends a connection whose request could not be read, answering it when there is a request
/// to answer.
fn end_unreadable(stream: &TcpStream, e: ReadError) {
    if let ReadError::Bad(status, message) = e {
        refuse(stream, status, message);
    }
}

/// Ends a connection after answering a request whose body was not read: our side first (the
/// client sees the answer, then end of stream), then a bounded drain of what the client is
/// still sending, so closing with unread bytes does not reset the connection under the
/// answer.
fn close_unread(stream: &TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(UNREAD_LINGER));
    let until = Instant::now() + UNREAD_LINGER;
    let mut chunk = [0u8; 16 * 1024];
    let mut drained = 0;
    let mut r = stream;
    while drained < UNREAD_LINGER_BYTES && Instant::now() < until {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => drained += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Binds `addr`.
pub(in crate::emulator) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr)
}
