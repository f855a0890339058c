//! One build of the pi bundle in a fresh directory: the embedded build inputs written there,
//! `npm ci` (the locked pi packages and the pinned esbuild, whose platform binary is an
//! optional dependency: all from the npm registry), `node build.mjs`, its report and the
//! bundle checked, `node_modules` removed (nothing reads it again), and the marker written
//! last. Its options are the install cache's.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::bundle::PiBundle;
use super::command::{run_until, Finished};
use super::error::{io_err, PiError};
use super::{specs, BUILD_INPUTS, BUNDLE_FILE, ESBUILD_VERSION, PI_PACKAGES, PI_VERSION};

/// How long one build (`npm ci`, then the bundling) may take before it is killed.
pub const DEFAULT_INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// The marker file in an install directory: the inputs it was built from and the bundle's
/// digest. Written last.
pub(super) const MARKER: &str = ".wmo-installed";

/// The build's report (what `build.mjs` printed), kept beside the bundle.
pub(super) const REPORT_FILE: &str = "bundle.json";

/// What `npm ci` is given: the locked packages exactly, no install scripts (esbuild's would
/// only check its binary), and esbuild's binary, which is its platform's optional
/// dependency, kept even under a user's `omit=optional`.
pub const NPM_CI_ARGS: [&str; 5] = [
    "ci",
    "--no-audit",
    "--no-fund",
    "--ignore-scripts",
    "--include=optional",
];

/// How to run the build.
#[derive(Debug, Clone)]
pub struct InstallOpts {
    /// The npm program (a name looked up on `PATH`, or a path).
    pub npm: PathBuf,
    /// The node program that runs the bundler.
    pub node: PathBuf,
    pub timeout: Duration,
}

impl Default for InstallOpts {
    fn default() -> Self {
        InstallOpts {
            npm: PathBuf::from("npm"),
            node: PathBuf::from("node"),
            timeout: DEFAULT_INSTALL_TIMEOUT,
        }
    }
}

/// The marker's lines naming what a bundle is built from: the pinned specs, then the
/// digest of each build input. A binary whose inputs differ builds its own.
pub(super) fn inputs_text() -> String {
    let mut s = String::new();
    for spec in specs() {
        s.push_str(&spec);
        s.push('\n');
    }
    for (name, text) in BUILD_INPUTS {
        s.push_str(&format!(
            "{} {name}\n",
            crate::digest::sha256(text.as_bytes())
        ));
    }
    s
}

/// The whole marker: the inputs, then the bundle's digest (`sha256:<hex> pi.mjs`).
pub(super) fn marker_text(bundle_sha256: &str) -> String {
    format!("{}sha256:{bundle_sha256} {BUNDLE_FILE}\n", inputs_text())
}

/// The bundle digest (hex) a marker records, if it names exactly this binary's inputs.
pub(super) fn marked_digest(marker: &str) -> Option<&str> {
    let rest = marker.strip_prefix(inputs_text().as_str())?;
    let hex = rest
        .strip_prefix("sha256:")?
        .strip_suffix(&format!(" {BUNDLE_FILE}\n"))?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

/// Builds the bundle in a fresh `dir` and writes the marker; returns the bundle's digest.
pub(super) fn build_into(dir: &Path, opts: &InstallOpts) -> Result<String, PiError> {
    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    for (name, text) in BUILD_INPUTS {
        let path = dir.join(name);
        fs::write(&path, text).map_err(io_err("write", &path))?;
    }
    let deadline = Instant::now() + opts.timeout;

    let mut npm = Command::new(&opts.npm);
    npm.args(NPM_CI_ARGS)
        .current_dir(dir)
        .env("npm_config_update_notifier", "false");
    let done = run_until(&mut npm, deadline).map_err(not_run(Step::NpmCi, &opts.npm, dir))?;
    Step::NpmCi.output(done, dir, opts.timeout)?;

    let mut node = Command::new(&opts.node);
    node.args(["build.mjs", BUNDLE_FILE]).current_dir(dir);
    let done = run_until(&mut node, deadline).map_err(not_run(Step::Bundle, &opts.node, dir))?;
    let report = Step::Bundle.output(done, dir, opts.timeout)?;
    check_report(dir, &report)?;
    let report_path = dir.join(REPORT_FILE);
    fs::write(&report_path, &report).map_err(io_err("write", &report_path))?;

    let bundle = PiBundle::read(&dir.join(BUNDLE_FILE), None)?;
    let modules = dir.join("node_modules");
    match fs::remove_dir_all(&modules) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove", &modules)(e)),
    }
    let marker = dir.join(MARKER);
    fs::write(&marker, marker_text(&bundle.sha256)).map_err(io_err("write", &marker))?;
    Ok(bundle.sha256)
}

/// The two programs of a build.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// `npm ci`: the locked packages.
    NpmCi,
    /// `node build.mjs`: the bundle.
    Bundle,
}

impl Step {
    fn program(self) -> &'static str {
        match self {
            Step::NpmCi => "npm",
            Step::Bundle => "node",
        }
    }

    /// The stdout of a run that succeeded; the step's own error otherwise.
    fn output(self, done: Finished, dir: &Path, timeout: Duration) -> Result<Vec<u8>, PiError> {
        let dir = dir.to_path_buf();
        let Some(status) = done.status else {
            return Err(PiError::Timeout {
                step: match self {
                    Step::NpmCi => "`npm ci`",
                    Step::Bundle => "the pi bundle build (`node build.mjs`)",
                },
                dir,
                timeout,
                stderr_tail: done.stderr_tail,
            });
        };
        if status.success() {
            return Ok(done.stdout);
        }
        let (specs, status, stderr_tail) =
            (specs().join(" "), status.to_string(), done.stderr_tail);
        Err(match self {
            Step::NpmCi => PiError::Install {
                specs,
                dir,
                status,
                stderr_tail,
            },
            Step::Bundle => PiError::Bundle {
                specs,
                dir,
                status,
                stderr_tail,
            },
        })
    }
}

/// A program that could not be started: missing, or refused by the system.
fn not_run(step: Step, path: &Path, dir: &Path) -> impl FnOnce(io::Error) -> PiError {
    let (path, dir) = (path.to_path_buf(), dir.to_path_buf());
    move |e| match e.kind() {
        io::ErrorKind::NotFound => PiError::ToolMissing {
            program: step.program(),
            path,
            specs: specs().join(" "),
        },
        _ => PiError::Io {
            what: match step {
                Step::NpmCi => "run npm in",
                Step::Bundle => "run node in",
            },
            path: dir,
            source: e,
        },
    }
}

/// The build's report must name the pinned versions: what npm installed is what we pinned.
fn check_report(dir: &Path, stdout: &[u8]) -> Result<(), PiError> {
    let incomplete = |what: String, why: String| PiError::Incomplete {
        what,
        dir: dir.to_path_buf(),
        why,
    };
    let line = String::from_utf8_lossy(stdout);
    let report: serde_json::Value = serde_json::from_str(line.trim()).map_err(|e| {
        incomplete(
            "its report is unreadable".into(),
            format!("{e}: {:?}", line.chars().take(200).collect::<String>()),
        )
    })?;
    for package in PI_PACKAGES {
        let found = &report["versions"][package];
        if found.as_str() != Some(PI_VERSION) {
            return Err(incomplete(
                format!("{package} is not {PI_VERSION}"),
                format!("the build found version {found}"),
            ));
        }
    }
    let esbuild = &report["esbuild"];
    if esbuild.as_str() != Some(ESBUILD_VERSION) {
        return Err(incomplete(
            format!("esbuild is not {ESBUILD_VERSION}"),
            format!("the build ran esbuild {esbuild}"),
        ));
    }
    Ok(())
}
