//! The Connect streams of process.Process: the protocol check, the stream options, and the
//! pump that relays a hub's events (with keepalives, the call's deadline, and the seeded
//! stream drops).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::select;
use serde_json::{json, Value};

use crate::emulator::connect::{
    encode_bytes, end_of_stream, message_envelope, request_message, Code, RpcError, RpcResult,
    STREAM_CONTENT_TYPE,
};
use crate::emulator::envd::call::rpc_user;
use crate::emulator::http::{ChunkedWriter, Request, Responder, Response};
use crate::emulator::hub::{Ending, HubEvent, Subscription};
use crate::emulator::state::{SandboxEntry, Shared};
use crate::sandbox::Role;

/// envd's keepalive interval when the client asks for none.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// What a stream needs once its subscription is set up.
pub(super) struct StreamPlan {
    pub pid: u32,
    /// Whether the process was started with stdin (a long-lived runner, typically).
    pub stdin: bool,
    pub sub: Subscription,
    /// The `Connect-Timeout-Ms` deadline of this call.
    pub deadline: Option<Instant>,
}

/// Stream options every streaming call shares.
pub(super) struct StreamOpts {
    keepalive: Duration,
    pub deadline: Option<Instant>,
    /// Who the process runs as (the Basic-auth user).
    pub role: Role,
}

/// Sets up what a server stream relays: Start spawns a process, Connect finds one.
pub(super) type Open =
    fn(&Shared, &Arc<SandboxEntry>, &Value, &StreamOpts) -> RpcResult<StreamPlan>;

/// How a stream ended.
enum Pumped {
    /// Ended with an end-of-stream message; the body can be finished.
    Done,
    /// Cut without one (a dropped stream, a stopped emulator, a dead client).
    Cut,
}

/// Checks the protocol, runs `open`, and streams what it set up. Failures before the first
/// event come as an end-of-stream error inside a 200 stream, as connect-go does.
pub(super) fn stream_call(
    shared: &Shared,
    entry: &Arc<SandboxEntry>,
    req: &Request,
    out: &mut Responder<'_>,
    open: Open,
) {
    if !accept_stream(shared, req, out) {
        return;
    }
    let Ok(mut w) = open_stream(out) else {
        return;
    };
    let plan = stream_opts(req).and_then(|opts| {
        let msg = request_message(&req.body)?;
        let plan = open(shared, entry, &msg, &opts)?;
        Ok((opts, plan))
    });
    match plan {
        Ok((opts, plan)) => {
            if let Ok(Pumped::Done) = pump(shared, &mut w, plan, &opts) {
                let _ = w.finish();
            }
            // Otherwise dropping the unfinished writer cuts the connection.
        }
        Err(e) => end_stream(w, Some(&e)),
    }
}

/// Checks a streaming call's protocol and counts the stream; false when the call was
/// answered already (415, as connect-go answers a wrong one).
pub(super) fn accept_stream(shared: &Shared, req: &Request, out: &mut Responder<'_>) -> bool {
    if let Err(resp) = check_stream_protocol(req) {
        let _ = out.send(resp);
        return false;
    }
    shared.streams.fetch_add(1, Ordering::SeqCst);
    true
}

/// Answers a streaming call the emulator does not serve as connect-go does: a 200 stream
/// whose end-of-stream message carries `error` (a client then raises its own exception for
/// the code, not a transport error).
pub(in crate::emulator::envd) fn refuse_stream(
    shared: &Shared,
    req: &Request,
    out: &mut Responder<'_>,
    error: &RpcError,
) {
    if !accept_stream(shared, req, out) {
        return;
    }
    if let Ok(w) = open_stream(out) {
        end_stream(w, Some(error));
    }
}

/// Starts the 200 stream every streaming call answers with.
pub(super) fn open_stream<'r, 'a>(out: &'r mut Responder<'a>) -> io::Result<ChunkedWriter<'r, 'a>> {
    out.stream(200, &[("Content-Type", STREAM_CONTENT_TYPE)])
}

/// Ends a stream with its end-of-stream message (carrying `error`, if any) and finishes the
/// body; a failed write leaves it unfinished, which cuts the connection.
pub(super) fn end_stream(mut w: ChunkedWriter<'_, '_>, error: Option<&RpcError>) {
    if w.send(&end_of_stream(error)).is_ok() {
        let _ = w.finish();
    }
}

/// A streaming call must be a POST of `application/connect+json`; anything else gets the 415
/// connect-go answers with.
fn check_stream_protocol(req: &Request) -> Result<(), Response> {
    let content_type = req
        .header("content-type")
        .unwrap_or("")
        .to_ascii_lowercase();
    if req.method != "POST" || !content_type.starts_with("application/connect+") {
        return Err(Response::bytes(
            415,
            "text/plain",
            b"expected application/connect+json".to_vec(),
        ));
    }
    if content_type != STREAM_CONTENT_TYPE {
        return Err(Response::bytes(
            415,
            "text/plain",
            format!("unsupported codec {content_type:?}: the emulator speaks JSON only")
                .into_bytes(),
        ));
    }
    Ok(())
}

fn stream_opts(req: &Request) -> RpcResult<StreamOpts> {
    let keepalive = req
        .header("keepalive-ping-interval")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_KEEPALIVE, Duration::from_secs);
    let deadline = match req.header("connect-timeout-ms") {
        None => None,
        Some(v) => {
            let v = v.trim();
            if v.is_empty() || v.len() > 10 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(RpcError::new(
                    Code::InvalidArgument,
                    format!("protocol error: invalid timeout {v:?}"),
                ));
            }
            let ms: u64 = v.parse().unwrap_or(0);
            (ms > 0).then(|| Instant::now() + Duration::from_millis(ms))
        }
    };
    Ok(StreamOpts {
        keepalive,
        deadline,
        role: rpc_user(req)?,
    })
}

/// Writes `start`, then every event of the subscription, keepalives when idle, and the end.
fn pump(
    shared: &Shared,
    w: &mut ChunkedWriter<'_, '_>,
    plan: StreamPlan,
    opts: &StreamOpts,
) -> io::Result<Pumped> {
    // A dropped stream delivers the start and at most `n` more events, then is cut.
    let mut budget = shared.faults.drop_stream(plan.stdin);
    w.send(&message_envelope(
        &json!({"event": {"start": {"pid": plan.pid}}}),
    ))?;
    let rx = match plan.sub {
        Subscription::Ended(end) => {
            if budget.is_some() {
                return Ok(Pumped::Cut);
            }
            return send_ending(w, &end);
        }
        Subscription::Live(rx) => rx,
    };
    let past_deadline = || plan.deadline.is_some_and(|d| Instant::now() >= d);
    let far = Duration::from_secs(3600);
    let mut next_ping = Instant::now() + opts.keepalive;
    loop {
        let now = Instant::now();
        let wake = plan.deadline.map_or(next_ping, |d| d.min(next_ping));
        let event = select! {
            recv(rx) -> ev => ev,
            recv(shared.stop_rx) -> _ => return Ok(Pumped::Cut),
            default(wake.saturating_duration_since(now).min(far)) => {
                if past_deadline() {
                    return send_error(w, &deadline_exceeded());
                }
                if spend(&mut budget) {
                    return Ok(Pumped::Cut);
                }
                w.send(&message_envelope(&json!({"event": {"keepalive": {}}})))?;
                next_ping = Instant::now() + opts.keepalive;
                continue;
            }
        };
        let (stream, data) = match event {
            Ok(HubEvent::Stdout(d)) => ("stdout", d),
            Ok(HubEvent::Stderr(d)) => ("stderr", d),
            Ok(HubEvent::End(end)) => {
                if budget.is_some() {
                    return Ok(Pumped::Cut);
                }
                if past_deadline() && matches!(end, Ending::Exited(_)) {
                    // The deadline kill won the race with the exit: report the deadline.
                    return send_error(w, &deadline_exceeded());
                }
                return send_ending(w, &end);
            }
            Err(_) => {
                if shared.is_stopping() {
                    return Ok(Pumped::Cut);
                }
                return send_error(
                    w,
                    &RpcError::new(
                        Code::Aborted,
                        "the stream fell too far behind the process and was detached",
                    ),
                );
            }
        };
        if spend(&mut budget) {
            return Ok(Pumped::Cut);
        }
        w.send(&message_envelope(
            &json!({"event": {"data": {stream: encode_bytes(&data)}}}),
        ))?;
        next_ping = Instant::now() + opts.keepalive;
    }
}

/// The `end` event and a clean end of stream; or, when the sandbox died under the process,
/// the `unavailable` end of stream E2B's proxy gives when the connection to a sandbox ends
/// mid-stream (the SDK then probes `/health` and reports the sandbox gone).
fn send_ending(w: &mut ChunkedWriter<'_, '_>, end: &Ending) -> io::Result<Pumped> {
    match end {
        Ending::Exited(end) => {
            w.send(&message_envelope(&end.to_event()))?;
            w.send(&end_of_stream(None))?;
            Ok(Pumped::Done)
        }
        Ending::SandboxGone => send_error(
            w,
            &RpcError::new(
                Code::Unavailable,
                "the connection to the sandbox ended before the stream completed: \
                 the sandbox is gone",
            ),
        ),
    }
}

/// An end of stream carrying `error`.
fn send_error(w: &mut ChunkedWriter<'_, '_>, error: &RpcError) -> io::Result<Pumped> {
    w.send(&end_of_stream(Some(error)))?;
    Ok(Pumped::Done)
}

fn deadline_exceeded() -> RpcError {
    RpcError::new(
        Code::DeadlineExceeded,
        "the operation timed out (Connect-Timeout-Ms)",
    )
}

/// Spends one event of a dropped stream's budget; true when the stream must be cut now.
fn spend(budget: &mut Option<u32>) -> bool {
    match budget {
        None => false,
        Some(0) => true,
        Some(n) => {
            *n -= 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_budget() {
        let mut b = Some(1);
        assert!(!spend(&mut b));
        assert!(spend(&mut b));
        let mut none = None;
        assert!(!spend(&mut none));
    }
}
