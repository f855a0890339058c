//! The warm-sandbox pool: hands out bootstrapped, hello-verified sandboxes and takes them
//! back.
//!
//! Reuse is what makes evaluation cheap, and what could make results wrong: a task must never
//! see what an earlier one left. So a sandbox is sealed once its runner is up, and a released
//! healthy sandbox is reset (every task process ended, home and `/tmp` back to the sealed
//! state, proven by the backend) before it goes back on a LIFO stack (the most recently used
//! is the most likely still alive). Whatever cannot be proven clean is retired, i.e. killed,
//! and a kill is only counted done when the backend proves it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::channel::{LeaseRenewal, StdioChannel};
use crate::runner::{self, BootstrapOpts, RunnerError};
use crate::sandbox::{Backend, CreateSpec, ImageRoot, Sandbox, SandboxError};
use crate::sync::lock;

/// Parallel kills at `close`.
pub const MAX_RETIRE_WORKERS: usize = 16;

/// Lease of a pooled sandbox for an episode budget of `episode`: long enough for one episode
/// plus cleanup after its watchdog fires.
pub fn lease_for(episode: Duration) -> Duration {
    if episode <= Duration::from_secs(300) {
        Duration::from_secs(900)
    } else {
        episode + Duration::from_secs(900)
    }
}

/// Hard cap on how long keepalives may keep one episode's sandbox alive.
pub fn lifetime_for(episode: Duration) -> Duration {
    lease_for(episode).max(Duration::from_secs(3600))
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Template and metadata of new sandboxes; `timeout_secs` is overridden by `lease`.
    pub spec: CreateSpec,
    pub lease: Duration,
    pub lifetime: Duration,
    pub bootstrap: BootstrapOpts,
    /// The directory under `home()` that episodes work in; the job creates it before each use.
    pub workspace_dir: String,
    /// Reset released sandboxes for the next task; false gives every task a fresh sandbox.
    pub reuse: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("the sandbox pool is closed")]
    Closed,
    #[error("could not create a sandbox")]
    Create(#[source] SandboxError),
    #[error("could not start the runner")]
    Bootstrap(#[source] RunnerError),
    #[error("sandbox {id} could not be killed")]
    Kill {
        id: String,
        #[source]
        source: SandboxError,
    },
    #[error("failed to prove cleanup for {failed} of {total} sandboxes (first: {first_id})")]
    Cleanup {
        failed: usize,
        total: usize,
        first_id: String,
        #[source]
        first: SandboxError,
    },
}

impl PoolError {
    /// Whether trying again (on a fresh sandbox) may succeed.
    pub fn is_transport(&self) -> bool {
        match self {
            PoolError::Closed => false,
            PoolError::Create(e) => e.is_transport(),
            PoolError::Bootstrap(e) => e.is_transport(),
            PoolError::Kill { .. } | PoolError::Cleanup { .. } => true,
        }
    }
}

/// A sandbox handed out by the pool, with its runner's channel.
pub struct Warm {
    pub sandbox: Arc<dyn Sandbox>,
    pub channel: StdioChannel,
    /// Whether an earlier episode used this sandbox.
    pub reused: bool,
    /// The digest of the harness files this sandbox's runner holds (sent with an earlier
    /// episode; the runner keeps them for as long as it runs).
    pub harness_files: Option<String>,
    /// The image its task processes run on (its id), if any: it serves only tasks of that
    /// environment.
    pub image: Option<String>,
}

/// Sandboxes created and sandbox-seconds (create to proven kill, or to now while live), and
/// how the resets between tasks went.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PoolUsage {
    pub count: u64,
    pub seconds: f64,
    /// Resets proven clean (each let a sandbox serve another task).
    pub resets: u64,
    /// Resets that could not prove the sandbox clean (it was retired instead).
    pub unclean: u64,
    /// Seconds spent resetting, in all.
    pub reset_seconds: f64,
    /// Why the first unclean reset could not prove its sandbox clean.
    pub unclean_reason: Option<String>,
}

struct Live {
    sandbox: Arc<dyn Sandbox>,
    started: Instant,
    /// Held while one thread kills the sandbox, so a second retirer waits for the proof
    /// instead of taking "already gone" for it.
    retiring: Arc<Mutex<()>>,
}

#[derive(Default)]
struct State {
    idle: Vec<Warm>,
    live: HashMap<String, Live>,
    closed: bool,
    created: u64,
    retired_seconds: f64,
    resets: u64,
    unclean: u64,
    reset_seconds: f64,
    unclean_reason: Option<String>,
}

pub struct Pool {
    backend: Arc<dyn Backend>,
    config: PoolConfig,
    state: Mutex<State>,
}

impl Pool {
    pub fn new(backend: Arc<dyn Backend>, config: PoolConfig) -> Self {
        Pool {
            backend,
            config,
            state: Mutex::new(State::default()),
        }
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The absolute workspace directory of a task on `sandbox` whose processes run on
    /// `image`: the image's working directory when it names one (where its tasks expect to
    /// work), else the pool's workspace in the home.
    pub fn workspace_for(&self, sandbox: &dyn Sandbox, image: Option<&ImageRoot>) -> String {
        match image.and_then(|i| i.workdir.as_deref()) {
            Some(dir) if dir.starts_with('/') && dir != "/" => dir.trim_end_matches('/').into(),
            _ => self.workspace_of(sandbox),
        }
    }

    /// The absolute workspace directory of `sandbox`.
    pub fn workspace_of(&self, sandbox: &dyn Sandbox) -> String {
        format!(
            "{}/{}",
            sandbox.home().trim_end_matches('/'),
            self.config.workspace_dir
        )
    }

    /// A warm sandbox of the pool's own environment (see [`Pool::acquire_for`]).
    pub fn acquire(&self) -> Result<Warm, PoolError> {
        self.acquire_for(None)
    }

    /// A warm sandbox whose task processes run on `image` (`None`: the spec's own): the
    /// most recently released idle one of that environment that is still alive, or a new
    /// one. Making a new one retires the longest idle sandbox of another environment, so a
    /// run over many environments holds no more sandboxes than one over a single one.
    pub fn acquire_for(&self, image: Option<&ImageRoot>) -> Result<Warm, PoolError> {
        let wanted = image.map(|i| i.id.as_str());
        loop {
            let (warm, other) = {
                let mut st = self.state();
                if st.closed {
                    return Err(PoolError::Closed);
                }
                match st.idle.iter().rposition(|w| w.image.as_deref() == wanted) {
                    Some(i) => (Some(st.idle.remove(i)), None),
                    None if st.idle.is_empty() => (None, None),
                    None => (None, Some(st.idle.remove(0))),
                }
            };
            if let Some(other) = other {
                let sandbox = other.sandbox.clone();
                drop(other);
                let _ = self.retire(&sandbox);
            }
            let Some(mut warm) = warm else { break };
            // Extending the lease first proves the sandbox is alive and gives the episode a
            // full lease.
            match warm.sandbox.set_timeout(self.config.lease.as_secs()) {
                Ok(()) => {
                    warm.reused = true;
                    return Ok(warm);
                }
                Err(_) => {
                    let _ = self.retire(&warm.sandbox);
                }
            }
        }
        self.create(image)
    }

    fn create(&self, image: Option<&ImageRoot>) -> Result<Warm, PoolError> {
        let mut spec = self.config.spec.clone();
        spec.timeout_secs = self.config.lease.as_secs();
        if let Some(image) = image {
            spec.image = Some(image.clone());
        }
        let sandbox = self.backend.create(&spec).map_err(PoolError::Create)?;
        {
            let mut st = self.state();
            st.created += 1;
            // Registered before bootstrap so a close() during a slow start still kills it.
            st.live.insert(
                sandbox.id().to_string(),
                Live {
                    sandbox: sandbox.clone(),
                    started: Instant::now(),
                    retiring: Arc::new(Mutex::new(())),
                },
            );
            if st.closed {
                drop(st);
                let _ = self.retire(&sandbox);
                return Err(PoolError::Closed);
            }
        }
        let mut opts = self.config.bootstrap.clone();
        opts.renewal = Some(LeaseRenewal::new(self.config.lease, self.config.lifetime));
        let started = match runner::bootstrap(&sandbox, &opts) {
            Ok(s) => s,
            Err(e) => {
                let _ = self.retire(&sandbox);
                return Err(PoolError::Bootstrap(e));
            }
        };
        if self.state().closed {
            let _ = self.retire(&sandbox);
            return Err(PoolError::Closed);
        }
        // The runner is up: this is the state every task served by this sandbox starts from.
        if self.config.reuse {
            if let Err(e) = sandbox.seal() {
                let _ = self.retire(&sandbox);
                return Err(PoolError::Create(e));
            }
        }
        // The bootstrap took some of the lease; the first episode gets a full one.
        if let Err(e) = sandbox.set_timeout(self.config.lease.as_secs()) {
            let _ = self.retire(&sandbox);
            return Err(PoolError::Create(e));
        }
        Ok(Warm {
            sandbox,
            channel: started.channel,
            reused: false,
            harness_files: None,
            image: spec.image.map(|i| i.id),
        })
    }

    /// Returns a sandbox. A healthy one is reset and kept when the reset proves it clean;
    /// anything else is retired.
    pub fn release(&self, warm: Warm, healthy: bool) -> Result<(), PoolError> {
        if healthy && self.config.reuse && !self.state().closed {
            let started = Instant::now();
            let reset = warm.sandbox.reset();
            let mut st = self.state();
            st.reset_seconds += started.elapsed().as_secs_f64();
            match reset {
                Ok(()) => {
                    st.resets += 1;
                    if !st.closed {
                        st.idle.push(warm);
                        return Ok(());
                    }
                }
                Err(e) => {
                    st.unclean += 1;
                    if st.unclean_reason.is_none() {
                        st.unclean_reason = Some(e.to_string());
                    }
                }
            }
        }
        let sandbox = warm.sandbox.clone();
        drop(warm);
        self.retire(&sandbox)
    }

    /// Kills a sandbox (the backend repeats the kill as far as that can help: one loop, not
    /// one here on top of it); its lease is closed only once the kill is proven.
    fn retire(&self, sandbox: &Arc<dyn Sandbox>) -> Result<(), PoolError> {
        let id = sandbox.id().to_string();
        let Some(owner) = self.state().live.get(&id).map(|l| l.retiring.clone()) else {
            return Ok(());
        };
        let _owner = lock(&owner);
        // Another retirer may have proven the kill while we waited.
        if !self.state().live.contains_key(&id) {
            return Ok(());
        }
        self.backend.kill(&id).map_err(|source| PoolError::Kill {
            id: id.clone(),
            source,
        })?;
        let mut st = self.state();
        if let Some(live) = st.live.remove(&id) {
            st.retired_seconds += live.started.elapsed().as_secs_f64();
        }
        Ok(())
    }

    /// Closes the pool and retires every sandbox it holds, idle or in flight. Idempotent; a
    /// later call retries kills that failed.
    pub fn close(&self) -> Result<(), PoolError> {
        let (idle, live): (Vec<Warm>, Vec<Arc<dyn Sandbox>>) = {
            let mut st = self.state();
            st.closed = true;
            let idle = std::mem::take(&mut st.idle);
            let live = st.live.values().map(|l| l.sandbox.clone()).collect();
            (idle, live)
        };
        drop(idle);
        self.retire_many(&live)
    }

    fn retire_many(&self, sandboxes: &[Arc<dyn Sandbox>]) -> Result<(), PoolError> {
        let total = sandboxes.len();
        if total == 0 {
            return Ok(());
        }
        let workers = MAX_RETIRE_WORKERS.min(total);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failures: Mutex<Vec<(String, SandboxError)>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(sb) = sandboxes.get(i) else { break };
                    if let Err(PoolError::Kill { id, source }) = self.retire(sb) {
                        lock(&failures).push((id, source));
                    }
                });
            }
        });
        let mut failures = crate::sync::into_inner(failures);
        if failures.is_empty() {
            return Ok(());
        }
        let failed = failures.len();
        let (first_id, first) = failures.swap_remove(0);
        Err(PoolError::Cleanup {
            failed,
            total,
            first_id,
            first,
        })
    }

    pub fn usage(&self) -> PoolUsage {
        let st = self.state();
        let live: f64 = st
            .live
            .values()
            .map(|l| l.started.elapsed().as_secs_f64())
            .sum();
        PoolUsage {
            count: st.created,
            seconds: st.retired_seconds + live,
            resets: st.resets,
            unclean: st.unclean,
            reset_seconds: st.reset_seconds,
            unclean_reason: st.unclean_reason.clone(),
        }
    }

    /// Accounts for the creates whose outcome is unknown (see [`Backend::settle_creates`]);
    /// call after [`Pool::close`], once no create is in flight.
    pub fn settle_creates(&self) -> Result<(), SandboxError> {
        self.backend.settle_creates()
    }

    /// Sandboxes still held (idle or in flight).
    pub fn live_count(&self) -> usize {
        self.state().live.len()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Last line of defence: a pool dropped on an error path still kills what it holds.
        // One that was closed already tried every kill once; another round would be a second
        // retry loop on top of the backend's.
        if !self.state().closed {
            let _ = self.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::local::{IsolationChoice, LocalBackend, LocalOptions};
    use crate::sandbox::{Metadata, RunOpts};

    fn new_pool(
        isolation: IsolationChoice,
        reuse: bool,
    ) -> (tempfile::TempDir, Arc<LocalBackend>, Pool) {
        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open_with(
            dir.path(),
            LocalOptions {
                isolation,
                ..LocalOptions::default()
            },
        )
        .unwrap();
        let episode = Duration::from_secs(60);
        let pool = Pool::new(
            backend.clone(),
            PoolConfig {
                spec: CreateSpec {
                    internet: true,
                    ..CreateSpec::default()
                },
                lease: lease_for(episode),
                lifetime: lifetime_for(episode),
                bootstrap: BootstrapOpts::default(),
                workspace_dir: "workspace".into(),
                reuse,
            },
        );
        (dir, backend, pool)
    }

    fn sh(warm: &Warm, cmd: &str) -> String {
        let out = warm.sandbox.run(cmd, &RunOpts::default()).unwrap();
        assert_eq!(out.exit_code, Some(0), "{cmd}: {}", out.stderr.to_text());
        out.stdout.to_text()
    }

    fn live(backend: &LocalBackend) -> Vec<String> {
        backend
            .list(&Metadata::new())
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect()
    }

    #[test]
    fn a_healthy_release_is_reset_and_served_again() {
        let (_d, backend, pool) = new_pool(IsolationChoice::Bwrap, true);
        let first = pool.acquire().unwrap();
        assert!(!first.reused);
        let id = first.sandbox.id().to_string();
        sh(
            &first,
            "setsid sleep 600 < /dev/null > /dev/null 2>&1 & echo x > ~/left.txt; echo y > /tmp/left",
        );
        pool.release(first, true).unwrap();
        let again = pool.acquire().unwrap();
        assert!(again.reused);
        assert_eq!(again.sandbox.id(), id);
        assert_eq!(
            sh(&again, "ls -A ~ /tmp; pgrep -c -f 'sleep 60[0]' || true"),
            "/home/user:\n\n/tmp:\n0\n"
        );
        // The runner survived the reset and still answers.
        assert!(again
            .sandbox
            .processes()
            .unwrap()
            .iter()
            .any(|p| p.pid == again.channel.pid()));
        let usage = pool.usage();
        assert_eq!((usage.count, usage.resets, usage.unclean), (1, 1, 0));
        pool.release(again, true).unwrap();
        pool.close().unwrap();
        assert!(live(&backend).is_empty());
    }

    #[test]
    fn unhealthy_and_unprovable_sandboxes_are_retired() {
        // Unhealthy: never reset, killed.
        let (_d, backend, pool) = new_pool(IsolationChoice::Bwrap, true);
        let w = pool.acquire().unwrap();
        let id = w.sandbox.id().to_string();
        pool.release(w, false).unwrap();
        assert!(!live(&backend).contains(&id));
        assert_eq!(pool.live_count(), 0);
        assert_ne!(pool.acquire().unwrap().sandbox.id(), id);

        // Unconfined: a reset cannot prove anything, so the sandbox is retired.
        let (_d2, backend, pool) = new_pool(IsolationChoice::None, true);
        let w = pool.acquire().unwrap();
        let id = w.sandbox.id().to_string();
        pool.release(w, true).unwrap();
        assert!(!live(&backend).contains(&id));
        let usage = pool.usage();
        assert_eq!((usage.resets, usage.unclean), (0, 1));
        assert!(usage.unclean_reason.unwrap().contains("--isolation none"));

        // --no-reuse: every release retires.
        let (_d3, backend, pool) = new_pool(IsolationChoice::Bwrap, false);
        let w = pool.acquire().unwrap();
        let id = w.sandbox.id().to_string();
        pool.release(w, true).unwrap();
        assert!(!live(&backend).contains(&id));
        assert_eq!(pool.usage().resets, 0);
    }

    #[test]
    fn a_sandbox_that_died_while_idle_is_replaced() {
        let (_d, backend, pool) = new_pool(IsolationChoice::Bwrap, true);
        let w = pool.acquire().unwrap();
        let id = w.sandbox.id().to_string();
        pool.release(w, true).unwrap();
        backend.kill(&id).unwrap();
        let w = pool.acquire().unwrap();
        assert!(!w.reused);
        assert_ne!(w.sandbox.id(), id);
    }

    #[test]
    fn close_retires_idle_and_busy_sandboxes_and_refuses_more() {
        let (_d, backend, pool) = new_pool(IsolationChoice::Bwrap, true);
        let a = pool.acquire().unwrap();
        let b = pool.acquire().unwrap();
        pool.release(a, true).unwrap();
        assert_eq!(live(&backend).len(), 2);
        pool.close().unwrap();
        assert!(live(&backend).is_empty());
        assert_eq!(pool.live_count(), 0);
        assert!(matches!(pool.acquire(), Err(PoolError::Closed)));
        // A sandbox released after close is retired, not kept.
        pool.release(b, true).unwrap();
        assert!(live(&backend).is_empty());
        assert_eq!(pool.usage().count, 2);
    }
}
