//! envd: requests carrying `E2b-Sandbox-Id`, routed to the sandbox they name, checked for
//! its access token, and dispatched to health, files, and the Connect services.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};

use super::connect::{parse_message, Code, RpcError, RpcResult};
use super::control::constant_time_eq;
use super::http::{Request, Responder, Response};
use super::server::{SandboxEntry, Shared};
use super::{files, process};
use crate::sandbox::Role;

pub(super) fn handle(shared: &Shared, raw_id: &str, req: Request, out: &mut Responder<'_>) {
    // The legacy composite `<id>-<clientID>` names the same sandbox.
    let id = raw_id.split('-').next().unwrap_or(raw_id);
    let Some(entry) = shared.live_sandbox(id) else {
        // What E2B's edge proxy answers for a sandbox that is gone.
        let body =
            json!({"message": "The sandbox was not found", "sandboxId": raw_id, "code": 502});
        let _ = out.send(Response::bytes(
            502,
            "application/json; charset=utf-8",
            body.to_string().into_bytes(),
        ));
        return;
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
    if path == "/files" {
        let resp = match req.method.as_str() {
            "GET" => files::download(&entry, &req),
            "POST" => files::upload(&entry, &req),
            _ => plain_error(405, "method not allowed"),
        };
        let _ = out.send(resp);
        return;
    }
    if path == "/envs" && req.method == "GET" {
        let _ = out.send(Response::json(200, &json!(entry.env_vars)));
        return;
    }
    if let Some(method) = path.strip_prefix("/process.Process/") {
        process::handle(shared, &entry, method, req, out);
        return;
    }
    if let Some(method) = path.strip_prefix("/filesystem.Filesystem/") {
        let resp = unary(&req, |msg, role| files::rpc(&entry, method, msg, role));
        let _ = out.send(resp);
        return;
    }
    let _ = out.send(plain_error(404, &format!("{path} is not an envd endpoint")));
}

/// envd's own errors (auth, files) are plain JSON with an integer code, not Connect errors.
pub(super) fn plain_error(status: u16, message: &str) -> Response {
    Response::json(status, &json!({"code": status, "message": message}))
}

fn check_token(entry: &SandboxEntry, req: &Request) -> Result<(), Response> {
    let Some(token) = &entry.token else {
        return Ok(());
    };
    match req.header("x-access-token") {
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => Ok(()),
        None if req.path == "/files" && req.query("signature").is_some() => Err(plain_error(
            401,
            "URL signatures are not supported by the wmo-e2b emulator; send X-Access-Token",
        )),
        _ => Err(plain_error(
            401,
            "unauthorized access, please provide a valid access token or method signing if supported",
        )),
    }
}

/// Users the emulator answers to: E2B templates have `user` (the default: task commands,
/// confined to the sandbox's task namespace) and `root` (the host's machinery, which sees the
/// system directory and every process); see `Role`.
fn role_of(user: &str) -> Option<Role> {
    match user {
        "user" => Some(Role::Task),
        "root" => Some(Role::System),
        _ => None,
    }
}

/// The user an RPC runs as (HTTP Basic username, empty password); `user` when absent.
pub(super) fn rpc_user(req: &Request) -> RpcResult<Role> {
    let Some(auth) = req.header("authorization") else {
        return Ok(Role::Task);
    };
    let bad = |m: String| RpcError::new(Code::Unauthenticated, m);
    let encoded = auth
        .strip_prefix("Basic ")
        .ok_or_else(|| bad("only Basic authorization is supported".into()))?;
    let decoded = STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| bad("malformed Basic authorization".into()))?;
    let user = decoded.split(':').next().unwrap_or("");
    role_of(user).ok_or_else(|| bad(format!("invalid username: '{user}'")))
}

/// The `username` query parameter of `/files`.
pub(super) fn files_user(req: &Request) -> Result<Role, Response> {
    match req.query("username") {
        None | Some("") => Ok(Role::Task),
        Some(u) => role_of(u)
            .ok_or_else(|| plain_error(401, &format!("error looking up user '{u}': unknown user"))),
    }
}

/// A unary Connect call with the JSON codec: checks the protocol, decodes the request,
/// encodes the answer or the error.
pub(super) fn unary(
    req: &Request,
    call: impl FnOnce(&Value, Role) -> RpcResult<Value>,
) -> Response {
    if req.method != "POST" {
        return RpcError::new(Code::Unimplemented, "envd RPCs accept only POST").into_response();
    }
    let content_type = req
        .header("content-type")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if content_type != "application/json" {
        return Response::bytes(
            415,
            "text/plain",
            format!("unsupported content type {content_type:?}: the emulator speaks JSON only")
                .into_bytes(),
        );
    }
    if req
        .header("content-encoding")
        .is_some_and(|e| !e.eq_ignore_ascii_case("identity"))
    {
        return RpcError::new(Code::Unimplemented, "request compression is not supported")
            .into_response();
    }
    let result = rpc_user(req).and_then(|role| call(&parse_message(&req.body)?, role));
    match result {
        Ok(v) => Response::json(200, &v),
        Err(e) => e.into_response(),
    }
}
