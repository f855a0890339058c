//! What the request threads share: the table of sandboxes this emulator created, the local
//! backend behind them, the fault generators, the counters, and the stop signal.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use serde::Serialize;

use super::config::EmulatorConfig;
use super::faults::{FaultCounts, Faults};
use super::http::Server;
use super::hub::ProcHub;
use super::keys::Keys;
use super::templates::Templates;
use crate::sandbox::local::{LocalBackend, LocalSandbox, Resume, Resumed};
use crate::sandbox::{Backend, Metadata, PauseKind, RunState, Sandbox, SandboxError};
use crate::sync::lock;

/// Counters for tests and for `GET /_emulator/stats`.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub seed: u64,
    pub faults: FaultCounts,
    pub requests: u64,
    pub creates: u64,
    pub streams: u64,
    /// Sandboxes this emulator created that are still alive, running or paused.
    pub sandboxes: usize,
    /// Those of them that are paused.
    pub paused: usize,
    pub connections: usize,
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
    /// What a request to one of the sandbox's ports must carry (`e2b-traffic-access-token`);
    /// `None` when its ports are public.
    pub traffic_token: Option<String>,
    pub started: SystemTime,
    /// When the sandbox dies (the local backend enforces it, rounded up to a second); for a
    /// paused one, when it was to end before it was paused.
    pub deadline: Mutex<SystemTime>,
    /// The timeout it was created with, which a resume by envd traffic gives it again.
    pub timeout: u64,
    pub lifecycle: Lifecycle,
    pub metadata: Metadata,
    pub env_vars: BTreeMap<String, String>,
    pub network: Mutex<NetworkState>,
    /// Processes started through envd, kept 30 s after they end so `Connect` can replay the
    /// end (as envd does).
    pub procs: Mutex<HashMap<u32, Arc<ProcHub>>>,
}

/// What a sandbox does at its timeout, and whether envd traffic wakes it once paused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Lifecycle {
    /// How it is paused at its timeout; `None`: it is killed then.
    pub pause: Option<PauseKind>,
    pub auto_resume: bool,
}

/// Why a paused sandbox could not be woken for an envd request.
pub(super) enum Asleep {
    /// It was not created to be woken by traffic (or it is gone).
    NotWoken,
    /// Waking it would pass the limit on running sandboxes.
    AtLimit,
    Failed(SandboxError),
}

#[derive(Debug, Clone, Default)]
pub(super) struct NetworkState {
    pub internet: bool,
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
    /// What the sandbox was asked for, as the API reports it back: `allow_internet_access`
    /// and `network` as given, null where they were not.
    pub asked_internet: Option<bool>,
    pub asked_network: bool,
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
    /// Which `Idempotency-Key` made which sandbox, and whose create is running.
    pub keys: Keys,
    pub server: Arc<Server>,
    stop_tx: Mutex<Option<Sender<()>>>,
    /// Never receives a message; it disconnects when the emulator stops, which wakes every
    /// `select!` waiting on it.
    pub stop_rx: Receiver<()>,
    pub requests: AtomicU64,
    pub creates: AtomicU64,
    pub streams: AtomicU64,
    pub templates: Arc<Templates>,
}

impl Shared {
    pub fn new(config: EmulatorConfig, backend: Arc<LocalBackend>) -> Shared {
        let (stop_tx, stop_rx) = bounded(0);
        Shared {
            templates: Arc::new(Templates::new(&config.state_dir, config.max_builds)),
            faults: Faults::new(config.faults.clone(), config.seed),
            config,
            backend,
            table: Mutex::new(Table::default()),
            keys: Keys::default(),
            server: Server::new(),
            stop_tx: Mutex::new(Some(stop_tx)),
            stop_rx,
            requests: AtomicU64::new(0),
            creates: AtomicU64::new(0),
            streams: AtomicU64::new(0),
        }
    }

    pub fn stats(&self) -> Stats {
        let live = self.live_entries().unwrap_or_default();
        Stats {
            seed: self.config.seed,
            faults: self.faults.counts(),
            requests: self.requests.load(Ordering::SeqCst),
            creates: self.creates.load(Ordering::SeqCst),
            streams: self.streams.load(Ordering::SeqCst),
            sandboxes: live.len(),
            paused: live.iter().filter(|(_, s)| *s == RunState::Paused).count(),
            connections: self.server.connections(),
        }
    }

    /// Whether `given` is the API key every control-plane request must carry.
    pub fn api_key_matches(&self, given: &str) -> bool {
        constant_time_eq(given.as_bytes(), self.config.api_key.as_bytes())
    }

    /// Live sandboxes of this emulator, each running or paused. The backend's list also
    /// kills (or pauses) whatever passed its deadline, so a dead sandbox is never reported.
    pub fn live_entries(&self) -> Result<Vec<(Arc<SandboxEntry>, RunState)>, SandboxError> {
        let live: HashMap<String, RunState> = self
            .backend
            .list(&Metadata::new())?
            .into_iter()
            .map(|s| (s.id, s.state))
            .collect();
        let table = lock(&self.table);
        Ok(table
            .map
            .values()
            .filter_map(|e| Some((Arc::clone(e), *live.get(&e.local_id)?)))
            .collect())
    }

    /// The entry for `id` if the sandbox is still alive; a dead one is forgotten.
    pub fn live_sandbox(&self, id: &str) -> Option<Arc<SandboxEntry>> {
        self.lookup(id).map(|(e, _)| e)
    }

    /// The entry for `id` and whether it runs or is paused (never resumed by looking), if
    /// it is alive; a dead one is forgotten.
    pub fn lookup(&self, id: &str) -> Option<(Arc<SandboxEntry>, RunState)> {
        let entry = lock(&self.table).map.get(id).cloned()?;
        match self.backend.run_state(&entry.local_id) {
            Ok(state) => Some((entry, state)),
            Err(SandboxError::Gone { .. }) => {
                self.forget(id);
                None
            }
            // Cannot tell (an I/O error reading its meta): let the operation itself fail.
            Err(_) => Some((entry, RunState::Running)),
        }
    }

    /// The entry for `id` if its sandbox runs, woken first when it is paused and was created
    /// to be woken by traffic (E2B's `autoResume`).
    pub fn awake_sandbox(&self, id: &str) -> Result<Arc<SandboxEntry>, Asleep> {
        let (entry, state) = self.lookup(id).ok_or(Asleep::NotWoken)?;
        if state == RunState::Running {
            return Ok(entry);
        }
        if !entry.lifecycle.auto_resume {
            return Err(Asleep::NotWoken);
        }
        if self.running_count().map_err(Asleep::Failed)? >= self.config.max_sandboxes {
            return Err(Asleep::AtLimit);
        }
        entry
            .resume(self, Resume::AsPaused, entry.timeout)
            .map_err(|e| match e {
                SandboxError::Gone { .. } => Asleep::NotWoken,
                e => Asleep::Failed(e),
            })?;
        Ok(entry)
    }

    /// How many sandboxes of this emulator run (paused ones do not count against E2B's
    /// limit on concurrent sandboxes).
    pub fn running_count(&self) -> Result<usize, SandboxError> {
        Ok(self
            .live_entries()?
            .iter()
            .filter(|(_, s)| *s == RunState::Running)
            .count())
    }

    pub fn forget(&self, id: &str) {
        lock(&self.table).map.remove(id);
    }

    /// Drops entries whose sandbox died (at its deadline, or killed behind our back).
    pub fn purge_dead(&self) {
        let entries: Vec<Arc<SandboxEntry>> = lock(&self.table).map.values().cloned().collect();
        for e in entries {
            if matches!(
                self.backend.run_state(&e.local_id),
                Err(SandboxError::Gone { .. })
            ) {
                self.forget(&e.id);
            }
        }
    }

    /// Closes the table for good and hands back what it held: a create finishing afterwards
    /// kills its own sandbox, so none outlives the emulator.
    pub fn close_table(&self) -> Vec<Arc<SandboxEntry>> {
        let mut table = lock(&self.table);
        table.closed = true;
        table.map.drain().map(|(_, e)| e).collect()
    }

    /// Disconnects the stop channel: streams and process followers end at once.
    pub fn signal_stop(&self) {
        lock(&self.stop_tx).take();
    }

    pub fn is_stopping(&self) -> bool {
        self.server.is_stopping()
    }

    /// Sleeps for `d` unless the emulator stops first; false when it stopped.
    pub fn sleep(&self, d: Duration) -> bool {
        matches!(self.stop_rx.recv_timeout(d), Err(RecvTimeoutError::Timeout))
    }
}

impl SandboxEntry {
    /// Moves the deadline to `secs` from now.
    pub fn set_deadline(&self, secs: u64) -> Result<(), SandboxError> {
        self.sandbox.set_timeout(secs)?;
        *lock(&self.deadline) = SystemTime::now() + Duration::from_secs(secs);
        Ok(())
    }

    /// Moves the deadline to `secs` from now unless it lies later already: a connect or a
    /// refresh only ever extends a sandbox's life.
    pub fn extend_deadline(&self, secs: u64) -> Result<(), SandboxError> {
        let wanted = SystemTime::now() + Duration::from_secs(secs);
        if wanted > *lock(&self.deadline) {
            self.set_deadline(secs)?;
        }
        Ok(())
    }

    /// Resumes the paused sandbox `how` and gives it `secs` to live; `false` when it ran
    /// already (it is left as it was).
    pub fn resume(&self, shared: &Shared, how: Resume, secs: u64) -> Result<bool, SandboxError> {
        let (_, resumed) = shared.backend.resume_local(&self.local_id, how)?;
        if resumed == Resumed::WasRunning {
            return Ok(false);
        }
        // A reboot leaves none of the processes envd started, as a fresh envd knows none:
        // forget them now rather than when their followers notice the ends.
        let live: HashSet<u32> = self.sandbox.processes()?.iter().map(|p| p.pid).collect();
        lock(&self.procs).retain(|pid, hub| !hub.is_running() || live.contains(pid));
        self.set_deadline(secs)?;
        Ok(true)
    }

    /// Whether `given` is this sandbox's envd access token (false when it has none).
    pub fn token_matches(&self, given: &str) -> bool {
        self.token
            .as_ref()
            .is_some_and(|t| constant_time_eq(given.as_bytes(), t.as_bytes()))
    }
}

/// Compares without an early exit, so timing does not reveal how much of a secret matched.
pub(in crate::emulator) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
