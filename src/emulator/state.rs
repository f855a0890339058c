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
use crate::sandbox::local::{LocalBackend, LocalSandbox};
use crate::sandbox::{Backend, Metadata, Sandbox, SandboxError};
use crate::sync::lock;

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
}

impl Shared {
    pub fn new(config: EmulatorConfig, backend: Arc<LocalBackend>) -> Shared {
        let (stop_tx, stop_rx) = bounded(0);
        Shared {
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
        Stats {
            seed: self.config.seed,
            faults: self.faults.counts(),
            requests: self.requests.load(Ordering::SeqCst),
            creates: self.creates.load(Ordering::SeqCst),
            streams: self.streams.load(Ordering::SeqCst),
            sandboxes: self.live_entries().map_or(0, |live| live.len()),
            connections: self.server.connections(),
        }
    }

    /// Whether `given` is the API key every control-plane request must carry.
    pub fn api_key_matches(&self, given: &str) -> bool {
        constant_time_eq(given.as_bytes(), self.config.api_key.as_bytes())
    }

    /// Live sandboxes of this emulator. The backend's list also kills whatever passed its
    /// deadline, so a dead sandbox is never reported.
    pub fn live_entries(&self) -> Result<Vec<Arc<SandboxEntry>>, SandboxError> {
        let live = self.backend.list(&Metadata::new())?;
        let live: HashSet<String> = live.into_iter().map(|s| s.id).collect();
        let table = lock(&self.table);
        Ok(table
            .map
            .values()
            .filter(|e| live.contains(&e.local_id))
            .cloned()
            .collect())
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

    /// Whether `given` is this sandbox's envd access token (false when it has none).
    pub fn token_matches(&self, given: &str) -> bool {
        self.token
            .as_ref()
            .is_some_and(|t| constant_time_eq(given.as_bytes(), t.as_bytes()))
    }
}

/// Compares without an early exit, so timing does not reveal how much of a secret matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
