//! The control-plane client: create, connect, info, list, kill, timeout and network, over
//! REST with `X-API-Key`. Every status is classified in `error::api_class`; every call is
//! retried on the server's hints (`error::retry_hint`) with one bounded schedule.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use ureq::http::Response;
use ureq::typestate::{WithBody, WithoutBody};
use ureq::{Agent, Body, RequestBuilder};

use super::config::E2bConfig;
use super::error::{
    api_call_failure, api_failure, call_failure, retry_hint, ApiOp, ApiStatus, Limits, RetryHint,
};
use super::gate::Clock;
use super::retry::{is_idempotency_key, Retries, RetryPolicy};
use crate::backoff::Backoff;
use crate::sandbox::{
    ErrorClass, Killed, Metadata, OnTimeout, PauseKind, Paused, Result, RunState, SandboxError,
    SandboxSummary,
};

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

/// What a create asks for.
#[derive(Debug, Clone)]
pub struct NewSandbox {
    pub template: String,
    pub timeout_secs: u64,
    pub metadata: Metadata,
    pub env_vars: BTreeMap<String, String>,
    pub internet: bool,
    /// Sent as `Idempotency-Key`, so that a create repeated after a lost or failed answer
    /// gets the sandbox the first one made instead of a second. Only a key of the documented
    /// form (1-255 of `[a-z0-9-]`) is sent.
    pub idempotency_key: Option<String>,
    pub on_timeout: OnTimeout,
}

/// The parts of a create/connect answer a sandbox handle needs.
#[derive(Debug, Clone, Deserialize)]
pub struct SandboxAccess {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: Option<String>,
    /// The base domain of the sandbox's host, when it differs from ours.
    pub domain: Option<String>,
    #[serde(rename = "envdVersion")]
    pub envd_version: Option<String>,
}

/// A sandbox as `GET /sandboxes/{id}` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxDetail {
    pub id: String,
    pub template_id: Option<String>,
    pub alias: Option<String>,
    pub metadata: Metadata,
    /// Unix seconds; 0 when the answer had no parsable time.
    pub started: u64,
    /// Unix seconds; 0 when the answer had no parsable time.
    pub end: u64,
    /// `running` or `paused`.
    pub state: String,
    pub envd_version: Option<String>,
}

/// One entry of a list or info answer; every field but the id is optional to us.
#[derive(Debug, Deserialize)]
struct Listed {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    alias: Option<String>,
    metadata: Option<Metadata>,
    #[serde(rename = "startedAt")]
    started_at: Option<String>,
    #[serde(rename = "endAt")]
    end_at: Option<String>,
    state: Option<String>,
    #[serde(rename = "envdVersion")]
    envd_version: Option<String>,
}

impl Listed {
    fn into_summary(self) -> SandboxSummary {
        SandboxSummary {
            id: self.sandbox_id,
            // The alias is the name a create asked for ("base"); the id is internal.
            template: self.alias.or(self.template_id),
            metadata: self.metadata.unwrap_or_default(),
            created: self.started_at.as_deref().and_then(unix_secs).unwrap_or(0),
            deadline: self.end_at.as_deref().and_then(unix_secs).unwrap_or(0),
            state: match self.state.as_deref() {
                Some("paused") => RunState::Paused,
                _ => RunState::Running,
            },
        }
    }

    fn into_detail(self) -> SandboxDetail {
        SandboxDetail {
            id: self.sandbox_id,
            template_id: self.template_id,
            alias: self.alias,
            metadata: self.metadata.unwrap_or_default(),
            started: self.started_at.as_deref().and_then(unix_secs).unwrap_or(0),
            end: self.end_at.as_deref().and_then(unix_secs).unwrap_or(0),
            state: self.state.unwrap_or_default(),
            envd_version: self.envd_version,
        }
    }
}

/// The control plane of one E2B account.
pub struct Api {
    agent: Agent,
    config: Arc<E2bConfig>,
    limits: Limits,
    retry: RetryPolicy,
    clock: Arc<dyn Clock>,
    pub retries: Retries,
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
    ) -> Api {
        Api {
            agent,
            config,
            limits,
            retry,
            clock,
            retries: Retries::default(),
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
        self.send_with(op, id, true, &|| Ok(()), call)
    }

    /// As [`Api::send`], with `admit` run before every attempt (a create's rate gate), and
    /// `replayable` saying whether a request whose answer was lost may be sent again (a
    /// create without an idempotency key may have made a sandbox).
    fn send_with(
        &self,
        op: ApiOp,
        id: Option<&str>,
        replayable: bool,
        admit: &dyn Fn() -> Result<()>,
        call: impl Fn(&Agent, &str) -> std::result::Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>> {
        let r = &self.retry;
        let mut schedule = Backoff::doubling(r.base, r.cap, r.retries);
        loop {
            admit()?;
            let wait = match call(&self.agent, &self.config.api_key) {
                Ok(resp) => {
                    let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
                    let hint = retry_hint(
                        resp.status().as_u16(),
                        header("should-retry"),
                        header("retry-after"),
                    );
                    let RetryHint::After(asked) = hint else {
                        return Ok(resp);
                    };
                    let Some(backoff) = schedule.next() else {
                        return Ok(resp);
                    };
                    asked.map_or(backoff, |a| a.min(r.max_retry_after))
                }
                Err(e) => {
                    let failure = call_failure(e, &self.limits);
                    let again = replayable && failure.class == ErrorClass::Transport;
                    match schedule.next().filter(|_| again) {
                        Some(backoff) => backoff,
                        None => return Err(api_call_failure(op, id, failure)),
                    }
                }
            };
            let counter = match op {
                ApiOp::Create => &self.retries.create,
                ApiOp::Kill => &self.retries.kill,
                _ => &self.retries.other,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            self.clock.sleep(wait);
        }
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
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| api_call_failure(op, id, call_failure(e, &self.limits)))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            let target = id.map(|id| format!(" {id}")).unwrap_or_default();
            SandboxError::Remote {
                class: ErrorClass::Transport,
                message: format!(
                    "{}{target}: the answer is not the expected JSON",
                    op.describe()
                ),
                source: Some(Box::new(e)),
            }
        })
    }

    /// Creates a sandbox: `POST /v2/sandboxes`, or `POST /sandboxes` on servers without v2.
    /// `admit` runs before every attempt, retries included: each is a create E2B counts.
    pub fn create(
        &self,
        new: &NewSandbox,
        admit: &dyn Fn() -> Result<()>,
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
            self.send_with(op, None, key.is_some(), admit, |a, api_key| {
                let mut req = a.post(self.url(path)).header("X-API-Key", api_key);
                if let Some(k) = key {
                    req = req.header("Idempotency-Key", k);
                }
                req.send_json(body)
            })
        };
        if !self.v1_create.load(Ordering::Relaxed) {
            let resp = post("/v2/sandboxes", &body)?;
            if resp.status().as_u16() != 404 {
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
            if resp.status().as_u16() != 404 {
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
            return Err(SandboxError::Remote {
                class: ErrorClass::Transport,
                message: format!(
                    "{}: the answer's sandboxID {:?} is not a sandbox id",
                    op.describe(),
                    access.sandbox_id
                ),
                source: None,
            });
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

/// Sandbox ids go into URL paths and host names, so only id characters are let through.
pub fn is_sandbox_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
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
    let body = resp
        .body_mut()
        .with_config()
        .limit(MAX_ERROR_BODY)
        .read_to_vec()
        .unwrap_or_default();
    api_failure(op, id, ApiStatus::parse(status, &body))
}

/// The `metadata` list filter: `k1=v1&k2=v2` with each key and value percent-encoded twice,
/// because the API unescapes the whole value once more before splitting it and then unescapes
/// each part (the query layer's own encoding is added by ureq).
pub fn metadata_query(filter: &Metadata) -> String {
    filter
        .iter()
        .map(|(k, v)| format!("{}={}", pct(&pct(k)), pct(&pct(v))))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses an RFC 3339 time (`2026-08-21T20:00:22.123Z`, `...+02:00`) to Unix seconds.
pub fn unix_secs(s: &str) -> Option<u64> {
    crate::civil::parse_rfc3339(s)?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_become_unix_seconds() {
        assert_eq!(unix_secs("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_secs("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(unix_secs("2024-02-29T12:34:56Z"), Some(1_709_210_096));
        assert_eq!(
            unix_secs("2026-08-21T20:00:22.123456789Z"),
            Some(1_787_342_422)
        );
        assert_eq!(unix_secs("2026-08-21T22:00:22+02:00"), Some(1_787_342_422));
        assert_eq!(
            unix_secs("2026-08-21T19:30:22.5-00:30"),
            Some(1_787_342_422)
        );
        for bad in [
            "",
            "2026-08-21",
            "2026-08-21T20:00:22",
            "2026-13-01T00:00:00Z",
            "2026-08-21T20:00:22+0200",
            "1969-12-31T23:59:59Z",
            "20x6-08-21T20:00:22Z",
        ] {
            assert_eq!(unix_secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn metadata_filters_encode_each_part_twice() {
        let mut m = Metadata::new();
        m.insert("wmo-e2b.run".into(), "r1".into());
        m.insert("pool".into(), "eval".into());
        assert_eq!(metadata_query(&m), "pool=eval&wmo-e2b.run=r1");
        let mut m = Metadata::new();
        m.insert("a b".into(), "x=y&z".into());
        assert_eq!(metadata_query(&m), "a%2520b=x%253Dy%2526z");
        assert_eq!(metadata_query(&Metadata::new()), "");
    }

    #[test]
    fn listed_entries_prefer_the_alias_and_default_the_rest() {
        let listed: Listed = serde_json::from_str(
            r#"{"sandboxID":"isb","templateID":"tpl123","alias":"base","metadata":null,
                "startedAt":"1970-01-01T00:01:00Z","endAt":"bogus","state":"running",
                "clientID":"6532622b","cpuCount":2}"#,
        )
        .unwrap();
        let s = listed.into_summary();
        assert_eq!(s.id, "isb");
        assert_eq!(s.template.as_deref(), Some("base"));
        assert!(s.metadata.is_empty());
        assert_eq!((s.created, s.deadline), (60, 0));
    }
}
