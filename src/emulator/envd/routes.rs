//! Which sandbox an envd request is for, whether it may reach it (a paused one only when
//! the request wakes it), and which endpoint serves it.

use serde_json::json;

use super::call::unary;
use super::{files, process, signing};
use crate::emulator::connect::{Code, RpcError};
use crate::emulator::edge;
use crate::emulator::http::{Request, Responder, Response};
use crate::emulator::state::{SandboxEntry, Shared};

pub(in crate::emulator) fn handle(
    shared: &Shared,
    raw_id: &str,
    req: Request,
    out: &mut Responder<'_>,
) {
    // A paused sandbox is gone to envd's callers, as behind E2B's proxy, unless traffic
    // wakes it.
    let entry = match edge::awake(shared, raw_id) {
        Ok(entry) => entry,
        Err(refused) => {
            let _ = out.send(refused);
            return;
        }
    };
    if req.method == "GET" && req.path == "/health" {
        let _ = out.send(Response::empty(204).with_header("Cache-Control", "no-store"));
        return;
    }
    if let Err(resp) = check_token(&entry, &req) {
        let _ = out.send(resp);
        return;
    }
    let path = req.path.clone();
    if path == "/filesystem.Filesystem/WatchDir" {
        // The one server stream of the filesystem service.
        let refused = RpcError::new(
            Code::Unimplemented,
            "watching directories is not supported by the wmo-e2b emulator",
        );
        process::refuse_stream(shared, &req, out, &refused);
        return;
    }
    match path.strip_prefix("/process.Process/") {
        // Process calls may stream, so they answer themselves.
        Some(method) => process::handle(shared, &entry, method, req, out),
        None => {
            let _ = out.send(answer(&entry, &req));
        }
    }
}

/// The answer of every endpoint but the process service's.
fn answer(entry: &SandboxEntry, req: &Request) -> Response {
    let path = req.path.as_str();
    if path == "/files" {
        return match req.method.as_str() {
            "GET" => files::download(entry, req),
            "POST" => files::upload(entry, req),
            _ => Response::error(405, "method not allowed"),
        };
    }
    if path == "/envs" && req.method == "GET" {
        return Response::json(200, &json!(entry.env_vars));
    }
    if let Some(method) = path.strip_prefix("/filesystem.Filesystem/") {
        return unary(req, |msg, role| files::rpc(entry, method, msg, role));
    }
    // envd serves these; the SDK's sandbox classes never call them.
    if matches!(path, "/files/compose" | "/metrics") {
        return Response::error(
            501,
            format!("{path} is not supported by the wmo-e2b emulator"),
        );
    }
    Response::error(404, format!("{path} is not an envd endpoint"))
}

/// A signed `/files` request without a sandbox header: the sandbox its signature names (see
/// `signing`); one that no live sandbox signed is refused as envd refuses a wrong signature.
pub(in crate::emulator) fn handle_signed(shared: &Shared, req: Request, out: &mut Responder<'_>) {
    match signing::signer(shared, &req) {
        Some(id) => handle(shared, &id, req, out),
        None => {
            let _ = out.send(Response::error(401, "invalid signature"));
        }
    }
}

fn check_token(entry: &SandboxEntry, req: &Request) -> Result<(), Response> {
    if req.path == "/files" {
        return signing::authorize_files(entry, req);
    }
    if entry.token.is_none() {
        return Ok(());
    }
    match req.header("x-access-token") {
        Some(given) if entry.token_matches(given) => Ok(()),
        _ => Err(Response::error(
            401,
            "unauthorized access, please provide a valid access token or method signing if supported",
        )),
    }
}
