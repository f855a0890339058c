//! Creating a sandbox (v1 and v2): the body checked, a slot reserved against the limit, the
//! local sandbox created and entered in the table, with the seeded create faults first. A
//! create carrying an `Idempotency-Key` already used answers the sandbox that key made, and
//! one sent while the create with its key runs waits for that one's answer (`keys`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{json, Map, Value};

use super::body::{
    body_object, bool_of, int_of, present, string_list, string_map, timeout_secs,
    V1_DEFAULT_TIMEOUT, V2_DEFAULT_TIMEOUT,
};
use super::reply::{at_limit, backend_error, sandbox_json, stopping, Answer};
use crate::emulator::config::{EmulatorConfig, BASE_TEMPLATE};
use crate::emulator::faults::CreateFault;
use crate::emulator::http::{Request, Response};
use crate::emulator::keys::Claim;
use crate::emulator::state::{Lifecycle, NetworkState, SandboxEntry, Shared};
use crate::emulator::templates::{Found, Templates};
use crate::sandbox::e2b::is_idempotency_key;
use crate::sandbox::{
    Backend, CreateSpec, ImageRoot, Metadata, OnTimeout, PauseKind, RunState, Sandbox,
};
use crate::sync::lock;

/// How much longer than the create delay a repeat waits for the running create with its key.
const KEY_WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    V1,
    V2,
}

pub(super) fn create(shared: &Shared, req: &Request, version: Version) -> Answer {
    shared.creates.fetch_add(1, Ordering::SeqCst);
    // Claimed on arrival, so a repeat sent while this create runs waits for its answer.
    let claim = match idempotency_key(req)? {
        None => None,
        Some(k) => match claim_key(shared, k) {
            Claim::Made(id) => return made(shared, &id),
            Claim::First(guard) => Some(guard),
            Claim::Busy => {
                return Err(Response::error(
                    409,
                    "a create with this Idempotency-Key is still in progress",
                ))
            }
        },
    };
    let delay = shared.faults.create_delay();
    if !delay.is_zero() && !shared.sleep(delay) {
        return Err(stopping());
    }
    match shared.faults.create() {
        CreateFault::None => {}
        CreateFault::RateLimited => return Err(shared.faults.rate_limited()),
        CreateFault::NoCapacity => {
            return Err(shared.faults.hinted(Response::json(
                503,
                &json!({
                    "code": 503,
                    "message": "Failed to place sandbox: not enough capacity (injected by the emulator)",
                    "error_code": "sandbox_capacity_unavailable",
                }),
            )))
        }
    }
    let body = body_object(req)?;
    let wanted = Wanted::read(&body, version, &shared.config, &shared.templates)?;
    let entry = create_sandbox(shared, wanted)?;
    if let Some(guard) = &claim {
        // Keys of sandboxes that are gone can never answer again: the map stays bounded.
        guard.made(&entry.id, |id| lock(&shared.table).map.contains_key(id));
    }
    drop(claim);
    if shared.faults.create_502_after() {
        return Err(shared.faults.hinted(Response::error(
            502,
            "the create's answer was lost (injected by the emulator; the sandbox runs)",
        )));
    }
    Ok(Response::json(201, &sandbox_json(&entry)))
}

/// The request's `Idempotency-Key`, checked against the documented form.
fn idempotency_key(req: &Request) -> Result<Option<&str>, Response> {
    match req.header("idempotency-key") {
        None => Ok(None),
        Some(k) if is_idempotency_key(k) => Ok(Some(k)),
        Some(_) => Err(Response::error(
            400,
            "Idempotency-Key must be 1-255 characters of [a-z0-9-]",
        )),
    }
}

/// Claims `key`, waiting for a running create with it as long as that one may take.
fn claim_key<'a>(shared: &'a Shared, key: &str) -> Claim<'a> {
    let wait = shared.faults.create_delay() + KEY_WAIT;
    shared.keys.claim(
        key,
        |id| shared.live_sandbox(id).is_some(),
        wait,
        || shared.is_stopping(),
    )
}

/// The answer for a key whose create made sandbox `id`.
fn made(shared: &Shared, id: &str) -> Answer {
    match shared.live_sandbox(id) {
        Some(entry) => Ok(Response::json(201, &sandbox_json(&entry))),
        None => Err(Response::error(
            409,
            "the sandbox this Idempotency-Key made is gone",
        )),
    }
}

/// What a create body asks for, checked.
struct Wanted {
    template: String,
    /// The image a built template's sandboxes run on; `None`: the host's own system.
    image: Option<ImageRoot>,
    timeout: u64,
    metadata: Metadata,
    env_vars: BTreeMap<String, String>,
    secure: bool,
    net: NetworkState,
    /// `network.allowPublicTraffic` (default true): false puts the sandbox's ports behind a
    /// traffic access token.
    public_traffic: bool,
    lifecycle: Lifecycle,
}

impl Wanted {
    fn read(
        body: &Map<String, Value>,
        version: Version,
        config: &EmulatorConfig,
        templates: &Templates,
    ) -> Result<Wanted, Response> {
        let template = match present(body, "templateID") {
            Some(Value::String(t)) if !t.is_empty() => t.clone(),
            Some(_) => {
                return Err(Response::error(
                    400,
                    "templateID must be a non-empty string",
                ))
            }
            None => return Err(Response::error(400, "templateID is required")),
        };
        let image = if template == BASE_TEMPLATE || config.templates.contains(&template) {
            None
        } else {
            match templates.for_create(&template) {
                Found::Image(root) => Some(root),
                Found::NotReady => {
                    return Err(Response::error(
                        400,
                        format!("template '{template}' has no finished build"),
                    ))
                }
                Found::Missing => {
                    return Err(Response::error(
                        404,
                        format!("template '{template}' not found"),
                    ))
                }
            }
        };
        let default = match version {
            Version::V1 => V1_DEFAULT_TIMEOUT,
            Version::V2 => V2_DEFAULT_TIMEOUT,
        };
        let timeout = timeout_secs(int_of(body, "timeout")?, default, config.plan)?;
        let metadata: Metadata = string_map(body, "metadata")?;
        let env_vars = string_map(body, "envVars")?;
        let secure = match version {
            Version::V1 => bool_of(body, "secure")?.unwrap_or(false),
            // v2 sandboxes are always secure.
            Version::V2 => true,
        };
        let net = egress(
            bool_of(body, "allow_internet_access")?,
            present(body, "network"),
        )?;
        let public_traffic = match present(body, "network") {
            Some(Value::Object(m)) => bool_of(m, "allowPublicTraffic")?.unwrap_or(true),
            _ => true,
        };
        let lifecycle = lifecycle(body)?;
        // What local sandboxes cannot give is refused, not silently left out.
        let refused = [
            (
                present(body, "mcp").is_some(),
                "mcp is not supported by the wmo-e2b emulator",
            ),
            (
                present(body, "volumeMounts")
                    .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())),
                "volumeMounts are not supported by the wmo-e2b emulator",
            ),
        ];
        if let Some((_, message)) = refused.iter().find(|(asked, _)| *asked) {
            return Err(Response::error(400, *message));
        }
        Ok(Wanted {
            template,
            image,
            timeout,
            metadata,
            env_vars,
            secure,
            net,
            public_traffic,
            lifecycle,
        })
    }
}

/// What a create's `autoPause`, `autoPauseMemory` and `autoResume` ask for (what the SDK's
/// `lifecycle` becomes): a pause at the timeout, full unless `autoPauseMemory` is false, and
/// whether envd traffic wakes the paused sandbox.
fn lifecycle(body: &Map<String, Value>) -> Result<Lifecycle, Response> {
    let auto_pause = bool_of(body, "autoPause")?.unwrap_or(false);
    let memory = bool_of(body, "autoPauseMemory")?.unwrap_or(true);
    let auto_resume = match present(body, "autoResume") {
        None => false,
        Some(Value::Object(m)) => bool_of(m, "enabled")?.unwrap_or(false),
        Some(_) => {
            return Err(Response::error(
                400,
                "autoResume must be an object {\"enabled\": bool}",
            ))
        }
    };
    if auto_resume && !auto_pause {
        return Err(Response::error(
            400,
            "autoResume can only be enabled for a sandbox that pauses at its timeout (autoPause)",
        ));
    }
    if auto_resume && !memory {
        return Err(Response::error(
            400,
            "autoResume cannot wake a filesystem-only pause (autoPauseMemory false): \
             connect to resume it",
        ));
    }
    Ok(Lifecycle {
        pause: auto_pause.then_some(if memory {
            PauseKind::Memory
        } else {
            PauseKind::Filesystem
        }),
        auto_resume,
    })
}

/// The egress a create or network update asks for. The local backend can only allow or deny
/// everything, so anything finer is refused rather than silently widened.
pub(super) fn egress(
    allow_internet: Option<bool>,
    network: Option<&Value>,
) -> Result<NetworkState, Response> {
    let empty = Map::new();
    let net = match network {
        None => &empty,
        Some(Value::Object(m)) => m,
        Some(_) => return Err(Response::error(400, "network must be an object")),
    };
    let allow_out = string_list(net, "allowOut")?;
    let deny_out = string_list(net, "denyOut")?;
    if present(net, "egressProxy").is_some() {
        return Err(Response::error(
            403,
            "an egress proxy is not supported by the wmo-e2b emulator",
        ));
    }
    if present(net, "rules").is_some_and(|r| r.as_object().is_some_and(|m| !m.is_empty())) {
        return Err(Response::error(
            400,
            "network rules are not supported by the wmo-e2b emulator",
        ));
    }
    let deny_all = allow_internet == Some(false) || deny_out.iter().any(|d| d == "0.0.0.0/0");
    let partial = if deny_all {
        !allow_out.is_empty()
    } else {
        !deny_out.is_empty()
    };
    if partial {
        return Err(Response::error(
            400,
            "the wmo-e2b emulator can only allow or deny all egress \
             (allow_internet_access, or denyOut [\"0.0.0.0/0\"] with no allowOut)",
        ));
    }
    Ok(NetworkState {
        internet: !deny_all,
        allow_out,
        deny_out,
        asked_internet: allow_internet,
        asked_network: network.is_some(),
    })
}

/// Reserves a slot so concurrent creates cannot overshoot the limit.
fn reserve_slot(shared: &Shared) -> Result<(), Response> {
    shared.purge_dead();
    // Paused sandboxes do not count against E2B's limit; a resume is checked against it.
    let paused = match shared.live_entries() {
        Ok(live) => live.iter().filter(|(_, s)| *s == RunState::Paused).count(),
        Err(e) => return Err(backend_error("", &e)),
    };
    let mut table = lock(&shared.table);
    if table.closed {
        return Err(stopping());
    }
    let max = shared.config.max_sandboxes;
    if table.map.len().saturating_sub(paused) + table.pending >= max {
        return Err(at_limit(max));
    }
    table.pending += 1;
    Ok(())
}

fn create_sandbox(shared: &Shared, wanted: Wanted) -> Result<Arc<SandboxEntry>, Response> {
    // Never public for want of randomness: no token, no sandbox.
    let traffic_token = match wanted.public_traffic {
        true => None,
        false => Some(crate::id::random_hex(16).map_err(|e| {
            Response::error(500, format!("cannot make a traffic access token: {e}"))
        })?),
    };
    reserve_slot(shared)?;
    let spec = CreateSpec {
        template: Some(wanted.template.clone()),
        timeout_secs: wanted.timeout,
        metadata: wanted.metadata.clone(),
        envs: wanted
            .env_vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        internet: wanted.net.internet,
        on_timeout: wanted
            .lifecycle
            .pause
            .map_or(OnTimeout::Kill, OnTimeout::Pause),
        // E2B has no such limits: a template's resources are its limits.
        limits: crate::sandbox::Limits::default(),
        network: Default::default(),
        image: wanted.image.clone(),
    };
    let created = shared.backend.create_local(&spec);
    let token = if wanted.secure {
        crate::id::random_hex(16).ok()
    } else {
        None
    };
    let mut table = lock(&shared.table);
    table.pending -= 1;
    let sandbox = created.map_err(|e| backend_error("", &e))?;
    let local_id = sandbox.id().to_string();
    let id = local_id.replace('-', "");
    let started = SystemTime::now();
    let entry = Arc::new(SandboxEntry {
        id: id.clone(),
        local_id: local_id.clone(),
        sandbox,
        template: wanted.template,
        token,
        traffic_token,
        started,
        deadline: Mutex::new(started + Duration::from_secs(wanted.timeout)),
        timeout: wanted.timeout,
        lifecycle: wanted.lifecycle,
        metadata: wanted.metadata,
        env_vars: wanted.env_vars,
        network: Mutex::new(wanted.net),
        procs: Mutex::default(),
    });
    if table.closed {
        drop(table);
        // Stop already swept the table; this sandbox must not outlive the emulator.
        let _ = shared.backend.kill(&local_id);
        return Err(stopping());
    }
    table.map.insert(id, Arc::clone(&entry));
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_is_all_or_nothing() {
        assert!(egress(None, None).unwrap().internet);
        assert!(!egress(Some(false), None).unwrap().internet);
        let deny_all = json!({"denyOut": ["0.0.0.0/0"]});
        assert!(!egress(None, Some(&deny_all)).unwrap().internet);
        let partial = json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["1.1.1.1"]});
        assert_eq!(egress(None, Some(&partial)).unwrap_err().status, 400);
        let some = json!({"denyOut": ["10.0.0.0/8"]});
        assert_eq!(egress(None, Some(&some)).unwrap_err().status, 400);
    }

    #[test]
    fn lifecycles_read_as_the_sdk_sends_them() {
        let read = |v: Value| lifecycle(v.as_object().unwrap());
        let none = read(json!({})).unwrap();
        assert_eq!((none.pause, none.auto_resume), (None, false));
        let full = read(json!({"autoPause": true, "autoResume": {"enabled": true}})).unwrap();
        assert_eq!(
            (full.pause, full.auto_resume),
            (Some(PauseKind::Memory), true)
        );
        let fs = read(json!({"autoPause": true, "autoPauseMemory": false})).unwrap();
        assert_eq!(fs.pause, Some(PauseKind::Filesystem));
        for bad in [
            json!({"autoResume": {"enabled": true}}),
            json!({"autoPause": true, "autoPauseMemory": false, "autoResume": {"enabled": true}}),
            json!({"autoPause": "yes"}),
            json!({"autoPause": true, "autoResume": true}),
        ] {
            assert_eq!(read(bad.clone()).unwrap_err().status, 400, "{bad}");
        }
    }
}
