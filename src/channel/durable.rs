//! The durable channel: frames that survive a dropped output stream.
//!
//! The runner publishes every frame to a sequenced outbox on the sandbox's disk
//! (`frames/<seq>.json`, then `head`) before it writes the same envelope to stdout. The host
//! takes frames from stdout while the stream lives, fills any gap from the outbox files, and
//! keeps polling `head` when the stream is gone, so a lost stream costs latency, never a
//! frame. Inbound frames carry their own sequence and are acknowledged; a lost ack means the
//! same sequence is written again and the runner dedupes it. The runner is declared dead only
//! when the sandbox's process list has not shown it for a grace period.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde_json::{json, Value};

use super::error::ChannelError;
use super::frame::{self, frame_type, Frame};
use super::lines::{LineBuffer, Piece};
use super::stdio::{MAX_LINE, STDERR_LINES};
use crate::sandbox::{ErrorClass, Process, ProcessEvent, Sandbox};
use crate::sync::lock;

/// How often the outbox is polled when stdout is quiet or gone.
pub const POLL: Duration = Duration::from_millis(250);
/// A frame the outbox says exists but cannot be read for this long is fatal.
pub const FRAME_GRACE: Duration = Duration::from_secs(5);
/// A runner missing from the process list for this long is dead.
pub const PID_GRACE: Duration = Duration::from_secs(3);
/// How long an inbound frame may wait for its acknowledgement.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Physical writes of one inbound frame at most (same sequence each time).
const MAX_WRITES: u32 = 2;

enum ReaderMsg {
    Envelope(u64, Frame),
    Diagnostic(String),
    /// A JSON object on stdout that is not an envelope: the runner broke the protocol.
    Unsequenced,
    StreamEnd(String),
}

pub struct DurableChannel {
    sandbox: Arc<dyn Sandbox>,
    pid: u32,
    /// The outbox directory inside the sandbox.
    root: String,
    rx: Receiver<ReaderMsg>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Frames received out of order, by sequence.
    pending: BTreeMap<u64, Frame>,
    /// Frames in order, ready for `recv`.
    ready: VecDeque<Frame>,
    last_seq: u64,
    known_head: u64,
    next_in: u64,
    acked_in: u64,
    stream_dead_at: Option<Instant>,
    last_poll: Option<Instant>,
    last_probe: Option<Instant>,
    pid_missing_since: Option<Instant>,
    missing_since: HashMap<u64, Instant>,
    fatal: Option<String>,
    closed: bool,
    /// How many frames came from the outbox files rather than stdout.
    pub frames_from_disk: u64,
}

impl DurableChannel {
    /// Wraps a runner started with `WMO_LIVE_OUTBOX=<root>`.
    pub fn new(sandbox: Arc<dyn Sandbox>, process: Process, root: String) -> DurableChannel {
        let (tx, rx) = crossbeam_channel::bounded(1024);
        let stderr = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_LINES)));
        let events = process.events;
        let _ = std::thread::Builder::new()
            .name(format!("durable-{}", process.pid))
            .spawn(move || read_stream(events, tx));
        DurableChannel {
            sandbox,
            pid: process.pid,
            root,
            rx,
            stderr,
            pending: BTreeMap::new(),
            ready: VecDeque::new(),
            last_seq: 0,
            known_head: 0,
            next_in: 0,
            acked_in: 0,
            stream_dead_at: None,
            last_poll: None,
            last_probe: None,
            pid_missing_since: None,
            missing_since: HashMap::new(),
            fatal: None,
            closed: false,
            frames_from_disk: 0,
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the output stream has been lost (frames now come from the outbox).
    pub fn stream_lost(&self) -> bool {
        self.stream_dead_at.is_some()
    }

    fn push_stderr(&self, line: String) {
        let mut ring = lock(&self.stderr);
        if ring.len() == STDERR_LINES {
            ring.pop_front();
        }
        ring.push_back(line);
    }

    /// The last stderr lines: the stream's diagnostics and the runner's `stderr.log`.
    pub fn stderr_tail(&self) -> String {
        let mut lines: Vec<String> = lock(&self.stderr).iter().cloned().collect();
        if let Ok(log) = self.sandbox.read_file(&format!("{}/stderr.log", self.root)) {
            lines.extend(String::from_utf8_lossy(&log).lines().map(str::to_string));
        }
        let skip = lines.len().saturating_sub(STDERR_LINES);
        lines[skip..].join("\n")
    }

    fn fatal_error(&self) -> ChannelError {
        ChannelError::Lost {
            message: self
                .fatal
                .clone()
                .unwrap_or_else(|| "the live runner failed".into()),
            stderr_tail: self.stderr_tail(),
        }
    }

    fn set_fatal(&mut self, message: String) {
        if self.fatal.is_none() {
            self.fatal = Some(message);
        }
    }

    /// Sends one frame and waits for the runner to acknowledge it.
    pub fn send(&mut self, frame: &Value) -> Result<(), ChannelError> {
        if self.fatal.is_some() {
            return Err(self.fatal_error());
        }
        self.next_in += 1;
        let seq = self.next_in;
        let line = frame::encode(&json!({"transport_in_seq": seq, "frame": frame}));
        let deadline = Instant::now() + ACK_TIMEOUT;
        let mut writes = 0;
        let mut last_write_error = None;
        let mut next_write = Instant::now();
        loop {
            if self.acked_in >= seq {
                return Ok(());
            }
            if self.fatal.is_some() {
                return Err(self.fatal_error());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ChannelError::Unacknowledged {
                    seq,
                    waited: ACK_TIMEOUT,
                    last_write_error,
                });
            }
            if writes < MAX_WRITES && now >= next_write {
                writes += 1;
                // A second write (same sequence) covers a write or an ack lost in transit.
                next_write = now + ACK_TIMEOUT / 2;
                if let Err(e) = self.sandbox.send_stdin(self.pid, &line) {
                    last_write_error = Some(e);
                }
            }
            self.pump(Duration::from_millis(25).min(deadline - now));
        }
    }

    /// The next frame in sequence; `Ok(None)` after `close`.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Frame>, ChannelError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.closed {
                return Ok(None);
            }
            if let Some(f) = self.ready.pop_front() {
                return Ok(Some(f));
            }
            if self.fatal.is_some() {
                return Err(self.fatal_error());
            }
            let now = Instant::now();
            if now >= deadline {
                // No stderr tail: reading the runner's log on every quiet poll costs a file
                // read, and a timeout is the caller's to judge.
                return Err(ChannelError::Timeout {
                    waited: timeout,
                    stderr_tail: String::new(),
                });
            }
            self.pump((deadline - now).min(POLL));
        }
    }

    /// Moves whatever has arrived into `ready`, waiting at most `wait`.
    fn pump(&mut self, wait: Duration) {
        if self.stream_dead_at.is_none() {
            // The fast path while the stream lives: frames arrive on stdout.
            match self.rx.recv_timeout(wait) {
                Ok(msg) => self.on_reader(msg),
                Err(RecvTimeoutError::Disconnected) => {
                    self.stream_dead_at.get_or_insert_with(Instant::now);
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        } else {
            // Gone: the outbox is the only source; poll it at a modest rate.
            std::thread::sleep(wait.min(POLL));
        }
        while let Ok(msg) = self.rx.try_recv() {
            self.on_reader(msg);
        }
        let poll_due = self.last_poll.is_none_or(|t| t.elapsed() >= POLL);
        if poll_due && self.ready.is_empty() && self.stream_dead_at.is_some() {
            self.poll_head();
        }
        self.drain();
        if self.stream_dead_at.is_some() && self.ready.is_empty() {
            self.probe_liveness();
        }
    }

    fn on_reader(&mut self, msg: ReaderMsg) {
        match msg {
            ReaderMsg::Envelope(seq, frame) => {
                if seq > self.last_seq {
                    self.pending.entry(seq).or_insert(frame);
                    self.known_head = self.known_head.max(seq);
                }
            }
            ReaderMsg::Diagnostic(line) => self.push_stderr(line),
            ReaderMsg::Unsequenced => {
                self.set_fatal("the live runner emitted an unsequenced frame on stdout".into())
            }
            ReaderMsg::StreamEnd(why) => {
                self.push_stderr(format!("[channel] output stream ended: {why}"));
                self.stream_dead_at.get_or_insert_with(Instant::now);
            }
        }
    }

    fn poll_head(&mut self) {
        self.last_poll = Some(Instant::now());
        match self.sandbox.read_file(&format!("{}/head", self.root)) {
            Ok(bytes) => match String::from_utf8_lossy(&bytes).trim().parse::<u64>() {
                Ok(head) => self.known_head = self.known_head.max(head),
                Err(_) => self.push_stderr("[channel] the outbox head is not a number".into()),
            },
            Err(e) if e.class() == ErrorClass::Gone => {
                self.set_fatal(format!("the project sandbox is gone: {e}"));
            }
            Err(e) => self.push_stderr(format!("[channel] outbox head read failed: {e}")),
        }
    }

    /// Delivers frames in sequence, reading from the outbox what stdout did not bring.
    fn drain(&mut self) {
        let mut file_reads = 0;
        loop {
            let expected = self.last_seq + 1;
            let frame = match self.pending.remove(&expected) {
                Some(f) => f,
                None => {
                    if expected > self.known_head || file_reads >= 8 {
                        return;
                    }
                    file_reads += 1;
                    match self.read_outbox_frame(expected) {
                        Ok(f) => {
                            self.frames_from_disk += 1;
                            f
                        }
                        Err(why) => {
                            let since = *self
                                .missing_since
                                .entry(expected)
                                .or_insert_with(Instant::now);
                            if since.elapsed() >= FRAME_GRACE {
                                self.set_fatal(format!(
                                    "durable outbox frame {expected} unavailable after {FRAME_GRACE:?}: {why}"
                                ));
                            }
                            return;
                        }
                    }
                }
            };
            self.last_seq = expected;
            self.missing_since.remove(&expected);
            match frame_type(&frame) {
                "transport_keepalive" => {}
                "transport_ack" => match frame.get("transport_in_seq").and_then(Value::as_u64) {
                    Some(n) if n > 0 && n <= self.next_in => self.acked_in = self.acked_in.max(n),
                    _ => self.set_fatal(
                        "the live runner acknowledged a frame that was never sent".into(),
                    ),
                },
                "transport_nack" => self.set_fatal(format!(
                    "the live runner rejected inbound frame {}; it expected {}",
                    frame
                        .get("transport_in_seq")
                        .cloned()
                        .unwrap_or(Value::Null),
                    frame
                        .get("expected_transport_in_seq")
                        .cloned()
                        .unwrap_or(Value::Null)
                )),
                _ => self.ready.push_back(frame),
            }
        }
    }

    fn read_outbox_frame(&self, seq: u64) -> Result<Frame, String> {
        let path = format!("{}/frames/{seq:020}.json", self.root);
        let bytes = self.sandbox.read_file(&path).map_err(|e| e.to_string())?;
        let v = frame::parse_json(bytes).map_err(|e| e.to_string())?;
        if v.get("transport_seq").and_then(Value::as_u64) != Some(seq) {
            return Err(format!("{path} holds another sequence"));
        }
        match v.get("frame") {
            Some(Value::Object(f)) => Ok(Frame::from_map(f.clone())),
            _ => Err(format!("{path} holds no frame")),
        }
    }

    /// With the stream gone, only the process list can say the runner died.
    fn probe_liveness(&mut self) {
        let due = self
            .last_probe
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(500));
        if !due {
            return;
        }
        self.last_probe = Some(Instant::now());
        match self.sandbox.processes() {
            Ok(list) if list.iter().any(|p| p.pid == self.pid) => self.pid_missing_since = None,
            Ok(_) => {
                let since = *self.pid_missing_since.get_or_insert_with(Instant::now);
                // Give the outbox one more look before declaring death: its last frames may
                // still be unread.
                if since.elapsed() >= PID_GRACE
                    && self.ready.is_empty()
                    && self.known_head <= self.last_seq
                {
                    self.set_fatal("the live runner process exited".into());
                }
            }
            Err(e) if e.class() == ErrorClass::Gone => {
                self.set_fatal(format!("the project sandbox is gone: {e}"));
            }
            Err(e) => self.push_stderr(format!("[channel] runner liveness probe failed: {e}")),
        }
    }

    /// Asks the runner to exit and stops the process. Idempotent.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.next_in += 1;
        let line = frame::encode(
            &json!({"transport_in_seq": self.next_in, "frame": {"type": "shutdown"}}),
        );
        let _ = self.sandbox.send_stdin(self.pid, &line);
        let _ = self.sandbox.kill_process(self.pid);
    }
}

impl Drop for DurableChannel {
    fn drop(&mut self) {
        self.close();
    }
}

fn read_stream(events: Receiver<ProcessEvent>, tx: crossbeam_channel::Sender<ReaderMsg>) {
    let mut stdout = LineBuffer::default();
    let mut stderr = LineBuffer::default();
    let end = loop {
        match events.recv() {
            Ok(ProcessEvent::Stdout(chunk)) => {
                let mut msgs = Vec::new();
                stdout.feed(&chunk, MAX_LINE, |piece| msgs.push(classify_line(piece)));
                for m in msgs.into_iter().flatten() {
                    if tx.send(m).is_err() {
                        return;
                    }
                }
            }
            Ok(ProcessEvent::Stderr(chunk)) => {
                let mut lines = Vec::new();
                stderr.feed(&chunk, 4096, |piece| {
                    if let Piece::Line(l) = piece {
                        let t = String::from_utf8_lossy(l).trim_end().to_string();
                        if !t.is_empty() {
                            lines.push(t);
                        }
                    }
                });
                for l in lines {
                    let _ = tx.send(ReaderMsg::Diagnostic(l));
                }
            }
            Ok(ProcessEvent::Exit(code)) => break format!("the runner exited ({code:?})"),
            Ok(ProcessEvent::Failed(e)) => break format!("the stream failed: {e}"),
            Err(_) => break "the stream closed".to_string(),
        }
    };
    let _ = tx.send(ReaderMsg::StreamEnd(end));
}

fn classify_line(piece: Piece<'_>) -> Option<ReaderMsg> {
    let line = match piece {
        Piece::Line(l) => l,
        Piece::Oversized(n) => {
            return Some(ReaderMsg::Diagnostic(format!(
                "[stdout] dropped a {n}-byte line (over the limit)"
            )))
        }
    };
    if line.trim_ascii().is_empty() {
        return None;
    }
    match frame::decode(line) {
        Ok(f) if frame_type(&f) == "transport_keepalive" => None,
        Ok(f) => match (
            f.get("transport_seq").and_then(Value::as_u64),
            f.get("frame"),
        ) {
            (Some(seq), Some(Value::Object(inner))) if seq > 0 => {
                Some(ReaderMsg::Envelope(seq, Frame::from_map(inner.clone())))
            }
            _ => Some(ReaderMsg::Unsequenced),
        },
        Err(e) => Some(ReaderMsg::Diagnostic(format!(
            "[stdout] {} ({e})",
            String::from_utf8_lossy(&line[..line.len().min(512)])
        ))),
    }
}
