//! A small blocking HTTP/1.1 server: one thread per connection, keep-alive, `Content-Length`
//! and chunked request bodies, and chunked responses flushed chunk by chunk.
//!
//! Why not tiny_http: its chunked response encoder buffers 8 KiB before writing, so a Connect
//! stream's `start` envelope would sit in a buffer while the SDK waits for it, and dropping a
//! response writes the terminating chunk, so a stream could not be cut the way a dropped
//! connection cuts it. A thread per connection also keeps every request on its own thread:
//! no shared worker pool that could leave a request unanswered.
//!
//! Layout: `server` (accepting, connections, the request loop), `read` (request heads and
//! bodies off the wire), `respond` (writing answers), `message` (requests and responses),
//! `query` (percent-decoding).

mod message;
mod query;
mod read;
mod respond;
mod server;

pub(super) use message::{Body, Request, Response};
pub(super) use query::query_unescape_strict;
pub(super) use read::MAX_BODY_BYTES;
pub(super) use respond::{encoded, ChunkedWriter, Responder};
pub(super) use server::{bind, Handler, Server};
