//! `eval --harness agent:NAME | cmd:COMMAND`: the agent's install and where sandboxes see it.

use anyhow::{Context, Result};
use wmo_e2b::eval::Harness;
use wmo_e2b::runner::agents::{self, AgentInstall, AgentShipment, AGENT_DIR_ENV};
use wmo_e2b::sandbox::local::Isolation;

/// Gives an agent harness the run's model and installs a known agent's package (once per
/// host). `None` for any other harness, and for `cmd:`, which brings its own program.
pub fn install(harness: &mut Harness, model: &str) -> Result<Option<AgentInstall>> {
    let Harness::Agent(agent) = harness else {
        return Ok(None);
    };
    agent.model = model.to_string();
    let Some(recipe) = agent.recipe else {
        return Ok(None);
    };
    let found = agents::ensure_installed(&wmo_e2b::state::state_dir(), recipe)
        .with_context(|| format!("cannot install the agent {}", recipe.spec()))?;
    agent.digest = Some(found.digest.clone());
    Ok(Some(found))
}

/// On E2B, what the bootstrap places in each sandbox (the install's archive, read once),
/// and the agent told where it lands.
pub fn ship(
    harness: &mut Harness,
    install: Option<&AgentInstall>,
) -> Result<Option<AgentShipment>> {
    let (Harness::Agent(agent), Some(install)) = (harness, install) else {
        return Ok(None);
    };
    let ship = install.shipment().with_context(|| {
        format!(
            "cannot ship the agent {} to sandboxes",
            install.recipe.spec()
        )
    })?;
    agent.set_env(AGENT_DIR_ENV, install.recipe.sandbox_dir());
    Ok(Some(ship))
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
        Isolation::Bwrap => install.recipe.sandbox_dir(),
        Isolation::None => install.dir.to_string_lossy().into_owned(),
    };
    agent.set_env(AGENT_DIR_ENV, seen);
}
