//! The control plane: create, connect, get, list, kill, timeout, network, and the stats
//! endpoint. Shapes and statuses follow `shared/docs/e2b-wire.md` §1–§2; every error body is
//! `{"code": <status>, "message": "..."}` because the SDK's parsers require both keys.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Map, Value};

use super::faults::CreateFault;
use super::http::{query_unescape_strict, Request, Response};
use super::server::{NetworkState, SandboxEntry, Shared, CLIENT_ID, ENVD_VERSION};
use crate::errors::error_chain;
use crate::sandbox::{Backend, CreateSpec, ErrorClass, Killed, Metadata, Sandbox, SandboxError};
use crate::sync::lock;

/// The longest timeout E2B accepts (a Pro team's 24 h).
const MAX_TIMEOUT_SECS: i64 = 24 * 3600;
/// Default sandbox lifetime when a v1 create omits `timeout` (the infra API's default).
const V1_DEFAULT_TIMEOUT: i64 = 15;
/// Default when a v2 create or a connect omits it.
const V2_DEFAULT_TIMEOUT: i64 = 300;
const MAX_PAGE: usize = 100;

/// Reported in sandbox details; the local backend has no such limits, so these are E2B's
/// defaults for the base template.
const CPU_COUNT: u32 = 2;
const MEMORY_MB: u32 = 512;
const DISK_MB: u32 = 10 * 1024;

pub(super) fn api_error(status: u16, message: impl Into<String>) -> Response {
    Response::json(status, &json!({"code": status, "message": message.into()}))
}

fn api_error_code(status: u16, code: &str, message: impl Into<String>) -> Response {
    Response::json(
        status,
        &json!({"code": status, "message": message.into(), "error_code": code}),
    )
}

fn not_found(id: &str) -> Response {
    api_error(
        404,
        format!("Sandbox \"{id}\" doesn't exist or you don't have access to it"),
    )
}

/// Checks a control-plane request from its head alone, before its body is read: a request
/// without the key is answered 401 without taking in a body of up to 256 MiB first.
pub(super) fn admit(shared: &Shared, head: &Request) -> Option<Response> {
    if is_health(head) || authorized(shared, head) {
        None
    } else {
        Some(api_error(401, "Invalid API key"))
    }
}

/// The API's own health check, which needs no key.
fn is_health(req: &Request) -> bool {
    req.method == "GET" && req.path.trim_matches('/') == "health"
}

pub(super) fn handle(shared: &Shared, req: &Request) -> Response {
    let segments: Vec<&str> = req
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let method = req.method.as_str();
    if is_health(req) {
        return Response::empty(204);
    }
    // Also checked by `admit` before the body was read; kept so `handle` stands alone.
    if let Some(refused) = admit(shared, req) {
        return refused;
    }
    match (method, segments.as_slice()) {
        ("POST", ["sandboxes"]) => create(shared, req, Version::V1),
        ("POST", ["v2", "sandboxes"]) => create(shared, req, Version::V2),
        ("GET", ["sandboxes"]) => list_v1(shared, req),
        ("GET", ["v2", "sandboxes"]) => list_v2(shared, req),
        ("GET", ["_emulator", "stats"]) => stats(shared),
        (_, ["sandboxes", raw, rest @ ..]) | (_, ["v2", "sandboxes", raw, rest @ ..]) => {
            let v2 = segments[0] == "v2";
            let id = match sandbox_id(raw) {
                Ok(id) => id,
                Err(resp) => return resp,
            };
            match (method, rest, v2) {
                ("GET", [], false) => detail(shared, id),
                ("DELETE", [], false) => kill(shared, id),
                ("POST", ["connect"], _) => connect(shared, req, id),
                ("POST", ["timeout"], false) => set_timeout(shared, req, id),
                ("POST", ["refreshes"], false) => refresh(shared, req, id),
                ("POST", ["pause"], false) => pause(shared, id),
                ("POST", ["resume"], false) => resume(shared, id),
                ("PUT", ["network"], false) => network(shared, req, id),
                _ => route_not_found(req),
            }
        }
        _ => route_not_found(req),
    }
}

fn route_not_found(req: &Request) -> Response {
    api_error(
        404,
        format!(
            "{} {} is not served by the wmo-e2b emulator",
            req.method, req.path
        ),
    )
}

fn authorized(shared: &Shared, req: &Request) -> bool {
    req.header("x-api-key")
        .is_some_and(|k| constant_time_eq(k.as_bytes(), shared.config.api_key.as_bytes()))
}

/// Compares without an early exit, so timing does not reveal how much of a key matched.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Accepts the legacy `<sandboxID>-<clientID>` form like the real API.
fn sandbox_id(raw: &str) -> Result<&str, Response> {
    match raw.split('-').count() {
        1 => Ok(raw),
        2 => Ok(raw.split('-').next().unwrap_or(raw)),
        _ => Err(api_error(400, "Invalid sandbox ID")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

fn body_object(req: &Request) -> Result<Map<String, Value>, Response> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(api_error(400, "the request body must be a JSON object")),
        Err(e) => Err(api_error(400, format!("the request body is not JSON: {e}"))),
    }
}

fn present<'a>(body: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

fn int_of(body: &Map<String, Value>, key: &str) -> Result<Option<i64>, Response> {
    match present(body, key) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| api_error(400, format!("{key} must be an integer"))),
    }
}

fn bool_of(body: &Map<String, Value>, key: &str) -> Result<Option<bool>, Response> {
    match present(body, key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| api_error(400, format!("{key} must be a boolean"))),
    }
}

fn string_map(body: &Map<String, Value>, key: &str) -> Result<BTreeMap<String, String>, Response> {
    match present(body, key) {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(api_error(400, format!("{key}.{k} must be a string"))),
            })
            .collect(),
        Some(_) => Err(api_error(
            400,
            format!("{key} must be an object of strings"),
        )),
    }
}

fn string_list(obj: &Map<String, Value>, key: &str) -> Result<Vec<String>, Response> {
    match present(obj, key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| api_error(400, format!("{key} must be a list of strings")))
            })
            .collect(),
        Some(_) => Err(api_error(400, format!("{key} must be a list of strings"))),
    }
}

fn timeout_secs(value: Option<i64>, default: i64) -> Result<u64, Response> {
    let t = value.unwrap_or(default);
    if t <= 0 {
        return Err(api_error(
            400,
            "timeout must be a positive number of seconds",
        ));
    }
    if t > MAX_TIMEOUT_SECS {
        return Err(api_error(
            400,
            format!(
                "timeout cannot be greater than {} hours",
                MAX_TIMEOUT_SECS / 3600
            ),
        ));
    }
    Ok(t as u64)
}

/// The egress a create or network update asks for. The local backend can only allow or deny
/// everything, so anything finer is refused rather than silently widened.
fn egress(allow_internet: Option<bool>, network: Option<&Value>) -> Result<NetworkState, Response> {
    let empty = Map::new();
    let net = match network {
        None => &empty,
        Some(Value::Object(m)) => m,
        Some(_) => return Err(api_error(400, "network must be an object")),
    };
    let allow_out = string_list(net, "allowOut")?;
    let deny_out = string_list(net, "denyOut")?;
    if present(net, "egressProxy").is_some() {
        return Err(api_error(
            403,
            "an egress proxy is not supported by the wmo-e2b emulator",
        ));
    }
    if present(net, "rules").is_some_and(|r| r.as_object().is_some_and(|m| !m.is_empty())) {
        return Err(api_error(
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
        return Err(api_error(
            400,
            "the wmo-e2b emulator can only allow or deny all egress \
             (allow_internet_access, or denyOut [\"0.0.0.0/0\"] with no allowOut)",
        ));
    }
    Ok(NetworkState {
        internet: !deny_all,
        allow_out,
        deny_out,
    })
}

/// Maps a backend failure to a status: a host that cannot lock the network is 501, a
/// sandbox that vanished 404, a bad request 400, the rest 500.
fn backend_error(id: &str, e: &SandboxError) -> Response {
    match e.class() {
        ErrorClass::Unsupported => api_error(501, error_chain(e)),
        ErrorClass::Gone => not_found(id),
        ErrorClass::BadRequest => api_error(400, error_chain(e)),
        _ => api_error(500, error_chain(e)),
    }
}

fn create(shared: &Shared, req: &Request, version: Version) -> Response {
    shared.creates.fetch_add(1, Ordering::SeqCst);
    let delay = shared.faults.create_delay();
    if !delay.is_zero() && !shared.sleep(delay) {
        return api_error(503, "the emulator is stopping");
    }
    match shared.faults.create() {
        CreateFault::None => {}
        CreateFault::RateLimited => {
            return api_error(429, "Rate limit exceeded")
                .with_header("Retry-After", "1")
                .with_header("RateLimit-Limit", "20")
                .with_header("RateLimit-Remaining", "0")
                .with_header("RateLimit-Reset", "1")
        }
        CreateFault::NoCapacity => {
            return api_error_code(
                503,
                "sandbox_capacity_unavailable",
                "Failed to place sandbox: not enough capacity (injected by the emulator)",
            )
        }
    }
    let body = match body_object(req) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    match create_sandbox(shared, &body, version) {
        Ok(entry) => Response::json(201, &sandbox_json(&entry)),
        Err(resp) => resp,
    }
}

fn create_sandbox(
    shared: &Shared,
    body: &Map<String, Value>,
    version: Version,
) -> Result<Arc<SandboxEntry>, Response> {
    let template = match present(body, "templateID") {
        Some(Value::String(t)) if !t.is_empty() => t.clone(),
        Some(_) => return Err(api_error(400, "templateID must be a non-empty string")),
        None => return Err(api_error(400, "templateID is required")),
    };
    let default = match version {
        Version::V1 => V1_DEFAULT_TIMEOUT,
        Version::V2 => V2_DEFAULT_TIMEOUT,
    };
    let timeout = timeout_secs(int_of(body, "timeout")?, default)?;
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
    if bool_of(body, "autoPause")? == Some(true) {
        return Err(api_error(
            400,
            "autoPause is not supported by the wmo-e2b emulator (local sandboxes cannot pause)",
        ));
    }
    if present(body, "mcp").is_some() {
        return Err(api_error(
            400,
            "mcp is not supported by the wmo-e2b emulator",
        ));
    }
    if present(body, "volumeMounts").is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())) {
        return Err(api_error(
            400,
            "volumeMounts are not supported by the wmo-e2b emulator",
        ));
    }

    // Reserve a slot so concurrent creates cannot overshoot the limit.
    shared.purge_dead();
    {
        let mut table = lock(&shared.table);
        if table.closed {
            return Err(api_error(503, "the emulator is stopping"));
        }
        let max = shared.config.max_sandboxes;
        if table.map.len() + table.pending >= max {
            return Err(api_error(
                429,
                format!(
                    "you have reached the maximum number of concurrent E2B sandboxes ({max}). \
                     If you need more, start the emulator with a higher limit"
                ),
            ));
        }
        table.pending += 1;
    }
    let spec = CreateSpec {
        template: Some(template.clone()),
        timeout_secs: timeout,
        metadata: metadata.clone(),
        envs: env_vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        internet: net.internet,
    };
    let created = shared.backend.create_local(&spec);
    let token = if secure {
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
        template,
        token,
        started,
        deadline: Mutex::new(started + Duration::from_secs(timeout)),
        metadata,
        env_vars,
        network: Mutex::new(net),
        procs: Mutex::default(),
    });
    if table.closed {
        drop(table);
        // Stop already swept the table; this sandbox must not outlive the emulator.
        let _ = shared.backend.kill(&local_id);
        return Err(api_error(503, "the emulator is stopping"));
    }
    table.map.insert(id, Arc::clone(&entry));
    Ok(entry)
}

/// The `Sandbox` object create and connect answer with.
fn sandbox_json(e: &SandboxEntry) -> Value {
    let mut v = json!({
        "templateID": e.template,
        "sandboxID": e.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        // Null: the SDK then builds envd URLs from its own settings (E2B_SANDBOX_URL).
        "domain": null,
        "trafficAccessToken": null,
    });
    if let Some(token) = &e.token {
        v["envdAccessToken"] = json!(token);
    }
    v
}

/// The keys `ListedSandbox` requires, plus metadata.
fn listed_json(e: &SandboxEntry) -> Value {
    json!({
        "templateID": e.template,
        "sandboxID": e.id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(e.started),
        "endAt": rfc3339(*lock(&e.deadline)),
        "cpuCount": CPU_COUNT,
        "memoryMB": MEMORY_MB,
        "diskSizeMB": DISK_MB,
        "state": "running",
        "envdVersion": ENVD_VERSION,
        "metadata": e.metadata,
    })
}

fn detail(shared: &Shared, id: &str) -> Response {
    let Some(e) = shared.live_sandbox(id) else {
        return not_found(id);
    };
    let mut v = listed_json(&e);
    let net = lock(&e.network).clone();
    v["domain"] = Value::Null;
    v["allowInternetAccess"] = json!(net.internet);
    v["network"] = json!({"allowOut": net.allow_out, "denyOut": net.deny_out});
    v["lifecycle"] = json!({"autoResume": false, "onTimeout": "kill"});
    if let Some(token) = &e.token {
        v["envdAccessToken"] = json!(token);
    }
    Response::json(200, &v)
}

fn connect(shared: &Shared, req: &Request, id: &str) -> Response {
    let body = match body_object(req) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let Some(e) = shared.live_sandbox(id) else {
        return not_found(id);
    };
    let secs = match int_of(&body, "timeout").and_then(|t| timeout_secs(t, V2_DEFAULT_TIMEOUT)) {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    // Connect only ever extends the lifetime.
    let wanted = SystemTime::now() + Duration::from_secs(secs);
    if wanted > *lock(&e.deadline) {
        if let Err(err) = e.set_deadline(secs) {
            return backend_error(id, &err);
        }
    }
    Response::json(200, &sandbox_json(&e))
}

fn kill(shared: &Shared, id: &str) -> Response {
    let Some(e) = shared.live_sandbox(id) else {
        return not_found(id);
    };
    if shared.faults.kill_fail() {
        return api_error(
            500,
            "the kill failed (injected by the emulator; the sandbox is still running)",
        );
    }
    match shared.backend.kill(&e.local_id) {
        Ok(Killed::Now) => {
            shared.forget(id);
            Response::empty(204)
        }
        Ok(Killed::AlreadyGone) => {
            shared.forget(id);
            not_found(id)
        }
        Err(err) => api_error(
            500,
            format!("cannot kill the sandbox: {}", error_chain(&err)),
        ),
    }
}

fn set_timeout(shared: &Shared, req: &Request, id: &str) -> Response {
    let body = match body_object(req) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let secs = match int_of(&body, "timeout") {
        Ok(Some(t)) if t > MAX_TIMEOUT_SECS => {
            return api_error(
                400,
                format!(
                    "timeout cannot be greater than {} hours",
                    MAX_TIMEOUT_SECS / 3600
                ),
            )
        }
        // The real API clamps a negative timeout to zero: the sandbox dies now.
        Ok(Some(t)) => t.max(0) as u64,
        Ok(None) => return api_error(400, "timeout is required"),
        Err(resp) => return resp,
    };
    let Some(e) = shared.live_sandbox(id) else {
        return not_found(id);
    };
    match e.set_deadline(secs) {
        Ok(()) => Response::empty(204),
        Err(err) => backend_error(id, &err),
    }
}

fn refresh(shared: &Shared, req: &Request, id: &str) -> Response {
    let body = match body_object(req) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let secs = match int_of(&body, "duration") {
        Ok(Some(d)) if !(0..=3600).contains(&d) => {
            return api_error(400, "duration must be between 0 and 3600 seconds")
        }
        Ok(d) => d.unwrap_or(V2_DEFAULT_TIMEOUT) as u64,
        Err(resp) => return resp,
    };
    let Some(e) = shared.live_sandbox(id) else {
        return not_found(id);
    };
    let wanted = SystemTime::now() + Duration::from_secs(secs);
    if wanted > *lock(&e.deadline) {
        if let Err(err) = e.set_deadline(secs) {
            return backend_error(id, &err);
        }
    }
    Response::empty(204)
}

fn pause(shared: &Shared, id: &str) -> Response {
    if shared.live_sandbox(id).is_none() {
        return not_found(id);
    }
    // Not 409: the SDK reads 409 as "already paused" and returns False, hiding the truth.
    api_error(
        501,
        "pausing is not supported by the wmo-e2b emulator (local sandboxes cannot be paused)",
    )
}

fn resume(shared: &Shared, id: &str) -> Response {
    if shared.live_sandbox(id).is_none() {
        return not_found(id);
    }
    api_error(409, format!("Sandbox {id} is already running"))
}

fn network(shared: &Shared, req: &Request, id: &str) -> Response {
    let body = match body_object(req) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let allow = match bool_of(&body, "allow_internet_access") {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    // The update body is the network object itself.
    let net = match egress(allow, Some(&Value::Object(body.clone()))) {
        Ok(n) => n,
        Err(resp) => return resp,
    };
    let Some(e) = shared.live_sandbox(id) else {
        return not_found(id);
    };
    if let Err(err) = e.sandbox.set_internet(net.internet) {
        return backend_error(id, &err);
    }
    *lock(&e.network) = net;
    Response::empty(204)
}

fn stats(shared: &Shared) -> Response {
    match serde_json::to_value(shared.stats()) {
        Ok(v) => Response::json(200, &v),
        Err(e) => api_error(500, format!("cannot encode the stats: {e}")),
    }
}

/// Live sandboxes of this emulator, each with the metadata it was created with.
fn live_entries(shared: &Shared) -> Result<Vec<Arc<SandboxEntry>>, Response> {
    // The backend's list also kills whatever passed its deadline.
    let live = shared
        .backend
        .list(&Metadata::new())
        .map_err(|e| api_error(500, format!("cannot list sandboxes: {}", error_chain(&e))))?;
    let live: HashSet<String> = live.into_iter().map(|s| s.id).collect();
    let table = lock(&shared.table);
    Ok(table
        .map
        .values()
        .filter(|e| live.contains(&e.local_id))
        .cloned()
        .collect())
}

/// Decodes the `metadata` query value the way the API does: the value (already
/// query-decoded once) is unescaped again as a whole, split into `k=v` pairs on `&`, and each
/// key and value unescaped once more.
fn metadata_filter(raw: Option<&str>) -> Result<Metadata, Response> {
    let mut filter = Metadata::new();
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(filter);
    };
    let bad = || api_error(400, format!("invalid metadata filter {raw:?}"));
    let whole = query_unescape_strict(raw).ok_or_else(bad)?;
    for pair in whole.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(bad)?;
        let k = query_unescape_strict(k).ok_or_else(bad)?;
        let v = query_unescape_strict(v).ok_or_else(bad)?;
        filter.insert(k, v);
    }
    Ok(filter)
}

fn matches(e: &SandboxEntry, filter: &Metadata) -> bool {
    filter.iter().all(|(k, v)| e.metadata.get(k) == Some(v))
}

fn list_v1(shared: &Shared, req: &Request) -> Response {
    let filter = match metadata_filter(req.query("metadata")) {
        Ok(f) => f,
        Err(resp) => return resp,
    };
    let mut entries = match live_entries(shared) {
        Ok(e) => e,
        Err(resp) => return resp,
    };
    entries.retain(|e| matches(e, &filter));
    entries.sort_by(|a, b| (b.started, &b.id).cmp(&(a.started, &a.id)));
    Response::json(
        200,
        &Value::Array(entries.iter().map(|e| listed_json(e)).collect()),
    )
}

/// Where a page starts: after the item with this key, in this order.
fn encode_cursor(e: &SandboxEntry, ascending: bool) -> String {
    let nanos = e
        .started
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let order = if ascending { "asc" } else { "desc" };
    URL_SAFE_NO_PAD.encode(format!("{nanos}__{}__{order}", e.id))
}

fn decode_cursor(token: &str, ascending: bool) -> Option<(SystemTime, String)> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(token.trim_end_matches('=')).ok()?).ok()?;
    let mut parts = text.split("__");
    let nanos: u128 = parts.next()?.parse().ok()?;
    let id = parts.next()?.to_string();
    let order = parts.next()?;
    if parts.next().is_some() || (order == "asc") != ascending {
        return None;
    }
    let nanos = u64::try_from(nanos).ok()?;
    Some((UNIX_EPOCH + Duration::from_nanos(nanos), id))
}

fn list_v2(shared: &Shared, req: &Request) -> Response {
    match list_v2_inner(shared, req) {
        Ok(resp) | Err(resp) => resp,
    }
}

fn list_v2_inner(shared: &Shared, req: &Request) -> Result<Response, Response> {
    let filter = metadata_filter(req.query("metadata"))?;
    // Absent means running and paused; nothing here is ever paused.
    let mut running = true;
    if let Some(states) = req.query("state").filter(|s| !s.is_empty()) {
        running = false;
        for s in states.split(',') {
            match s.trim() {
                "running" => running = true,
                "paused" => {}
                other => return Err(api_error(400, format!("invalid state {other:?}"))),
            }
        }
    }
    let limit = match req.query("limit") {
        None => MAX_PAGE,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(api_error(
                    400,
                    format!("limit must be between 1 and {MAX_PAGE}"),
                ))
            }
        },
    };
    let ascending = match req.query("order") {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(o) => return Err(api_error(400, format!("invalid order {o:?}"))),
    };
    let started_after = match req.query("startedAfter") {
        None => None,
        Some(t) => Some(
            parse_rfc3339(t)
                .ok_or_else(|| api_error(400, format!("invalid startedAfter {t:?}")))?,
        ),
    };
    let template = req.query("template").filter(|t| !t.is_empty());
    let cursor = match req.query("nextToken").filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => {
            Some(decode_cursor(t, ascending).ok_or_else(|| api_error(400, "invalid nextToken"))?)
        }
    };

    let mut entries = if running {
        live_entries(shared)?
    } else {
        Vec::new()
    };
    entries.retain(|e| {
        matches(e, &filter)
            && started_after.is_none_or(|t| e.started >= t)
            && template.is_none_or(|t| e.template == t)
    });
    let total = entries.len();
    entries.sort_by(|a, b| (a.started, &a.id).cmp(&(b.started, &b.id)));
    if !ascending {
        entries.reverse();
    }
    if let Some((t, id)) = &cursor {
        entries.retain(|e| {
            let key = (e.started, &e.id);
            if ascending {
                key > (*t, id)
            } else {
                key < (*t, id)
            }
        });
    }
    let more = entries.len() > limit;
    entries.truncate(limit);
    let mut resp = Response::json(
        200,
        &Value::Array(entries.iter().map(|e| listed_json(e)).collect()),
    );
    if running {
        resp = resp.with_header("X-Total-Running", total.to_string());
    }
    if more {
        if let Some(last) = entries.last() {
            resp = resp.with_header("X-Next-Token", encode_cursor(last, ascending));
        }
    }
    Ok(resp)
}

pub(super) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Parses RFC 3339 date-times with any offset (`Z`, `+02:00`), as the SDK sends them.
pub(super) fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    crate::civil::parse_rfc3339(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_takes_offsets() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        let utc = parse_rfc3339("2024-02-29T12:00:00Z").unwrap();
        assert_eq!(parse_rfc3339("2024-02-29T14:00:00+02:00"), Some(utc));
        assert_eq!(parse_rfc3339("2024-02-29T11:30:00.000000-00:30"), Some(utc));
        assert_eq!(
            utc.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_709_208_000
        );
        for bad in [
            "",
            "2024-02-29",
            "2024-13-01T00:00:00Z",
            "2024-02-29T12:00:00+2",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn metadata_filter_decodes_the_sdk_encoding() {
        // What the Python SDK sends for {"pool": "eval", "a b": "x&y"}, once query-decoded.
        let f = metadata_filter(Some("pool=eval&a%2520b=x%2526y")).unwrap();
        assert_eq!(f.get("pool").map(String::as_str), Some("eval"));
        assert_eq!(f.get("a b").map(String::as_str), Some("x&y"));
        assert!(metadata_filter(Some("novalue")).is_err());
        assert!(metadata_filter(None).unwrap().is_empty());
    }

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
    fn composite_ids() {
        assert_eq!(sandbox_id("lsbabc").ok(), Some("lsbabc"));
        assert_eq!(sandbox_id("lsbabc-6532622b").ok(), Some("lsbabc"));
        assert!(sandbox_id("a-b-c").is_err());
    }
}
