//! The sandbox's processes: finding one by its selector, listing the running ones, and the
//! calls that act on a process as a whole (SendSignal, Update).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

use crate::emulator::connect::{
    enum_value, field, int_field, string_field, Code, RpcError, RpcResult,
};
use crate::emulator::hub::ProcHub;
use crate::emulator::state::SandboxEntry;
use crate::errors::error_chain;
use crate::sandbox::{Sandbox, SandboxError};
use crate::sync::lock;

/// Drops processes that ended longer ago than the retention window.
pub(super) fn prune(entry: &SandboxEntry) {
    let now = Instant::now();
    lock(&entry.procs).retain(|_, hub| !hub.expired(now));
}

/// The process a `ProcessSelector` (`{"pid": N}` or `{"tag": "t"}`) names; `running` skips
/// ended ones.
pub(super) fn select_process(
    entry: &SandboxEntry,
    msg: &Value,
    running: bool,
) -> RpcResult<Arc<ProcHub>> {
    let selector = field(msg, "process", "process")
        .filter(|p| p.is_object())
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "process selector is required"))?;
    let procs = lock(&entry.procs);
    let usable = |h: &&Arc<ProcHub>| !running || h.is_running();
    if let Some(pid) = int_field(selector, "pid", "pid")? {
        let found = u32::try_from(pid)
            .ok()
            .and_then(|p| procs.get(&p))
            .filter(usable);
        return found.cloned().ok_or_else(|| {
            RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
        });
    }
    if let Some(tag) = string_field(selector, "tag", "tag")? {
        // Prefer a running process when a tag was reused.
        let mut candidates: Vec<&Arc<ProcHub>> = procs
            .values()
            .filter(|h| h.tag.as_deref() == Some(tag.as_str()))
            .filter(usable)
            .collect();
        candidates.sort_by_key(|h| !h.is_running());
        return candidates.first().map(|h| Arc::clone(h)).ok_or_else(|| {
            RpcError::new(Code::NotFound, format!("process with tag {tag} not found"))
        });
    }
    Err(RpcError::new(
        Code::InvalidArgument,
        "process selector needs a pid or a tag",
    ))
}

pub(super) fn list(entry: &SandboxEntry) -> RpcResult<Value> {
    prune(entry);
    let mut hubs: Vec<Arc<ProcHub>> = lock(&entry.procs)
        .values()
        .filter(|h| h.is_running())
        .cloned()
        .collect();
    hubs.sort_by_key(|h| h.pid);
    if hubs.is_empty() {
        return Ok(json!({}));
    }
    let processes: Vec<Value> = hubs
        .iter()
        .map(|h| {
            let mut p = json!({"config": h.config, "pid": h.pid});
            if let Some(tag) = &h.tag {
                p["tag"] = json!(tag);
            }
            p
        })
        .collect();
    Ok(json!({"processes": processes}))
}

/// A failed operation on process `pid`, as envd reports it.
pub(super) fn process_error(pid: u32, e: &SandboxError, what: &str) -> RpcError {
    match e {
        SandboxError::NoSuchProcess { .. } => {
            RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
        }
        SandboxError::Gone { .. } => RpcError::new(Code::Unavailable, e.to_string()),
        other => RpcError::new(Code::Internal, format!("{what}: {}", error_chain(other))),
    }
}

pub(super) fn send_signal(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let hub = select_process(entry, msg, true)?;
    let names = [
        ("SIGNAL_UNSPECIFIED", 0),
        ("SIGNAL_SIGTERM", 15),
        ("SIGNAL_SIGKILL", 9),
    ];
    let signal = field(msg, "signal", "signal").and_then(|v| enum_value(v, &names));
    match signal {
        // The local backend signals whole process groups with SIGKILL only; SIGTERM gets the
        // same (envd's SIGTERM is as final for a process that does not trap it).
        Some(9) | Some(15) => {}
        _ => {
            return Err(RpcError::new(
                Code::Unimplemented,
                "only SIGNAL_SIGKILL and SIGNAL_SIGTERM are supported",
            ))
        }
    }
    entry
        .sandbox
        .kill_process(hub.pid)
        .map_err(|e| process_error(hub.pid, &e, "error sending signal"))?;
    Ok(json!({}))
}

pub(super) fn update(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let _hub = select_process(entry, msg, true)?;
    if field(msg, "pty", "pty").is_some() {
        return Err(RpcError::new(
            Code::Internal,
            "error resizing pty: the process has no PTY",
        ));
    }
    Ok(json!({}))
}
