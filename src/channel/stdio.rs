//! The stdio channel: frames over a background process's stdin and stdout.
//!
//! The process's output is cut into frames by a [`FrameSink`] on the backend's own reading
//! thread (no thread of the channel's, no hand-off per chunk), and every frame of a chunk
//! crosses to the consumer in one batch. The sink reassembles partial lines, drops (with a
//! diagnostic) any line over [`MAX_LINE`] instead of buffering it, keeps the last
//! [`STDERR_LINES`] stderr lines for error messages, and consumes `transport_keepalive`
//! frames itself (renewing the sandbox lease, even while the consumer is busy elsewhere) so
//! they never reach the broker.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde_json::{json, Value};

use super::error::ChannelError;
use super::frame::{self, frame_type, Frame};
use super::lines::{LineBuffer, Piece};
use super::renewal::LeaseRenewal;
use crate::sandbox::sink::{Delivery, Forward, OutputSink};
use crate::sandbox::{ProcessEvent, Sandbox, SandboxError, SpawnOpts};
use crate::sync::lock;

/// Longest line the sink assembles; a longer one is skipped as a diagnostic.
pub const MAX_LINE: usize = 64 << 20;
/// Stderr lines kept for error messages.
pub const STDERR_LINES: usize = 50;
/// Longest stderr line kept (a runner printing a huge line must not pin memory).
const MAX_STDERR_LINE: usize = 4096;

/// How the output stream ended.
#[derive(Debug, Clone)]
enum End {
    Exited(Option<i32>),
    Failed(Arc<SandboxError>),
}

/// How many chunks' frames may wait for the channel's reader (a chunk is one read of the
/// runner's stdout by the backend: locally a pipe read, at most 64 KiB). The queue's slots
/// are allocated and touched up front, so this is also what every live runner costs.
const QUEUED_CHUNKS: usize = 256;

/// What the sink hands over: every frame of one stdout chunk at once (one wake-up for a
/// chunk holding hundreds of small frames), or the end.
enum Incoming {
    Frames(Vec<Frame>),
    End(End),
}

/// State the sink and the channel both touch.
struct Shared {
    stderr: Mutex<VecDeque<String>>,
    renewal: Mutex<Option<LeaseRenewal>>,
}

impl Shared {
    fn stderr(&self) -> MutexGuard<'_, VecDeque<String>> {
        lock(&self.stderr)
    }

    fn renewal(&self) -> MutexGuard<'_, Option<LeaseRenewal>> {
        lock(&self.renewal)
    }

    fn push_stderr(&self, line: String) {
        let mut ring = self.stderr();
        if ring.len() == STDERR_LINES {
            ring.pop_front();
        }
        ring.push_back(line);
    }

    fn tail(&self) -> String {
        self.stderr().iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// A framed channel to one runner process.
pub struct StdioChannel {
    sandbox: Arc<dyn Sandbox>,
    pid: u32,
    rx: Receiver<Incoming>,
    /// Frames of a batch not yet handed out, in order.
    ready: VecDeque<Frame>,
    shared: Arc<Shared>,
    ended: Option<End>,
    closed: bool,
}

impl StdioChannel {
    /// Starts `cmd` in `sandbox` as a background process and frames its output. With
    /// `renewal`, keepalives during an episode extend the sandbox's timeout.
    pub fn spawn(
        sandbox: Arc<dyn Sandbox>,
        cmd: &str,
        opts: &SpawnOpts,
        renewal: Option<LeaseRenewal>,
    ) -> Result<StdioChannel, SandboxError> {
        let (mut channel, sink) = StdioChannel::fed(sandbox, 0, renewal);
        match channel.sandbox.spawn_into(cmd, opts, Box::new(sink)) {
            Ok(pid) => {
                channel.pid = pid;
                Ok(channel)
            }
            Err(e) => {
                // Nothing to shut down when it is dropped.
                channel.closed = true;
                Err(e)
            }
        }
    }

    /// A channel to process `pid` of `sandbox` whose output the caller hands to the returned
    /// sink.
    pub fn fed(
        sandbox: Arc<dyn Sandbox>,
        pid: u32,
        renewal: Option<LeaseRenewal>,
    ) -> (StdioChannel, FrameSink) {
        let shared = Arc::new(Shared {
            stderr: Mutex::new(VecDeque::with_capacity(STDERR_LINES)),
            renewal: Mutex::new(renewal),
        });
        // Bounded so a runner that floods frames is slowed by backpressure rather than
        // growing host memory: at most this many chunks' frames wait.
        let (tx, rx) = crossbeam_channel::bounded(QUEUED_CHUNKS);
        let sink = FrameSink {
            sandbox: sandbox.clone(),
            shared: shared.clone(),
            out: Forward::new(tx),
            stdout: LineBuffer::default(),
            stderr: LineBuffer::default(),
        };
        let channel = StdioChannel {
            sandbox,
            pid,
            rx,
            ready: VecDeque::new(),
            shared,
            ended: None,
            closed: false,
        };
        (channel, sink)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn sandbox(&self) -> &Arc<dyn Sandbox> {
        &self.sandbox
    }

    pub fn stderr_tail(&self) -> String {
        self.shared.tail()
    }

    /// Sends one frame. `episode_start` starts the lease-renewal clock.
    pub fn send(&self, frame: &Value) -> Result<(), ChannelError> {
        if frame.get("type").and_then(Value::as_str) == Some("episode_start") {
            if let Some(r) = self.shared.renewal().as_mut() {
                r.episode_started(Instant::now());
            }
        }
        let line = frame::encode(frame);
        match self.sandbox.send_stdin(self.pid, &line) {
            Ok(()) => Ok(()),
            Err(source) => Err(self.explain_send_failure(source)),
        }
    }

    /// A write to a runner that has died fails with whatever the pipe says; the truth (its
    /// exit and last words) is usually already on its way through the output stream, so wait
    /// briefly for it and report that instead.
    fn explain_send_failure(&self, source: SandboxError) -> ChannelError {
        const GRACE: Duration = Duration::from_millis(500);
        let deadline = Instant::now() + GRACE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                // The episode is lost either way; frames still in flight do not matter.
                Ok(Incoming::Frames(_)) => continue,
                Ok(Incoming::End(End::Exited(code))) => {
                    return ChannelError::Exited {
                        code,
                        stderr_tail: self.shared.tail(),
                    }
                }
                Ok(Incoming::End(End::Failed(e))) => {
                    return ChannelError::StreamFailed {
                        source: clone_sandbox_error(&e),
                        stderr_tail: self.shared.tail(),
                    }
                }
                Err(_) => {
                    return ChannelError::Send {
                        source,
                        stderr_tail: self.shared.tail(),
                    }
                }
            }
        }
    }

    /// The next frame, `Ok(None)` once the channel was closed by us. End of the stream is
    /// sticky: every later call reports it again.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Frame>, ChannelError> {
        if let Some(f) = self.ready.pop_front() {
            return Ok(Some(f));
        }
        if let Some(end) = &self.ended {
            return self.end_error(end.clone());
        }
        match self.rx.recv_timeout(timeout) {
            Ok(Incoming::Frames(batch)) => {
                self.ready.extend(batch);
                match self.ready.pop_front() {
                    Some(f) => Ok(Some(f)),
                    // The sink sends no empty batch; one would be a wait that found nothing.
                    None => Err(ChannelError::Timeout {
                        waited: timeout,
                        stderr_tail: self.shared.tail(),
                    }),
                }
            }
            Ok(Incoming::End(end)) => {
                self.ended = Some(end.clone());
                self.end_error(end)
            }
            Err(RecvTimeoutError::Timeout) => Err(ChannelError::Timeout {
                waited: timeout,
                stderr_tail: self.shared.tail(),
            }),
            Err(RecvTimeoutError::Disconnected) => {
                let end = End::Exited(None);
                self.ended = Some(end.clone());
                self.end_error(end)
            }
        }
    }

    fn end_error(&self, end: End) -> Result<Option<Frame>, ChannelError> {
        if self.closed {
            return Ok(None);
        }
        let stderr_tail = self.shared.tail();
        Err(match end {
            End::Exited(code) => ChannelError::Exited { code, stderr_tail },
            End::Failed(e) => ChannelError::StreamFailed {
                source: clone_sandbox_error(&e),
                stderr_tail,
            },
        })
    }

    /// Waits for `hello`, skipping anything else.
    pub fn wait_hello(&mut self, timeout: Duration) -> Result<Frame, ChannelError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ChannelError::Timeout {
                    waited: timeout,
                    stderr_tail: self.shared.tail(),
                });
            }
            match self.recv(left) {
                Ok(Some(f)) if frame_type(&f) == "hello" => return Ok(f),
                Ok(Some(_)) => continue,
                Ok(None) => {
                    return Err(ChannelError::Exited {
                        code: None,
                        stderr_tail: self.shared.tail(),
                    })
                }
                Err(ChannelError::Timeout { .. }) => {
                    return Err(ChannelError::Timeout {
                        waited: timeout,
                        stderr_tail: self.shared.tail(),
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The episode ended host-side; stop renewing the lease.
    pub fn episode_ended(&self) {
        if let Some(r) = self.shared.renewal().as_mut() {
            r.episode_ended();
        }
    }

    /// Asks the runner to exit. Idempotent; it does not kill the process.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.episode_ended();
        // Best effort: a runner that is already gone needs no shutdown.
        let _ = self
            .sandbox
            .send_stdin(self.pid, &frame::encode(&json!({"type": "shutdown"})));
    }
}

impl Drop for StdioChannel {
    fn drop(&mut self) {
        self.close();
    }
}

/// Sandbox errors are not `Clone` (they carry io errors); the sticky end re-reports a copy
/// that keeps the class and the message.
fn clone_sandbox_error(e: &SandboxError) -> SandboxError {
    SandboxError::Remote {
        class: e.class(),
        message: e.to_string(),
        source: None,
    }
}

/// Cuts a runner's output into frames where the backend reads it, and hands each chunk's
/// frames to the channel in one batch.
pub struct FrameSink {
    sandbox: Arc<dyn Sandbox>,
    shared: Arc<Shared>,
    out: Forward<Incoming>,
    stdout: LineBuffer,
    stderr: LineBuffer,
}

impl OutputSink for FrameSink {
    fn offer(&mut self, event: ProcessEvent, within: Duration) -> Delivery {
        let incoming = match event {
            ProcessEvent::Stdout(chunk) => {
                let frames = self.on_stdout(&chunk);
                if frames.is_empty() {
                    return Delivery::Done;
                }
                Incoming::Frames(frames)
            }
            ProcessEvent::Stderr(chunk) => {
                self.on_stderr(&chunk);
                return Delivery::Done;
            }
            ProcessEvent::Exit(code) => Incoming::End(End::Exited(code)),
            ProcessEvent::Failed(e) => {
                self.shared
                    .push_stderr(format!("[channel] output stream failed: {e}"));
                Incoming::End(End::Failed(Arc::new(e)))
            }
        };
        self.out.send(incoming, within)
    }

    fn retry(&mut self, within: Duration) -> Delivery {
        self.out.retry(within)
    }
}

impl FrameSink {
    /// The frames of a stdout chunk, keepalives taken out (and acted on).
    fn on_stdout(&mut self, chunk: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        let shared = &self.shared;
        self.stdout.feed(chunk, MAX_LINE, |piece| match piece {
            Piece::Line(line) => {
                if line.trim_ascii().is_empty() {
                    return;
                }
                match frame::decode(line) {
                    Ok(f) => frames.push(f),
                    Err(e) => shared.push_stderr(format!(
                        "[stdout] {} ({e})",
                        String::from_utf8_lossy(&line[..line.len().min(MAX_STDERR_LINE)])
                    )),
                }
            }
            Piece::Oversized(n) => shared.push_stderr(format!(
                "[channel] dropped a {n}-byte stdout line (over the {MAX_LINE}-byte limit)"
            )),
        });
        let mut keepalive = false;
        frames.retain(|f| match frame_type(f) {
            "transport_keepalive" => {
                keepalive = true;
                false
            }
            "done" | "episode_error" => {
                if let Some(r) = self.shared.renewal().as_mut() {
                    r.episode_ended();
                }
                true
            }
            _ => true,
        });
        if keepalive {
            self.renew();
        }
        frames
    }

    fn on_stderr(&mut self, chunk: &[u8]) {
        let shared = &self.shared;
        self.stderr
            .feed(chunk, MAX_STDERR_LINE, |piece| match piece {
                Piece::Line(line) => {
                    let text = String::from_utf8_lossy(line);
                    if !text.trim().is_empty() {
                        shared.push_stderr(text.into_owned());
                    }
                }
                Piece::Oversized(n) => shared.push_stderr(format!("[stderr] ({n}-byte line cut)")),
            });
    }

    fn renew(&self) {
        let now = Instant::now();
        let due = self.shared.renewal().as_ref().and_then(|r| r.due(now));
        let Some(secs) = due else { return };
        match self.sandbox.set_timeout(secs) {
            Ok(()) => {
                if let Some(r) = self.shared.renewal().as_mut() {
                    r.renewed(now);
                }
            }
            Err(e) => self
                .shared
                .push_stderr(format!("[channel] sandbox timeout refresh failed: {e}")),
        }
    }
}
