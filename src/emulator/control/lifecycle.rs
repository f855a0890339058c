//! One sandbox's life: get, connect, kill, timeout, refresh, pause, resume, network.

use serde_json::{json, Value};

use super::body::{body_object, bool_of, int_of, timeout_secs, timeout_too_long};
use super::body::{MAX_TIMEOUT_SECS, V2_DEFAULT_TIMEOUT};
use super::create::egress;
use super::reply::{backend_error, listed_json, live, not_found, sandbox_json, Answer};
use crate::emulator::http::{Request, Response};
use crate::emulator::state::Shared;
use crate::errors::error_chain;
use crate::sandbox::{Backend, Killed, Sandbox};
use crate::sync::lock;

pub(super) fn detail(shared: &Shared, id: &str) -> Answer {
    let e = live(shared, id)?;
    let mut v = listed_json(&e);
    let net = lock(&e.network).clone();
    v["domain"] = Value::Null;
    v["allowInternetAccess"] = json!(net.internet);
    v["network"] = json!({"allowOut": net.allow_out, "denyOut": net.deny_out});
    v["lifecycle"] = json!({"autoResume": false, "onTimeout": "kill"});
    if let Some(token) = &e.token {
        v["envdAccessToken"] = json!(token);
    }
    Ok(Response::json(200, &v))
}

pub(super) fn connect(shared: &Shared, req: &Request, id: &str) -> Answer {
    let body = body_object(req)?;
    let e = live(shared, id)?;
    let secs = timeout_secs(int_of(&body, "timeout")?, V2_DEFAULT_TIMEOUT)?;
    e.extend_deadline(secs)
        .map_err(|err| backend_error(id, &err))?;
    Ok(Response::json(200, &sandbox_json(&e)))
}

pub(super) fn kill(shared: &Shared, id: &str) -> Answer {
    let e = live(shared, id)?;
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
        Some(t) if t > MAX_TIMEOUT_SECS => return Err(timeout_too_long()),
        // The real API clamps a negative timeout to zero: the sandbox dies now.
        Some(t) => t.max(0) as u64,
        None => return Err(Response::error(400, "timeout is required")),
    };
    let e = live(shared, id)?;
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
    let e = live(shared, id)?;
    e.extend_deadline(secs)
        .map_err(|err| backend_error(id, &err))?;
    Ok(Response::empty(204))
}

pub(super) fn pause(shared: &Shared, id: &str) -> Answer {
    live(shared, id)?;
    // Not 409: the SDK reads 409 as "already paused" and returns False, hiding the truth.
    Err(Response::error(
        501,
        "pausing is not supported by the wmo-e2b emulator (local sandboxes cannot be paused)",
    ))
}

pub(super) fn resume(shared: &Shared, id: &str) -> Answer {
    live(shared, id)?;
    Err(Response::error(
        409,
        format!("Sandbox {id} is already running"),
    ))
}

pub(super) fn network(shared: &Shared, req: &Request, id: &str) -> Answer {
    let body = body_object(req)?;
    let allow = bool_of(&body, "allow_internet_access")?;
    // The update body is the network object itself.
    let net = egress(allow, Some(&Value::Object(body)))?;
    let e = live(shared, id)?;
    e.sandbox
        .set_internet(net.internet)
        .map_err(|err| backend_error(id, &err))?;
    *lock(&e.network) = net;
    Ok(Response::empty(204))
}
