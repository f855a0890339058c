//! A backend wrapper that puts every sandbox in the lease ledger before it exists.
//!
//! Jobs (eval's pool, projects) create sandboxes only through this, so no code path can
//! create one the ledger does not know about: the lease is written `creating` before the
//! create call, tagged onto the sandbox, moved to `active` once the id is known, and
//! `retired` only after a proven kill. A create whose outcome is unknown leaves its lease
//! `creating` until [`Backend::settle_creates`] finds (and kills) what it made.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::ledger::{
    unix_now, LeaseRecord, LeaseState, Ledger, LedgerError, DEADLINE_SLACK_SECS, TAG_KIND,
    TAG_LEASE, TAG_OWNER, TAG_RUN,
};
use super::{
    Backend, CreateSpec, ErrorClass, Killed, LimitHit, Limits, Metadata, Output, OutputSink,
    PauseKind, Paused, Process, ProcessInfo, Result, RunOpts, Sandbox, SandboxError,
    SandboxSummary, SpawnOpts,
};
use crate::backoff::Backoff;
use crate::sync::lock;

struct Tracker {
    ledger: Ledger,
    /// Leases of this process's live sandboxes, by sandbox id.
    leases: Mutex<HashMap<String, LeaseRecord>>,
}

impl Tracker {
    fn leases(&self) -> MutexGuard<'_, HashMap<String, LeaseRecord>> {
        lock(&self.leases)
    }

    /// Records a later deadline. The recorded one runs [`DEADLINE_SLACK_SECS`] ahead of the
    /// real one, so this writes at most once per slack period.
    fn extend(&self, sandbox_id: &str, secs: u64) -> Result<()> {
        let wanted = unix_now() + secs;
        let record = {
            let mut leases = self.leases();
            let Some(r) = leases.get_mut(sandbox_id) else {
                return Ok(());
            };
            if wanted <= r.deadline {
                return Ok(());
            }
            r.deadline = wanted + DEADLINE_SLACK_SECS;
            r.updated = unix_now();
            r.clone()
        };
        self.ledger.write(&record).map_err(ledger_error)
    }

    fn retire(&self, sandbox_id: &str, outcome: std::result::Result<(), String>) {
        let taken = {
            let mut leases = self.leases();
            match &outcome {
                Ok(()) => leases.remove(sandbox_id),
                Err(_) => leases.get(sandbox_id).cloned(),
            }
        };
        let Some(mut record) = taken else { return };
        let (state, error) = match outcome {
            Ok(()) => (LeaseState::Retired, None),
            Err(e) => (LeaseState::CleanupFailed, Some(e)),
        };
        // A lease that cannot be updated stays `active`; reap finds it once we are gone.
        let _ = self.ledger.transition(&mut record, state, error);
    }
}

fn ledger_error(e: LedgerError) -> SandboxError {
    SandboxError::Remote {
        class: ErrorClass::Transport,
        message: "the lease ledger could not be written".into(),
        source: Some(Box::new(e)),
    }
}

pub struct LeasedBackend {
    inner: Arc<dyn Backend>,
    kind: String,
    tracker: Arc<Tracker>,
}

impl LeasedBackend {
    /// `kind` is the job (`eval`, `project`) recorded in every lease.
    pub fn new(inner: Arc<dyn Backend>, ledger: Ledger, kind: &str) -> LeasedBackend {
        LeasedBackend {
            inner,
            kind: kind.to_string(),
            tracker: Arc::new(Tracker {
                ledger,
                leases: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn ledger(&self) -> &Ledger {
        &self.tracker.ledger
    }

    /// Lists the sandboxes tagged with `lease` and kills them. `Some(n)`: the list worked and
    /// all `n` found are proven dead; `None`: the list or a kill failed.
    fn sweep(&self, lease: &str) -> Option<usize> {
        let mut filter = Metadata::new();
        filter.insert(TAG_LEASE.into(), lease.to_string());
        let found = self.inner.list(&filter).ok()?;
        let mut proven = true;
        for s in &found {
            proven &= self.inner.kill(&s.id).is_ok();
        }
        proven.then_some(found.len())
    }

    /// After a failed create the sandbox may exist anyway (the answer was lost); find it by
    /// its lease tag and kill it. The lease is retired when nothing is left, except after a
    /// create whose outcome is unknown ([`SandboxError::CreateUnconfirmed`]) that found
    /// nothing yet: its sandbox may still appear, so the lease stays `creating`, stamped with
    /// the failure, for [`Backend::settle_creates`] (or `reap`) to resolve.
    fn resolve_failed_create(&self, lease: &mut LeaseRecord, cause: &SandboxError) {
        let unconfirmed = matches!(cause, SandboxError::CreateUnconfirmed { .. });
        let ledger = &self.tracker.ledger;
        let cause = crate::errors::error_chain(cause);
        match self.sweep(&lease.lease) {
            Some(0) if unconfirmed => {}
            Some(_) => {
                let why = format!("create failed: {cause}");
                let _ = ledger.transition(lease, LeaseState::Retired, Some(why));
                return;
            }
            None => {}
        }
        let why = if unconfirmed {
            format!("create failed, its outcome unknown: {cause}")
        } else {
            format!("create failed, and what it left could not be looked for: {cause}")
        };
        let _ = ledger.transition(lease, LeaseState::Creating, Some(why));
    }
}

/// How long after a create whose outcome is unknown its sandbox is still looked for: time
/// for a placement whose answer was lost to finish. Past it, a lease whose lists found
/// nothing is retired; a late sandbox still carries the tags `reap` finds, and its own
/// timeout ends it.
pub const SETTLE_WAIT: Duration = Duration::from_secs(30);
/// The first and the longest pause between two looks.
const SETTLE_POLL: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(2));

impl Backend for LeasedBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn create(&self, spec: &CreateSpec) -> Result<Arc<dyn Sandbox>> {
        let ledger = &self.tracker.ledger;
        let mut lease = ledger
            .begin(
                &self.kind,
                self.inner.name(),
                spec.template.as_deref(),
                spec.timeout_secs,
            )
            .map_err(ledger_error)?;
        let mut spec = spec.clone();
        spec.metadata.insert(TAG_LEASE.into(), lease.lease.clone());
        spec.metadata.insert(TAG_OWNER.into(), ledger.owner().tag());
        spec.metadata
            .insert(TAG_RUN.into(), ledger.run().to_string());
        spec.metadata.insert(TAG_KIND.into(), self.kind.clone());
        let sandbox = match self.inner.create(&spec) {
            Ok(s) => s,
            Err(e) => {
                self.resolve_failed_create(&mut lease, &e);
                return Err(e);
            }
        };
        let id = sandbox.id().to_string();
        lease.sandbox_id = Some(id.clone());
        if let Err(e) = ledger.transition(&mut lease, LeaseState::Active, None) {
            // A sandbox the ledger cannot account for must not outlive this call.
            if self.inner.kill(&id).is_ok() {
                let _ = ledger.transition(&mut lease, LeaseState::Retired, Some(e.to_string()));
            }
            return Err(ledger_error(e));
        }
        self.tracker.leases().insert(id, lease);
        Ok(Arc::new(LeasedSandbox {
            inner: sandbox,
            tracker: self.tracker.clone(),
        }))
    }

    fn connect(&self, id: &str) -> Result<Arc<dyn Sandbox>> {
        Ok(Arc::new(LeasedSandbox {
            inner: self.inner.connect(id)?,
            tracker: self.tracker.clone(),
        }))
    }

    fn list(&self, filter: &Metadata) -> Result<Vec<SandboxSummary>> {
        self.inner.list(filter)
    }

    fn describe(&self, id: &str) -> Result<SandboxSummary> {
        self.inner.describe(id)
    }

    fn kill(&self, id: &str) -> Result<Killed> {
        match self.inner.kill(id) {
            Ok(k) => {
                self.tracker.retire(id, Ok(()));
                Ok(k)
            }
            Err(e) => {
                self.tracker.retire(id, Err(e.to_string()));
                Err(e)
            }
        }
    }

    fn pause(&self, id: &str, kind: PauseKind) -> Result<Paused> {
        self.inner.pause(id, kind)
    }

    /// Resolves this run's `creating` leases: each is looked for by its tag until its
    /// sandbox turns up (killed, then retired) or [`SETTLE_WAIT`] has passed since its create
    /// failed (retired, if every look worked). Those that could not be looked for stay
    /// `creating` and are named in the error.
    fn settle_creates(&self) -> Result<()> {
        let ledger = &self.tracker.ledger;
        let mut left = ledger.own(LeaseState::Creating);
        let mut unresolved = Vec::new();
        let mut pauses = Backoff::doubling(SETTLE_POLL.0, SETTLE_POLL.1, u32::MAX);
        while !left.is_empty() {
            let now = unix_now();
            left.retain_mut(|lease| {
                let waited = now >= lease.updated.saturating_add(SETTLE_WAIT.as_secs());
                let (state, why) = match self.sweep(&lease.lease) {
                    Some(0) if !waited => return true,
                    Some(0) => (
                        LeaseState::Retired,
                        format!(
                            "no sandbox appeared within {} s of its failed create",
                            SETTLE_WAIT.as_secs()
                        ),
                    ),
                    Some(_) => (
                        LeaseState::Retired,
                        "its create failed, yet it made a sandbox: killed".to_string(),
                    ),
                    None if !waited => return true,
                    None => {
                        unresolved.push(lease.lease.clone());
                        return false;
                    }
                };
                let _ = ledger.transition(lease, state, Some(why));
                false
            });
            if left.is_empty() {
                break;
            }
            std::thread::sleep(pauses.next().unwrap_or(SETTLE_POLL.1));
        }
        if unresolved.is_empty() {
            return Ok(());
        }
        Err(SandboxError::Remote {
            class: ErrorClass::Transport,
            message: format!(
                "{} sandbox create(s) of unknown outcome could not be looked for by their lease tag (run `wmo-e2b reap` later): {}",
                unresolved.len(),
                unresolved.join(", ")
            ),
            source: None,
        })
    }
}

/// A sandbox whose timeout changes are mirrored into its lease.
struct LeasedSandbox {
    inner: Arc<dyn Sandbox>,
    tracker: Arc<Tracker>,
}

impl Sandbox for LeasedSandbox {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn home(&self) -> &str {
        self.inner.home()
    }
    fn system_dir(&self) -> &str {
        self.inner.system_dir()
    }
    fn seal(&self) -> Result<()> {
        self.inner.seal()
    }
    fn reset(&self) -> Result<()> {
        self.inner.reset()
    }
    fn stop_agent(&self, runner_too: bool) -> Result<()> {
        self.inner.stop_agent(runner_too)
    }
    fn run(&self, cmd: &str, opts: &RunOpts) -> Result<Output> {
        self.inner.run(cmd, opts)
    }
    fn spawn_into(&self, cmd: &str, opts: &SpawnOpts, sink: Box<dyn OutputSink>) -> Result<u32> {
        self.inner.spawn_into(cmd, opts, sink)
    }
    fn connect(&self, pid: u32) -> Result<Process> {
        self.inner.connect(pid)
    }
    fn send_stdin(&self, pid: u32, data: &[u8]) -> Result<()> {
        self.inner.send_stdin(pid, data)
    }
    fn close_stdin(&self, pid: u32) -> Result<()> {
        self.inner.close_stdin(pid)
    }
    fn processes(&self) -> Result<Vec<ProcessInfo>> {
        self.inner.processes()
    }
    fn kill_process(&self, pid: u32) -> Result<()> {
        self.inner.kill_process(pid)
    }
    fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        self.inner.read_file(path)
    }
    fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        self.inner.write_file(path, data)
    }
    fn empty_dir(&self, path: &str) -> Result<bool> {
        self.inner.empty_dir(path)
    }
    fn set_timeout(&self, secs: u64) -> Result<()> {
        // The lease first: a recorded deadline earlier than the real one could let reap kill
        // a sandbox that is still in use.
        self.tracker.extend(self.inner.id(), secs)?;
        self.inner.set_timeout(secs)
    }
    fn set_internet(&self, allowed: bool) -> Result<()> {
        self.inner.set_internet(allowed)
    }
    fn apply_limits(&self, limits: &Limits) -> Result<()> {
        self.inner.apply_limits(limits)
    }
    fn limit_reached(&self) -> Option<LimitHit> {
        self.inner.limit_reached()
    }
}
