//! One module per subcommand: parse options, wire library components, print.

pub mod eval;
pub mod project;
pub mod reap;
pub mod sandbox;

/// Documented exit codes (see `wmo-e2b --help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    TasksFailed = 1,
    Usage = 2,
    Infrastructure = 3,
    Interrupted = 130,
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e as u8)
    }
}

/// The backend a command works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Process sandboxes on this machine (no account needed).
    Local,
}

/// Opens a backend by kind.
pub fn open_backend(
    kind: BackendKind,
) -> anyhow::Result<std::sync::Arc<dyn wmo_e2b::sandbox::Backend>> {
    use anyhow::Context;
    match kind {
        BackendKind::Local => {
            let backend = wmo_e2b::sandbox::local::LocalBackend::open(&wmo_e2b::state::state_dir())
                .context("cannot open the local sandbox backend")?;
            Ok(backend)
        }
    }
}

/// An error whose exit code is usage (2): bad options or input files.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

pub fn exit_code_of(err: &anyhow::Error) -> Exit {
    let usage = err
        .chain()
        .any(|c| c.is::<UsageError>() || c.is::<wmo_e2b::task::TaskError>());
    if usage {
        Exit::Usage
    } else {
        Exit::Infrastructure
    }
}
