//! Starting and stopping the emulator, the table of sandboxes it created, and routing each
//! request to the control plane or to envd (by its `E2b-Sandbox-Id` header).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;
use serde::Serialize;

use super::faults::{FaultCounts, FaultSpec, Faults, DEFAULT_SEED};
use super::http::{self, Handler, Request, Responder, Server};
use super::process::ProcHub;
use super::{control, envd};
use crate::errors::error_chain;
use crate::sandbox::local::{Isolation, IsolationChoice, LocalBackend, LocalOptions, LocalSandbox};
use crate::sandbox::{Backend, Killed, Metadata, Sandbox, SandboxError};
use crate::sync::lock;

/// The constant `clientID` the real API still returns.
pub const CLIENT_ID: &str = "6532622b";
/// The envd version we claim: recent enough that the SDK enables every feature we serve.
pub const ENVD_VERSION: &str = "0.6.13";

/// Receives one line per answered request ("POST /v2/sandboxes 201 3ms").
pub type AccessLog = Arc<dyn Fn(&str) + Send + Sync>;

/// How long `stop` waits for connection threads to notice.
const STOP_GRACE: Duration = Duration::from_secs(5);

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
    /// How the local sandboxes are confined; the emulator needs bwrap (E2B's `/home/user` and
    /// `/tmp` exist only in a bwrap sandbox), so `auto` must find it.
    pub isolation: IsolationChoice,
    pub access_log: Option<AccessLog>,
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
            isolation: IsolationChoice::Auto,
            access_log: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("the API key must not be empty")]
    EmptyApiKey,
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot open the local backend under {path}")]
    Backend {
        path: PathBuf,
        #[source]
        source: SandboxError,
    },
    #[error("cannot start the accept thread")]
    Thread(#[source] io::Error),
    #[error("the emulator needs bubblewrap to lay sandboxes out as E2B does (/home/user, a private /tmp): {0}")]
    Unconfined(String),
}

/// Counters for tests and for `GET /_emulator/stats`.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub seed: u64,
    pub faults: FaultCounts,
    pub requests: u64,
    pub creates: u64,
    pub streams: u64,
    /// Sandboxes this emulator created that are still alive.
    pub sandboxes: usize,
    pub connections: usize,
}

/// What `stop` did.
#[derive(Debug, Clone, Default)]
pub struct StopReport {
    /// Sandboxes killed on the way out (E2B ids).
    pub killed: Vec<String>,
    /// Sandboxes whose kill could not be proven, with the reason.
    pub failed: Vec<(String, String)>,
}

/// The entry point: `Emulator::start(config)`.
pub struct Emulator;

impl Emulator {
    /// Binds, opens the backend, and serves on background threads until the handle is
    /// stopped or dropped.
    pub fn start(config: EmulatorConfig) -> Result<EmulatorHandle, EmulatorError> {
        if config.api_key.is_empty() {
            return Err(EmulatorError::EmptyApiKey);
        }
        let listener = http::bind(config.listen).map_err(|source| EmulatorError::Bind {
            addr: config.listen,
            source,
        })?;
        let addr = listener
            .local_addr()
            .map_err(|source| EmulatorError::Bind {
                addr: config.listen,
                source,
            })?;
        let options = LocalOptions {
            isolation: config.isolation,
            ..LocalOptions::default()
        };
        let backend = LocalBackend::open_with(&config.state_dir, options).map_err(|source| {
            EmulatorError::Backend {
                path: config.state_dir.clone(),
                source,
            }
        })?;
        if backend.isolation() != Isolation::Bwrap {
            return Err(EmulatorError::Unconfined(
                backend
                    .isolation_fallback()
                    .unwrap_or("--isolation none was asked for")
                    .to_string(),
            ));
        }
        let (stop_tx, stop_rx) = bounded(0);
        let shared = Arc::new(Shared {
            faults: Faults::new(config.faults.clone(), config.seed),
            config,
            backend,
            table: Mutex::new(Table::default()),
            server: Server::new(),
            stop_tx: Mutex::new(Some(stop_tx)),
            stop_rx,
            requests: AtomicU64::new(0),
            creates: AtomicU64::new(0),
            streams: AtomicU64::new(0),
        });
        let accept = spawn_accept(&shared, listener)?;
        Ok(EmulatorHandle {
            addr,
            shared,
            accept: Some(accept),
        })
    }
}

fn spawn_accept(
    shared: &Arc<Shared>,
    listener: TcpListener,
) -> Result<JoinHandle<()>, EmulatorError> {
    let server = Arc::clone(&shared.server);
    let handler: Arc<dyn Handler> = Arc::new(Router(Arc::clone(shared)));
    std::thread::Builder::new()
        .name("emu-accept".into())
        .spawn(move || server.accept_loop(&listener, &handler))
        .map_err(EmulatorError::Thread)
}

/// A running emulator. Dropping it stops it (and kills its sandboxes); `stop` also says
/// what happened.
pub struct EmulatorHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl EmulatorHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`: the value for both `E2B_API_URL` and `E2B_SANDBOX_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The local sandbox directories' parent, for tests that look behind the emulator.
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.shared.backend.sandboxes_dir().to_path_buf()
    }

    /// Stops serving, cuts every connection, and kills every sandbox this emulator created.
    pub fn stop(mut self) -> StopReport {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> StopReport {
        let Some(accept) = self.accept.take() else {
            return StopReport::default();
        };
        self.shared.server.stop();
        // Disconnects the stop channel: streams and process followers end at once.
        lock(&self.shared.stop_tx).take();
        let entries: Vec<Arc<SandboxEntry>> = {
            let mut table = lock(&self.shared.table);
            table.closed = true;
            table.map.drain().map(|(_, e)| e).collect()
        };
        // In parallel: a kill waits for its process groups to die, up to 5 s each.
        let backend = &self.shared.backend;
        let outcomes: Vec<(String, Result<Killed, SandboxError>)> = entries
            .par_iter()
            .map(|e| (e.id.clone(), backend.kill(&e.local_id)))
            .collect();
        let mut report = StopReport::default();
        for (id, outcome) in outcomes {
            match outcome {
                Ok(Killed::Now) => report.killed.push(id),
                Ok(Killed::AlreadyGone) => {}
                Err(e) => report.failed.push((id, error_chain(&e))),
            }
        }
        let _ = accept.join();
        let until = Instant::now() + STOP_GRACE;
        while self.shared.server.connections() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        report
    }
}

impl Drop for EmulatorHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// A sandbox this emulator created, with what E2B reports about it.
pub(super) struct SandboxEntry {
    /// The E2B id: the local id without its dash (E2B ids are lowercase alphanumerics).
    pub id: String,
    pub local_id: String,
    pub sandbox: Arc<LocalSandbox>,
    pub template: String,
    /// `None` for a v1 create without `secure`: envd then asks for no token.
    pub token: Option<String>,
    pub started: SystemTime,
    /// When the sandbox dies (the local backend enforces it, rounded up to a second).
    pub deadline: Mutex<SystemTime>,
    pub metadata: Metadata,
    pub env_vars: BTreeMap<String, String>,
    pub network: Mutex<NetworkState>,
    /// Processes started through envd, kept 30 s after they end so `Connect` can replay the
    /// end (as envd does).
    pub procs: Mutex<HashMap<u32, Arc<ProcHub>>>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct NetworkState {
    pub internet: bool,
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
}

#[derive(Default)]
pub(super) struct Table {
    pub map: HashMap<String, Arc<SandboxEntry>>,
    /// Creates in flight, counted against `max_sandboxes` before they finish.
    pub pending: usize,
    /// Set by `stop`: a create finishing afterwards kills its sandbox itself.
    pub closed: bool,
}

/// Everything the request threads share.
pub(super) struct Shared {
    pub config: EmulatorConfig,
    pub backend: Arc<LocalBackend>,
    pub faults: Faults,
    pub table: Mutex<Table>,
    pub server: Arc<Server>,
    stop_tx: Mutex<Option<Sender<()>>>,
    /// Never receives a message; it disconnects when the emulator stops, which wakes every
    /// `select!` waiting on it.
    pub stop_rx: Receiver<()>,
    pub requests: AtomicU64,
    pub creates: AtomicU64,
    pub streams: AtomicU64,
}

impl Shared {
    pub fn stats(&self) -> Stats {
        let sandboxes = self
            .backend
            .list(&Metadata::new())
            .map(|live| {
                let live: HashSet<String> = live.into_iter().map(|s| s.id).collect();
                let table = lock(&self.table);
                table
                    .map
                    .values()
                    .filter(|e| live.contains(&e.local_id))
                    .count()
            })
            .unwrap_or(0);
        Stats {
            seed: self.config.seed,
            faults: self.faults.counts(),
            requests: self.requests.load(Ordering::SeqCst),
            creates: self.creates.load(Ordering::SeqCst),
            streams: self.streams.load(Ordering::SeqCst),
            sandboxes,
            connections: self.server.connections(),
        }
    }

    /// The entry for `id` if the sandbox is still alive; a dead one is forgotten.
    pub fn live_sandbox(&self, id: &str) -> Option<Arc<SandboxEntry>> {
        let entry = lock(&self.table).map.get(id).cloned()?;
        match self.backend.connect_local(&entry.local_id) {
            Ok(_) => Some(entry),
            Err(SandboxError::Gone { .. }) => {
                self.forget(id);
                None
            }
            // Cannot tell (an I/O error reading its meta): let the operation itself fail.
            Err(_) => Some(entry),
        }
    }

    pub fn forget(&self, id: &str) {
        lock(&self.table).map.remove(id);
    }

    /// Drops entries whose sandbox died (at its deadline, or killed behind our back).
    pub fn purge_dead(&self) {
        let entries: Vec<Arc<SandboxEntry>> = lock(&self.table).map.values().cloned().collect();
        for e in entries {
            if matches!(
                self.backend.connect_local(&e.local_id),
                Err(SandboxError::Gone { .. })
            ) {
                self.forget(&e.id);
            }
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.server.is_stopping()
    }

    /// Sleeps for `d` unless the emulator stops first; false when it stopped.
    pub fn sleep(&self, d: Duration) -> bool {
        matches!(
            self.stop_rx.recv_timeout(d),
            Err(crossbeam_channel::RecvTimeoutError::Timeout)
        )
    }
}

impl SandboxEntry {
    /// Moves the deadline to `secs` from now.
    pub fn set_deadline(&self, secs: u64) -> Result<(), SandboxError> {
        self.sandbox.set_timeout(secs)?;
        *lock(&self.deadline) = SystemTime::now() + Duration::from_secs(secs);
        Ok(())
    }
}

struct Router(Arc<Shared>);

impl Handler for Router {
    fn admit(&self, head: &Request) -> Option<http::Response> {
        // envd requests are checked against their sandbox's token, in `handle`.
        if head.header("e2b-sandbox-id").is_some() {
            return None;
        }
        let refused = control::admit(&self.0, head)?;
        self.0.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(log) = &self.0.config.access_log {
            log(&format!(
                "{} {} {} (body not read)",
                head.method, head.path, refused.status
            ));
        }
        Some(refused)
    }

    fn handle(&self, req: Request, out: &mut Responder<'_>) {
        let shared = &self.0;
        shared.requests.fetch_add(1, Ordering::SeqCst);
        let started = Instant::now();
        let line = shared
            .config
            .access_log
            .as_ref()
            .map(|_| format!("{} {}", req.method, req.path));
        let sandbox = req.header("e2b-sandbox-id").map(str::to_string);
        match sandbox {
            Some(id) => envd::handle(shared, &id, req, out),
            None => {
                let resp = control::handle(shared, &req);
                let _ = out.send(resp);
            }
        }
        if let (Some(log), Some(line)) = (&shared.config.access_log, line) {
            log(&format!(
                "{line} {} {}ms",
                out.status(),
                started.elapsed().as_millis()
            ));
        }
    }
}
