//! This tool's sandboxes as the operator sees them: the backend's list joined with the
//! lease ledger, and kills that keep the ledger true.

use std::path::Path;

use serde::Serialize;

use super::ledger::{
    read_leases, unix_now, LeaseRecord, LeaseState, Ledger, TAG_KIND, TAG_LEASE, TAG_OWNER,
};
use super::{Backend, Killed, Metadata, Result};

#[derive(Debug, Clone, Serialize)]
pub struct SandboxRow {
    pub id: String,
    pub kind: Option<String>,
    pub owner: Option<String>,
    pub age_secs: u64,
    /// Unix seconds.
    pub deadline: u64,
    pub lease: Option<String>,
    pub lease_state: Option<LeaseState>,
    pub template: Option<String>,
    /// `running` or `paused`.
    pub state: &'static str,
}

/// Live sandboxes of `backend`: those this tool tagged, or every one with `all`.
pub fn list(backend: &dyn Backend, state_dir: &Path, all: bool) -> Result<Vec<SandboxRow>> {
    let (leases, _) = read_leases(state_dir);
    let now = unix_now();
    let mut rows: Vec<SandboxRow> = backend
        .list(&Metadata::new())?
        .into_iter()
        .filter(|s| all || s.metadata.contains_key(TAG_LEASE))
        .map(|s| {
            let lease = find_lease(
                &leases,
                &s.id,
                s.metadata.get(TAG_LEASE).map(String::as_str),
            );
            SandboxRow {
                kind: s.metadata.get(TAG_KIND).cloned(),
                owner: s.metadata.get(TAG_OWNER).cloned(),
                age_secs: now.saturating_sub(s.created),
                deadline: s.deadline,
                lease: s.metadata.get(TAG_LEASE).cloned(),
                lease_state: lease.map(|l| l.state),
                template: s.template.clone(),
                state: s.state.as_str(),
                id: s.id,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(rows)
}

fn find_lease<'a>(
    leases: &'a [(std::path::PathBuf, LeaseRecord)],
    id: &str,
    tag: Option<&str>,
) -> Option<&'a LeaseRecord> {
    leases
        .iter()
        .map(|(_, l)| l)
        .find(|l| l.sandbox_id.as_deref() == Some(id) || Some(l.lease.as_str()) == tag)
}

/// Kills one sandbox and retires its lease once the kill is proven.
pub fn kill(backend: &dyn Backend, state_dir: &Path, id: &str) -> Result<Killed> {
    let killed = backend.kill(id)?;
    let (leases, _) = read_leases(state_dir);
    if let Ok(ledger) = Ledger::open(state_dir, "sandbox-kill") {
        for (_, mut lease) in leases {
            if lease.sandbox_id.as_deref() == Some(id) && lease.state != LeaseState::Retired {
                let _ = ledger.transition(&mut lease, LeaseState::Retired, None);
            }
        }
    }
    Ok(killed)
}
