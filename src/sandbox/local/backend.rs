//! The local backend itself: opening the state directory, creating and connecting to
//! sandboxes, listing, killing, pausing and resuming them, and the sweep and watcher that
//! end (or pause) those whose deadline passed.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::cgroup::{self, Cgroup};
use super::holder_start;
use super::id_range;
use super::image_root;
use super::isolation::{self, Isolation, IsolationChoice};
use super::meta::{
    self, Meta, MetaError, LOGS_DIR, ROOT_DIR, STAGING_PREFIX, SYSTEM_DIR, TESTS_DIR, TMP_DIR,
    TOMB_PREFIX, VERIFIER_DIR,
};
use super::netns;
use super::ns::{Space, NS_DIR};
use super::pause::{self, Resume, Resumed};
use super::sandbox::LocalSandbox;
use super::state::{HostConfig, Mode, SandboxState};
use super::sys;
use super::teardown;
use crate::sandbox::{
    check_id, Backend, CreateSpec, ErrorClass, Killed, Metadata, Network, OnTimeout, PauseKind,
    Paused, Result, RunState, Sandbox, SandboxError, SandboxSummary,
};
use crate::sync::lock;

/// How often the watcher looks for sandboxes whose deadline passed.
const WATCH_PERIOD: Duration = Duration::from_millis(250);
/// A `.new-` directory this old belongs to a create that crashed.
const STALE_STAGING: Duration = Duration::from_secs(600);

/// How a local backend makes sandboxes.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    pub isolation: IsolationChoice,
    /// Host directories shown read-only to [`crate::sandbox::Role::System`] processes under
    /// bwrap, each at the sandbox path given (the pi install, under the system directory).
    pub system_read_only: Vec<(PathBuf, String)>,
    /// Host directories shown read-only to every process of a sandbox under bwrap (task,
    /// verifier and system alike), each at the sandbox path given: an agent's install.
    pub everyone_read_only: Vec<(PathBuf, String)>,
    /// Shows the system directory (the runner's, and what root placed there) read-only to
    /// task processes too, as an E2B sandbox's user sees what root wrote under `/opt`: the
    /// emulator's sandboxes. An eval's keep it from the task.
    pub system_read_only_to_tasks: bool,
    /// Namespace holders starting at once, for this whole process (see `admission`);
    /// `None` leaves the bound as it is (by default, the CPUs this process may use).
    pub create_concurrency: Option<usize>,
}

/// Process sandboxes on this machine, kept under a state directory.
pub struct LocalBackend {
    shared: Arc<Shared>,
    /// Dropping it stops the watcher.
    stop: Option<Sender<()>>,
    watcher: Option<JoinHandle<()>>,
}

struct Shared {
    /// `<state>/sandboxes`, absolute.
    sandboxes: PathBuf,
    /// `sandboxes` as text, the prefix of every host path shown to an unconfined sandbox.
    sandboxes_str: String,
    /// How new sandboxes are confined.
    isolation: Isolation,
    /// Why `auto` chose none, when it did.
    fallback_reason: Option<String>,
    host: Arc<HostConfig>,
    /// Sandboxes this backend created or connected to, so every handle on one shares its
    /// process table and the watcher knows what to expire.
    registry: Mutex<HashMap<String, Arc<SandboxState>>>,
}

impl LocalBackend {
    /// Opens the local backend with default options: bwrap isolation where it works.
    pub fn open(state_dir: &Path) -> Result<Arc<LocalBackend>> {
        Self::open_with(state_dir, LocalOptions::default())
    }

    /// Opens (creating if needed) the local backend under `state_dir`, sweeps every expired
    /// sandbox, and starts the expiry watcher. Fails when `--isolation bwrap` was asked for
    /// and bwrap cannot run here.
    pub fn open_with(state_dir: &Path, options: LocalOptions) -> Result<Arc<LocalBackend>> {
        if options.create_concurrency.is_some() {
            super::admission::set_create_concurrency(options.create_concurrency);
        }
        let resolved = isolation::resolve(options.isolation).map_err(SandboxError::Unsupported)?;
        let unusable = |path: &Path, e: io::Error| SandboxError::Remote {
            class: ErrorClass::Unsupported,
            message: format!("cannot use {} for local sandboxes", path.display()),
            source: Some(Box::new(e)),
        };
        let dir = state_dir.join("sandboxes");
        meta::private_dir_all(&dir).map_err(|e| unusable(&dir, e))?;
        let sandboxes = fs::canonicalize(&dir).map_err(|e| unusable(&dir, e))?;
        let Some(sandboxes_str) = sandboxes.to_str().map(str::to_string) else {
            return Err(SandboxError::Unsupported(format!(
                "the local backend needs a UTF-8 state directory; {} is not",
                sandboxes.display()
            )));
        };
        // Beside the sandboxes, not among them: every sandbox is bound to the same two files.
        let etc = state_dir.join("sandbox-identity");
        let (passwd, group) = fs::create_dir_all(&etc)
            .and_then(|()| isolation::write_identity(&etc))
            .map_err(|e| unusable(&etc, e))?;
        let shared = Arc::new(Shared {
            sandboxes,
            sandboxes_str,
            isolation: resolved.isolation,
            fallback_reason: resolved.fallback_reason,
            host: Arc::new(HostConfig {
                passwd,
                group,
                system_read_only: options.system_read_only,
                everyone_read_only: options.everyone_read_only,
                system_read_only_to_tasks: options.system_read_only_to_tasks,
            }),
            registry: Mutex::default(),
        });
        shared.sweep();
        let (stop, stopped) = bounded(0);
        let watched = Arc::clone(&shared);
        let watcher = std::thread::Builder::new()
            .name("lsb-watcher".into())
            .spawn(move || watch(&watched, &stopped))
            .map_err(|e| unusable(&shared.sandboxes, e))?;
        Ok(Arc::new(LocalBackend {
            shared,
            stop: Some(stop),
            watcher: Some(watcher),
        }))
    }

    /// `<state>/sandboxes`.
    pub fn sandboxes_dir(&self) -> &Path {
        &self.shared.sandboxes
    }

    /// How new sandboxes are confined.
    pub fn isolation(&self) -> Isolation {
        self.shared.isolation
    }

    /// Why `--isolation auto` fell back to none, when it did: for a warning to the user.
    pub fn isolation_fallback(&self) -> Option<&str> {
        self.shared.fallback_reason.as_deref()
    }

    /// Why sandboxes cannot have a network of their own (`Network::Internet`) here, if they
    /// cannot: what is missing.
    pub fn network_unavailable(&self) -> Option<String> {
        let bwrap = match self.shared.isolation {
            Isolation::Bwrap => isolation::probe().ok(),
            Isolation::None => None,
        };
        netns::unavailable(bwrap)
    }

    /// Why sandboxes get no memory, process or CPU limits here, if they do not: for a
    /// warning to the user.
    pub fn limits_unavailable(&self) -> Option<&'static str> {
        cgroup::unavailable()
    }

    /// Kills (or pauses, as they were created to) the sandboxes past their deadline, whoever
    /// created them; returns how many were killed.
    pub fn sweep_expired(&self) -> usize {
        self.shared.sweep()
    }

    /// Creates a sandbox and returns its concrete handle.
    pub fn create_local(&self, spec: &CreateSpec) -> Result<Arc<LocalSandbox>> {
        let isolation = self.shared.isolation;
        if !spec.internet && isolation == Isolation::None {
            sys::netlock_flag()?;
        }
        if spec.on_timeout == OnTimeout::Pause(PauseKind::Memory) && isolation == Isolation::None {
            // Refused now rather than at the deadline, when nobody is there to hear it.
            return Err(SandboxError::Unsupported(
                "a sandbox that pauses its memory at its deadline needs --isolation bwrap".into(),
            ));
        }
        let own_network = spec.internet && spec.network == Network::Internet;
        if let Some(why) = own_network.then(|| self.network_unavailable()).flatten() {
            return Err(SandboxError::Unsupported(why));
        }
        if spec.image.is_some() {
            image_root::supported(isolation)?;
        }
        let id = meta::new_id().map_err(|e| SandboxError::Io {
            id: String::new(),
            what: "choosing a sandbox id".into(),
            source: e,
        })?;
        let io_error = |what: &str, source| SandboxError::Io {
            id: id.clone(),
            what: what.to_string(),
            source,
        };
        let now = meta::now_ms() / 1000;
        let mut m = Meta {
            id: id.clone(),
            created: now,
            deadline: meta::deadline_after(spec.timeout_secs),
            metadata: spec.metadata.clone(),
            template: spec.template.clone(),
            internet: spec.internet,
            own_network,
            owner_pid: std::process::id(),
            envs: spec.envs.clone(),
            isolation,
            ids: None,
            timeout: spec.timeout_secs,
            pause_at_deadline: match spec.on_timeout {
                OnTimeout::Kill => None,
                OnTimeout::Pause(kind) => Some(kind.into()),
            },
            paused: None,
            image: spec.image.clone(),
        };
        // Built aside and renamed into place, so no reader ever sees half a sandbox. Made
        // first: a sandbox's id range names it, and is free again once it exists in no form.
        let staging = self.shared.sandboxes.join(format!("{STAGING_PREFIX}{id}"));
        meta::private_dir(&staging).map_err(|e| io_error("creating the sandbox directory", e))?;
        let undo = |m: &Meta| {
            let _ = crate::deep_remove::remove_tree(&staging);
            if let Some(range) = m.ids {
                let _ = id_range::release(&self.shared.sandboxes, &m.id, range);
            }
        };
        let wants_range = isolation == Isolation::Bwrap
            && isolation::probe()
                .ok()
                .and_then(holder_start::mapper)
                .is_some();
        if wants_range {
            match id_range::allocate(&self.shared.sandboxes, &id) {
                Ok(range) => m.ids = Some(range),
                Err(e) => {
                    undo(&m);
                    return Err(io_error("choosing the sandbox's user ids", e));
                }
            }
        }
        let state = match self.shared.state_of(&m) {
            Ok(state) => state,
            Err(e) => {
                undo(&m);
                return Err(e);
            }
        };
        let owner = state.file_owner();
        let built = (|| {
            super::procs_dir::make(&staging)?;
            meta::private_dir(&staging.join(NS_DIR))?;
            // The sandbox user's own directories, with the modes E2B gives them.
            // `/tests` too, read-only to tasks (see `stop`).
            for (dir, mode) in [
                (ROOT_DIR, 0o755),
                (TMP_DIR, 0o1777),
                (SYSTEM_DIR, 0o700),
                (TESTS_DIR, 0o755),
                (LOGS_DIR, 0o755),
            ] {
                let path = staging.join(dir);
                fs::create_dir(&path)?;
                fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
                if let Some(uid) = owner {
                    sys::chown(&path, uid)?;
                }
            }
            fs::create_dir(staging.join(VERIFIER_DIR))?;
            meta::write_meta(&staging, &m)?;
            // Made while the sandbox is still `.new-`, which a sweep leaves alone, and
            // limited before its first process joins them.
            if spec.limits.any() {
                if let Some(cgroup) = Cgroup::create(&staging, &id)? {
                    if let Err(e) = cgroup.apply(&spec.limits) {
                        let _ = cgroup.remove();
                        return Err(e);
                    }
                }
            }
            fs::rename(&staging, self.shared.sandboxes.join(&id))
        })();
        if let Err(e) = built {
            undo(&m);
            return Err(io_error("creating the sandbox directory", e));
        }
        let state = Arc::new(state);
        lock(&self.shared.registry).insert(id.clone(), Arc::clone(&state));
        if let Mode::Bwrap(bwrap) = state.mode {
            let holders = state
                .start_holder(bwrap, Space::Sandbox)
                .and_then(|_| state.start_holder(bwrap, Space::Task));
            if let Err(e) = holders {
                let _ = self.shared.destroy(&id);
                return Err(e);
            }
            state.prepare_spare(bwrap);
        }
        Ok(Arc::new(LocalSandbox { state }))
    }

    /// Opens an existing sandbox by id, resuming it if it is paused, and returns its
    /// concrete handle.
    pub fn connect_local(&self, id: &str) -> Result<Arc<LocalSandbox>> {
        Ok(self.resume_local(id, Resume::AsPaused)?.0)
    }

    /// Opens an existing sandbox by id, resuming it `how` if it is paused (a running one is
    /// left as it is), and says which it was.
    pub fn resume_local(&self, id: &str, how: Resume) -> Result<(Arc<LocalSandbox>, Resumed)> {
        check_local_id(id)?;
        let state = self.shared.state_for(id)?;
        let resumed = match state.ensure_live() {
            Ok(()) => Resumed::WasRunning,
            Err(SandboxError::Paused { .. }) => pause::resume(&state, how)?,
            Err(e) => return Err(e),
        };
        Ok((Arc::new(LocalSandbox { state }), resumed))
    }

    /// Whether the sandbox `id` runs or is paused, without resuming it; `Gone` once it is
    /// dead.
    pub fn run_state(&self, id: &str) -> Result<RunState> {
        check_local_id(id)?;
        let state = self.shared.state_for(id)?;
        match state.ensure_live() {
            Ok(()) => Ok(RunState::Running),
            // Paused, or due to be: settled, so that it is.
            Err(SandboxError::Paused { .. }) => pause::settle(&state),
            Err(e) => Err(e),
        }
    }
}

impl Drop for LocalBackend {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(watcher) = self.watcher.take() {
            // The watcher wakes at once on the disconnect; a tick in progress is bounded.
            let _ = watcher.join();
        }
    }
}

impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    fn create(&self, spec: &CreateSpec) -> Result<Arc<dyn Sandbox>> {
        Ok(self.create_local(spec)?)
    }

    fn connect(&self, id: &str) -> Result<Arc<dyn Sandbox>> {
        Ok(self.connect_local(id)?)
    }

    fn list(&self, filter: &Metadata) -> Result<Vec<SandboxSummary>> {
        let entries = fs::read_dir(&self.shared.sandboxes).map_err(|source| SandboxError::Io {
            id: String::new(),
            what: format!("listing {}", self.shared.sandboxes.display()),
            source,
        })?;
        let now = meta::now_ms();
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let Some(id) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !meta::is_id(&id) {
                continue;
            }
            // Torn, corrupt or vanished meta: not a sandbox we can describe; skip it.
            let Ok(m) = meta::read_meta(&entry.path()) else {
                continue;
            };
            if m.id != id {
                continue;
            }
            let state = if m.paused.is_some() {
                RunState::Paused
            } else if !m.expired_at(now) {
                RunState::Running
            } else {
                // Swept by any command; a failure is retried by the next one.
                match self.shared.expire(&id, &m) {
                    Ok(Some(state)) => state,
                    Ok(None) | Err(_) => continue,
                }
            };
            if filter.iter().all(|(k, v)| m.metadata.get(k) == Some(v)) {
                out.push(SandboxSummary {
                    id: m.id,
                    template: m.template,
                    metadata: m.metadata,
                    created: m.created,
                    deadline: m.deadline,
                    state,
                });
            }
        }
        out.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        Ok(out)
    }

    fn describe(&self, id: &str) -> Result<SandboxSummary> {
        check_local_id(id)?;
        // One directory scan: cheap here, and the one place a sandbox's summary is built.
        self.list(&Metadata::new())?
            .into_iter()
            .find(|s| s.id == id)
            .ok_or_else(|| SandboxError::Gone { id: id.to_string() })
    }

    fn kill(&self, id: &str) -> Result<Killed> {
        check_local_id(id)?;
        self.shared.destroy(id)
    }

    fn pause(&self, id: &str, kind: PauseKind) -> Result<Paused> {
        check_local_id(id)?;
        pause::pause(&self.shared.state_for(id)?, kind)
    }
}

fn check_local_id(id: &str) -> Result<()> {
    check_id(id, meta::is_id(id), "a local sandbox id")
}

impl Shared {
    /// The in-process state of the sandbox `meta` describes (not yet registered).
    fn state_of(&self, meta: &Meta) -> Result<SandboxState> {
        SandboxState::new(
            &self.sandboxes,
            &self.sandboxes_str,
            meta,
            Arc::clone(&self.host),
        )
    }

    fn registered(&self, id: &str) -> Option<Arc<SandboxState>> {
        lock(&self.registry)
            .get(id)
            .filter(|s| !s.is_gone())
            .cloned()
    }

    /// The state of sandbox `id`: this process's, or one made from its meta.json and
    /// registered. `Gone` once it is dead (killed now if its deadline passed and it dies
    /// then).
    fn state_for(&self, id: &str) -> Result<Arc<SandboxState>> {
        if let Some(state) = self.registered(id) {
            return Ok(state);
        }
        let gone = || SandboxError::Gone { id: id.to_string() };
        let m = match meta::read_meta(&self.sandboxes.join(id)) {
            Ok(m) if m.id == id => m,
            Ok(_) | Err(MetaError::Missing) => return Err(gone()),
            Err(MetaError::Corrupt(source) | MetaError::Io(source)) => {
                return Err(SandboxError::Io {
                    id: id.to_string(),
                    what: "reading meta.json".into(),
                    source,
                })
            }
        };
        if m.expired_at(meta::now_ms()) && m.on_timeout() == OnTimeout::Kill {
            self.destroy(id)?;
            return Err(gone());
        }
        let fresh = self.state_of(&m)?;
        let mut registry = lock(&self.registry);
        // Another thread may have connected meanwhile; share its state (and process table).
        let slot = registry
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(fresh));
        Ok(Arc::clone(slot))
    }

    /// Does what the passed deadline of sandbox `id` (described by `m`) asks: kills it
    /// (`None`), or pauses it. The state it is left in otherwise.
    fn expire(&self, id: &str, m: &Meta) -> Result<Option<RunState>> {
        if m.on_timeout() == OnTimeout::Kill {
            self.destroy(id)?;
            return Ok(None);
        }
        match pause::settle(&self.state_for(id)?) {
            Ok(state) => Ok(Some(state)),
            Err(e) if e.class() == ErrorClass::Gone => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn destroy(&self, id: &str) -> Result<Killed> {
        let state = lock(&self.registry).remove(id);
        match state {
            Some(state) => state.destroy(),
            None => Ok(if teardown::destroy_dir(&self.sandboxes, id)? {
                Killed::Now
            } else {
                Killed::AlreadyGone
            }),
        }
    }

    /// Kills expired sandboxes, finishes interrupted kills, removes crashed creates. Errors
    /// are skipped: whatever is left is retried by the next sweep.
    fn sweep(&self) -> usize {
        let Ok(entries) = fs::read_dir(&self.sandboxes) else {
            return 0;
        };
        let now = meta::now_ms();
        let mut swept = 0;
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let path = entry.path();
            if name.starts_with(TOMB_PREFIX) {
                let _ = teardown::finish_burial(&path, &name, None);
            } else if name.starts_with(STAGING_PREFIX) {
                let stale = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_STAGING);
                if stale {
                    let _ = crate::deep_remove::remove_tree(&path);
                }
            } else if meta::is_id(&name) {
                let Ok(m) = meta::read_meta(&path) else {
                    continue;
                };
                if m.expired_at(now) && matches!(self.expire(&name, &m), Ok(None)) {
                    swept += 1;
                }
            }
        }
        let sandboxes = &self.sandboxes;
        cgroup::sweep_leftovers(sandboxes, |id| {
            sandboxes.join(id).exists() || sandboxes.join(format!("{STAGING_PREFIX}{id}")).exists()
        });
        swept
    }
}

/// Kills (or pauses) this backend's sandboxes when their deadline passes, until the backend
/// is dropped.
fn watch(shared: &Shared, stop: &Receiver<()>) {
    loop {
        match stop.recv_timeout(WATCH_PERIOD) {
            Err(RecvTimeoutError::Timeout) => {}
            // Disconnected: the backend was dropped.
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let states: Vec<Arc<SandboxState>> = lock(&shared.registry).values().cloned().collect();
        for state in &states {
            if state.is_due() {
                // Nobody to tell: a sandbox that cannot be killed or paused now is tried
                // again at the next tick.
                let _ = pause::settle(state);
            }
        }
        lock(&shared.registry).retain(|_, s| !s.is_gone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_the_backend_stops_its_watcher() {
        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open(dir.path()).unwrap();
        let shared = Arc::clone(&backend.shared);
        assert_eq!(Arc::strong_count(&shared), 3, "backend, watcher, test");
        drop(backend);
        // Drop joins the watcher, which held the other reference.
        assert_eq!(Arc::strong_count(&shared), 1);
    }
}
