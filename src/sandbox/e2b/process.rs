//! Process streams: the reader thread that hands a Start or Connect stream's
//! [`ProcessEvent`]s to a sink, and the collector behind a foreground `run`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::envd::{Envd, EventStream, StreamEvent};
use super::error::{EnvdFailure, Subject};
use crate::sandbox::sink::{self, OutputSink};
use crate::sandbox::{Captured, ProcessEvent};
use crate::sync::lock;

/// Which reader owns each process's output. envd fans output out to every attached stream and
/// waits for the slowest, so a stream whose consumer went away without dropping its receiver
/// would stall the one a later `connect` opened; the newer reader wins and the older one quits.
#[derive(Default)]
pub struct Readers {
    current: Mutex<HashMap<(String, u32), u64>>,
    next: AtomicU64,
}

impl Readers {
    /// Makes a new reader of `pid` the current one; returns its generation.
    pub fn claim(&self, sandbox_id: &str, pid: u32) -> u64 {
        let generation = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.current).insert((sandbox_id.to_string(), pid), generation);
        generation
    }

    fn is_current(&self, sandbox_id: &str, pid: u32, generation: u64) -> bool {
        lock(&self.current).get(&(sandbox_id.to_string(), pid)) == Some(&generation)
    }

    fn release(&self, sandbox_id: &str, pid: u32, generation: u64) {
        let mut current = lock(&self.current);
        let key = (sandbox_id.to_string(), pid);
        if current.get(&key) == Some(&generation) {
            current.remove(&key);
        }
    }
}

/// Reads a stream up to its start event and returns the pid it names.
pub fn await_start(stream: &mut EventStream) -> Result<u32, EnvdFailure> {
    loop {
        match stream.next_event()? {
            Some(StreamEvent::Start(pid)) => return Ok(pid),
            Some(StreamEvent::Keepalive | StreamEvent::Other) => {}
            Some(_) => {
                return Err(EnvdFailure::protocol(
                    "process output came before the start event",
                    None,
                ))
            }
            None => {
                return Err(EnvdFailure::protocol(
                    "the stream ended before the process started",
                    None,
                ))
            }
        }
    }
}

/// One reader's identity: the process it reads and its generation among readers of it.
pub struct ReaderTicket {
    /// For the health probe after a broken stream.
    pub envd: Envd,
    pub sandbox_id: String,
    pub pid: u32,
    pub readers: Arc<Readers>,
    pub generation: u64,
}

impl ReaderTicket {
    fn failed(&self, failure: EnvdFailure) -> ProcessEvent {
        ProcessEvent::Failed(self.envd.confirm(failure).into_error(
            &self.sandbox_id,
            &format!("reading the output of process {}", self.pid),
            Subject::Process(self.pid),
        ))
    }

    fn is_current(&self) -> bool {
        self.readers
            .is_current(&self.sandbox_id, self.pid, self.generation)
    }
}

/// Starts the thread that carries `stream`'s events to `sink`: output in order, then `Exit`
/// or `Failed`, then nothing.
pub fn start_reader(
    ticket: ReaderTicket,
    stream: EventStream,
    mut sink: Box<dyn OutputSink>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("e2b-proc-{}", ticket.pid))
        .spawn(move || {
            pump(&ticket, stream, sink.as_mut());
            ticket
                .readers
                .release(&ticket.sandbox_id, ticket.pid, ticket.generation);
        })?;
    Ok(())
}

fn pump(ticket: &ReaderTicket, mut stream: EventStream, sink: &mut dyn OutputSink) {
    // Waiting on a slow consumer, as long as this reader is still the current one.
    let mut deliver = |event| sink::deliver(sink, event, &mut || ticket.is_current());
    loop {
        let event = match stream.next_event() {
            Ok(Some(StreamEvent::Stdout(bytes))) => ProcessEvent::Stdout(bytes),
            Ok(Some(StreamEvent::Stderr(bytes))) => ProcessEvent::Stderr(bytes),
            Ok(Some(StreamEvent::End(code))) => {
                if deliver(ProcessEvent::Exit(code)) {
                    // The end-of-stream message follows; reading it lets the connection be
                    // reused. Nobody waits on this read.
                    let _ = stream.next_event();
                }
                return;
            }
            Ok(Some(_)) => {
                // Keepalives: a chance to notice that a newer stream took over.
                if !ticket.is_current() {
                    return;
                }
                continue;
            }
            Ok(None) => ticket.failed(EnvdFailure::protocol(
                "the stream ended without an end event",
                None,
            )),
            Err(failure) => ticket.failed(failure),
        };
        let last = matches!(event, ProcessEvent::Failed(_));
        if !deliver(event) || last {
            return;
        }
    }
}

/// What a foreground command produced.
pub struct Collected {
    pub stdout: Captured,
    pub stderr: Captured,
    /// `None` when killed by a signal or cut off by its time limit.
    pub exit: Option<i32>,
    /// The command's time limit ran out (envd's `deadline_exceeded`, or our own bound on the
    /// whole exchange).
    pub expired: bool,
}

/// Reads a started command's stream to its end, keeping at most `max` bytes per stream.
pub fn collect(stream: &mut EventStream, max: usize) -> Result<Collected, EnvdFailure> {
    let mut out = Collected {
        stdout: Captured::default(),
        stderr: Captured::default(),
        exit: None,
        expired: false,
    };
    loop {
        match stream.next_event() {
            Ok(Some(StreamEvent::Stdout(bytes))) => out.stdout.push(&bytes, max),
            Ok(Some(StreamEvent::Stderr(bytes))) => out.stderr.push(&bytes, max),
            Ok(Some(StreamEvent::End(code))) => {
                out.exit = code;
                // A failure after the end event changes nothing about the command.
                let _ = stream.next_event();
                return Ok(out);
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(EnvdFailure::protocol(
                    "the stream ended without an end event",
                    None,
                ))
            }
            Err(failure) if Envd::is_lifetime_expiry(&failure) => {
                out.expired = true;
                return Ok(out);
            }
            Err(failure) => return Err(failure),
        }
    }
}
