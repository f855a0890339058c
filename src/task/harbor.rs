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

use super::environment::{EnvironmentSpec, Solution, SOLUTION_DIR};
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
/// The command that verifies a Harbor task, as Harbor runs it.
pub const HARBOR_VERIFY: &str = "bash /tests/test.sh";

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
        solution: solution.map(|files| Solution {
            files,
            command: format!("bash {SOLUTION_DIR}/solve.sh"),
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
mod tests {
    use super::*;

    fn fixture(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/harbor")
            .join(rel)
    }

    /// A minimal valid task at `dir/id`.
    fn write_task(dir: &Path, id: &str) -> PathBuf {
        let t = dir.join(id);
        std::fs::create_dir_all(t.join("tests")).unwrap();
        std::fs::write(t.join("task.toml"), "version = \"1.0\"\n").unwrap();
        std::fs::write(t.join("instruction.md"), "do it\n").unwrap();
        std::fs::write(t.join("tests/test.sh"), "exit 0\n").unwrap();
        t
    }

    #[test]
    fn a_dataset_reads_into_tasks_sorted_by_name() {
        let (tasks, digest) = load_dataset(&fixture("dataset")).unwrap();
        let ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["hello-file", "sum-numbers", "verifier-env"]);
        assert!(digest.starts_with("sha256:"), "{digest}");
        let hello = &tasks[0];
        assert_eq!(hello.timeout_s, Some(120.0));
        assert_eq!(hello.verify_timeout_s, Some(60.0));
        assert_eq!(hello.verify.as_deref(), Some(HARBOR_VERIFY));
        assert!(hello.tests.contains_key("test.sh"));
        assert_eq!(hello.metadata["difficulty"], "easy");
        assert_eq!(hello.metadata["tags"][1], "fixture");
        assert_eq!(hello.network, Some(Network::None));
        let limits = hello.limits.unwrap();
        assert_eq!(
            (limits.cpus, limits.memory_mb, limits.disk_mb),
            (Some(1.0), Some(1024), Some(512))
        );
        assert_eq!(hello.environment, None);
        let sum = &tasks[1];
        let solution = sum.solution.as_ref().unwrap();
        assert!(solution.files.contains_key("sum.awk"));
        assert_eq!(solution.command, format!("bash {SOLUTION_DIR}/solve.sh"));
        assert_eq!(sum.network, None);
        assert_eq!(tasks[2].verify_env["EXPECTED_ANSWER"], "42");

        // One task is a dataset of one; a change to any file is a change of digest.
        let (one, one_digest) = load_dataset(&fixture("dataset/hello-file")).unwrap();
        assert_eq!(one.len(), 1);
        assert_ne!(one_digest, digest);
    }

    #[test]
    fn an_environment_directory_is_the_dockerfile_and_its_context() {
        let dir = fixture("with-dockerfile");
        let (tasks, _) = load_dataset(&dir).unwrap();
        assert_eq!(
            tasks[0].environment,
            Some(EnvironmentSpec::Dockerfile {
                path: dir.join("environment/Dockerfile"),
                context: dir.join("environment"),
            })
        );
        let limits = tasks[0].limits.unwrap();
        assert_eq!((limits.memory_mb, limits.disk_mb), (Some(2048), Some(4096)));

        // `docker_image` names a prebuilt image of it, and wins.
        let tmp = tempfile::tempdir().unwrap();
        let t = write_task(tmp.path(), "prebuilt");
        std::fs::create_dir(t.join("environment")).unwrap();
        std::fs::write(t.join("environment/Dockerfile"), "FROM x\n").unwrap();
        std::fs::write(
            t.join("task.toml"),
            "[environment]\ndocker_image = \"registry.example/app@sha256:ab\"\n",
        )
        .unwrap();
        let (tasks, _) = load_dataset(&t).unwrap();
        assert_eq!(
            tasks[0].environment,
            Some(EnvironmentSpec::Image(
                "registry.example/app@sha256:ab".into()
            ))
        );
    }

    /// Each way a task directory can be wrong, refused naming the file and the field.
    #[test]
    fn a_bad_task_directory_is_refused_by_file_and_field() {
        type Break = fn(&Path);
        let cases: [(&str, Break, &str, &str); 14] = [
            (
                "unknown key",
                |t| append(t, "task.toml", "colour = \"red\"\n"),
                "task.toml",
                "colour",
            ),
            (
                "unknown section key",
                |t| append(t, "task.toml", "[agent]\nuser = \"x\"\n"),
                "task.toml",
                "agent",
            ),
            (
                "wrong type",
                |t| append(t, "task.toml", "[agent]\ntimeout_sec = \"soon\"\n"),
                "task.toml",
                "agent.timeout_sec",
            ),
            (
                "bad timeout",
                |t| append(t, "task.toml", "[verifier]\ntimeout_sec = -1\n"),
                "task.toml",
                "verifier.timeout_sec",
            ),
            (
                "bad memory",
                |t| append(t, "task.toml", "[environment]\nmemory = \"lots\"\n"),
                "task.toml",
                "environment.memory",
            ),
            (
                "both memories",
                |t| {
                    append(
                        t,
                        "task.toml",
                        "[environment]\nmemory = \"1G\"\nmemory_mb = 1\n",
                    )
                },
                "task.toml",
                "memory_mb",
            ),
            (
                "bad env name",
                |t| append(t, "task.toml", "[verifier.env]\nLD_PRELOAD = \"x\"\n"),
                "task.toml",
                "verify_env",
            ),
            (
                "no instruction",
                |t| remove(t, "instruction.md"),
                "instruction.md",
                "missing",
            ),
            (
                "no test.sh",
                |t| remove(t, "tests/test.sh"),
                "test.sh",
                "missing",
            ),
            (
                "no solve.sh",
                |t| std::fs::create_dir(t.join("solution")).unwrap(),
                "solve.sh",
                "missing",
            ),
            (
                "symlinked instruction",
                |t| {
                    remove(t, "instruction.md");
                    std::os::unix::fs::symlink("/etc/passwd", t.join("instruction.md")).unwrap();
                },
                "instruction.md",
                "symlink",
            ),
            (
                "binary instruction",
                |t| std::fs::write(t.join("instruction.md"), b"\xff\xfe").unwrap(),
                "instruction.md",
                "UTF-8",
            ),
            (
                "compose",
                |t| {
                    std::fs::create_dir(t.join("environment")).unwrap();
                    std::fs::write(t.join("environment/docker-compose.yaml"), "services: {}\n")
                        .unwrap();
                },
                "docker-compose.yaml",
                "sidecar services are not supported",
            ),
            (
                "symlinked test",
                |t| std::os::unix::fs::symlink("/etc/shadow", t.join("tests/secret")).unwrap(),
                "secret",
                "symlink",
            ),
        ];
        for (what, break_it, file, needle) in cases {
            let tmp = tempfile::tempdir().unwrap();
            let t = write_task(tmp.path(), "broken");
            load_dataset(&t).unwrap_or_else(|e| panic!("{what}: the valid task fails: {e}"));
            break_it(&t);
            let e = load_dataset(&t).expect_err(what).to_string();
            assert!(e.contains(file) && e.contains(needle), "{what}: {e}");
            assert!(
                e.contains("broken"),
                "{what}: names the task's directory: {e}"
            );
        }
    }

    #[test]
    fn trees_past_their_bounds_and_datasets_of_nothing_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let t = write_task(tmp.path(), "many");
        for i in 0..=TREE_BOUNDS.max_files {
            std::fs::write(t.join(format!("tests/f{i}")), "x").unwrap();
        }
        let e = load_dataset(&t).unwrap_err();
        assert!(
            matches!(e, HarborError::Tree(TreeError::TooManyFiles { .. })),
            "{e}"
        );

        let t = write_task(tmp.path(), "big");
        let file = std::fs::File::create(t.join("tests/big")).unwrap();
        file.set_len(TREE_BOUNDS.max_bytes + 1).unwrap();
        let e = load_dataset(&t).unwrap_err();
        assert!(
            matches!(e, HarborError::Tree(TreeError::TooManyBytes { .. })),
            "{e}"
        );

        let empty = tempfile::tempdir().unwrap();
        std::fs::create_dir(empty.path().join("not-a-task")).unwrap();
        let e = load_dataset(empty.path()).unwrap_err();
        assert!(matches!(e, HarborError::NotATask { .. }), "{e}");

        // A symlinked task would be read from wherever it points.
        let ds = tempfile::tempdir().unwrap();
        write_task(ds.path(), "real");
        std::os::unix::fs::symlink(t, ds.path().join("linked")).unwrap();
        let e = load_dataset(ds.path()).unwrap_err().to_string();
        assert!(e.contains("linked") && e.contains("symlink"), "{e}");
    }

    fn append(t: &Path, file: &str, text: &str) {
        let mut all = std::fs::read_to_string(t.join(file)).unwrap();
        all.push_str(text);
        std::fs::write(t.join(file), all).unwrap();
    }

    fn remove(t: &Path, file: &str) {
        std::fs::remove_file(t.join(file)).unwrap();
    }

    #[test]
    fn sizes_read_as_harbor_writes_them() {
        assert_eq!(parse_size_mb("2G"), Some(2048));
        assert_eq!(parse_size_mb("512M"), Some(512));
        assert_eq!(parse_size_mb("4Gi"), Some(4096));
        assert_eq!(parse_size_mb("1024"), Some(1024));
        assert_eq!(parse_size_mb("2048K"), Some(2));
        for bad in ["", "G", "-1G", "2X", "0", "99999999999999999999T"] {
            assert_eq!(parse_size_mb(bad), None, "{bad}");
        }
    }
}
