//! An agent's install in a sandbox that cannot see the host's (E2B): one archive of the
//! install, made once per host beside it, uploaded by the bootstrap and unpacked at
//! [`SANDBOX_AGENTS_DIR`]`/<name>` as the sandbox's root, unless that directory already
//! holds an install with the same digest (an earlier runner of the sandbox placed it, or a
//! template baked it). The install's own marker file names its digest.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{AgentInstall, AgentInstallError, INSTALL_TIMEOUT, MARKER, SANDBOX_AGENTS_DIR};
use crate::runner::pi::command::run_until;
use crate::runner::RunnerError;
use crate::sandbox::{shell_quote, RunOpts, Sandbox};

/// How long unpacking in a sandbox may take.
const UNPACK_TIMEOUT: Duration = Duration::from_secs(300);

/// What the bootstrap places in a sandbox: the install's archive, read once per run.
#[derive(Debug, Clone)]
pub struct AgentShipment {
    pub name: &'static str,
    pub digest: String,
    pub archive: Arc<Vec<u8>>,
}

impl AgentShipment {
    /// Where the sandbox sees the agent once placed.
    pub fn sandbox_dir(&self) -> String {
        format!("{SANDBOX_AGENTS_DIR}/{}", self.name)
    }
}

impl AgentInstall {
    /// The install as a shipment: its gzipped tar, made beside it once (under the install's
    /// lock), then read.
    pub fn shipment(&self) -> Result<AgentShipment, AgentInstallError> {
        let archive = self.archive_path();
        if !archive.exists() {
            make_archive(self, &archive)?;
        }
        let bytes = fs::read(&archive).map_err(|source| AgentInstallError::Io {
            spec: self.recipe.spec(),
            what: "read",
            path: archive.clone(),
            source,
        })?;
        Ok(AgentShipment {
            name: self.recipe.name,
            digest: self.digest.clone(),
            archive: Arc::new(bytes),
        })
    }

    fn archive_path(&self) -> PathBuf {
        let mut name = self.dir.file_name().unwrap_or_default().to_os_string();
        name.push(".tar.gz");
        self.dir.with_file_name(name)
    }
}

fn make_archive(install: &AgentInstall, archive: &Path) -> Result<(), AgentInstallError> {
    let spec = install.recipe.spec();
    let io = |what, path: &Path| {
        let (spec, path) = (spec.clone(), path.to_path_buf());
        move |source| AgentInstallError::Io {
            spec,
            what,
            path,
            source,
        }
    };
    let mut lock_name = install.dir.file_name().unwrap_or_default().to_os_string();
    lock_name.push(".lock");
    let lock_path = install.dir.with_file_name(lock_name);
    let _lock = crate::sync::flock_within(&lock_path, libc::LOCK_EX, INSTALL_TIMEOUT)
        .map_err(io("lock", &lock_path))?;
    if archive.exists() {
        return Ok(());
    }
    let tmp = archive.with_extension(format!("tmp.{}", crate::id::unique_hex(6)));
    // Fast compression: the archive is made once and unpacked once per sandbox.
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        "set -e; tar -C \"$1\" -cf - . | gzip -1 > \"$2\"",
        "sh",
    ])
    .arg(&install.dir)
    .arg(&tmp);
    let done = run_until(&mut cmd, Instant::now() + INSTALL_TIMEOUT);
    let ok = matches!(&done, Ok(d) if d.status.is_some_and(|s| s.success()));
    if !ok {
        let _ = fs::remove_file(&tmp);
        let stderr_tail = match done {
            Ok(d) => d.stderr_tail,
            Err(e) => e.to_string(),
        };
        return Err(AgentInstallError::Install {
            spec,
            step: "tar | gzip of the install",
            how: "failed".into(),
            stderr_tail,
        });
    }
    fs::rename(&tmp, archive).map_err(io("rename", &tmp))
}

/// Places `ship` in `sandbox` unless it is there with the same digest.
pub fn place_agent(sandbox: &dyn Sandbox, ship: &AgentShipment) -> Result<(), RunnerError> {
    let id = sandbox.id().to_string();
    let upload = |source| RunnerError::Upload {
        id: id.clone(),
        source,
    };
    let dir = ship.sandbox_dir();
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
    let archive = format!("{SANDBOX_AGENTS_DIR}/.{}.tar.gz", ship.name);
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
            agent: ship.name,
            output: out.stderr.to_text(),
        });
    }
    Ok(())
}
