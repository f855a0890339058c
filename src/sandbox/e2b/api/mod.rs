//! The control-plane client: create, connect, info, list, kill, timeout and network, over
//! REST with `X-API-Key`. Every status is classified in `error::api_class`; every call is
//! retried on the server's hints (`error::api_retry_hint`) on the one bounded schedule
//! (`RetryPolicy::run`), each attempt bounded by the control-plane limit. A create whose
//! failure may have made a sandbox says so (`SandboxError::CreateUnconfirmed`).

mod templates;
mod wire;

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use ureq::http::Response;
use ureq::typestate::{WithBody, WithoutBody};
use ureq::{Agent, Body, RequestBuilder};

use super::config::E2bConfig;
use super::error::{
    api_call_failure, api_failure, api_retry_hint, call_failure, is_api_error_body, ApiOp,
    ApiStatus, Limits, RetryHint,
};
use super::gate::Clock;
use super::retry::{is_idempotency_key, Attempt, Retries, RetryPolicy};
use crate::sandbox::{
    ErrorClass, Killed, Metadata, OnTimeout, PauseKind, Paused, Result, SandboxError,
    SandboxSummary,
};
pub use templates::TemplateBuild;
pub use wire::{is_sandbox_id, NewSandbox, SandboxAccess, SandboxDetail};
use wire::{metadata_query, Listed};

/// Largest control-plane answer we read; a page of 100 sandboxes is far smaller.
const MAX_BODY: u64 = 8 << 20;
/// Largest error body kept for the message.
const MAX_ERROR_BODY: u64 = 64 << 10;
/// Pages a list may take before we assume the server is looping.
const MAX_PAGES: usize = 1000;
/// The page size of a list.
const PAGE_LIMIT: &str = "100";

/// A request's method, as the agent starts it on a URL (`Agent::get`, `Agent::post`, ...);
/// `B` says whether the request carries a body.
type Method<B> = fn(&Agent, String) -> RequestBuilder<B>;

/// The control plane of one E2B account.
pub struct Api {
    agent: Agent,
    config: Arc<E2bConfig>,
    limits: Limits,
    retry: RetryPolicy,
    clock: Arc<dyn Clock>,
    /// Shared with envd's clients, which count their repeats in it too.
    pub retries: Arc<Retries>,
    /// Set once `/v2/sandboxes` answered 404 and `/sandboxes` worked: this server has no v2.
    v1_create: AtomicBool,
    v1_connect: AtomicBool,
}

impl Api {
    pub fn new(
        agent: Agent,
        config: Arc<E2bConfig>,
        limits: Limits,
        retry: RetryPolicy,
        clock: Arc<dyn Clock>,
        retries: Arc<Retries>,
    ) -> Api {
        Api {
            agent,
            config,
            limits,
            retry,
            clock,
            retries,
            v1_create: AtomicBool::new(false),
            v1_connect: AtomicBool::new(false),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.api_base)
    }

    /// Runs one exchange, repeated on the server's hints; a failure to get any answer is
    /// classified here.
    fn send(
        &self,
        op: ApiOp,
        id: Option<&str>,
        call: impl Fn(&Agent, &str) -> std::result::Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>> {
        self.send_with(op, id, true, &|| Ok(()), &Cell::new(false), call)
    }

    /// As [`Api::send`], with `admit` run before every attempt (a create's rate gate),
    /// `replayable` saying whether a request whose answer was lost may be sent again (a
    /// create without an idempotency key may have made a sandbox), and `doubt` set once an
    /// attempt may have done its work without saying so (no answer after the request went
    /// out, or a status that can follow the work).
    fn send_with(
        &self,
        op: ApiOp,
        id: Option<&str>,
        replayable: bool,
        admit: &dyn Fn() -> Result<()>,
        doubt: &Cell<bool>,
        call: impl Fn(&Agent, &str) -> std::result::Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>> {
        let repeats = match op {
            ApiOp::Create => &self.retries.create,
            ApiOp::Kill => &self.retries.kill,
            _ => &self.retries.other,
        };
        self.retry.run(self.clock.as_ref(), repeats, || {
            if let Err(e) = admit() {
                return Attempt::Final(Err(e));
            }
            match call(&self.agent, &self.config.api_key) {
                Ok(resp) => {
                    if matches!(resp.status().as_u16(), 409 | 500 | 502 | 504) {
                        doubt.set(true);
                    }
                    let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
                    match api_retry_hint(
                        op,
                        resp.status().as_u16(),
                        header("should-retry"),
                        header("retry-after"),
                    ) {
                        RetryHint::Never => Attempt::Final(Ok(resp)),
                        RetryHint::After(asked) => Attempt::Again(Ok(resp), asked),
                    }
                }
                Err(e) => {
                    let failure = call_failure(e, &self.limits);
                    let again = replayable && failure.class == ErrorClass::Transport;
                    if failure.maybe_delivered {
                        doubt.set(true);
                    }
                    let err = in_doubt(op, doubt.get(), api_call_failure(op, id, failure));
                    if again {
                        Attempt::Again(Err(err), None)
                    } else {
                        Attempt::Final(Err(err))
                    }
                }
            }
        })
    }

    /// One bodiless request (`Agent::get`, `Agent::delete`) on `path`.
    fn call(
        &self,
        op: ApiOp,
        id: Option<&str>,
        method: Method<WithoutBody>,
        path: &str,
    ) -> Result<Response<Body>> {
        self.send(op, id, |a, key| {
            method(a, self.url(path)).header("X-API-Key", key).call()
        })
    }

    /// One request (`Agent::post`, `Agent::put`) sending `body` as JSON to `path`.
    fn call_json(
        &self,
        op: ApiOp,
        id: Option<&str>,
        method: Method<WithBody>,
        path: &str,
        body: &Value,
    ) -> Result<Response<Body>> {
        self.send(op, id, |a, key| {
            method(a, self.url(path))
                .header("X-API-Key", key)
                .send_json(body)
        })
    }

    /// Reads a success body as JSON.
    fn json<T: serde::de::DeserializeOwned>(
        &self,
        op: ApiOp,
        id: Option<&str>,
        mut resp: Response<Body>,
    ) -> Result<T> {
        // A create's success that cannot be read still made a sandbox.
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| {
                in_doubt(
                    op,
                    true,
                    api_call_failure(op, id, call_failure(e, &self.limits)),
                )
            })?;
        serde_json::from_slice(&bytes).map_err(|e| {
            let target = id.map(|id| format!(" {id}")).unwrap_or_default();
            let err = SandboxError::Remote {
                class: ErrorClass::Transport,
                message: format!(
                    "{}{target}: the answer is not the expected JSON",
                    op.describe()
                ),
                source: Some(Box::new(e)),
            };
            in_doubt(op, true, err)
        })
    }

    /// Creates a sandbox: `POST /v2/sandboxes`, or `POST /sandboxes` on servers without v2.
    /// `admit` runs before every attempt, retries included: each is a create E2B counts. Once
    /// any attempt may have made a sandbox, a failure says so, whatever the last attempt got.
    pub fn create(
        &self,
        new: &NewSandbox,
        admit: &dyn Fn() -> Result<()>,
    ) -> Result<SandboxAccess> {
        let doubt = Cell::new(false);
        self.create_doubting(new, admit, &doubt)
            .map_err(|e| in_doubt(ApiOp::Create, doubt.get(), e))
    }

    fn create_doubting(
        &self,
        new: &NewSandbox,
        admit: &dyn Fn() -> Result<()>,
        doubt: &Cell<bool>,
    ) -> Result<SandboxAccess> {
        let op = ApiOp::Create;
        let mut body = json!({
            "templateID": new.template,
            "timeout": new.timeout_secs,
            "metadata": new.metadata,
            "envVars": new.env_vars,
            "allow_internet_access": new.internet,
        });
        if let OnTimeout::Pause(kind) = new.on_timeout {
            // Resuming on the next connect is ours to do; an envd request alone wakes nothing.
            body["autoPause"] = Value::Bool(true);
            body["autoPauseMemory"] = Value::Bool(kind == PauseKind::Memory);
            body["autoResume"] = json!({ "enabled": false });
        }
        let key = new
            .idempotency_key
            .as_deref()
            .filter(|k| is_idempotency_key(k));
        let post = |path: &str, body: &Value| {
            self.send_with(op, None, key.is_some(), admit, doubt, |a, api_key| {
                let mut req = a.post(self.url(path)).header("X-API-Key", api_key);
                if let Some(k) = key {
                    req = req.header("Idempotency-Key", k);
                }
                req.send_json(body)
            })
        };
        if !self.v1_create.load(Ordering::Relaxed) {
            let resp = post("/v2/sandboxes", &body)?;
            if let Some(resp) = v2_answer(op, None, resp)? {
                return self.created(op, None, resp);
            }
        }
        // v1 still needs `secure` to get an envd access token; v2 is always secure.
        body["secure"] = Value::Bool(true);
        let resp = post("/sandboxes", &body)?;
        let access = self.created(op, None, resp)?;
        self.v1_create.store(true, Ordering::Relaxed);
        Ok(access)
    }

    /// Connects to (resuming if paused) a sandbox; its TTL becomes at least `timeout_secs`.
    pub fn connect(&self, id: &str, timeout_secs: u64) -> Result<SandboxAccess> {
        let op = ApiOp::Connect;
        let body = json!({ "timeout": timeout_secs });
        if !self.v1_connect.load(Ordering::Relaxed) {
            let v2 = format!("/v2/sandboxes/{id}/connect");
            let resp = self.call_json(op, Some(id), Agent::post, &v2, &body)?;
            if let Some(resp) = v2_answer(op, Some(id), resp)? {
                return self.created(op, Some(id), resp);
            }
        }
        let v1 = format!("/sandboxes/{id}/connect");
        let resp = self.call_json(op, Some(id), Agent::post, &v1, &body)?;
        let access = self.created(op, Some(id), resp)?;
        self.v1_connect.store(true, Ordering::Relaxed);
        Ok(access)
    }

    /// A create or connect answer: 201 (created or resumed) or 200 (already running).
    fn created(&self, op: ApiOp, id: Option<&str>, resp: Response<Body>) -> Result<SandboxAccess> {
        let resp = expect(op, id, resp, &[200, 201])?;
        let access: SandboxAccess = self.json(op, id, resp)?;
        if !is_sandbox_id(&access.sandbox_id) {
            let err = SandboxError::Remote {
                class: ErrorClass::Transport,
                message: format!(
                    "{}: the answer's sandboxID {:?} is not a sandbox id",
                    op.describe(),
                    access.sandbox_id
                ),
                source: None,
            };
            return Err(in_doubt(op, true, err));
        }
        Ok(access)
    }

    pub fn info(&self, id: &str) -> Result<SandboxDetail> {
        Ok(self.listed(id)?.into_detail())
    }

    /// One sandbox as a list reports it: `GET /sandboxes/{id}`, not a list of the team.
    pub fn describe(&self, id: &str) -> Result<SandboxSummary> {
        Ok(self.listed(id)?.into_summary())
    }

    fn listed(&self, id: &str) -> Result<Listed> {
        let op = ApiOp::Info;
        let resp = self.call(op, Some(id), Agent::get, &format!("/sandboxes/{id}"))?;
        let resp = expect(op, Some(id), resp, &[200])?;
        self.json(op, Some(id), resp)
    }

    /// Sandboxes, running and paused, whose metadata holds every pair of `filter`, across all pages.
    pub fn list(&self, filter: &Metadata) -> Result<Vec<SandboxSummary>> {
        let op = ApiOp::List;
        let metadata = metadata_query(filter);
        let mut token: Option<String> = None;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for _ in 0..MAX_PAGES {
            let resp = self.send(op, None, |a, key| {
                let mut req = a.get(self.url("/v2/sandboxes")).header("X-API-Key", key);
                if !metadata.is_empty() {
                    req = req.query("metadata", &metadata);
                }
                req = req
                    .query("state", "running,paused")
                    .query("limit", PAGE_LIMIT);
                if let Some(t) = &token {
                    req = req.query("nextToken", t);
                }
                req.call()
            })?;
            let resp = expect(op, None, resp, &[200])?;
            let next = resp
                .headers()
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            let page: Vec<Listed> = self.json(op, None, resp)?;
            for listed in page {
                // Pages can overlap while sandboxes come and go.
                if seen.insert(listed.sandbox_id.clone()) {
                    out.push(listed.into_summary());
                }
            }
            match next {
                None => return Ok(out),
                Some(t) if token.as_ref() == Some(&t) => return Err(looping(op)),
                Some(t) => token = Some(t),
            }
        }
        Err(looping(op))
    }

    /// One kill, repeated on the server's hints: 204 killed, 404 already gone.
    pub fn kill(&self, id: &str) -> Result<Killed> {
        let op = ApiOp::Kill;
        let resp = self.call(op, Some(id), Agent::delete, &format!("/sandboxes/{id}"))?;
        match resp.status().as_u16() {
            404 => Ok(Killed::AlreadyGone),
            s if (200..300).contains(&s) => Ok(Killed::Now),
            _ => Err(status_failure(op, Some(id), resp)),
        }
    }

    /// Pauses a running sandbox: 204 paused, 409 paused already, 404 gone.
    pub fn pause(&self, id: &str, kind: PauseKind) -> Result<Paused> {
        let op = ApiOp::Pause;
        let body = json!({ "memory": kind == PauseKind::Memory });
        let path = format!("/sandboxes/{id}/pause");
        let resp = self.call_json(op, Some(id), Agent::post, &path, &body)?;
        match resp.status().as_u16() {
            409 => Ok(Paused::AlreadyPaused),
            s if (200..300).contains(&s) => Ok(Paused::Now),
            _ => Err(status_failure(op, Some(id), resp)),
        }
    }

    /// Moves the sandbox's end to `secs` from now (shorter or longer).
    pub fn set_timeout(&self, id: &str, secs: u64) -> Result<()> {
        let body = json!({ "timeout": secs });
        self.change(ApiOp::SetTimeout, id, Agent::post, "timeout", &body)
    }

    /// Replaces the sandbox's egress rules with all-or-nothing internet access.
    pub fn set_network(&self, id: &str, internet: bool) -> Result<()> {
        let body = json!({ "allow_internet_access": internet });
        self.change(ApiOp::SetNetwork, id, Agent::put, "network", &body)
    }

    /// Changes one setting of the sandbox `id` by sending `body` to its `setting` resource;
    /// any 2xx answer means done.
    fn change(
        &self,
        op: ApiOp,
        id: &str,
        method: Method<WithBody>,
        setting: &str,
        body: &Value,
    ) -> Result<()> {
        let path = format!("/sandboxes/{id}/{setting}");
        let resp = self.call_json(op, Some(id), method, &path, body)?;
        expect_2xx(op, id, resp)
    }
}

fn looping(op: ApiOp) -> SandboxError {
    SandboxError::Remote {
        class: ErrorClass::Transport,
        message: format!(
            "{}: the server keeps returning the same page token",
            op.describe()
        ),
        source: None,
    }
}

fn expect(op: ApiOp, id: Option<&str>, resp: Response<Body>, ok: &[u16]) -> Result<Response<Body>> {
    if ok.contains(&resp.status().as_u16()) {
        Ok(resp)
    } else {
        Err(status_failure(op, id, resp))
    }
}

fn expect_2xx(op: ApiOp, id: &str, resp: Response<Body>) -> Result<()> {
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(status_failure(op, Some(id), resp))
    }
}

/// The error an unexpected status stands for; the body is read (bounded) for its message.
fn status_failure(op: ApiOp, id: Option<&str>, mut resp: Response<Body>) -> SandboxError {
    let status = resp.status().as_u16();
    let body = error_body(&mut resp);
    failure_of(
        op,
        id,
        ApiStatus::parse(status, &body),
        resp.status().is_success(),
    )
}

/// The error a status answer stands for; for a create, one that says it may have made its
/// sandbox (a success of another kind, or a 5xx that can follow the work) stays in doubt.
fn failure_of(op: ApiOp, id: Option<&str>, status: ApiStatus, success: bool) -> SandboxError {
    let doubt = success || status.create_may_have_landed();
    in_doubt(op, doubt, api_failure(op, id, status))
}

fn error_body(resp: &mut Response<Body>) -> Vec<u8> {
    resp.body_mut()
        .with_config()
        .limit(MAX_ERROR_BODY)
        .read_to_vec()
        .unwrap_or_default()
}

/// A v2 answer, or `None` when the server has no such v2 endpoint. Only a 404 that is not
/// the API's own JSON error means that: the API's 404 (a missing sandbox or template) is
/// its answer, and v1's would only hide it.
fn v2_answer(
    op: ApiOp,
    id: Option<&str>,
    mut resp: Response<Body>,
) -> Result<Option<Response<Body>>> {
    if resp.status().as_u16() != 404 {
        return Ok(Some(resp));
    }
    let body = error_body(&mut resp);
    if is_api_error_body(&body) {
        return Err(failure_of(op, id, ApiStatus::parse(404, &body), false));
    }
    Ok(None)
}

/// For a create whose failure may have made a sandbox (`doubt`), the error that says so.
fn in_doubt(op: ApiOp, doubt: bool, err: SandboxError) -> SandboxError {
    let said = matches!(err, SandboxError::CreateUnconfirmed { .. });
    if op == ApiOp::Create && doubt && !said {
        SandboxError::CreateUnconfirmed {
            source: Box::new(err),
        }
    } else {
        err
    }
}
