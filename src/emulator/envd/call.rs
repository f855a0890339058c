//! What envd's services share: the user a call runs as, and unary Connect calls with the JSON
//! codec.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::Value;

use crate::emulator::connect::{parse_message, Code, RpcError, RpcResult};
use crate::emulator::http::{Request, Response};
use crate::sandbox::Role;

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
        Some(u) => role_of(u).ok_or_else(|| {
            Response::error(401, format!("error looking up user '{u}': unknown user"))
        }),
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
    let content_type = req.media_type();
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
