//! What can go wrong making the pi bundle on the host, or reading it back.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum PiError {
    #[error("{program} is not installed (no {path:?} on PATH): the pi harness needs Node.js and npm on the host to build its bundle ({specs}) once")]
    ToolMissing {
        /// `npm` or `node`.
        program: &'static str,
        path: PathBuf,
        specs: String,
    },
    #[error("`npm ci` of the pi bundle's inputs ({specs}) failed ({status}) in {dir}; npm stderr (tail):\n{stderr_tail}")]
    Install {
        specs: String,
        dir: PathBuf,
        status: String,
        stderr_tail: String,
    },
    #[error("bundling pi ({specs}) failed ({status}) in {dir}; stderr (tail):\n{stderr_tail}")]
    Bundle {
        specs: String,
        dir: PathBuf,
        status: String,
        stderr_tail: String,
    },
    #[error("{step} did not finish within {timeout:?} in {dir} and was killed; stderr (tail):\n{stderr_tail}")]
    Timeout {
        /// `npm ci` or `the pi bundle build`.
        step: &'static str,
        dir: PathBuf,
        timeout: Duration,
        stderr_tail: String,
    },
    #[error("the pi bundle build succeeded but {what} in {dir}: {why}")]
    Incomplete {
        what: String,
        dir: PathBuf,
        why: String,
    },
    #[error("the pi bundle {file} is {bytes} bytes, over the {max}-byte cap")]
    TooLarge { file: PathBuf, bytes: u64, max: u64 },
    #[error("the pi bundle {file} is corrupt: its sha256 is {found}, not the {expected} it was built with; remove {} to build it again", file.parent().unwrap_or(file).display())]
    Digest {
        file: PathBuf,
        expected: String,
        found: String,
    },
    #[error("pi install cache: could not {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub(super) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PiError {
    let path = path.to_path_buf();
    move |source| PiError::Io { what, path, source }
}
