//! A process's stdin: SendInput, its client-streaming twin StreamInput, and CloseStdin.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use super::stream::{accept_stream, end_stream, open_stream};
use super::table::{process_error, select_process};
use crate::emulator::connect::{
    decode_bytes, field, message_envelope, request_messages, Code, RpcError, RpcResult,
};
use crate::emulator::envd::call::rpc_user;
use crate::emulator::http::{Request, Responder};
use crate::emulator::hub::ProcHub;
use crate::emulator::state::{SandboxEntry, Shared};
use crate::sandbox::Sandbox;

/// StreamInput, the client-streaming twin of SendInput. The request body is read whole
/// before this runs, so the input reaches the process when the client finishes sending
/// rather than chunk by chunk; the bytes and their order are the same.
pub(super) fn stream_input(
    shared: &Shared,
    entry: &SandboxEntry,
    req: &Request,
    out: &mut Responder<'_>,
) {
    if !accept_stream(shared, req, out) {
        return;
    }
    let result = rpc_user(req).and_then(|_| apply_input_stream(entry, &req.body));
    let Ok(mut w) = open_stream(out) else {
        return;
    };
    match result {
        Ok(()) => {
            if w.send(&message_envelope(&json!({}))).is_ok() {
                end_stream(w, None);
            }
        }
        Err(e) => end_stream(w, Some(&e)),
    }
}

/// Applies `{"start": {"process": selector}}` and then each `{"data": {"input": ..}}`.
fn apply_input_stream(entry: &SandboxEntry, body: &[u8]) -> RpcResult<()> {
    let mut hub = None;
    for msg in request_messages(body)? {
        if let Some(start) = field(&msg, "start", "start") {
            hub = Some(select_process(entry, start, true)?);
        } else if let Some(data) = field(&msg, "data", "data") {
            let hub = hub.as_ref().ok_or_else(|| {
                RpcError::new(Code::InvalidArgument, "the first message must be start")
            })?;
            let input = field(data, "input", "input")
                .ok_or_else(|| RpcError::new(Code::InvalidArgument, "data.input is required"))?;
            write_input(entry, hub, input)?;
        }
        // Keepalives carry nothing.
    }
    if hub.is_none() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "the input stream has no start message",
        ));
    }
    Ok(())
}

pub(super) fn send_input(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let hub = select_process(entry, msg, true)?;
    let input = field(msg, "input", "input")
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "input is required"))?;
    write_input(entry, &hub, input)?;
    Ok(json!({}))
}

/// Writes a `ProcessInput` (`{"stdin": b64}`) to the process.
fn write_input(entry: &SandboxEntry, hub: &ProcHub, input: &Value) -> RpcResult<()> {
    if field(input, "pty", "pty").is_some() {
        return Err(RpcError::new(
            Code::Internal,
            "error writing to pty: the process has no PTY",
        ));
    }
    let data = match field(input, "stdin", "stdin") {
        None => Vec::new(),
        Some(Value::String(s)) => decode_bytes(s)
            .ok_or_else(|| RpcError::new(Code::InvalidArgument, "input.stdin is not base64"))?,
        Some(_) => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "input.stdin must be a base64 string",
            ))
        }
    };
    if !hub.stdin_open.load(Ordering::SeqCst) {
        return Err(RpcError::new(
            Code::Internal,
            "error writing to stdin: stdin not enabled or closed",
        ));
    }
    if data.is_empty() {
        return Ok(());
    }
    entry
        .sandbox
        .send_stdin(hub.pid, &data)
        .map_err(|e| process_error(hub.pid, &e, "error writing to stdin"))
}

pub(super) fn close_stdin(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let hub = select_process(entry, msg, true)?;
    hub.stdin_open.store(false, Ordering::SeqCst);
    entry
        .sandbox
        .close_stdin(hub.pid)
        .map_err(|e| process_error(hub.pid, &e, "error closing stdin"))?;
    Ok(json!({}))
}
