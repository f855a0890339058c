//! Signed `/files` URLs (`download_url` / `upload_url`): with an access token, `/files` takes
//! either the token itself or a signature made from it, optionally with an expiry.
//!
//! E2B names the sandbox of a signed URL in its host (`49983-<id>.<domain>`). Behind the one
//! URL every sandbox of an emulator shares, a signed request carries no sandbox header, so
//! the signature names the sandbox instead: only that sandbox's token makes it.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::emulator::http::{Request, Response};
use crate::emulator::state::{constant_time_eq, SandboxEntry, Shared};
use crate::sync::lock;

/// What a signature lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Read,
    Write,
}

impl Operation {
    fn of(req: &Request) -> Option<Operation> {
        match req.method.as_str() {
            "GET" => Some(Operation::Read),
            "POST" => Some(Operation::Write),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// A `/files` request that carries a signature in place of a token.
pub(in crate::emulator) fn is_signed(req: &Request) -> bool {
    req.path == "/files" && req.query("signature").is_some()
}

/// The E2B id of the sandbox whose token made the request's signature, if any (whether it
/// still lives is for `routes::handle` to check, as for any envd request).
pub(super) fn signer(shared: &Shared, req: &Request) -> Option<String> {
    let op = Operation::of(req)?;
    let given = req.query("signature")?;
    let expiration = expiration(req).ok()?;
    let entries: Vec<Arc<SandboxEntry>> = lock(&shared.table).map.values().cloned().collect();
    entries
        .into_iter()
        .find(|e| {
            e.token.as_deref().is_some_and(|token| {
                let want = signature(req, op, token, expiration);
                constant_time_eq(want.as_bytes(), given.as_bytes())
            })
        })
        .map(|e| e.id.clone())
}

/// Whether a `/files` request may reach this sandbox, checked as envd checks it: a token
/// header must be the token (a signature is then ignored); without one, the signature must
/// be the one the token makes for this path, operation and user, and not expired.
pub(super) fn authorize_files(entry: &SandboxEntry, req: &Request) -> Result<(), Response> {
    let Some(token) = entry.token.as_deref() else {
        return Ok(());
    };
    let unauthorized = |m: &str| Err(Response::error(401, m));
    // An empty header is no header, as envd reads it.
    if let Some(given) = req.header("x-access-token").filter(|t| !t.is_empty()) {
        return if entry.token_matches(given) {
            Ok(())
        } else {
            unauthorized("access token present in header but does not match")
        };
    }
    let Some(op) = Operation::of(req) else {
        return unauthorized(
            "unauthorized access, please provide a valid access token or method signing if supported",
        );
    };
    let Some(given) = req.query("signature") else {
        return unauthorized("missing signature query parameter");
    };
    let expiration = expiration(req)?;
    let want = signature(req, op, token, expiration);
    if !constant_time_eq(want.as_bytes(), given.as_bytes()) {
        return unauthorized("invalid signature");
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if expiration.is_some_and(|exp| exp < i64::try_from(now).unwrap_or(i64::MAX)) {
        return unauthorized("signature is already expired");
    }
    Ok(())
}

/// The `signature_expiration` parameter: Unix seconds, absent for a signature that never
/// expires.
fn expiration(req: &Request) -> Result<Option<i64>, Response> {
    match req.query("signature_expiration") {
        None => Ok(None),
        Some(v) => v.trim().parse::<i64>().map(Some).map_err(|_| {
            Response::error(
                400,
                format!(
                    "Invalid format for parameter signature_expiration: {v:?} is not an integer"
                ),
            )
        }),
    }
}

/// The signature envd expects of a request: over the `path` and `username` parameters as
/// given (empty when absent), not as resolved.
fn signature(req: &Request, op: Operation, token: &str, expiration: Option<i64>) -> String {
    let path = req.query("path").unwrap_or("");
    let user = req.query("username").unwrap_or("");
    sign(path, op.as_str(), user, token, expiration)
}

/// `v1_` + unpadded base64 of SHA-256 over `path:operation:user:token[:expiration]`.
fn sign(path: &str, op: &str, user: &str, token: &str, expiration: Option<i64>) -> String {
    let mut raw = format!("{path}:{op}:{user}:{token}");
    if let Some(exp) = expiration {
        raw.push_str(&format!(":{exp}"));
    }
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdks() {
        // What e2b's `get_signature("/home/user/a.txt", "read", None, "tok")` returns.
        assert_eq!(
            sign("/home/user/a.txt", "read", "", "tok", None),
            "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY"
        );
        assert_eq!(
            sign("/home/user/a.txt", "write", "user", "tok", None),
            "v1_ob71eBd6/B8TZfSyP5Exh8UyCTAstOLxKROv6uPKGeI"
        );
        assert_eq!(
            sign("/tmp/x y", "read", "", "tok", Some(1_700_000_000)),
            "v1_MknjdjTuO2iFDN/7XA1LSdNhBIJIG6PIFCZTmuqPB3Q"
        );
    }
}
