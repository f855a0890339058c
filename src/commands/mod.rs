//! One module per subcommand: parse options, wire library components, print.

pub mod eval;

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
