//! One sandbox's life: get, connect, kill, timeout, refresh, pause, resume, network.

use serde_json::{json, Value};

use super::body::V2_DEFAULT_TIMEOUT;
use super::body::{body_object, bool_of, int_of, timeout_secs, timeout_too_long};
use super::create::egress;
use super::reply::{
    at_limit, backend_error, listed_json, live, not_found, running, sandbox_json, Answer,
};
use crate::emulator::http::{Request, Response};
use crate::emulator::state::{SandboxEntry, Shared};
use crate::errors::error_chain;
use crate::sandbox::local::Resume;
use crate::sandbox::{Backend, Killed, PauseKind, Paused, RunState, Sandbox};
use crate::sync::lock;

pub(super) fn detail(shared: &Shared, id: &str) -> Answer {
    let (e, state) = live(shared, id)?;
    let mut v = listed_json(&e, state);
    let net = lock(&e.network).clone();
    v["domain"] = Value::Null;
    // As the API answers: what was asked; `allowInternetAccess` is null where nothing was,
    // and `network` is left out (the SDK parses a present `network` as an object).
    v["allowInternetAccess"] = json!(net.asked_internet);
    if net.asked_network {
        v["network"] = json!({"allowOut": net.allow_out, "denyOut": net.deny_out});
    }
    let on_timeout = if e.lifecycle.pause.is_some() {
        "pause"
    } else {
        "kill"
    };
    v["lifecycle"] = json!({"autoResume": e.lifecycle.auto_resume, "onTimeout": on_timeout});
    if let Some(token) = &e.token {
        v["envdAccessToken"] = json!(token);
    }
    Ok(Response::json(200, &v))
}

/// Connect (v1 and v2): a running sandbox's life is extended to the timeout (200), a paused
/// one is resumed with it (201), rebooted when v2's `memory` is false.
pub(super) fn connect(shared: &Shared, req: &Request, id: &str, v2: bool) -> Answer {
    let body = body_object(req)?;
    // v1's body requires it (the spec's `ConnectSandbox`); v2's is optional.
    if !v2 && !body.contains_key("timeout") {
        return Err(Response::error(400, "timeout is required"));
    }
    let secs = timeout_secs(
        int_of(&body, "timeout")?,
        V2_DEFAULT_TIMEOUT,
        shared.config.plan,
    )?;
    let memory = if v2 { bool_of(&body, "memory")? } else { None };
    let how = match memory {
        Some(false) => Resume::Reboot,
        _ => Resume::AsPaused,
    };
    let (e, state) = live(shared, id)?;
    // Not resumed: another request resumed it meanwhile, and it is a running one.
    if state == RunState::Paused && resume_entry(shared, &e, how, secs)? {
        return Ok(Response::json(201, &sandbox_json(&e)));
    }
    e.extend_deadline(secs)
        .map_err(|err| backend_error(id, &err))?;
    Ok(Response::json(200, &sandbox_json(&e)))
}

/// Resumes a paused sandbox with `secs` to live, within the limit on running sandboxes;
/// false when it ran already.
fn resume_entry(
    shared: &Shared,
    e: &SandboxEntry,
    how: Resume,
    secs: u64,
) -> Result<bool, Response> {
    let max = shared.config.max_sandboxes;
    let running = shared
        .running_count()
        .map_err(|err| backend_error(&e.id, &err))?;
    if running >= max {
        return Err(at_limit(max));
    }
    e.resume(shared, how, secs)
        .map_err(|err| backend_error(&e.id, &err))
}

pub(super) fn kill(shared: &Shared, id: &str) -> Answer {
    let (e, _) = live(shared, id)?;
    if shared.faults.kill_fail() {
        return Err(Response::error(
            500,
            "the kill failed (injected by the emulator; the sandbox is still running)",
        ));
    }
    match shared.backend.kill(&e.local_id) {
        Ok(Killed::Now) => {
            shared.forget(id);
            Ok(Response::empty(204))
        }
        Ok(Killed::AlreadyGone) => {
            shared.forget(id);
            Err(not_found(id))
        }
        Err(err) => Err(Response::error(
            500,
            format!("cannot kill the sandbox: {}", error_chain(&err)),
        )),
    }
}

pub(super) fn set_timeout(shared: &Shared, req: &Request, id: &str) -> Answer {
    let body = body_object(req)?;
    let secs = match int_of(&body, "timeout")? {
        Some(t) if t > shared.config.plan.max_timeout_secs() => {
            return Err(timeout_too_long(shared.config.plan))
        }
        // The real API clamps a negative timeout to zero: the sandbox dies now.
        Some(t) => t.max(0) as u64,
        None => return Err(Response::error(400, "timeout is required")),
    };
    let e = running(shared, id)?;
    e.set_deadline(secs)
        .map_err(|err| backend_error(id, &err))?;
    Ok(Response::empty(204))
}

pub(super) fn refresh(shared: &Shared, req: &Request, id: &str) -> Answer {
    let body = body_object(req)?;
    let secs = match int_of(&body, "duration")? {
        Some(d) if !(0..=3600).contains(&d) => {
            return Err(Response::error(
                400,
                "duration must be between 0 and 3600 seconds",
            ))
        }
        d => d.unwrap_or(V2_DEFAULT_TIMEOUT) as u64,
    };
    let e = running(shared, id)?;
    e.extend_deadline(secs)
        .map_err(|err| backend_error(id, &err))?;
    Ok(Response::empty(204))
}

/// Pause: with its memory (its processes stopped where they are) unless `memory` is false,
/// when only its files stay. 409 when it is paused already.
pub(super) fn pause(shared: &Shared, req: &Request, id: &str) -> Answer {
    let body = body_object(req)?;
    let kind = match bool_of(&body, "memory")? {
        Some(false) => PauseKind::Filesystem,
        _ => PauseKind::Memory,
    };
    // Read for its type only: a local sandbox's envd always answers, so it is always healthy.
    bool_of(&body, "requireHealthyGuest")?;
    let (e, _) = live(shared, id)?;
    match shared.backend.pause(&e.local_id, kind) {
        Ok(Paused::Now) => Ok(Response::empty(204)),
        Ok(Paused::AlreadyPaused) => Err(Response::error(
            409,
            format!("Sandbox {id} is already paused"),
        )),
        Err(err) => Err(backend_error(id, &err)),
    }
}

/// The deprecated resume: 201 with the sandbox resumed, 409 when it runs.
pub(super) fn resume(shared: &Shared, req: &Request, id: &str) -> Answer {
    let body = body_object(req)?;
    let secs = timeout_secs(
        int_of(&body, "timeout")?,
        V2_DEFAULT_TIMEOUT,
        shared.config.plan,
    )?;
    let auto_pause = bool_of(&body, "autoPause")?;
    let (e, state) = live(shared, id)?;
    if auto_pause.is_some_and(|a| a != e.lifecycle.pause.is_some()) {
        return Err(Response::error(
            400,
            "changing autoPause on resume is not supported by the wmo-e2b emulator",
        ));
    }
    if state == RunState::Running || !resume_entry(shared, &e, Resume::AsPaused, secs)? {
        return Err(Response::error(
            409,
            format!("Sandbox {id} is already running"),
        ));
    }
    Ok(Response::json(201, &sandbox_json(&e)))
}

pub(super) fn network(shared: &Shared, req: &Request, id: &str) -> Answer {
    let body = body_object(req)?;
    let allow = bool_of(&body, "allow_internet_access")?;
    // The update body is the network object itself.
    let mut net = egress(allow, Some(&Value::Object(body)))?;
    // An update replaces the whole egress config, so afterwards internet access is decided
    // either way, not merely unasked.
    net.asked_internet = Some(net.internet);
    let e = running(shared, id)?;
    e.sandbox
        .set_internet(net.internet)
        .map_err(|err| backend_error(id, &err))?;
    *lock(&e.network) = net;
    Ok(Response::empty(204))
}
