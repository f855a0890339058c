//! One `npm install` of the pinned pi packages into a fresh directory: run with a timeout
//! (npm and everything it started are killed at it), npm's stderr kept for the error, and
//! what it installed checked before the marker is written. Its options and errors are the
//! install cache's too.

use std::fs;
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{specs, PI_PACKAGES, PI_VERSION};

/// How long one `npm install` may take before it is killed.
pub const DEFAULT_INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// The marker file in an install directory: the specs it holds, one a line. Written last.
pub(super) const MARKER: &str = ".wmo-installed";

/// How to run npm.
#[derive(Debug, Clone)]
pub struct InstallOpts {
    /// The npm program (a name looked up on `PATH`, or a path).
    pub npm: PathBuf,
    pub timeout: Duration,
}

impl Default for InstallOpts {
    fn default() -> Self {
        InstallOpts {
            npm: PathBuf::from("npm"),
            timeout: DEFAULT_INSTALL_TIMEOUT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PiError {
    #[error("npm is not installed (no {npm:?} on PATH): the pi harness needs npm on the host to install {specs} once")]
    NpmMissing { npm: PathBuf, specs: String },
    #[error("`npm install {specs}` failed ({status}) in {dir}; npm stderr (tail):\n{stderr_tail}")]
    Install {
        specs: String,
        dir: PathBuf,
        status: String,
        stderr_tail: String,
    },
    #[error("`npm install {specs}` did not finish within {timeout:?} in {dir} and was killed; npm stderr (tail):\n{stderr_tail}")]
    Timeout {
        specs: String,
        dir: PathBuf,
        timeout: Duration,
        stderr_tail: String,
    },
    #[error("`npm install {specs}` succeeded but left no usable {package} in {dir}: {why}")]
    Incomplete {
        specs: String,
        package: String,
        dir: PathBuf,
        why: String,
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

pub(super) fn marker_text() -> String {
    let mut s = specs().join("\n");
    s.push('\n');
    s
}

/// Bytes of npm's stderr quoted in an error.
const STDERR_TAIL: usize = 4096;

/// Runs npm in a fresh `dir`, checks what it installed, and writes the marker.
pub(super) fn install_into(dir: &Path, opts: &InstallOpts) -> Result<(), PiError> {
    let specs = specs();
    let joined = specs.join(" ");
    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let manifest = dir.join("package.json");
    fs::write(
        &manifest,
        "{\n  \"name\": \"wmo-e2b-pi-cache\",\n  \"private\": true\n}\n",
    )
    .map_err(io_err("write", &manifest))?;

    let mut cmd = Command::new(&opts.npm);
    cmd.arg("install")
        .args([
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            "--save-exact",
        ])
        .args(&specs)
        .current_dir(dir)
        .env("npm_config_update_notifier", "false")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // its own process group, so a timeout kills npm and everything it started
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(PiError::NpmMissing {
                npm: opts.npm.clone(),
                specs: joined,
            })
        }
        Err(e) => return Err(io_err("run npm in", dir)(e)),
    };
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + opts.timeout;
    let status: Option<ExitStatus> = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() >= deadline => {
                // SAFETY: kill(2) on the process group npm leads; no memory is involved.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io_err("wait for npm in", dir)(e));
            }
        }
    };
    let _ = out.join();
    let stderr_tail = tail(&err.join().unwrap_or_default());
    let Some(status) = status else {
        return Err(PiError::Timeout {
            specs: joined,
            dir: dir.to_path_buf(),
            timeout: opts.timeout,
            stderr_tail,
        });
    };
    if !status.success() {
        return Err(PiError::Install {
            specs: joined,
            dir: dir.to_path_buf(),
            status: status.to_string(),
            stderr_tail,
        });
    }
    for package in PI_PACKAGES {
        let pj = dir.join("node_modules").join(package).join("package.json");
        let why = match fs::read_to_string(&pj) {
            Err(e) => Some(format!("cannot read {}: {e}", pj.display())),
            Ok(text) => match serde_json::from_str::<serde_json::Value>(&text) {
                Err(e) => Some(format!("{} is not JSON: {e}", pj.display())),
                Ok(v) if v.get("version").and_then(|v| v.as_str()) == Some(PI_VERSION) => None,
                Ok(v) => Some(format!(
                    "found version {} instead of {PI_VERSION}",
                    v.get("version").unwrap_or(&serde_json::Value::Null)
                )),
            },
        };
        if let Some(why) = why {
            return Err(PiError::Incomplete {
                specs: joined,
                package: package.to_string(),
                dir: dir.to_path_buf(),
                why,
            });
        }
    }
    let marker = dir.join(MARKER);
    fs::write(&marker, marker_text()).map_err(io_err("write", &marker))?;
    Ok(())
}

fn drain<R: Read + Send + 'static>(stream: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let Some(mut s) = stream else {
            return kept;
        };
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > 4 * STDERR_TAIL {
                        kept.drain(..kept.len() - STDERR_TAIL);
                    }
                }
            }
        }
        kept
    })
}

fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(STDERR_TAIL);
    let text = String::from_utf8_lossy(&bytes[start..]);
    let text = text.trim();
    if text.is_empty() {
        "(npm wrote nothing to stderr)".to_string()
    } else {
        text.to_string()
    }
}
