//! What an emulator is started with, and the constants it reports as E2B does.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::faults::{FaultSpec, DEFAULT_SEED};
use super::tls::TlsIdentity;
use crate::sandbox::local::IsolationChoice;

/// The constant `clientID` the real API still returns.
pub const CLIENT_ID: &str = "6532622b";
/// The envd version we claim: recent enough that the SDK enables every feature we serve.
pub const ENVD_VERSION: &str = "0.6.13";

/// The E2B plan the emulated team is on: it bounds a sandbox's timeout as E2B's does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Plan {
    /// 1 hour at most.
    #[default]
    Hobby,
    /// 24 hours at most.
    Pro,
}

impl Plan {
    /// The longest timeout a create, connect or set-timeout may ask for, in seconds.
    pub fn max_timeout_secs(self) -> i64 {
        match self {
            Plan::Hobby => 3600,
            Plan::Pro => 24 * 3600,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Plan::Hobby => "hobby",
            Plan::Pro => "pro",
        }
    }
}

/// The template every emulator serves; others are named with [`EmulatorConfig::templates`].
pub const BASE_TEMPLATE: &str = "base";

/// Receives one line per answered request ("POST /v2/sandboxes 201 3ms").
pub type AccessLog = Arc<dyn Fn(&str) + Send + Sync>;

/// What to serve and how.
#[derive(Clone)]
pub struct EmulatorConfig {
    /// Port 0 picks a free port; `EmulatorHandle::addr` tells which.
    pub listen: SocketAddr,
    /// Every control-plane request must carry it as `X-API-Key`.
    pub api_key: String,
    /// The local backend's state directory (sandboxes live under `<state_dir>/sandboxes`).
    pub state_dir: PathBuf,
    pub faults: FaultSpec,
    pub seed: u64,
    /// Live sandboxes at once; a create beyond it is answered 429 like E2B's team limit.
    pub max_sandboxes: usize,
    /// Template builds running at once (`None`: the CPUs this process may use); a build
    /// started beyond it is answered 429.
    pub max_builds: Option<usize>,
    /// How the local sandboxes are confined; the emulator needs bwrap (E2B's `/home/user` and
    /// `/tmp` exist only in a bwrap sandbox), so `auto` must find it.
    pub isolation: IsolationChoice,
    pub access_log: Option<AccessLog>,
    /// Sandbox namespaces starting at once (`None`: the CPUs this process may use).
    pub create_concurrency: Option<usize>,
    /// Bounds timeouts as the team's plan does (default: the strictest, Hobby).
    pub plan: Plan,
    /// Templates a create may name besides `base`; any other is answered 404 as the API does.
    /// All run on the same local sandbox.
    pub templates: Vec<String>,
    /// The certificate HTTPS tunnels to a sandbox's port are answered with; `None`: such a
    /// `CONNECT` is refused (plain HTTP with the sandbox's host still reaches it).
    pub tls: Option<TlsIdentity>,
}

impl EmulatorConfig {
    pub fn new(listen: SocketAddr, api_key: impl Into<String>, state_dir: PathBuf) -> Self {
        EmulatorConfig {
            listen,
            api_key: api_key.into(),
            state_dir,
            faults: FaultSpec::default(),
            seed: DEFAULT_SEED,
            max_sandboxes: 256,
            max_builds: None,
            isolation: IsolationChoice::Auto,
            access_log: None,
            create_concurrency: None,
            plan: Plan::default(),
            templates: Vec::new(),
            tls: None,
        }
    }
}
