//! Start (spawn a process, give it a hub, attach the call's stream) and Connect (attach a
//! stream to a process started before).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::stream::{StreamOpts, StreamPlan};
use super::table::{prune, select_process};
use crate::emulator::connect::{
    bool_field, field, string_field, string_list, string_map, Code, RpcError, RpcResult,
};
use crate::emulator::envd::files::{resolve, Follow};
use crate::emulator::hub::{follow, FollowOpts, ProcHub};
use crate::emulator::paths;
use crate::emulator::state::{SandboxEntry, Shared};
use crate::sandbox::{shell_quote, Role, Sandbox, SandboxError, SpawnOpts};
use crate::sync::lock;

/// Processes tracked per sandbox (running, or ended within the retention window).
const MAX_PROCS: usize = 1024;

pub(super) fn start(
    shared: &Shared,
    entry: &Arc<SandboxEntry>,
    msg: &Value,
    opts: &StreamOpts,
) -> RpcResult<StreamPlan> {
    let process = field(msg, "process", "process")
        .filter(|p| p.is_object())
        .ok_or_else(|| invalid("process is required"))?;
    let cmd = string_field(process, "cmd", "cmd")?
        .filter(|c| !c.is_empty())
        .ok_or_else(|| invalid("process.cmd is required"))?;
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
        Some(c) => Some(working_dir(entry, c, opts.role)?),
    };
    // E2B's `root` runs in the sandbox's system namespace, on the host's programs (the runner
    // with them). On a template's image, a `root` command that starts in one of the image's
    // own directories (a verifier in the task's working directory; not `/`, where the
    // system's scripts start) runs on the image instead, in the task namespace: in the cloud
    // all of root runs on the image, and the emulator's root is uid 1000 either way.
    let role = match &local_cwd {
        Some(c) if opts.role == Role::System && c != "/" && entry.sandbox.in_image(c) => Role::Task,
        _ => opts.role,
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
            role,
            cwd: local_cwd,
            envs: all_envs,
            stdin,
            network_of: None,
            ends_after: None,
        },
    );
    let process = spawned.map_err(|e| match e {
        SandboxError::Gone { .. } => RpcError::new(Code::Unavailable, e.to_string()),
        other => invalid(format!("error starting process: {other}")),
    })?;
    let pid = process.pid;
    let config = process_config(cmd, args, envs, cwd);
    let hub = Arc::new(ProcHub::new(pid, tag, config, stdin));
    // Subscribed before the hub reads anything, so this stream sees all output.
    let sub = hub.subscribe();
    lock(&entry.procs).insert(pid, Arc::clone(&hub));
    let backend = Arc::clone(&shared.backend);
    let local_id = entry.local_id.clone();
    let how = FollowOpts {
        kill_at: opts.deadline,
        sandbox: Arc::clone(&entry.sandbox),
        // A look that wakes nothing: a process a pause ended must not resume its sandbox.
        sandbox_gone: Box::new(move || {
            matches!(backend.run_state(&local_id), Err(SandboxError::Gone { .. }))
        }),
        stop: shared.stop_rx.clone(),
    };
    let followed = follow(&hub, process.events, how);
    if let Err(e) = followed {
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

pub(super) fn connect(
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

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::new(Code::InvalidArgument, message)
}

/// A Start's `cwd` as an E2B path, which must name a directory.
fn working_dir(entry: &SandboxEntry, cwd: &str, role: Role) -> RpcResult<String> {
    let path = paths::normalize(cwd, role).map_err(|e| invalid(e.to_string()))?;
    let missing = || invalid(format!("cwd '{path}' does not exist"));
    // The sandbox's own directories are checked where they are; of the read-only system
    // directories only `/` is a sensible place to start in. On a template's image, the
    // image's own directories are the task namespace's to find (a command there starts in
    // one, or fails to).
    if path != "/" && !entry.sandbox.in_image(&path) {
        let real = resolve(entry, &path, Follow::All).map_err(|_| missing())?;
        let (files, rel) = entry.sandbox.files(&real).map_err(|_| missing())?;
        if !files.metadata(&rel).is_ok_and(|m| m.is_dir()) {
            return Err(missing());
        }
    }
    Ok(path)
}

/// The `ProcessConfig` as requested, zero values omitted, as `List` reports it back.
fn process_config(
    cmd: String,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    cwd: Option<String>,
) -> Value {
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
    Value::Object(config)
}
