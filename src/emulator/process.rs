//! process.Process: Start and Connect streams, List, SendInput, CloseStdin, SendSignal,
//! Update.
//!
//! Each started process gets a hub thread that owns the local backend's event channel and
//! fans every chunk out to the streams attached at that moment (envd buffers nothing for
//! late readers), enforces the Start call's `Connect-Timeout-Ms` as the process's lifetime,
//! and keeps the end for 30 s so a late `Connect` can replay it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use serde_json::{json, Map, Value};

use super::connect::{
    bool_field, decode_bytes, encode_bytes, end_of_stream, enum_value, field, int_field,
    message_envelope, request_message, request_messages, string_field, string_list, string_map,
    Code, RpcError, RpcResult, STREAM_CONTENT_TYPE,
};
use super::envd::{rpc_user, unary};
use super::http::{ChunkedWriter, Request, Responder, Response};
use super::paths;
use super::server::{SandboxEntry, Shared};
use crate::sandbox::local::LocalSandbox;
use crate::sandbox::Role;
use crate::sandbox::{shell_quote, ProcessEvent, Sandbox, SandboxError, SpawnOpts};
use crate::sync::lock;

/// How long an ended process can still be `Connect`ed to (envd's retention).
const END_RETENTION: Duration = Duration::from_secs(30);
/// Chunks queued per attached stream before the hub waits for it.
const SUBSCRIBER_BUFFER: usize = 256;
/// How long the hub waits on one stream that stopped reading before detaching it. Until
/// then the process is back-pressured, as envd's fan-out does.
const SUBSCRIBER_STALL: Duration = Duration::from_secs(300);
/// envd's keepalive interval when the client asks for none.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);
/// Processes tracked per sandbox (running, or ended within the retention window).
const MAX_PROCS: usize = 1024;

/// How a process ended, as the `end` event reports it.
#[derive(Debug, Clone)]
struct EndInfo {
    exit_code: i32,
    exited: bool,
    status: String,
    error: Option<String>,
}

impl EndInfo {
    fn from_exit(code: Option<i32>) -> EndInfo {
        match code {
            Some(0) => EndInfo {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            },
            Some(n) => EndInfo {
                exit_code: n,
                exited: true,
                status: format!("exit status {n}"),
                error: Some(format!("exit status {n}")),
            },
            // The local backend only says "a signal"; envd's kill is SIGKILL.
            None => EndInfo {
                exit_code: -1,
                exited: false,
                status: "signal: killed".into(),
                error: Some("signal: killed".into()),
            },
        }
    }

    fn failed(message: String) -> EndInfo {
        EndInfo {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some(message),
        }
    }

    /// The `end` event, zero values omitted as ProtoJSON does.
    fn to_event(&self) -> Value {
        let mut end = Map::new();
        if self.exit_code != 0 {
            end.insert("exitCode".into(), json!(self.exit_code));
        }
        if self.exited {
            end.insert("exited".into(), json!(true));
        }
        end.insert("status".into(), json!(self.status));
        if let Some(e) = &self.error {
            end.insert("error".into(), json!(e));
        }
        json!({"event": {"end": end}})
    }
}

#[derive(Clone)]
enum HubEvent {
    Stdout(Arc<Vec<u8>>),
    Stderr(Arc<Vec<u8>>),
    End(EndInfo),
}

enum Subscription {
    Live(Receiver<HubEvent>),
    Ended(EndInfo),
}

#[derive(Default)]
struct HubState {
    subs: Vec<Sender<HubEvent>>,
    end: Option<EndInfo>,
    ended_at: Option<Instant>,
}

/// One process started through envd.
pub(super) struct ProcHub {
    pid: u32,
    tag: Option<String>,
    /// The `ProcessConfig` as requested, which `List` reports back.
    config: Value,
    stdin_open: AtomicBool,
    state: Mutex<HubState>,
}

impl ProcHub {
    fn subscribe(&self) -> Subscription {
        let mut st = lock(&self.state);
        if let Some(end) = &st.end {
            return Subscription::Ended(end.clone());
        }
        let (tx, rx) = bounded(SUBSCRIBER_BUFFER);
        st.subs.push(tx);
        Subscription::Live(rx)
    }

    fn is_running(&self) -> bool {
        lock(&self.state).end.is_none()
    }

    /// Ended longer ago than the retention window.
    fn expired(&self, now: Instant) -> bool {
        lock(&self.state)
            .ended_at
            .is_some_and(|t| now.duration_since(t) > END_RETENTION)
    }

    fn broadcast(&self, event: &HubEvent) {
        let subs = lock(&self.state).subs.clone();
        let mut dead = Vec::new();
        for tx in subs {
            if tx.send_timeout(event.clone(), SUBSCRIBER_STALL).is_err() {
                dead.push(tx);
            }
        }
        if !dead.is_empty() {
            lock(&self.state)
                .subs
                .retain(|s| !dead.iter().any(|d| d.same_channel(s)));
        }
    }

    fn finish(&self, end: EndInfo) {
        let subs = {
            let mut st = lock(&self.state);
            st.end = Some(end.clone());
            st.ended_at = Some(Instant::now());
            std::mem::take(&mut st.subs)
        };
        for tx in subs {
            let _ = tx.send_timeout(HubEvent::End(end.clone()), SUBSCRIBER_STALL);
        }
    }
}

/// Follows one process until it ends: fans out its output, kills it at `kill_at`.
fn run_hub(
    hub: &ProcHub,
    events: &Receiver<ProcessEvent>,
    mut kill_at: Option<Instant>,
    sandbox: &LocalSandbox,
    stop: &Receiver<()>,
) {
    loop {
        let wait = kill_at.map_or(Duration::from_secs(3600), |t| {
            t.saturating_duration_since(Instant::now())
        });
        let event = select! {
            recv(events) -> ev => ev,
            // The emulator stopped: it kills the sandboxes itself.
            recv(stop) -> _ => return,
            default(wait) => {
                if kill_at.is_some_and(|t| Instant::now() >= t) {
                    // envd kills a process whose Start deadline passed, stream or no stream.
                    let _ = sandbox.kill_process(hub.pid);
                    kill_at = None;
                }
                continue;
            }
        };
        match event {
            Ok(ProcessEvent::Stdout(d)) => hub.broadcast(&HubEvent::Stdout(Arc::new(d))),
            Ok(ProcessEvent::Stderr(d)) => hub.broadcast(&HubEvent::Stderr(Arc::new(d))),
            Ok(ProcessEvent::Exit(code)) => {
                hub.finish(EndInfo::from_exit(code));
                return;
            }
            Ok(ProcessEvent::Failed(e)) => {
                hub.finish(EndInfo::failed(e.to_string()));
                return;
            }
            Err(_) => {
                hub.finish(EndInfo::failed(
                    "the process's output stream ended without an exit status".into(),
                ));
                return;
            }
        }
    }
}

pub(super) fn handle(
    shared: &Shared,
    entry: &Arc<SandboxEntry>,
    method: &str,
    req: Request,
    out: &mut Responder<'_>,
) {
    match method {
        "Start" => stream_call(shared, entry, &req, out, start),
        "Connect" => stream_call(shared, entry, &req, out, connect),
        "List" => send(out, unary(&req, |_, _| list(entry))),
        "SendInput" => send(out, unary(&req, |m, _| send_input(entry, m))),
        "CloseStdin" => send(out, unary(&req, |m, _| close_stdin(entry, m))),
        "SendSignal" => send(out, unary(&req, |m, _| send_signal(entry, m))),
        "Update" => send(out, unary(&req, |m, _| update(entry, m))),
        "StreamInput" => stream_input(shared, entry, &req, out),
        other => send(
            out,
            Response::json(
                404,
                &RpcError::new(
                    Code::Unimplemented,
                    format!("process.Process/{other} is not implemented"),
                )
                .to_json(),
            ),
        ),
    }
}

fn send(out: &mut Responder<'_>, resp: Response) {
    let _ = out.send(resp);
}

/// What a stream needs once its subscription is set up.
struct StreamPlan {
    pid: u32,
    /// Whether the process was started with stdin (a long-lived runner, typically).
    stdin: bool,
    sub: Subscription,
    /// The `Connect-Timeout-Ms` deadline of this call.
    deadline: Option<Instant>,
}

/// Stream options every streaming call shares.
struct StreamOpts {
    keepalive: Duration,
    deadline: Option<Instant>,
    /// Who the process runs as (the Basic-auth user).
    role: Role,
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

/// Checks the protocol, runs `open`, and streams what it set up. Failures before the first
/// event come as an end-of-stream error inside a 200 stream, as connect-go does.
fn stream_call(
    shared: &Shared,
    entry: &Arc<SandboxEntry>,
    req: &Request,
    out: &mut Responder<'_>,
    open: fn(&Shared, &Arc<SandboxEntry>, &Value, &StreamOpts) -> RpcResult<StreamPlan>,
) {
    if let Err(resp) = check_stream_protocol(req) {
        send(out, resp);
        return;
    }
    shared.streams.fetch_add(1, Ordering::SeqCst);
    let Ok(mut w) = out.stream(200, &[("Content-Type", STREAM_CONTENT_TYPE)]) else {
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
        Err(e) => {
            if w.send(&end_of_stream(Some(&e))).is_ok() {
                let _ = w.finish();
            }
        }
    }
}

/// How a stream ended.
enum Pumped {
    /// Ended with an end-of-stream message; the body can be finished.
    Done,
    /// Cut without one (a dropped stream, a stopped emulator, a dead client).
    Cut,
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
) -> std::io::Result<Pumped> {
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
            w.send(&message_envelope(&end.to_event()))?;
            w.send(&end_of_stream(None))?;
            return Ok(Pumped::Done);
        }
        Subscription::Live(rx) => rx,
    };
    let far = Duration::from_secs(3600);
    let mut next_ping = Instant::now() + opts.keepalive;
    loop {
        let now = Instant::now();
        let wake = plan.deadline.map_or(next_ping, |d| d.min(next_ping));
        let event = select! {
            recv(rx) -> ev => ev,
            recv(shared.stop_rx) -> _ => return Ok(Pumped::Cut),
            default(wake.saturating_duration_since(now).min(far)) => {
                if plan.deadline.is_some_and(|d| Instant::now() >= d) {
                    w.send(&end_of_stream(Some(&RpcError::new(
                        Code::DeadlineExceeded,
                        "the operation timed out (Connect-Timeout-Ms)",
                    ))))?;
                    return Ok(Pumped::Done);
                }
                if spend(&mut budget) {
                    return Ok(Pumped::Cut);
                }
                w.send(&message_envelope(&json!({"event": {"keepalive": {}}})))?;
                next_ping = Instant::now() + opts.keepalive;
                continue;
            }
        };
        match event {
            Ok(HubEvent::Stdout(d)) | Ok(HubEvent::Stderr(d)) if spend(&mut budget) => {
                drop(d);
                return Ok(Pumped::Cut);
            }
            Ok(HubEvent::Stdout(d)) => {
                w.send(&message_envelope(
                    &json!({"event": {"data": {"stdout": encode_bytes(&d)}}}),
                ))?;
                next_ping = Instant::now() + opts.keepalive;
            }
            Ok(HubEvent::Stderr(d)) => {
                w.send(&message_envelope(
                    &json!({"event": {"data": {"stderr": encode_bytes(&d)}}}),
                ))?;
                next_ping = Instant::now() + opts.keepalive;
            }
            Ok(HubEvent::End(end)) => {
                if budget.is_some() {
                    return Ok(Pumped::Cut);
                }
                if plan.deadline.is_some_and(|d| Instant::now() >= d) {
                    // The deadline kill won the race with the exit: report the deadline.
                    w.send(&end_of_stream(Some(&RpcError::new(
                        Code::DeadlineExceeded,
                        "the operation timed out (Connect-Timeout-Ms)",
                    ))))?;
                    return Ok(Pumped::Done);
                }
                w.send(&message_envelope(&end.to_event()))?;
                w.send(&end_of_stream(None))?;
                return Ok(Pumped::Done);
            }
            Err(_) => {
                if shared.is_stopping() {
                    return Ok(Pumped::Cut);
                }
                w.send(&end_of_stream(Some(&RpcError::new(
                    Code::Aborted,
                    "the stream fell too far behind the process and was detached",
                ))))?;
                return Ok(Pumped::Done);
            }
        }
    }
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

fn start(
    shared: &Shared,
    entry: &Arc<SandboxEntry>,
    msg: &Value,
    opts: &StreamOpts,
) -> RpcResult<StreamPlan> {
    let invalid = |m: String| RpcError::new(Code::InvalidArgument, m);
    let process = field(msg, "process", "process")
        .filter(|p| p.is_object())
        .ok_or_else(|| invalid("process is required".into()))?;
    let cmd = string_field(process, "cmd", "cmd")?
        .filter(|c| !c.is_empty())
        .ok_or_else(|| invalid("process.cmd is required".into()))?;
    let args = string_list(process, "args", "args")?;
    let envs = string_map(process, "envs", "envs")?;
    let cwd = string_field(process, "cwd", "cwd")?;
    let tag = string_field(msg, "tag", "tag")?;
    // Absent means a stdin pipe, as envd keeps it for old clients.
    let stdin = bool_field(msg, "stdin", "stdin")?.unwrap_or(true);
    if field(msg, "pty", "pty").is_some() {
        return Err(RpcError::new(
            Code::Unimplemented,
            "PTY processes are not supported by the wmo-e2b emulator",
        ));
    }
    let local_cwd = match &cwd {
        None => None,
        Some(c) => {
            let path = paths::normalize(c, opts.role).map_err(|e| invalid(e.to_string()))?;
            let missing = || invalid(format!("cwd '{path}' does not exist"));
            // The sandbox's own directories are checked where they are; of the read-only
            // system directories only `/` is a sensible place to start in.
            if path != "/" {
                let real = super::files::resolve(entry, &path, super::files::Follow::All)
                    .map_err(|_| missing())?;
                let (files, rel) = entry.sandbox.files(&real).map_err(|_| missing())?;
                if !files.metadata(&rel).is_ok_and(|m| m.is_dir()) {
                    return Err(missing());
                }
            }
            Some(path)
        }
    };
    prune(entry);
    if lock(&entry.procs).len() >= MAX_PROCS {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("too many processes in this sandbox (at most {MAX_PROCS})"),
        ));
    }
    // envd's global variables first, so the request's own `envs` win.
    let mut all_envs = vec![
        ("E2B_SANDBOX".to_string(), "true".to_string()),
        ("E2B_SANDBOX_ID".to_string(), entry.id.clone()),
        ("E2B_TEMPLATE_ID".to_string(), entry.template.clone()),
    ];
    all_envs.extend(envs.iter().cloned());
    // `exec` so the pid we report is the process the client asked for.
    let line = std::iter::once(&cmd)
        .chain(&args)
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ");
    let spawned = entry.sandbox.spawn(
        &format!("exec {line}"),
        &SpawnOpts {
            role: opts.role,
            cwd: local_cwd,
            envs: all_envs,
            stdin,
        },
    );
    let process = spawned.map_err(|e| match e {
        SandboxError::Gone { .. } => RpcError::new(Code::Unavailable, e.to_string()),
        other => invalid(format!("error starting process: {other}")),
    })?;
    let mut config = Map::new();
    config.insert("cmd".into(), json!(cmd));
    if !args.is_empty() {
        config.insert("args".into(), json!(args));
    }
    if !envs.is_empty() {
        let m: Map<String, Value> = envs.into_iter().map(|(k, v)| (k, json!(v))).collect();
        config.insert("envs".into(), Value::Object(m));
    }
    if let Some(c) = cwd {
        config.insert("cwd".into(), json!(c));
    }
    let pid = process.pid;
    let hub = Arc::new(ProcHub {
        pid,
        tag,
        config: Value::Object(config),
        stdin_open: AtomicBool::new(stdin),
        state: Mutex::default(),
    });
    // Subscribed before the hub reads anything, so this stream sees all output.
    let sub = hub.subscribe();
    lock(&entry.procs).insert(pid, Arc::clone(&hub));
    let follower = Arc::clone(&hub);
    let sandbox = Arc::clone(&entry.sandbox);
    let stop = shared.stop_rx.clone();
    let kill_at = opts.deadline;
    let events = process.events;
    let spawned = std::thread::Builder::new()
        .name(format!("emu-proc-{pid}"))
        .spawn(move || run_hub(&follower, &events, kill_at, &sandbox, &stop));
    if let Err(e) = spawned {
        let _ = entry.sandbox.kill_process(pid);
        lock(&entry.procs).remove(&pid);
        return Err(RpcError::new(
            Code::Internal,
            format!("cannot follow the process: {e}"),
        ));
    }
    Ok(StreamPlan {
        pid,
        stdin,
        sub,
        deadline: opts.deadline,
    })
}

fn connect(
    _shared: &Shared,
    entry: &Arc<SandboxEntry>,
    msg: &Value,
    opts: &StreamOpts,
) -> RpcResult<StreamPlan> {
    prune(entry);
    let hub = select_process(entry, msg, false)?;
    Ok(StreamPlan {
        pid: hub.pid,
        stdin: hub.stdin_open.load(Ordering::SeqCst),
        sub: hub.subscribe(),
        deadline: opts.deadline,
    })
}

/// Drops processes that ended longer ago than the retention window.
fn prune(entry: &SandboxEntry) {
    let now = Instant::now();
    lock(&entry.procs).retain(|_, hub| !hub.expired(now));
}

/// The process a `ProcessSelector` (`{"pid": N}` or `{"tag": "t"}`) names; `running` skips
/// ended ones.
fn select_process(entry: &SandboxEntry, msg: &Value, running: bool) -> RpcResult<Arc<ProcHub>> {
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

fn list(entry: &SandboxEntry) -> RpcResult<Value> {
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

fn process_error(pid: u32, e: &SandboxError, what: &str) -> RpcError {
    match e {
        SandboxError::NoSuchProcess { .. } => {
            RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
        }
        SandboxError::Gone { .. } => RpcError::new(Code::Unavailable, e.to_string()),
        other => RpcError::new(
            Code::Internal,
            format!("{what}: {}", crate::errors::error_chain(other)),
        ),
    }
}

/// StreamInput, the client-streaming twin of SendInput. The request body is read whole
/// before this runs, so the input reaches the process when the client finishes sending
/// rather than chunk by chunk; the bytes and their order are the same.
fn stream_input(shared: &Shared, entry: &SandboxEntry, req: &Request, out: &mut Responder<'_>) {
    if let Err(resp) = check_stream_protocol(req) {
        send(out, resp);
        return;
    }
    shared.streams.fetch_add(1, Ordering::SeqCst);
    let result = rpc_user(req).and_then(|_| apply_input_stream(entry, &req.body));
    let Ok(mut w) = out.stream(200, &[("Content-Type", STREAM_CONTENT_TYPE)]) else {
        return;
    };
    let sent = match result {
        Ok(()) => w
            .send(&message_envelope(&json!({})))
            .and_then(|()| w.send(&end_of_stream(None))),
        Err(e) => w.send(&end_of_stream(Some(&e))),
    };
    if sent.is_ok() {
        let _ = w.finish();
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

fn send_input(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
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

fn close_stdin(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let hub = select_process(entry, msg, true)?;
    hub.stdin_open.store(false, Ordering::SeqCst);
    entry
        .sandbox
        .close_stdin(hub.pid)
        .map_err(|e| process_error(hub.pid, &e, "error closing stdin"))?;
    Ok(json!({}))
}

fn send_signal(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
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

fn update(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let _hub = select_process(entry, msg, true)?;
    if field(msg, "pty", "pty").is_some() {
        return Err(RpcError::new(
            Code::Internal,
            "error resizing pty: the process has no PTY",
        ));
    }
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_omit_zero_values() {
        assert_eq!(
            EndInfo::from_exit(Some(0)).to_event(),
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
        );
        assert_eq!(
            EndInfo::from_exit(Some(3)).to_event(),
            json!({"event": {"end": {"exitCode": 3, "exited": true,
                "status": "exit status 3", "error": "exit status 3"}}})
        );
        assert_eq!(
            EndInfo::from_exit(None).to_event(),
            json!({"event": {"end": {"exitCode": -1, "status": "signal: killed",
                "error": "signal: killed"}}})
        );
    }

    #[test]
    fn drop_budget() {
        let mut b = Some(1);
        assert!(!spend(&mut b));
        assert!(spend(&mut b));
        let mut none = None;
        assert!(!spend(&mut none));
    }
}
