//! Harbor task directories, read as they are into the same [`Task`]s a tasks file gives.
//!
//! A task is a directory holding `task.toml`, `instruction.md`, `tests/` (with `test.sh`),
//! and optionally `solution/` (with `solve.sh`) and `environment/` (with a `Dockerfile`); a
//! dataset is a directory of them. Everything is read, bounded and checked before any
//! sandbox starts; what is wrong is named by directory, file and field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::environment::{EnvironmentSpec, Solution};
use super::{validate, Task};
use crate::sandbox::{Limits, Network};
use crate::tree::{self, TreeBounds, TreeError};

/// Tasks a dataset may hold.
pub const MAX_TASKS: usize = 10_000;
/// Bytes of `task.toml` or `instruction.md`.
const MAX_TEXT_BYTES: u64 = 1 << 20;
/// Bounds on a task's `tests/` and `solution/`, each.
const TREE_BOUNDS: TreeBounds = TreeBounds {
    max_files: 1024,
    max_bytes: 16 << 20,
    max_path: 512,
};
/// Bytes read from a whole dataset: past it, the tasks are too many to hold.
const MAX_DATASET_BYTES: u64 = 1 << 30;
/// A script run with bash, as Harbor runs it, or with `sh` where the task's image has no
/// bash (busybox, alpine): there a script for bash fails either way, one for sh can pass.
macro_rules! bash_or_sh {
    ($script:literal) => {
        concat!(
            "if command -v bash >/dev/null 2>&1; then bash ",
            $script,
            "; else sh ",
            $script,
            "; fi"
        )
    };
}
/// The command that verifies a Harbor task.
pub const HARBOR_VERIFY: &str = bash_or_sh!("/tests/test.sh");
/// The command that runs a Harbor task's reference solution, in
/// [`SOLUTION_DIR`](super::environment::SOLUTION_DIR).
pub const HARBOR_SOLVE: &str = bash_or_sh!("/tmp/solution/solve.sh");

/// A task directory (or dataset) that cannot be run, named by directory, file and field.
#[derive(Debug, thiserror::Error)]
pub enum HarborError {
    #[error(
        "{dir}: not a Harbor task (no task.toml) nor a dataset of them (no subdirectory holds one)"
    )]
    NotATask { dir: PathBuf },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{path}: sidecar services are not supported (a docker-compose environment)")]
    Compose { path: PathBuf },
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("{dir} holds more than {max} tasks")]
    TooManyTasks { dir: PathBuf, max: usize },
    #[error("{dir}: its tasks hold more than {max} bytes")]
    TooLarge { dir: PathBuf, max: u64 },
}

/// The tasks of `dir`: itself when it holds `task.toml`, else each subdirectory that does,
/// sorted by name. Also returns the digest of every file read, by path.
pub fn load_dataset(dir: &Path) -> Result<(Vec<Task>, String), HarborError> {
    let task_dirs = if dir.join("task.toml").exists() {
        vec![dir.to_path_buf()]
    } else {
        dataset_members(dir)?
    };
    let mut tasks = Vec::new();
    let mut read: Vec<(String, String)> = Vec::new();
    let mut total: u64 = 0;
    for (i, task_dir) in task_dirs.iter().enumerate() {
        let (mut task, files) = load_task(task_dir)?;
        task.line = i + 1;
        for (rel, content) in files {
            total += content.len() as u64;
            if total > MAX_DATASET_BYTES {
                return Err(HarborError::TooLarge {
                    dir: dir.to_path_buf(),
                    max: MAX_DATASET_BYTES,
                });
            }
            read.push((format!("{}/{rel}", task.id), content));
        }
        tasks.push(task);
    }
    let digest = crate::digest::sha256_parts(read.iter().map(|(p, c)| (p.as_str(), c.as_bytes())));
    Ok((tasks, digest))
}

/// The subdirectories of a dataset that hold `task.toml`, sorted by name.
fn dataset_members(dir: &Path) -> Result<Vec<PathBuf>, HarborError> {
    let io = |source| HarborError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut members = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let path = entry.path();
        let ft = entry.file_type().map_err(io)?;
        // A symlinked task would be read from wherever it points.
        if ft.is_symlink() && path.join("task.toml").exists() {
            return Err(HarborError::Invalid {
                path,
                message: "a task directory is a symlink: tasks are read where they lie".into(),
            });
        }
        if ft.is_dir() && path.join("task.toml").exists() {
            if members.len() >= MAX_TASKS {
                return Err(HarborError::TooManyTasks {
                    dir: dir.to_path_buf(),
                    max: MAX_TASKS,
                });
            }
            members.push(path);
        }
    }
    if members.is_empty() {
        return Err(HarborError::NotATask {
            dir: dir.to_path_buf(),
        });
    }
    members.sort();
    Ok(members)
}

/// `task.toml`, as Harbor writes it; any other key is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskToml {
    #[serde(default)]
    #[allow(dead_code)]
    version: Option<String>,
    #[serde(default)]
    metadata: toml::Table,
    #[serde(default)]
    agent: AgentSection,
    #[serde(default)]
    verifier: VerifierSection,
    #[serde(default)]
    environment: EnvironmentSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentSection {
    timeout_sec: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifierSection {
    timeout_sec: Option<f64>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Accepted as Harbor writes it; the verifier runs as wmo-e2b's verifier identity.
    #[allow(dead_code)]
    user: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvironmentSection {
    docker_image: Option<String>,
    build_timeout_sec: Option<f64>,
    cpus: Option<f64>,
    memory: Option<String>,
    memory_mb: Option<u64>,
    storage: Option<String>,
    storage_mb: Option<u64>,
    allow_internet: Option<bool>,
}

/// One task directory, and the text files read from it by task-relative path.
fn load_task(dir: &Path) -> Result<(Task, Vec<(String, String)>), HarborError> {
    let invalid = |file: &str, message: String| HarborError::Invalid {
        path: dir.join(file),
        message,
    };
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| invalid("", "the directory's name is not UTF-8".into()))?
        .to_string();
    let toml_text = read_text(&dir.join("task.toml"))?;
    let config: TaskToml = {
        let de = toml::Deserializer::new(&toml_text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            invalid(
                "task.toml",
                format!("field `{field}`: {}", inner.message().trim()),
            )
        })?
    };
    let instruction = read_text(&dir.join("instruction.md"))?;
    let tests = read_subtree(dir, "tests", "test.sh")?;
    let solution = match kind(&dir.join("solution"))? {
        Kind::Missing => None,
        _ => Some(read_subtree(dir, "solution", "solve.sh")?),
    };
    let environment = task_environment(dir, &config.environment)?;
    let limits = limits(&config.environment).map_err(|m| invalid("task.toml", m))?;
    for (field, value) in [
        ("agent.timeout_sec", config.agent.timeout_sec),
        ("verifier.timeout_sec", config.verifier.timeout_sec),
        (
            "environment.build_timeout_sec",
            config.environment.build_timeout_sec,
        ),
    ] {
        if value.is_some_and(|t| !(t.is_finite() && t > 0.0 && t <= 86_400.0)) {
            return Err(invalid(
                "task.toml",
                format!("field `{field}`: must be a number of seconds in (0, 86400]"),
            ));
        }
    }
    let metadata = match serde_json::to_value(&config.metadata) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let mut files: Vec<(String, String)> = vec![
        ("task.toml".into(), toml_text),
        ("instruction.md".into(), instruction.clone()),
    ];
    files.extend(tests.iter().map(|(p, c)| (format!("tests/{p}"), c.clone())));
    if let Some(s) = &solution {
        files.extend(s.iter().map(|(p, c)| (format!("solution/{p}"), c.clone())));
    }
    let task = Task {
        id,
        instruction,
        verify: Some(HARBOR_VERIFY.into()),
        tests,
        timeout_s: config.agent.timeout_sec,
        verify_timeout_s: config.verifier.timeout_sec,
        metadata,
        limits,
        network: (config.environment.allow_internet == Some(false)).then_some(Network::None),
        verify_env: config.verifier.env,
        build_timeout_s: config.environment.build_timeout_sec,
        solution: solution.map(|files| Solution {
            files,
            command: HARBOR_SOLVE.into(),
        }),
        environment,
        ..Task::default()
    };
    validate(&task).map_err(|m| invalid("task.toml", m))?;
    Ok((task, files))
}

/// The environment a task names: `docker_image` wins over `environment/Dockerfile`, as in
/// Harbor (a prebuilt image of the same Dockerfile).
fn task_environment(
    dir: &Path,
    env: &EnvironmentSection,
) -> Result<Option<EnvironmentSpec>, HarborError> {
    let env_dir = dir.join("environment");
    let present = match kind(&env_dir)? {
        Kind::Missing => false,
        Kind::Dir => true,
        Kind::Other(k) => {
            return Err(HarborError::Invalid {
                path: env_dir,
                message: format!("is a {k}, not a directory"),
            })
        }
    };
    if present {
        for compose in ["docker-compose.yaml", "docker-compose.yml"] {
            if kind(&env_dir.join(compose))? != Kind::Missing {
                return Err(HarborError::Compose {
                    path: env_dir.join(compose),
                });
            }
        }
    }
    if let Some(reference) = &env.docker_image {
        super::environment::check_reference(reference).map_err(|why| HarborError::Invalid {
            path: dir.join("task.toml"),
            message: format!("field `environment.docker_image`: {why}"),
        })?;
        return Ok(Some(EnvironmentSpec::Image(reference.clone())));
    }
    if !present {
        return Ok(None);
    }
    let dockerfile = env_dir.join("Dockerfile");
    match kind(&dockerfile)? {
        Kind::Other("file") => Ok(Some(EnvironmentSpec::Dockerfile {
            path: dockerfile,
            context: env_dir,
        })),
        Kind::Missing => Err(HarborError::Invalid {
            path: dockerfile,
            message: "missing: an environment/ directory holds a Dockerfile".into(),
        }),
        other => Err(HarborError::Invalid {
            path: dockerfile,
            message: format!("is a {}, not a regular file", other.name()),
        }),
    }
}

/// Harbor's resources onto the sandbox's limits.
fn limits(env: &EnvironmentSection) -> Result<Option<Limits>, String> {
    let memory = pick_mb("memory", env.memory.as_deref(), env.memory_mb)?;
    let disk = pick_mb("storage", env.storage.as_deref(), env.storage_mb)?;
    if let Some(c) = env.cpus {
        if !(c.is_finite() && c > 0.0) {
            return Err(format!(
                "field `environment.cpus`: {c} must be a positive number"
            ));
        }
    }
    let l = Limits {
        memory_mb: memory,
        pids: None,
        cpus: env.cpus,
        disk_mb: disk,
    };
    Ok((l != Limits::default()).then_some(l))
}

/// `memory`/`storage` ("2G", "512M", "1024" in MiB) or their `_mb` twin, never both.
fn pick_mb(field: &str, text: Option<&str>, mb: Option<u64>) -> Result<Option<u64>, String> {
    match (text, mb) {
        (Some(_), Some(_)) => Err(format!(
            "fields `environment.{field}` and `environment.{field}_mb`: name one"
        )),
        (None, mb) => Ok(mb),
        (Some(t), None) => parse_size_mb(t).map(Some).ok_or_else(|| {
            format!(
                "field `environment.{field}`: {:?} is not a size such as \"2G\" or \"512M\"",
                crate::terminal::escape(t)
            )
        }),
    }
}

/// A size in MiB: digits with an optional unit K, M, G or T (`i` and `B` allowed after it),
/// plain digits being MiB.
fn parse_size_mb(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit.trim_end_matches('B').trim_end_matches('I');
    let mb = match unit {
        "" | "M" => Some(n),
        "K" => Some(n.div_ceil(1024)),
        "G" => n.checked_mul(1024),
        "T" => n.checked_mul(1024 * 1024),
        _ => None,
    }?;
    (mb > 0).then_some(mb)
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Missing,
    Dir,
    Other(&'static str),
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Missing => "missing file",
            Kind::Dir => "directory",
            Kind::Other(k) => k,
        }
    }
}

/// What is at `path`, never following a symlink.
fn kind(path: &Path) -> Result<Kind, HarborError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Kind::Missing),
        Err(source) => Err(HarborError::Read {
            path: path.to_path_buf(),
            source,
        }),
        Ok(m) if m.is_dir() => Ok(Kind::Dir),
        Ok(m) if m.is_file() => Ok(Kind::Other("file")),
        Ok(m) => Ok(Kind::Other(tree::kind_of(&m.file_type()))),
    }
}

/// A regular file's UTF-8 text, bounded.
fn read_text(path: &Path) -> Result<String, HarborError> {
    let invalid = |message: String| HarborError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    match kind(path)? {
        Kind::Other("file") => {}
        Kind::Missing => return Err(invalid("missing: a Harbor task has one".into())),
        other => {
            return Err(invalid(format!(
                "is a {}, not a regular file",
                other.name()
            )))
        }
    }
    let io = |source| HarborError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, MAX_TEXT_BYTES + 1),
        &mut bytes,
    )
    .map_err(io)?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(invalid(format!("is larger than {MAX_TEXT_BYTES} bytes")));
    }
    String::from_utf8(bytes).map_err(|_| invalid("is not UTF-8 text".into()))
}

/// `dir/name/`, read whole, which must hold `entry`.
fn read_subtree(
    dir: &Path,
    name: &str,
    entry: &str,
) -> Result<BTreeMap<String, String>, HarborError> {
    let root = dir.join(name);
    match kind(&root)? {
        Kind::Dir => {}
        Kind::Missing => {
            return Err(HarborError::Invalid {
                path: root.join(entry),
                message: "missing: a Harbor task has one".into(),
            })
        }
        other => {
            return Err(HarborError::Invalid {
                path: root,
                message: format!("is a {}, not a directory", other.name()),
            })
        }
    }
    let files = tree::read_tree(&root, TREE_BOUNDS)?;
    if !files.contains_key(entry) {
        return Err(HarborError::Invalid {
            path: root.join(entry),
            message: "missing: a Harbor task has one".into(),
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests;
