//! Reap: kill what dead runs left behind, and nothing a live run holds.
//!
//! The plan joins two views: the lease files in this state directory and the sandboxes the
//! backend lists. A lease whose owner is provably dead, or whose deadline has passed, is
//! reaped; a tagged sandbox with no lease here is reaped only on request
//! (`--include-foreign`) or past an age (`--older-than`), and never when its tag names a live
//! owner. Nothing created after the reap began is touched: creation times are checked again
//! right before each kill. A lease is retired only after a proven kill, so running reap
//! twice reaches the same end state.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use crate::sandbox::ledger::{
    read_leases, unix_now, LeaseRecord, LeaseState, Ledger, Liveness, Owner, SkippedLease,
    TAG_KIND, TAG_LEASE, TAG_OWNER,
};
use crate::sandbox::{Backend, Killed, Metadata, SandboxError, SandboxSummary};
use crate::sync::lock;

/// Parallel kills.
pub const MAX_KILL_WORKERS: usize = 16;

#[derive(Debug, Clone, Default)]
pub struct ReapOptions {
    pub dry_run: bool,
    /// Also reap tagged sandboxes with no lease here that are older than this.
    pub older_than: Option<Duration>,
    /// Also reap every tagged sandbox with no lease here (unless its owner is alive).
    pub include_foreign: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Kill the sandbox, then retire its lease.
    Kill,
    /// The sandbox is already gone; only the lease is retired.
    Retire,
}

#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub sandbox_id: Option<String>,
    pub lease: Option<String>,
    #[serde(skip)]
    pub lease_path: Option<PathBuf>,
    pub kind: String,
    pub age_secs: u64,
    /// Unix seconds, when the backend reported it.
    #[serde(skip)]
    pub created: Option<u64>,
    pub owner: String,
    pub reason: String,
    pub action: Action,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReapOutcome {
    pub sandbox_id: Option<String>,
    pub lease: Option<String>,
    /// `killed`, `already_gone`, `retired`, `skipped`, `failed`, or `planned` (dry run).
    pub result: String,
    pub detail: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    #[error("could not list sandboxes on the {backend} backend")]
    List {
        backend: String,
        #[source]
        source: SandboxError,
    },
}

/// What a reap will do.
#[derive(Debug, Clone, Serialize)]
pub struct ReapPlan {
    /// Unix seconds when the reap began; nothing created later is touched.
    pub started: u64,
    pub candidates: Vec<Candidate>,
    #[serde(skip)]
    pub skipped_files: Vec<SkippedLease>,
}

/// Builds the plan for `backend` from the leases under `state_dir`.
pub fn plan(
    backend: &dyn Backend,
    state_dir: &Path,
    opts: &ReapOptions,
) -> Result<ReapPlan, ReapError> {
    let started = unix_now();
    let (leases, skipped_files) = read_leases(state_dir);
    let listed = backend
        .list(&Metadata::new())
        .map_err(|source| ReapError::List {
            backend: backend.name().to_string(),
            source,
        })?;
    let by_id: HashMap<&str, &SandboxSummary> = listed.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut by_lease_tag: HashMap<&str, Vec<&SandboxSummary>> = HashMap::new();
    for s in &listed {
        if let Some(tag) = s.metadata.get(TAG_LEASE) {
            by_lease_tag.entry(tag.as_str()).or_default().push(s);
        }
    }
    let mut candidates = Vec::new();
    let mut accounted: HashSet<String> = HashSet::new();
    let age = |created: u64| started.saturating_sub(created);

    for (path, lease) in &leases {
        if lease.backend != backend.name() {
            continue;
        }
        // Sandboxes this lease names or tagged: accounted for, reaped or not.
        let mut found: Vec<&SandboxSummary> = by_lease_tag
            .get(lease.lease.as_str())
            .cloned()
            .unwrap_or_default();
        if let Some(s) = lease.sandbox_id.as_deref().and_then(|id| by_id.get(id)) {
            if !found.iter().any(|f| f.id == s.id) {
                found.push(s);
            }
        }
        for s in &found {
            accounted.insert(s.id.clone());
        }
        if lease.state == LeaseState::Retired && found.is_empty() {
            continue;
        }
        let Some(reason) = lease_reason(lease, started, state_dir, !found.is_empty()) else {
            continue;
        };
        let owner = lease.owner.tag();
        if found.is_empty() {
            candidates.push(Candidate {
                sandbox_id: lease.sandbox_id.clone(),
                lease: Some(lease.lease.clone()),
                lease_path: Some(path.clone()),
                kind: lease.kind.clone(),
                age_secs: age(lease.created),
                created: Some(lease.created),
                owner,
                reason: format!("{reason}; the backend no longer lists it"),
                action: Action::Retire,
            });
            continue;
        }
        for s in found {
            candidates.push(Candidate {
                sandbox_id: Some(s.id.clone()),
                lease: Some(lease.lease.clone()),
                lease_path: Some(path.clone()),
                kind: lease.kind.clone(),
                age_secs: age(s.created),
                created: Some(s.created),
                owner: owner.clone(),
                reason: reason.clone(),
                action: Action::Kill,
            });
        }
    }

    // Tagged sandboxes with no lease here: another host's, or a lost state directory.
    for s in &listed {
        if accounted.contains(&s.id) || !s.metadata.contains_key(TAG_LEASE) {
            continue;
        }
        let owner = s.metadata.get(TAG_OWNER).and_then(|t| Owner::from_tag(t));
        if owner.as_ref().map(Owner::liveness) == Some(Liveness::Alive) {
            continue;
        }
        let old = opts
            .older_than
            .is_some_and(|d| age(s.created) > d.as_secs());
        if !(opts.include_foreign || old) {
            continue;
        }
        candidates.push(Candidate {
            sandbox_id: Some(s.id.clone()),
            lease: s.metadata.get(TAG_LEASE).cloned(),
            lease_path: None,
            kind: s.metadata.get(TAG_KIND).cloned().unwrap_or_default(),
            age_secs: age(s.created),
            created: Some(s.created),
            owner: s
                .metadata
                .get(TAG_OWNER)
                .cloned()
                .unwrap_or_else(|| "unknown".into()),
            reason: if old {
                "no lease here, older than --older-than".into()
            } else {
                "no lease here (--include-foreign)".into()
            },
            action: Action::Kill,
        });
    }
    candidates.sort_by_key(|c| std::cmp::Reverse(c.age_secs));
    Ok(ReapPlan {
        started,
        candidates,
        skipped_files,
    })
}

/// Why a lease may be reaped, or `None` when its owner may still be using it. A project's
/// sandbox belongs to the project, not to the command that created it: it is held, running
/// or paused, for as long as the project names its lease (`project close` kills it); only
/// the record of one the backend no longer lists is retired.
fn lease_reason(lease: &LeaseRecord, now: u64, state_dir: &Path, listed: bool) -> Option<String> {
    if lease.kind == "project" && crate::project::lease_is_held(state_dir, &lease.lease) {
        return (!listed).then(|| "its project's sandbox ended".to_string());
    }
    match lease.owner.liveness() {
        Liveness::Dead => Some(format!("owner pid {} is gone", lease.owner.pid)),
        _ if now > lease.deadline => Some("past its deadline".into()),
        Liveness::Alive | Liveness::Unknown => None,
    }
}

/// Carries out a plan: kills in parallel (bounded), retires leases after proven kills.
pub fn execute(
    backend: &dyn Backend,
    state_dir: &Path,
    plan: &ReapPlan,
    dry_run: bool,
) -> Vec<ReapOutcome> {
    if dry_run {
        return plan
            .candidates
            .iter()
            .map(|c| ReapOutcome {
                sandbox_id: c.sandbox_id.clone(),
                lease: c.lease.clone(),
                result: "planned".into(),
                detail: None,
            })
            .collect();
    }
    let ledger = Ledger::open(state_dir, "reap").ok();
    let outcomes: Mutex<Vec<(usize, ReapOutcome)>> = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = MAX_KILL_WORKERS.min(plan.candidates.len()).max(1);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(c) = plan.candidates.get(i) else {
                    break;
                };
                let outcome = reap_one(backend, state_dir, ledger.as_ref(), plan.started, c);
                lock(&outcomes).push((i, outcome));
            });
        }
    });
    let mut outcomes = crate::sync::into_inner(outcomes);
    outcomes.sort_by_key(|(i, _)| *i);
    outcomes.into_iter().map(|(_, o)| o).collect()
}

fn reap_one(
    backend: &dyn Backend,
    state_dir: &Path,
    ledger: Option<&Ledger>,
    started: u64,
    c: &Candidate,
) -> ReapOutcome {
    let outcome = |result: &str, detail: Option<String>| ReapOutcome {
        sandbox_id: c.sandbox_id.clone(),
        lease: c.lease.clone(),
        result: result.into(),
        detail,
    };
    // Re-check right before acting: the lease may have been updated since the plan (a live
    // owner never reaches here, but a lease file can move on), and nothing newer than the
    // reap itself is touched.
    if let Some(path) = &c.lease_path {
        if let Ok(bytes) = std::fs::read(path) {
            if let Ok(now) = serde_json::from_slice::<LeaseRecord>(&bytes) {
                if lease_reason(&now, unix_now(), state_dir, c.action == Action::Kill).is_none() {
                    return outcome("skipped", Some("the lease's owner is alive".into()));
                }
            }
        }
    }
    if c.created.is_some_and(|t| t > started) {
        return outcome("skipped", Some("created after the reap began".into()));
    }
    let result = match (c.action, &c.sandbox_id) {
        (Action::Kill, Some(id)) => match backend.kill(id) {
            Ok(Killed::Now) => outcome("killed", None),
            Ok(Killed::AlreadyGone) => outcome("already_gone", None),
            Err(e) => {
                mark(ledger, c, LeaseState::CleanupFailed, Some(e.to_string()));
                return outcome("failed", Some(crate::errors::error_chain(&e)));
            }
        },
        _ => outcome("retired", None),
    };
    mark(ledger, c, LeaseState::Retired, None);
    result
}

fn mark(ledger: Option<&Ledger>, c: &Candidate, state: LeaseState, error: Option<String>) {
    let (Some(ledger), Some(path)) = (ledger, &c.lease_path) else {
        return;
    };
    let Ok(bytes) = std::fs::read(path) else {
        return;
    };
    let Ok(mut record) = serde_json::from_slice::<LeaseRecord>(&bytes) else {
        return;
    };
    let _ = ledger.transition(&mut record, state, error);
}
