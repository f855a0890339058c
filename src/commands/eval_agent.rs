//! `eval --harness agent:NAME | cmd:COMMAND`: the agent's install and where sandboxes see it.

use anyhow::{Context, Result};
use wmo_e2b::eval::Harness;
use wmo_e2b::runner::agents::{self, AgentInstall, AGENT_DIR_ENV};
use wmo_e2b::sandbox::local::Isolation;

use super::{BackendKind, UsageError};

/// Gives an agent harness the run's model and installs a known agent's package (once per
/// host). `None` for any other harness, and for `cmd:`, which brings its own program.
pub fn install(
    harness: &mut Harness,
    model: &str,
    backend: BackendKind,
) -> Result<Option<AgentInstall>> {
    let Harness::Agent(agent) = harness else {
        return Ok(None);
    };
    agent.model = model.to_string();
    let Some(recipe) = agent.recipe else {
        return Ok(None);
    };
    if backend == BackendKind::E2b {
        return Err(UsageError(format!(
            "--harness agent:{} runs on the local backend: on E2B the agent would have to be in the template (use --harness cmd:'COMMAND' with a template that has it)",
            recipe.name
        ))
        .into());
    }
    let found = agents::ensure_installed(&wmo_e2b::state::state_dir(), recipe)
        .with_context(|| format!("cannot install the agent {}", recipe.spec()))?;
    agent.digest = Some(found.digest.clone());
    Ok(Some(found))
}

/// Tells the agent where its install is: the read-only mount under bwrap, the host
/// directory itself when unconfined.
pub fn point_at_install(
    harness: &mut Harness,
    install: Option<&AgentInstall>,
    isolation: Isolation,
) {
    let (Harness::Agent(agent), Some(install)) = (harness, install) else {
        return;
    };
    let seen = match isolation {
        Isolation::Bwrap => install.sandbox_dir(),
        Isolation::None => install.dir.to_string_lossy().into_owned(),
    };
    agent.envs.retain(|(k, _)| k != AGENT_DIR_ENV);
    agent.envs.push((AGENT_DIR_ENV.to_string(), seen));
}
