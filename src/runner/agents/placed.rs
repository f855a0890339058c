//! An agent's install in a sandbox that cannot see the host's (E2B): one archive of the
//! install, made once per host beside it, uploaded by the bootstrap and unpacked at
//! [`SANDBOX_AGENTS_DIR`]`/<name>` as the sandbox's root, unless that directory already
//! holds an install with the same digest (an earlier runner of the sandbox placed it, or a
//! template baked it). The install's own marker file names its digest.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use super::{
    io_error, run_step, AgentInstall, AgentInstallError, AgentRecipe, Installer, INSTALL_TIMEOUT,
    MARKER, SANDBOX_AGENTS_DIR,
};
use crate::runner::RunnerError;
use crate::sandbox::{shell_quote, RunOpts, Sandbox};

/// How long unpacking in a sandbox may take.
const UNPACK_TIMEOUT: Duration = Duration::from_secs(300);

/// What the bootstrap places in a sandbox: the install's archive, read once per run.
#[derive(Debug, Clone)]
pub struct AgentShipment {
    pub recipe: &'static AgentRecipe,
    pub digest: String,
    pub archive: Arc<Vec<u8>>,
}

impl AgentInstall {
    /// The install as a shipment: its gzipped tar, made beside it once (under the install's
    /// lock), then read.
    pub fn shipment(&self) -> Result<AgentShipment, AgentInstallError> {
        let archive = self.beside("tar.gz");
        if !archive.exists() {
            make_archive(self, &archive)?;
        }
        let bytes = fs::read(&archive).map_err(io_error(self.recipe, "read", &archive))?;
        Ok(AgentShipment {
            recipe: self.recipe,
            digest: self.digest.clone(),
            archive: Arc::new(bytes),
        })
    }
}

fn make_archive(install: &AgentInstall, archive: &Path) -> Result<(), AgentInstallError> {
    let recipe = install.recipe;
    let lock_path = install.beside("lock");
    let _lock = crate::sync::flock_within(&lock_path, libc::LOCK_EX, INSTALL_TIMEOUT)
        .map_err(io_error(recipe, "lock", &lock_path))?;
    if archive.exists() {
        return Ok(());
    }
    let tmp = archive.with_extension(format!("tmp.{}", crate::id::unique_hex(6)));
    // Fast compression: the archive is made once and unpacked once per sandbox. tar runs
    // the compressor itself, so a failure of either is its exit status.
    let mut cmd = Command::new("tar");
    cmd.arg("-C")
        .arg(&install.dir)
        .args(["-I", "gzip -1", "-cf"])
        .arg(&tmp)
        .arg(".");
    let tar = Installer {
        program: "tar",
        hint: "Debian: apt-get install tar gzip",
    };
    let made = run_step(&mut cmd, &tar, "tar of the install", &install.dir, recipe);
    if let Err(e) = made {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, archive).map_err(io_error(recipe, "rename", &tmp))
}

/// Places `ship` in `sandbox` unless it is there with the same digest.
pub fn place_agent(sandbox: &dyn Sandbox, ship: &AgentShipment) -> Result<(), RunnerError> {
    let id = sandbox.id().to_string();
    let upload = |source| RunnerError::Upload {
        id: id.clone(),
        source,
    };
    let dir = ship.recipe.sandbox_dir();
    let opts = RunOpts {
        role: crate::sandbox::Role::System,
        timeout: UNPACK_TIMEOUT,
        max_output: 4096,
        ..RunOpts::default()
    };
    let look = format!(
        "test \"$(cat {} 2>/dev/null)\" = {}",
        shell_quote(&format!("{dir}/{MARKER}")),
        shell_quote(&ship.digest)
    );
    if sandbox.run(&look, &opts).map_err(upload)?.exit_code == Some(0) {
        return Ok(());
    }
    let archive = format!("{SANDBOX_AGENTS_DIR}/.{}.tar.gz", ship.recipe.name);
    sandbox
        .write_file(&archive, &ship.archive)
        .map_err(upload)?;
    let unpack = format!(
        "set -e; d={d}; a={a}; rm -rf \"$d.tmp\" \"$d\"; mkdir -p \"$d.tmp\"; \
         tar -xzf \"$a\" -C \"$d.tmp\"; rm -f \"$a\"; chmod 755 \"$d.tmp\"; mv \"$d.tmp\" \"$d\"",
        d = shell_quote(&dir),
        a = shell_quote(&archive),
    );
    let out = sandbox.run(&unpack, &opts).map_err(upload)?;
    if out.exit_code != Some(0) {
        return Err(RunnerError::AgentUnpack {
            id,
            agent: ship.recipe.name,
            output: out.stderr.to_text(),
        });
    }
    Ok(())
}
