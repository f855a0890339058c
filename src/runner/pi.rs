//! The pi harness: the real pi agent loop (`@mariozechner/pi-agent-core`'s `runAgentLoop`)
//! run by the runner in place of its builtin loop, for episodes whose `episode_start` says
//! `"harness": "pi"`.
//!
//! The host installs the pinned packages once into `<state_dir>/npm/pi-<version>/` with
//! npm ([`ensure_installed`]) and bootstraps the runner with `WMO_PI_MODULES` naming that
//! `node_modules` directory (see `BootstrapOpts::pi_modules`); the runner imports pi lazily
//! at its first pi episode, through [`PI_HARNESS_JS`], which it finds next to `runner.mjs`.
//!
//! The install directory is filled under an exclusive `flock` (so concurrent wmo-e2b
//! processes run npm once), in a temporary directory renamed into place, and is only used
//! once its marker file lists exactly [`specs`].

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The exact version of both pi packages.
pub const PI_VERSION: &str = "0.73.1";

/// The packages installed, each at [`PI_VERSION`].
pub const PI_PACKAGES: [&str; 2] = ["@mariozechner/pi-agent-core", "@mariozechner/pi-ai"];

/// The runner's pi harness module, uploaded next to `runner.mjs` when pi is enabled.
pub const PI_HARNESS_JS: &str = include_str!("../../runner/pi_harness.mjs");

/// File name of [`PI_HARNESS_JS`] in the runner directory.
pub const PI_HARNESS_FILE: &str = "pi_harness.mjs";

/// The runner's environment variable naming the `node_modules` directory holding pi.
pub const PI_MODULES_ENV: &str = "WMO_PI_MODULES";

/// How long one `npm install` may take before it is killed.
pub const DEFAULT_INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// The marker file in an install directory: the specs it holds, one a line. Written last.
const MARKER: &str = ".wmo-installed";

/// Bytes of npm's stderr quoted in an error.
const STDERR_TAIL: usize = 4096;

/// An installed pi.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PiInstall {
    /// The `node_modules` directory holding both packages (what `WMO_PI_MODULES` names).
    pub modules_dir: PathBuf,
    /// The installed version ([`PI_VERSION`]).
    pub version: String,
}

impl PiInstall {
    /// How a local backend shows this install to confined runners: the host directory
    /// (holding `node_modules`), and the sandbox path it is mounted at, read-only.
    pub fn local_mount(&self) -> (PathBuf, String) {
        let dir = self
            .modules_dir
            .parent()
            .map_or_else(|| self.modules_dir.clone(), Path::to_path_buf);
        (dir, SANDBOX_PI_DIR.to_string())
    }

    /// The `node_modules` directory as a local runner sees it: where a template would keep
    /// it under bwrap, the host path when unconfined.
    pub fn modules_seen_by(&self, isolation: crate::sandbox::local::Isolation) -> PathBuf {
        match isolation {
            crate::sandbox::local::Isolation::Bwrap => PathBuf::from(TEMPLATE_PI_MODULES),
            crate::sandbox::local::Isolation::None => self.modules_dir.clone(),
        }
    }
}

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

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PiError {
    let path = path.to_path_buf();
    move |source| PiError::Io { what, path, source }
}

/// The exact package specs, e.g. `@mariozechner/pi-ai@0.73.1`.
pub fn specs() -> Vec<String> {
    PI_PACKAGES
        .iter()
        .map(|p| format!("{p}@{PI_VERSION}"))
        .collect()
}

/// Where [`ensure_installed`] puts pi: `<state_dir>/npm/pi-<version>`.
pub fn install_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("npm").join(format!("pi-{PI_VERSION}"))
}

fn marker_text() -> String {
    let mut s = specs().join("\n");
    s.push('\n');
    s
}

/// The install in `dir` if its marker lists exactly the pinned specs.
fn complete_install(dir: &Path) -> Option<PiInstall> {
    let marker = fs::read_to_string(dir.join(MARKER)).ok()?;
    let modules_dir = dir.join("node_modules");
    (marker == marker_text() && modules_dir.is_dir()).then(|| PiInstall {
        modules_dir,
        version: PI_VERSION.to_string(),
    })
}

/// The pinned pi, if it is already installed under `state_dir` (never runs npm).
pub fn find_installed(state_dir: &Path) -> Option<PiInstall> {
    complete_install(&install_dir(state_dir))
}

/// Installs the pinned pi packages under `state_dir` unless they already are, and returns
/// where they are. Runs `npm install` at most once per state directory, also across
/// concurrent processes; a later call only reads the marker.
pub fn ensure_installed(state_dir: &Path) -> Result<PiInstall, PiError> {
    ensure_installed_with(state_dir, &InstallOpts::default())
}

/// [`ensure_installed`] with a given npm program and timeout.
pub fn ensure_installed_with(state_dir: &Path, opts: &InstallOpts) -> Result<PiInstall, PiError> {
    let dir = install_dir(state_dir);
    if let Some(found) = complete_install(&dir) {
        share_read_only(&dir)?;
        return Ok(found);
    }
    let npm_dir = dir
        .parent()
        .expect("install_dir has a parent")
        .to_path_buf();
    fs::create_dir_all(&npm_dir).map_err(io_err("create", &npm_dir))?;
    let lock_path = npm_dir.join(format!("pi-{PI_VERSION}.lock"));
    let _lock = Flock::exclusive(&lock_path)?;
    // Someone may have finished while we waited for the lock.
    if let Some(found) = complete_install(&dir) {
        return Ok(found);
    }
    remove_leftovers(&npm_dir);

    let tmp = npm_dir.join(format!(
        ".pi-{PI_VERSION}.tmp.{}.{}",
        std::process::id(),
        unique_suffix()
    ));
    let result = install_into(&tmp, opts).and_then(|()| {
        if dir.exists() {
            // An incomplete or foreign install: move it aside, then drop it.
            let stale = npm_dir.join(format!(
                ".pi-{PI_VERSION}.stale.{}.{}",
                std::process::id(),
                unique_suffix()
            ));
            fs::rename(&dir, &stale).map_err(io_err("move aside", &dir))?;
            let _ = fs::remove_dir_all(&stale);
        }
        fs::rename(&tmp, &dir).map_err(io_err("rename the new install to", &dir))
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result?;
    share_read_only(&dir)?;
    complete_install(&dir).ok_or_else(|| PiError::Incomplete {
        specs: specs().join(" "),
        package: "marker".to_string(),
        dir: dir.clone(),
        why: "the marker did not survive the rename".to_string(),
    })
}

/// Makes the install readable by everyone: a confined runner reads it as the sandbox user,
/// which (when the host runs as root) is not the install's owner. Nothing in it is secret.
fn share_read_only(dir: &Path) -> Result<(), PiError> {
    use std::os::unix::fs::PermissionsExt;
    let shared = |m: &fs::Metadata| m.permissions().mode() & 0o005 == 0o005;
    match fs::symlink_metadata(dir) {
        Ok(m) if shared(&m) => return Ok(()),
        Ok(_) => {}
        Err(e) => return Err(io_err("read", dir)(e)),
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let m = fs::symlink_metadata(&path).map_err(io_err("read", &path))?;
        if m.file_type().is_symlink() {
            continue;
        }
        let mode = m.permissions().mode();
        let want = if m.is_dir() {
            mode | 0o555
        } else {
            mode | 0o444
        };
        if want != mode {
            fs::set_permissions(&path, fs::Permissions::from_mode(want))
                .map_err(io_err("share", &path))?;
        }
        if m.is_dir() {
            for e in fs::read_dir(&path).map_err(io_err("list", &path))? {
                stack.push(e.map_err(io_err("list", &path))?.path());
            }
        }
    }
    Ok(())
}

/// Removes temporary and stale directories left by crashed installs. Called under the
/// lock, so none of them is in use by a wmo-e2b process.
fn remove_leftovers(npm_dir: &Path) {
    let Ok(entries) = fs::read_dir(npm_dir) else {
        return;
    };
    let tmp = format!(".pi-{PI_VERSION}.tmp.");
    let stale = format!(".pi-{PI_VERSION}.stale.");
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&tmp) || name.starts_with(&stale) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn unique_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Runs npm in a fresh `dir`, checks what it installed, and writes the marker.
fn install_into(dir: &Path, opts: &InstallOpts) -> Result<(), PiError> {
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

/// An exclusive `flock` on a file, released when dropped (or when the process dies).
struct Flock {
    _file: File,
}

impl Flock {
    fn exclusive(path: &Path) -> Result<Flock, PiError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(io_err("open the lock file", path))?;
        loop {
            // SAFETY: flock(2) on a descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(Flock { _file: file });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(io_err("lock", path)(e));
            }
        }
    }
}

/// Where pi lives in a sandbox's system directory: the template recipe
/// (`scripts/e2b-template/`) prebakes it there, and a local bwrap sandbox is shown the host's
/// install there (read-only, to the runner only).
pub const SANDBOX_PI_DIR: &str = "/opt/wmo-e2b/pi";

/// pi's `node_modules` under [`SANDBOX_PI_DIR`].
pub const TEMPLATE_PI_MODULES: &str = "/opt/wmo-e2b/pi/node_modules";

/// How long an in-sandbox npm install may take.
pub const SANDBOX_INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Makes pi available inside a sandbox and returns its `node_modules` path as the runner
/// (working in `runner_dir`) should name it: the template's prebaked copy when present,
/// otherwise an install into the runner directory, done once per sandbox (a marker file
/// records it).
pub fn install_in_sandbox(
    sandbox: &dyn crate::sandbox::Sandbox,
    runner_dir: &str,
) -> Result<String, super::RunnerError> {
    let marker = format!("node_modules/.wmo-pi-{PI_VERSION}");
    let script = format!(
        "if [ -d {tpl}/@mariozechner/pi-agent-core ]; then echo {tpl}; exit 0; fi; \
         if [ ! -f {marker} ]; then \
           command -v npm >/dev/null || {{ echo 'npm is not installed in the sandbox' >&2; exit 127; }}; \
           npm install --no-audit --no-fund --ignore-scripts --save-exact {specs} >&2 && touch {marker} || exit 1; \
         fi; echo node_modules",
        tpl = TEMPLATE_PI_MODULES,
        specs = specs().join(" "),
    );
    let id = sandbox.id().to_string();
    // npm installs into the nearest package.json's directory: make it the runner's.
    sandbox
        .write_file(
            &format!("{runner_dir}/package.json"),
            br#"{"name":"wmo-runner","private":true,"type":"module"}"#,
        )
        .map_err(|source| super::RunnerError::Upload {
            id: id.clone(),
            source,
        })?;
    let out = sandbox
        .run(
            &script,
            &crate::sandbox::RunOpts {
                cwd: Some(runner_dir.to_string()),
                role: crate::sandbox::Role::System,
                timeout: SANDBOX_INSTALL_TIMEOUT,
                max_output: 16 * 1024,
                ..crate::sandbox::RunOpts::default()
            },
        )
        .map_err(|source| super::RunnerError::Upload {
            id: id.clone(),
            source,
        })?;
    let path = out.stdout.to_text().trim().to_string();
    if out.exit_code != Some(0) || path.is_empty() {
        return Err(super::RunnerError::PiUnavailable {
            id,
            reason: format!(
                "installing {} in the sandbox failed ({}): {}",
                specs().join(" "),
                if out.timed_out {
                    "timed out".to_string()
                } else {
                    format!("exit {:?}", out.exit_code)
                },
                out.stderr.to_text().trim()
            ),
        });
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fake npm: a shell script that records each run and creates the packages.
    fn fake_npm(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("fake-npm");
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn good_npm(dir: &Path) -> PathBuf {
        let runs = dir.join("runs");
        fake_npm(
            dir,
            &format!(
                "echo \"$@\" >> '{}'\nsleep 0.2\nfor p in pi-agent-core pi-ai; do\n  mkdir -p node_modules/@mariozechner/$p\n  echo '{{\"version\":\"{PI_VERSION}\"}}' > node_modules/@mariozechner/$p/package.json\ndone",
                runs.display()
            ),
        )
    }

    fn runs(dir: &Path) -> Vec<String> {
        fs::read_to_string(dir.join("runs"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn opts(npm: PathBuf) -> InstallOpts {
        InstallOpts {
            npm,
            timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_marked_install_is_reused_without_running_npm() {
        let state = tempfile::tempdir().unwrap();
        let dir = install_dir(state.path());
        fs::create_dir_all(dir.join("node_modules/@mariozechner/pi-ai")).unwrap();
        fs::write(dir.join(MARKER), marker_text()).unwrap();
        let missing = InstallOpts {
            npm: PathBuf::from("/nonexistent/npm"),
            ..InstallOpts::default()
        };
        let t0 = Instant::now();
        let found = ensure_installed_with(state.path(), &missing).unwrap();
        assert!(t0.elapsed() < Duration::from_millis(100));
        assert_eq!(found.modules_dir, dir.join("node_modules"));
        assert_eq!(found.version, PI_VERSION);
        assert_eq!(find_installed(state.path()), Some(found));
        // the fast path takes no lock and creates nothing
        assert!(!state.path().join("npm").join("pi-0.73.1.lock").exists());
    }

    #[test]
    fn installs_once_then_reuses() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = good_npm(tools.path());
        let first = ensure_installed_with(state.path(), &opts(npm.clone())).unwrap();
        let pj = first
            .modules_dir
            .join("@mariozechner/pi-agent-core/package.json");
        assert!(pj.is_file());
        let r = runs(tools.path());
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0],
            "install --no-audit --no-fund --ignore-scripts --save-exact \
             @mariozechner/pi-agent-core@0.73.1 @mariozechner/pi-ai@0.73.1"
        );
        let second = ensure_installed_with(state.path(), &opts(npm)).unwrap();
        assert_eq!(first, second);
        assert_eq!(runs(tools.path()).len(), 1, "the second call ran npm");
        // nothing temporary left beside it
        let names: Vec<String> = fs::read_dir(state.path().join("npm"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(".pi-")),
            "leftovers: {names:?}"
        );
    }

    #[test]
    fn concurrent_callers_run_npm_once() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = good_npm(tools.path());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let state = state.path().to_path_buf();
                let o = opts(npm.clone());
                std::thread::spawn(move || ensure_installed_with(&state, &o).unwrap())
            })
            .collect();
        let results: Vec<PiInstall> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(results.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(runs(tools.path()).len(), 1);
    }

    #[test]
    fn a_mismatched_marker_reinstalls() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let dir = install_dir(state.path());
        fs::create_dir_all(dir.join("node_modules")).unwrap();
        fs::write(dir.join(MARKER), "@mariozechner/pi-ai@0.1.0\n").unwrap();
        fs::write(dir.join("old-file"), "x").unwrap();
        let found = ensure_installed_with(state.path(), &opts(good_npm(tools.path()))).unwrap();
        assert_eq!(runs(tools.path()).len(), 1);
        assert!(!dir.join("old-file").exists());
        assert_eq!(fs::read_to_string(dir.join(MARKER)).unwrap(), marker_text());
        assert!(found.modules_dir.join("@mariozechner/pi-ai").is_dir());
    }

    #[test]
    fn npm_missing_is_named() {
        let state = tempfile::tempdir().unwrap();
        let e = ensure_installed_with(
            state.path(),
            &opts(PathBuf::from("wmo-e2b-no-such-npm-here")),
        )
        .unwrap_err();
        assert!(matches!(e, PiError::NpmMissing { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("npm is not installed"), "{msg}");
        assert!(msg.contains("@mariozechner/pi-agent-core@0.73.1"), "{msg}");
        assert!(find_installed(state.path()).is_none());
    }

    #[test]
    fn a_failed_install_quotes_npm_stderr_and_leaves_nothing() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = fake_npm(
            tools.path(),
            "echo 'npm error code E404' >&2\necho 'npm error 404 Not Found - GET https://registry.npmjs.org/x' >&2\nexit 1",
        );
        let e = ensure_installed_with(state.path(), &opts(npm)).unwrap_err();
        assert!(matches!(e, PiError::Install { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("npm error 404 Not Found"), "{msg}");
        assert!(msg.contains("exit status: 1"), "{msg}");
        assert!(!install_dir(state.path()).exists());
        let names: Vec<_> = fs::read_dir(state.path().join("npm"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "only the lock file: {names:?}");
    }

    #[test]
    fn an_install_without_the_packages_is_incomplete() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = fake_npm(tools.path(), "exit 0");
        let e = ensure_installed_with(state.path(), &opts(npm)).unwrap_err();
        assert!(matches!(e, PiError::Incomplete { .. }), "{e:?}");
        assert!(find_installed(state.path()).is_none());
    }

    /// End to end with the real packages: install (or reuse) pi in the repository's
    /// `target/pi-cache` (shared with the runner's node tests; `WMO_PI_MODULES` names an
    /// existing install instead), bootstrap a runner on a local sandbox with it, and run a
    /// pi episode over the channel.
    #[test]
    fn a_pi_episode_runs_in_a_bootstrapped_runner() {
        use crate::runner::{bootstrap, BootstrapOpts};
        use crate::sandbox::local::LocalBackend;
        use crate::sandbox::{Backend, CreateSpec, Sandbox};
        use serde_json::{json, Value};
        use std::sync::Arc;

        let install = match std::env::var_os(PI_MODULES_ENV).filter(|v| !v.is_empty()) {
            Some(dir) => PiInstall {
                modules_dir: PathBuf::from(dir),
                version: PI_VERSION.into(),
            },
            None => {
                let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pi-cache");
                let install = ensure_installed(&cache).unwrap_or_else(|e| {
                    panic!(
                        "the pi end-to-end test needs pi installed (the npm registry, once): {e}"
                    )
                });
                assert_eq!(find_installed(&cache).as_ref(), Some(&install));
                install
            }
        };
        let state = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open_with(
            state.path(),
            crate::sandbox::local::LocalOptions {
                system_read_only: vec![install.local_mount()],
                ..Default::default()
            },
        )
        .unwrap();
        let modules = install.modules_seen_by(backend.isolation());
        let sandbox: Arc<dyn Sandbox> = backend
            .create_local(&CreateSpec {
                timeout_secs: 120,
                internet: true,
                ..CreateSpec::default()
            })
            .unwrap();
        let opts = BootstrapOpts {
            pi_modules: Some(modules),
            ..BootstrapOpts::default()
        };
        let mut started = bootstrap(&sandbox, &opts).unwrap();
        assert_eq!(started.hello["pi_version"], PI_VERSION);
        assert_eq!(started.hello["harnesses"], json!(["builtin", "pi"]));
        let ch = &mut started.channel;
        let bash = json!({"type": "function", "function": {"name": "bash", "description": "run",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
            "required": ["command"]}}});
        let call = |id: &str, name: &str, args: Value| {
            json!({"id": id, "type": "function",
                "function": {"name": name, "arguments": args.to_string()}})
        };
        let completion = |calls: Value| {
            json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": calls}}]})
        };

        ch.send(
            &json!({"type": "episode_start", "episode_id": "e1", "harness": "pi",
            "instruction": "go", "system": "sys", "tools": [bash], "files": {}, "max_turns": 5}),
        )
        .unwrap();
        let req = next(ch, "llm_request");
        assert_eq!(req["openai_body"]["messages"][1]["content"], "go");
        ch.send(
            &json!({"type": "llm_response", "episode_id": "e1", "req_id": req["req_id"],
            "completion": completion(json!([call("c1", "bash", json!({"command": "echo hi"}))]))}),
        )
        .unwrap();
        let treq = next(ch, "tool_request");
        assert_eq!(treq["arguments"], json!({"command": "echo hi"}));
        ch.send(
            &json!({"type": "tool_response", "episode_id": "e1", "req_id": treq["req_id"],
            "content": "hi", "is_error": false}),
        )
        .unwrap();
        let req2 = next(ch, "llm_request");
        assert_eq!(
            req2["openai_body"]["messages"][3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "hi"})
        );
        ch.send(
            &json!({"type": "llm_response", "episode_id": "e1", "req_id": req2["req_id"],
            "completion": completion(json!([call("c2", "submit", json!({"answer": "42"}))]))}),
        )
        .unwrap();
        let done = next(ch, "done");
        assert_eq!(done["reason"], "submit");
        assert_eq!(done["answer"], "42");
        assert_eq!(done["turns"], 2);
        ch.close();
        let _ = backend.kill(sandbox.id());
    }

    #[test]
    fn bootstrap_refuses_a_runner_that_cannot_run_pi() {
        use crate::runner::{bootstrap, BootstrapOpts, RunnerError};
        use crate::sandbox::local::LocalBackend;
        use crate::sandbox::{Backend, CreateSpec, Sandbox};
        use std::sync::Arc;

        let state = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open(state.path()).unwrap();
        let sandbox: Arc<dyn Sandbox> = backend
            .create_local(&CreateSpec {
                timeout_secs: 60,
                internet: true,
                ..CreateSpec::default()
            })
            .unwrap();
        let opts = BootstrapOpts {
            pi_modules: Some(state.path().join("no-such-node_modules")),
            ..BootstrapOpts::default()
        };
        let e = bootstrap(&sandbox, &opts)
            .err()
            .expect("bootstrap must fail");
        assert!(matches!(e, RunnerError::PiUnavailable { .. }), "{e:?}");
        assert!(!e.is_transport());
        let msg = e.to_string();
        assert!(msg.contains("pi-agent-core/package.json: ENOENT"), "{msg}");
        // the harness module was uploaded next to the runner
        let dir = crate::runner::runner_dir(sandbox.as_ref());
        let uploaded = sandbox
            .read_file(&format!("{dir}/{PI_HARNESS_FILE}"))
            .unwrap();
        assert_eq!(uploaded, PI_HARNESS_JS.as_bytes());
        let _ = backend.kill(sandbox.id());
    }

    fn next(ch: &mut crate::channel::StdioChannel, want: &str) -> crate::channel::Frame {
        let f = ch.recv(Duration::from_secs(30)).unwrap().unwrap();
        assert_eq!(f["type"], want, "{f:?}");
        f
    }

    #[test]
    fn a_hanging_npm_is_killed_at_the_timeout() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = fake_npm(tools.path(), "echo working >&2\nsleep 30");
        let t0 = Instant::now();
        let e = ensure_installed_with(
            state.path(),
            &InstallOpts {
                npm,
                timeout: Duration::from_millis(300),
            },
        )
        .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(matches!(e, PiError::Timeout { .. }), "{e:?}");
        assert!(e.to_string().contains("working"), "{e}");
    }
}
