//! Agents people evaluate, as harnesses (`--harness agent:NAME`): each a recipe saying which
//! package at which version holds it, how it runs headless on the task's instruction, and
//! what points it at the runner's model endpoint. The package is installed once per host
//! from its registry (npm, or PyPI into a virtual environment of the host's `/usr/bin/python3`,
//! which sandboxes on the host's root see too) into `<state_dir>/agents/<name>-<version>/`
//! (under a lock, in a temporary directory renamed into place) and shown to sandboxes
//! read-only at [`SANDBOX_AGENTS_DIR`]`/<name>`. No sandbox runs npm or pip, and no sandbox
//! holds a key: the agent's key is the endpoint's placeholder.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::pi::command::run_until;

mod placed;

pub use placed::{place_agent, AgentShipment};

/// Where a sandbox sees an agent's install: `<this>/<name>`.
pub const SANDBOX_AGENTS_DIR: &str = "/opt/wmo-e2b/agents";

/// The variable naming the agent's install directory, as the sandbox sees it.
pub const AGENT_DIR_ENV: &str = "WMO_E2B_AGENT_DIR";

/// How long one install may take.
pub const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Where an agent's package comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    Npm,
    PyPi,
}

/// A known agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentRecipe {
    pub name: &'static str,
    pub registry: Registry,
    /// The package and its exact version.
    pub package: &'static str,
    pub version: &'static str,
    /// A shell command run in the workspace as the task; `$WMO_E2B_AGENT_DIR` is the
    /// install, `$WMO_E2B_INSTRUCTION` the task's instruction, `$WMO_E2B_MODEL` the run's
    /// model, and the endpoint's variables (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`, the
    /// keys) are set.
    pub command: &'static str,
    /// Variables of its own (what keeps it from phoning home, updating itself or asking).
    pub envs: &'static [(&'static str, &'static str)],
}

/// Claude Code in its headless `-p` mode, every permission granted (the sandbox is the
/// boundary; `IS_SANDBOX` lets it grant them when it runs as root, unconfined).
const CLAUDE_CODE: AgentRecipe = AgentRecipe {
    name: "claude-code",
    registry: Registry::Npm,
    package: "@anthropic-ai/claude-code",
    version: "2.1.332",
    command: r#"exec "$WMO_E2B_AGENT_DIR/node_modules/.bin/claude" -p "$WMO_E2B_INSTRUCTION" --model "$WMO_E2B_MODEL" --dangerously-skip-permissions --output-format text"#,
    envs: &[
        ("IS_SANDBOX", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_ERROR_REPORTING", "1"),
    ],
};

/// Codex CLI's `exec` mode, with a model provider of its own pointed at the endpoint's
/// Responses API (Codex reads no base-URL variable for its built-in provider) and its own
/// sandbox off (the task's sandbox is the boundary).
const CODEX: AgentRecipe = AgentRecipe {
    name: "codex",
    registry: Registry::Npm,
    package: "@openai/codex",
    version: "0.171.0",
    command: r#"mkdir -p "$CODEX_HOME" && exec "$WMO_E2B_AGENT_DIR/node_modules/.bin/codex" exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -c model_provider=wmo -c "model_providers.wmo={name=\"wmo-e2b\",base_url=\"$OPENAI_BASE_URL\",env_key=\"OPENAI_API_KEY\",wire_api=\"responses\",supports_websockets=false}" -m "$WMO_E2B_MODEL" "$WMO_E2B_INSTRUCTION""#,
    envs: &[("CODEX_HOME", "/tmp/wmo-e2b-codex-home")],
};

/// mini-swe-agent's `mini`, without confirmations, ending when the agent says it is done;
/// litellm reaches the endpoint as an OpenAI-compatible server, and counts no cost (the host
/// meters every call).
const MINI_SWE_AGENT: AgentRecipe = AgentRecipe {
    name: "mini-swe-agent",
    registry: Registry::PyPi,
    package: "mini-swe-agent",
    version: "2.4.6",
    command: r#"exec "$WMO_E2B_AGENT_DIR/bin/python" -m minisweagent.run.mini -t "$WMO_E2B_INSTRUCTION" --yolo --exit-immediately --cost-limit 0 -m "openai/$WMO_E2B_MODEL" </dev/null"#,
    envs: &[
        ("MSWEA_CONFIGURED", "true"),
        ("MSWEA_COST_TRACKING", "ignore_errors"),
        ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
    ],
};

/// Every known agent.
pub const RECIPES: [AgentRecipe; 3] = [CLAUDE_CODE, CODEX, MINI_SWE_AGENT];

/// The recipe named `name`.
pub fn recipe(name: &str) -> Option<&'static AgentRecipe> {
    RECIPES.iter().find(|r| r.name == name)
}

/// The names `--harness agent:` knows.
pub fn known() -> String {
    RECIPES
        .iter()
        .map(|r| r.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl AgentRecipe {
    /// `<name>-<version>`: its install directory's name, and its lock's and archive's stem.
    pub fn stem(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }

    /// Where sandboxes see its install.
    pub fn sandbox_dir(&self) -> String {
        format!("{SANDBOX_AGENTS_DIR}/{}", self.name)
    }

    /// `<package>@<version>` (npm) or `<package>==<version>` (PyPI).
    pub fn spec(&self) -> String {
        match self.registry {
            Registry::Npm => format!("{}@{}", self.package, self.version),
            Registry::PyPi => format!("{}=={}", self.package, self.version),
        }
    }
}

/// An installed agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentInstall {
    pub recipe: &'static AgentRecipe,
    /// `<state_dir>/agents/<name>-<version>`.
    pub dir: PathBuf,
    /// The package's integrity as the registry published it (`sha512-…`).
    pub digest: String,
}

impl AgentInstall {
    /// `<stem>.<extension>` beside the install directory (its lock, its archive).
    fn beside(&self, extension: &str) -> PathBuf {
        self.dir
            .with_file_name(format!("{}.{extension}", self.recipe.stem()))
    }
}

/// Maps an I/O error of installing `recipe` (`what` of `path`) to the error that says so.
fn io_error(
    recipe: &AgentRecipe,
    what: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> AgentInstallError {
    let (spec, path) = (recipe.spec(), path.to_path_buf());
    move |source| AgentInstallError::Io {
        spec,
        what,
        path,
        source,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentInstallError {
    #[error("cannot install agent {spec}: {what} {path:?}: {source}")]
    Io {
        spec: String,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} is not on this host: --harness agent:{name} installs {spec} with it once ({hint})")]
    NoInstaller {
        name: &'static str,
        spec: String,
        program: &'static str,
        hint: &'static str,
    },
    #[error("installing {spec} ({step}) {how}; its stderr ends:\n{stderr_tail}")]
    Install {
        spec: String,
        step: &'static str,
        how: String,
        stderr_tail: String,
    },
    #[error("installing {spec} finished, but {what}")]
    Incomplete { spec: String, what: String },
}

/// The marker an install is complete behind: the digest it was installed with.
pub(crate) const MARKER: &str = "wmo-e2b-installed";

/// Installs `recipe`'s package under `state_dir` unless it already is, once per host (also
/// across concurrent processes), and returns it.
pub fn ensure_installed(
    state_dir: &Path,
    recipe: &'static AgentRecipe,
) -> Result<AgentInstall, AgentInstallError> {
    let io = |what, path: &Path| io_error(recipe, what, path);
    let parent = state_dir.join("agents");
    fs::create_dir_all(&parent).map_err(io("create", &parent))?;
    // npm records paths relative to where it really is: a prefix through a link confuses
    // its lock file, and a removal here does not follow links.
    let parent = fs::canonicalize(&parent).map_err(io("resolve", &parent))?;
    let dir = parent.join(recipe.stem());
    if let Some(found) = complete(&dir, recipe) {
        return Ok(found);
    }
    let lock_path = parent.join(format!("{}.lock", recipe.stem()));
    let _lock = crate::sync::flock_within(&lock_path, libc::LOCK_EX, INSTALL_TIMEOUT)
        .map_err(io("lock", &lock_path))?;
    if let Some(found) = complete(&dir, recipe) {
        return Ok(found);
    }
    let tmp = parent.join(format!(
        ".{}.tmp.{}",
        recipe.stem(),
        crate::id::unique_hex(6)
    ));
    let installed = match recipe.registry {
        Registry::Npm => npm_install(&tmp, recipe),
        Registry::PyPi => pip_install(&tmp, recipe),
    };
    let result = installed.and_then(|digest| {
        fs::write(tmp.join(MARKER), &digest).map_err(io("write", &tmp))?;
        if dir.exists() {
            crate::deep_remove::remove_tree(&dir).map_err(io("remove", &dir))?;
        }
        fs::rename(&tmp, &dir).map_err(io("rename", &tmp))?;
        Ok(digest)
    });
    match result {
        Ok(digest) => Ok(AgentInstall {
            recipe,
            dir,
            digest,
        }),
        Err(e) => {
            let _ = crate::deep_remove::remove_tree(&tmp);
            Err(e)
        }
    }
}

/// The install in `dir`, if its marker says it is complete.
fn complete(dir: &Path, recipe: &'static AgentRecipe) -> Option<AgentInstall> {
    let digest = fs::read_to_string(dir.join(MARKER)).ok()?;
    let digest = digest.trim();
    (!digest.is_empty()).then(|| AgentInstall {
        recipe,
        dir: dir.to_path_buf(),
        digest: digest.to_string(),
    })
}

/// Runs npm into `dir`; returns the package's published integrity.
fn npm_install(dir: &Path, recipe: &AgentRecipe) -> Result<String, AgentInstallError> {
    let spec = recipe.spec();
    let mut cmd = Command::new("npm");
    cmd.args([
        "install",
        "--no-audit",
        "--no-fund",
        "--save-exact",
        "--prefix",
    ])
    .arg(dir)
    .arg(&spec)
    .current_dir(dir);
    let npm = Installer {
        program: "npm",
        hint: "Debian: apt-get install npm",
    };
    run_step(&mut cmd, &npm, "npm install", dir, recipe)?;
    let text = fs::read_to_string(dir.join("package-lock.json")).unwrap_or_default();
    let entry = format!("node_modules/{}", recipe.package);
    let parsed: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let found = &parsed["packages"][&entry];
    let integrity = found["integrity"].as_str().unwrap_or("");
    if found["version"].as_str() != Some(recipe.version) || integrity.is_empty() {
        return Err(AgentInstallError::Incomplete {
            spec,
            what: format!(
                "its package-lock.json names no {entry} at {} with an integrity",
                recipe.version
            ),
        });
    }
    Ok(integrity.to_string())
}

/// The host's Python that sandboxes on the host's root see at the same path.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Makes a virtual environment in `dir` and pip-installs the package into it; returns the
/// sha256 of the package's own distribution file, from pip's installation report.
fn pip_install(dir: &Path, recipe: &AgentRecipe) -> Result<String, AgentInstallError> {
    let python = Installer {
        program: SYSTEM_PYTHON,
        hint: "Debian: apt-get install python3-venv",
    };
    let mut venv = Command::new(SYSTEM_PYTHON);
    venv.args(["-m", "venv"]).arg(dir).current_dir(dir);
    run_step(&mut venv, &python, "python3 -m venv", dir, recipe)?;
    let report = dir.join("install-report.json");
    let mut pip = Command::new(dir.join("bin/python"));
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--report",
    ])
    .arg(&report)
    .arg(recipe.spec())
    .current_dir(dir);
    run_step(&mut pip, &python, "pip install", dir, recipe)?;
    let parsed: Value = fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let ours = parsed["install"].as_array().and_then(|all| {
        all.iter().find(|i| {
            i["metadata"]["name"].as_str() == Some(recipe.package)
                && i["metadata"]["version"].as_str() == Some(recipe.version)
        })
    });
    let hash = ours.and_then(|i| i["download_info"]["archive_info"]["hashes"]["sha256"].as_str());
    match hash {
        Some(hex) if !hex.is_empty() => Ok(format!("sha256:{hex}")),
        _ => Err(AgentInstallError::Incomplete {
            spec: recipe.spec(),
            what: format!(
                "pip's report names no {} {} with a sha256",
                recipe.package, recipe.version
            ),
        }),
    }
}

/// A program an install runs, and how to get it.
struct Installer {
    program: &'static str,
    hint: &'static str,
}

/// Runs one step of an install to its end, bounded by [`INSTALL_TIMEOUT`].
fn run_step(
    cmd: &mut Command,
    installer: &Installer,
    step: &'static str,
    dir: &Path,
    recipe: &AgentRecipe,
) -> Result<(), AgentInstallError> {
    fs::create_dir_all(dir).map_err(io_error(recipe, "create", dir))?;
    let done = match run_until(cmd, Instant::now() + INSTALL_TIMEOUT) {
        Ok(done) => done,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(AgentInstallError::NoInstaller {
                name: recipe.name,
                spec: recipe.spec(),
                program: installer.program,
                hint: installer.hint,
            })
        }
        Err(source) => return Err(io_error(recipe, "run the installer in", dir)(source)),
    };
    let how = match done.status {
        Some(s) if s.success() => return Ok(()),
        Some(s) => format!("failed ({s})"),
        None => format!("did not finish within {INSTALL_TIMEOUT:?}"),
    };
    Err(AgentInstallError::Install {
        spec: recipe.spec(),
        step,
        how,
        stderr_tail: done.stderr_tail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_is_pinned_and_found_by_name() {
        for r in &RECIPES {
            assert_eq!(recipe(r.name), Some(r));
            assert!(
                r.version.split('.').all(|p| p.parse::<u32>().is_ok()),
                "{}",
                r.version
            );
            assert!(r.command.contains("$WMO_E2B_INSTRUCTION"), "{}", r.name);
        }
        assert_eq!(recipe("aider"), None);
        assert_eq!(known(), "claude-code, codex, mini-swe-agent");
    }

    #[test]
    fn an_install_is_found_by_its_marker_only() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join(CODEX.stem());
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(complete(&dir, &RECIPES[1]), None);
        fs::write(dir.join(MARKER), "sha512-abc\n").unwrap();
        let found = complete(&dir, &RECIPES[1]).unwrap();
        assert_eq!(found.digest, "sha512-abc");
        assert_eq!(found.recipe.sandbox_dir(), "/opt/wmo-e2b/agents/codex");
    }
}
