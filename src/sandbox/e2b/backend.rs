//! `E2bBackend`: creates (through the rate gate and the slot cap, with the lease id as the
//! idempotency key), connects, lists and kills E2B sandboxes, refusing those whose envd is
//! older than this client drives, with one tuned HTTP agent for the control plane and one
//! for envd. Retries happen per call in [`Api`] and [`Envd`], on the server's hints.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ureq::Agent;

use super::api::{is_sandbox_id, Api, NewSandbox, SandboxAccess, SandboxDetail};
use super::config::{ConfigError, E2bConfig, USER_AGENT};
use super::envd::version::{self, EnvdRefused, EnvdVersion};
use super::envd::{Envd, EnvdLink};
use super::error::Limits;
use super::gate::{shared_gate, Clock, CreateGate, CreateRejected, Slots, SystemClock};
use super::process::Readers;
use super::retry::{Retries, RetryPolicy};
use super::sandbox::E2bSandbox;
use super::templates::TemplateSource;
use crate::sandbox::ledger::TAG_LEASE;
use crate::sandbox::{
    check_id, Backend, CreateSpec, ErrorClass, Killed, Metadata, PauseKind, Paused, Result,
    Sandbox, SandboxError, SandboxSummary,
};
use crate::sync::lock;

/// Variables of an image a sandbox is not created with (see [`E2bBackend::create_e2b`]).
const IMAGE_ENV_KEPT_OUT: &[&str] = &["PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR"];

/// How the backend behaves; every wait it makes is bounded by one of these.
#[derive(Debug, Clone)]
pub struct E2bOptions {
    /// Template of creates whose spec names none.
    pub template: String,
    /// Sandbox lifetime for creates whose spec says 0, and the least lifetime a connect leaves.
    pub sandbox_timeout: Duration,
    /// Creates admitted per second. The gate is shared by every backend of the same account
    /// (API base and key) in this process; the first one's rate and wait apply.
    pub create_rate: f64,
    /// Longest a create may queue at the rate gate; past it the create fails at once.
    pub create_wait: Duration,
    /// Most sandboxes this backend keeps alive at once.
    pub max_sandboxes: usize,
    /// Longest a create waits for one of them to be killed.
    pub slot_wait: Duration,
    /// Bound on each attempt of a control-plane call, creates included (the SDK's 60 s).
    pub api_timeout: Duration,
    /// Bound on an envd unary call (process lists, stdin writes, signals) and a health check.
    pub request_timeout: Duration,
    /// The longest a file download or upload may move no bytes; it has no total bound, so a
    /// large file takes as long as it takes while bytes flow.
    pub transfer_idle: Duration,
    /// Bound on establishing a connection (DNS, TCP, TLS).
    pub connect_timeout: Duration,
    /// envd's keepalive interval on process streams; a stream silent for about twice this is
    /// a transport failure. Whole seconds, at least one.
    pub keepalive: Duration,
    /// How every control-plane call is repeated when the server says it may be.
    pub retry: RetryPolicy,
}

impl Default for E2bOptions {
    fn default() -> Self {
        E2bOptions {
            template: "base".to_string(),
            sandbox_timeout: Duration::from_secs(300),
            create_rate: 4.0,
            create_wait: Duration::from_secs(60),
            max_sandboxes: 20,
            slot_wait: Duration::from_secs(60),
            api_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(60),
            transfer_idle: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            keepalive: Duration::from_secs(30),
            retry: RetryPolicy::default(),
        }
    }
}

impl E2bOptions {
    fn validate(&self) -> std::result::Result<(), ConfigError> {
        let bad = |name, reason: &str| {
            Err(ConfigError::BadOption {
                name,
                reason: reason.to_string(),
            })
        };
        if !(self.create_rate.is_finite() && self.create_rate > 0.0) {
            return bad(
                "create_rate",
                "must be a positive number of creates per second",
            );
        }
        if self.max_sandboxes == 0 {
            return bad("max_sandboxes", "must be at least 1");
        }
        let limits = [
            self.api_timeout,
            self.request_timeout,
            self.transfer_idle,
            self.connect_timeout,
        ];
        if limits.iter().any(Duration::is_zero) {
            return bad(
                "api_timeout",
                "request_timeout, transfer_idle and connect_timeout must be positive",
            );
        }
        if self.keepalive < Duration::from_secs(1) {
            return bad("keepalive", "must be at least one second");
        }
        if self.template.trim().is_empty() {
            return bad("template", "must not be empty");
        }
        Ok(())
    }
}

/// What the backend has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct E2bCounters {
    /// Sandboxes created.
    pub creates: u64,
    /// Create attempts repeated on the server's hints (or after a lost answer, when keyed).
    pub create_retries: u64,
    /// Creates refused by the rate gate or the slot cap before reaching E2B.
    pub create_rejections: u64,
    /// Kill calls that ended with the sandbox proven gone.
    pub kills: u64,
    /// Kill attempts repeated on the server's hints or after a lost answer.
    pub kill_retries: u64,
    /// Repeats of every other control-plane call (connect, info, list, timeout, network).
    pub other_retries: u64,
    /// Repeats of envd's idempotent calls (file reads, process lists, health).
    pub envd_retries: u64,
    /// Sandboxes killed at once because their envd is older than this client drives.
    pub envd_refusals: u64,
}

#[derive(Default)]
struct Counters {
    creates: AtomicU64,
    create_rejections: AtomicU64,
    kills: AtomicU64,
    envd_refusals: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// E2B cloud (or anything speaking its protocol, like `wmo-e2b emulator`).
pub struct E2bBackend {
    config: Arc<E2bConfig>,
    options: E2bOptions,
    envd: Arc<EnvdLink>,
    api: Arc<Api>,
    /// Shared with every backend of the same account in this process.
    gate: Arc<CreateGate>,
    slots: Slots,
    /// Sandboxes this backend created and has not killed: each holds a slot.
    holding: Mutex<HashSet<String>>,
    readers: Arc<Readers>,
    counters: Counters,
    clock: Arc<dyn Clock>,
}

impl E2bBackend {
    /// The backend `E2B_API_KEY`, `E2B_DOMAIN`, `E2B_API_URL` and `E2B_SANDBOX_URL` describe.
    pub fn from_env(options: E2bOptions) -> std::result::Result<Arc<E2bBackend>, ConfigError> {
        E2bBackend::new(E2bConfig::from_env()?, options)
    }

    pub fn new(
        config: E2bConfig,
        options: E2bOptions,
    ) -> std::result::Result<Arc<E2bBackend>, ConfigError> {
        E2bBackend::with_clock(config, options, Arc::new(SystemClock))
    }

    /// As [`E2bBackend::new`], with the clock the rate gate and retry waits use.
    pub fn with_clock(
        config: E2bConfig,
        options: E2bOptions,
        clock: Arc<dyn Clock>,
    ) -> std::result::Result<Arc<E2bBackend>, ConfigError> {
        options.validate()?;
        let config = Arc::new(config);
        let retries = Arc::new(Retries::default());
        let api = Arc::new(Api::new(
            agent(&options, options.api_timeout),
            Arc::clone(&config),
            Limits {
                total: Some(options.api_timeout),
                connect: options.connect_timeout,
                silence: None,
            },
            options.retry.clone(),
            Arc::clone(&clock),
            Arc::clone(&retries),
        ));
        let envd = Arc::new(EnvdLink {
            // Streams and file transfers set their own bounds; this is the unary one.
            agent: agent(&options, options.request_timeout),
            request_timeout: options.request_timeout,
            connect_timeout: options.connect_timeout,
            keepalive: options.keepalive,
            transfer_idle: options.transfer_idle,
            retry: options.retry.clone(),
            clock: Arc::clone(&clock),
            retries,
        });
        let interval = Duration::from_secs_f64(1.0 / options.create_rate);
        Ok(Arc::new(E2bBackend {
            gate: shared_gate(
                &format!("{} {}", config.api_base, config.api_key),
                interval,
                options.create_wait,
            ),
            slots: Slots::new(options.max_sandboxes),
            config,
            options,
            envd,
            api,
            holding: Mutex::default(),
            readers: Arc::default(),
            counters: Counters::default(),
            clock,
        }))
    }

    pub fn config(&self) -> &E2bConfig {
        &self.config
    }

    pub fn options(&self) -> &E2bOptions {
        &self.options
    }

    pub fn counters(&self) -> E2bCounters {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        E2bCounters {
            creates: get(&c.creates),
            create_retries: get(&self.api.retries.create),
            create_rejections: get(&c.create_rejections),
            kills: get(&c.kills),
            kill_retries: get(&self.api.retries.kill),
            other_retries: get(&self.api.retries.other),
            envd_retries: get(&self.api.retries.envd),
            envd_refusals: get(&c.envd_refusals),
        }
    }

    /// The template a task image is made into (built once per content; see `templates`).
    pub fn template_for(&self, source: &TemplateSource) -> Result<String> {
        super::templates::ensure(&self.api, &self.config, source)
    }

    /// Sandboxes this backend created and has not yet killed.
    pub fn live_sandboxes(&self) -> usize {
        self.slots.in_use()
    }

    /// Creates a sandbox and returns its concrete handle.
    pub fn create_e2b(&self, spec: &CreateSpec) -> Result<Arc<E2bSandbox>> {
        let permit = self
            .slots
            .acquire(self.options.slot_wait)
            .map_err(|r| self.rejected(r))?;
        let timeout = if spec.timeout_secs == 0 {
            self.options.sandbox_timeout.as_secs().max(1)
        } else {
            spec.timeout_secs
        };
        // A task's image is its own template, made before the run (see `templates`).
        let template = spec
            .image
            .as_ref()
            .and_then(|i| i.template.clone())
            .or_else(|| spec.template.clone())
            .filter(|t| !t.trim().is_empty())
            .unwrap_or_else(|| self.options.template.clone());
        // Not those that say who and where a process is, nor `PATH`, which the runner's and
        // envd's commands need as E2B sets it.
        let image_env: Vec<(String, String)> = spec
            .image
            .iter()
            .flat_map(|i| i.env.iter())
            .filter(|(k, _)| !IMAGE_ENV_KEPT_OUT.contains(&k.as_str()))
            .cloned()
            .collect();
        let new = NewSandbox {
            template: template.clone(),
            timeout_secs: timeout,
            metadata: spec.metadata.clone(),
            // An image's variables (E2B keeps a template's only for its build) beneath the
            // spec's own.
            env_vars: image_env
                .iter()
                .chain(&spec.envs)
                .cloned()
                .collect::<BTreeMap<_, _>>(),
            internet: spec.internet,
            // The lease id is unique per create and already of the key's form.
            idempotency_key: spec.metadata.get(TAG_LEASE).cloned(),
            on_timeout: spec.on_timeout,
        };
        let access = self.api.create(&new, &|| {
            self.gate
                .admit(self.clock.as_ref())
                .map(|_| ())
                .map_err(|r| self.rejected(r))
        })?;
        bump(&self.counters.creates);
        let version = match version::check(&template, access.envd_version.as_deref()) {
            Ok(v) => v,
            Err(refused) => {
                // A sandbox this client cannot drive is of no use to anyone: like the SDK,
                // kill it at once (its slot is given back with the permit).
                bump(&self.counters.envd_refusals);
                let _ = self.api.kill(&access.sandbox_id);
                return Err(envd_refused(refused));
            }
        };
        permit.keep();
        lock(&self.holding).insert(access.sandbox_id.clone());
        Ok(Arc::new(self.handle(access, version, image_env)))
    }

    /// Opens an existing sandbox by id (resuming it if paused) and returns its concrete handle.
    pub fn connect_e2b(&self, id: &str) -> Result<Arc<E2bSandbox>> {
        check_e2b_id(id)?;
        let access = self
            .api
            .connect(id, self.options.sandbox_timeout.as_secs().max(1))?;
        // Not ours to kill: someone else's sandbox is refused, left as it is.
        let template = access.template_id.as_deref().unwrap_or(id);
        let version =
            version::check(template, access.envd_version.as_deref()).map_err(envd_refused)?;
        Ok(Arc::new(self.handle(access, version, Vec::new())))
    }

    /// What the control plane knows about one sandbox.
    pub fn info(&self, id: &str) -> Result<SandboxDetail> {
        check_e2b_id(id)?;
        self.api.info(id)
    }

    /// `image_env`: the variables of the image the sandbox's template was made of, which its
    /// verifier gets too (its command starts from an empty environment).
    fn handle(
        &self,
        access: SandboxAccess,
        version: Option<EnvdVersion>,
        image_env: Vec<(String, String)>,
    ) -> E2bSandbox {
        let base = self
            .config
            .envd_base(&access.sandbox_id, access.domain.as_deref());
        let envd = Envd::new(
            Arc::clone(&self.envd),
            base,
            access.sandbox_id.clone(),
            access.envd_access_token,
            version,
        );
        E2bSandbox::new(
            access.sandbox_id,
            access.template_id,
            access.envd_version,
            envd,
            Arc::clone(&self.api),
            Arc::clone(&self.readers),
            image_env,
        )
    }

    fn rejected(&self, why: CreateRejected) -> SandboxError {
        bump(&self.counters.create_rejections);
        SandboxError::Remote {
            class: ErrorClass::Capacity,
            message: "an e2b sandbox create was not admitted".to_string(),
            source: Some(Box::new(why)),
        }
    }
}

/// One HTTP agent for the backend's calls, each bounded by `total` unless it says otherwise.
fn agent(options: &E2bOptions, total: Duration) -> Agent {
    // Enough idle connections that every sandbox's worker keeps its own warm one.
    let idle = options.max_sandboxes.saturating_mul(2).max(16);
    Agent::config_builder()
        // Statuses are classified by us, with the body in hand.
        .http_status_as_error(false)
        .timeout_global(Some(total))
        .timeout_connect(Some(options.connect_timeout))
        // A redirected POST would be replayed without its body; E2B never redirects.
        .max_redirects(0)
        .max_idle_connections(idle)
        .max_idle_connections_per_host(idle)
        .user_agent(USER_AGENT)
        .build()
        .new_agent()
}

/// A sandbox whose envd this client cannot drive: a bad request, which no retry cures.
fn envd_refused(refused: EnvdRefused) -> SandboxError {
    SandboxError::Remote {
        class: ErrorClass::BadRequest,
        message: refused.to_string(),
        source: Some(Box::new(refused)),
    }
}

fn check_e2b_id(id: &str) -> Result<()> {
    check_id(id, is_sandbox_id(id), "an e2b sandbox id")
}

impl Backend for E2bBackend {
    fn name(&self) -> &'static str {
        "e2b"
    }

    fn create(&self, spec: &CreateSpec) -> Result<Arc<dyn Sandbox>> {
        Ok(self.create_e2b(spec)?)
    }

    fn connect(&self, id: &str) -> Result<Arc<dyn Sandbox>> {
        Ok(self.connect_e2b(id)?)
    }

    fn list(&self, filter: &Metadata) -> Result<Vec<SandboxSummary>> {
        self.api.list(filter)
    }

    fn describe(&self, id: &str) -> Result<SandboxSummary> {
        check_e2b_id(id)?;
        self.api.describe(id)
    }

    /// Kills, repeating as the server allows; an error means the kill is not proven.
    fn kill(&self, id: &str) -> Result<Killed> {
        check_e2b_id(id)?;
        let killed = self.api.kill(id)?;
        bump(&self.counters.kills);
        if lock(&self.holding).remove(id) {
            self.slots.release();
        }
        Ok(killed)
    }

    fn pause(&self, id: &str, kind: PauseKind) -> Result<Paused> {
        check_e2b_id(id)?;
        self.api.pause(id, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated() {
        assert!(E2bOptions::default().validate().is_ok());
        let bad = [
            E2bOptions {
                create_rate: 0.0,
                ..E2bOptions::default()
            },
            E2bOptions {
                create_rate: f64::NAN,
                ..E2bOptions::default()
            },
            E2bOptions {
                max_sandboxes: 0,
                ..E2bOptions::default()
            },
            E2bOptions {
                keepalive: Duration::from_millis(500),
                ..E2bOptions::default()
            },
            E2bOptions {
                template: " ".into(),
                ..E2bOptions::default()
            },
        ];
        for o in bad {
            assert!(o.validate().is_err(), "{o:?}");
        }
    }

    #[test]
    fn ids_that_could_escape_a_url_path_are_refused() {
        assert!(check_e2b_id("i1a2b3c4d5e6f7g8h9j0k").is_ok());
        assert!(check_e2b_id("isb-6532622b").is_ok());
        for bad in ["", "a/b", "a?b", "../x", "a b", "a#b"] {
            assert!(check_e2b_id(bad).is_err(), "{bad:?}");
        }
    }
}
