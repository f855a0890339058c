//! What the control plane answers with: its errors, and the sandbox objects of create,
//! connect, get and list.

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{json, Value};

use crate::emulator::config::{CLIENT_ID, ENVD_VERSION};
use crate::emulator::http::Response;
use crate::emulator::state::{SandboxEntry, Shared};
use crate::errors::error_chain;
use crate::sandbox::{ErrorClass, RunState, SandboxError};
use crate::sync::lock;

/// Reported in sandbox details; the local backend has no such limits, so these are E2B's
/// defaults for the base template.
const CPU_COUNT: u32 = 2;
const MEMORY_MB: u32 = 512;
const DISK_MB: u32 = 10 * 1024;

/// A handler's answer. Failures are answers too; as `Err` they can leave a handler early
/// through `?`.
pub(super) type Answer = Result<Response, Response>;

pub(super) fn not_found(id: &str) -> Response {
    Response::error(
        404,
        format!("Sandbox \"{id}\" doesn't exist or you don't have access to it"),
    )
}

/// The sandbox `id` names if it is alive (running or paused), or the 404 E2B answers.
pub(super) fn live(shared: &Shared, id: &str) -> Result<(Arc<SandboxEntry>, RunState), Response> {
    shared.lookup(id).ok_or_else(|| not_found(id))
}

/// The sandbox `id` names if it runs: E2B's calls on a running sandbox (timeout, refresh,
/// network) find no paused one, and answer 404 for it as for a missing one.
pub(super) fn running(shared: &Shared, id: &str) -> Result<Arc<SandboxEntry>, Response> {
    match live(shared, id)? {
        (e, RunState::Running) => Ok(e),
        (_, RunState::Paused) => Err(Response::error(
            404,
            format!("Sandbox \"{id}\" is paused, not running; connect to it to resume it"),
        )),
    }
}

/// The 429 of a create or resume past the limit on running sandboxes.
pub(super) fn at_limit(max: usize) -> Response {
    Response::error(
        429,
        format!(
            "you have reached the maximum number of concurrent E2B sandboxes ({max}). \
             If you need more, start the emulator with a higher limit"
        ),
    )
}

/// The answer while the emulator shuts down.
pub(super) fn stopping() -> Response {
    Response::error(503, "the emulator is stopping")
}

/// Maps a backend failure to a status: a host that cannot lock the network is 501, a
/// sandbox that vanished 404, a bad request 400, the rest 500.
pub(super) fn backend_error(id: &str, e: &SandboxError) -> Response {
    match e.class() {
        ErrorClass::Unsupported => Response::error(501, error_chain(e)),
        ErrorClass::Gone => not_found(id),
        ErrorClass::BadRequest => Response::error(400, error_chain(e)),
        _ => Response::error(500, error_chain(e)),
    }
}

/// The `Sandbox` object create and connect answer with.
pub(super) fn sandbox_json(e: &SandboxEntry) -> Value {
    let mut v = json!({
        "templateID": e.template,
        "sandboxID": e.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        // Null: the SDK then builds envd URLs from its own settings (E2B_SANDBOX_URL).
        "domain": null,
        "trafficAccessToken": e.traffic_token,
    });
    if let Some(token) = &e.token {
        v["envdAccessToken"] = json!(token);
    }
    v
}

/// The keys `ListedSandbox` requires, plus metadata.
pub(super) fn listed_json(e: &SandboxEntry, state: RunState) -> Value {
    json!({
        "templateID": e.template,
        "sandboxID": e.id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(e.started),
        "endAt": rfc3339(*lock(&e.deadline)),
        "cpuCount": CPU_COUNT,
        "memoryMB": MEMORY_MB,
        "diskSizeMB": DISK_MB,
        "state": state.as_str(),
        "envdVersion": ENVD_VERSION,
        "metadata": e.metadata,
    })
}

pub(super) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
