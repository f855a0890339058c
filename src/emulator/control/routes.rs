//! Which control-plane request goes where, and who may send one.

use super::create::{create, Version};
use super::lifecycle::{connect, detail, kill, network, pause, refresh, resume, set_timeout};
use super::list::{list_v1, list_v2};
use super::reply::Answer;
use crate::emulator::faults::Call;
use crate::emulator::http::{Request, Response};
use crate::emulator::state::Shared;

/// Checks a control-plane request from its head alone, before its body is read: a request
/// without the key is answered 401 without taking in a body of up to 256 MiB first.
pub(in crate::emulator) fn admit(shared: &Shared, head: &Request) -> Option<Response> {
    if is_health(head) || authorized(shared, head) {
        None
    } else {
        Some(Response::error(401, "Invalid API key"))
    }
}

pub(in crate::emulator) fn handle(shared: &Shared, req: &Request) -> Response {
    match route(shared, req) {
        Ok(resp) | Err(resp) => resp,
    }
}

fn route(shared: &Shared, req: &Request) -> Answer {
    if is_health(req) {
        return Ok(Response::empty(204));
    }
    // Also checked by `admit` before the body was read; kept so `handle` stands alone.
    if let Some(refused) = admit(shared, req) {
        return Err(refused);
    }
    let segments: Vec<&str> = req
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let method = req.method.as_str();
    match (method, segments.as_slice()) {
        ("POST", ["sandboxes"]) => create(shared, req, Version::V1),
        ("POST", ["v2", "sandboxes"]) => create(shared, req, Version::V2),
        ("GET", ["sandboxes"]) => limited(shared, Call::List).and_then(|()| list_v1(shared, req)),
        ("GET", ["v2", "sandboxes"]) => {
            limited(shared, Call::List).and_then(|()| list_v2(shared, req))
        }
        ("GET", ["_emulator", "stats"]) => stats(shared),
        // The API's metrics of all sandboxes, not a sandbox named "metrics".
        ("GET", ["sandboxes", "metrics"]) => Err(route_not_found(req)),
        (_, ["sandboxes", raw, rest @ ..]) | (_, ["v2", "sandboxes", raw, rest @ ..]) => {
            let v2 = segments[0] == "v2";
            let id = sandbox_id(raw)?;
            let call = match (method, rest) {
                ("GET", []) => Some(Call::Info),
                ("DELETE", []) => Some(Call::Kill),
                ("POST", ["connect"]) => Some(Call::Connect),
                ("POST", ["timeout"]) => Some(Call::SetTimeout),
                ("PUT", ["network"]) => Some(Call::Network),
                _ => None,
            };
            if let Some(call) = call {
                limited(shared, call)?;
            }
            match (method, rest, v2) {
                ("GET", [], false) => detail(shared, id),
                ("DELETE", [], false) => kill(shared, id),
                ("POST", ["connect"], v2) => connect(shared, req, id, v2),
                ("POST", ["timeout"], false) => set_timeout(shared, req, id),
                ("POST", ["refreshes"], false) => refresh(shared, req, id),
                ("POST", ["pause"], false) => pause(shared, req, id),
                ("POST", ["resume"], false) => resume(shared, req, id),
                ("PUT", ["network"], false) => network(shared, req, id),
                _ => Err(route_not_found(req)),
            }
        }
        _ => Err(route_not_found(req)),
    }
}

/// A seeded `CALL-429` fault, answered before the call does anything.
fn limited(shared: &Shared, call: Call) -> Result<(), Response> {
    shared.faults.rate_limit(call).map_or(Ok(()), Err)
}

/// The API's own health check, which needs no key.
fn is_health(req: &Request) -> bool {
    req.method == "GET" && req.path.trim_matches('/') == "health"
}

fn authorized(shared: &Shared, req: &Request) -> bool {
    req.header("x-api-key")
        .is_some_and(|k| shared.api_key_matches(k))
}

fn route_not_found(req: &Request) -> Response {
    Response::error(
        404,
        format!(
            "{} {} is not served by the wmo-e2b emulator",
            req.method, req.path
        ),
    )
}

/// Accepts the legacy `<sandboxID>-<clientID>` form like the real API.
fn sandbox_id(raw: &str) -> Result<&str, Response> {
    match raw.split('-').count() {
        1 => Ok(raw),
        2 => Ok(raw.split('-').next().unwrap_or(raw)),
        _ => Err(Response::error(400, "Invalid sandbox ID")),
    }
}

fn stats(shared: &Shared) -> Answer {
    match serde_json::to_value(shared.stats()) {
        Ok(v) => Ok(Response::json(200, &v)),
        Err(e) => Err(Response::error(
            500,
            format!("cannot encode the stats: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composite_ids() {
        assert_eq!(sandbox_id("lsbabc").ok(), Some("lsbabc"));
        assert_eq!(sandbox_id("lsbabc-6532622b").ok(), Some("lsbabc"));
        assert!(sandbox_id("a-b-c").is_err());
    }
}
