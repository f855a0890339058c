//! process.Process: Start and Connect streams, StreamInput, List, SendInput, CloseStdin,
//! SendSignal, Update. Each started process is followed by its hub (`crate::emulator::hub`);
//! a stream attaches to the hub and relays what it fans out.
//!
//! Layout: `routes` (which method serves a call), `stream` (the Connect streams and their
//! pump), `start` (Start and Connect: what a stream attaches to), `input` (stdin), `table`
//! (the sandbox's processes: lookup, listing, signals).

mod input;
mod routes;
mod start;
mod stream;
mod table;

pub(super) use routes::handle;
pub(super) use stream::refuse_stream;
