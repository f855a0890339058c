//! Tasks files: JSON Lines, one task per line, validated whole before any sandbox starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

mod environment;
pub mod harbor;
mod read;

pub use environment::{check_reference, EnvironmentSpec, Solution, SOLUTION_DIR};
pub use read::{load_tasks, load_tasks_where, parse_tasks, TaskEntry, TaskList, MAX_LINE_BYTES};

/// One step of a task's `model_script`: what the scripted model answers to one call.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
    /// The scripted model waits this long before answering.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// The call fails with this message instead of answering.
    #[serde(default)]
    pub error: Option<String>,
    /// Overrides the finish reason (for example "length" to test truncation).
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    pub name: String,
    /// An object, or a string holding (possibly malformed) JSON, sent as-is.
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    pub id: String,
    pub instruction: String,
    /// Workspace-relative path to content, written before `setup` runs.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    #[serde(default)]
    pub setup: Option<String>,
    #[serde(default)]
    pub verify: Option<String>,
    /// Files only the verifier sees: `/tests`-relative path to content, written once the
    /// agent is stopped, read-only to anything the agent left.
    #[serde(default)]
    pub tests: BTreeMap<String, String>,
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// How long `verify` may run (the run's `--verify-timeout` when absent).
    #[serde(default)]
    pub verify_timeout_s: Option<f64>,
    #[serde(default)]
    pub max_turns: Option<u32>,
    /// Model tokens (input + output) an attempt of the task may use (the
    /// run's `--task-max-tokens` when absent).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Dollars of model calls the task may spend; needs prices (the run's `--task-max-cost`
    /// when absent).
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    #[serde(default)]
    pub model_script: Option<Vec<ScriptStep>>,
    /// What a scripted world model answers to each tool call (`--env world-model`).
    #[serde(default)]
    pub world_script: Option<Vec<ScriptStep>>,
    /// What the task's sandbox may take; each can only narrow the run's (`eval --limit-*`).
    #[serde(default)]
    pub limits: Option<crate::sandbox::Limits>,
    /// The network the task's sandbox gets; it can only narrow the run's (`eval --network`).
    #[serde(default)]
    pub network: Option<crate::sandbox::Network>,
    /// Variables handed to `verify` only (never to the agent's commands).
    #[serde(default)]
    pub verify_env: BTreeMap<String, String>,
    /// The reference solution `--harness oracle` runs instead of an agent.
    #[serde(default)]
    pub solution: Option<Solution>,
    /// Tasks-file field `image`: read into `environment` by the parser.
    #[serde(default)]
    image: Option<String>,
    /// How long building its `dockerfile` may take (Harbor's `build_timeout_sec`); the
    /// default when absent is the image builder's.
    #[serde(default)]
    pub build_timeout_s: Option<f64>,
    /// Tasks-file field `dockerfile`, relative to the tasks file: read into `environment`.
    #[serde(default)]
    dockerfile: Option<String>,
    /// What the task runs on; `None` runs it as every task ran before images.
    #[serde(skip)]
    pub environment: Option<EnvironmentSpec>,
    /// Its 1-based line in the tasks file (provenance), set by the parser.
    #[serde(skip)]
    pub line: usize,
}

/// Bad lines named one by one; any more are only counted.
pub const MAX_BAD_LINES: usize = 20;

/// One line that cannot be run, and why (the message names the field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    pub line: usize,
    pub message: String,
}

/// A tasks file that cannot be run, named by file and line.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("cannot read tasks file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Every bad line up to [`MAX_BAD_LINES`], like a compiler, so one run finds them all.
    #[error("{}", bad_lines_text(.path, .lines, *.more))]
    Invalid {
        path: PathBuf,
        lines: Vec<BadLine>,
        /// Bad lines past the first [`MAX_BAD_LINES`].
        more: usize,
    },
    #[error("{path}: the file holds no tasks")]
    Empty { path: PathBuf },
    /// A Harbor task directory (or dataset) that cannot be run.
    #[error(transparent)]
    Harbor(#[from] harbor::HarborError),
    /// The file changed after it was checked: a task is never run from a line it was not
    /// checked on.
    #[error("{path} changed while the run was using it: line {line} no longer holds task {id:?}; do not edit a tasks file a run is reading (copy it first)")]
    Changed {
        path: PathBuf,
        line: usize,
        id: String,
    },
}

fn bad_lines_text(path: &Path, lines: &[BadLine], more: usize) -> String {
    let mut text = lines
        .iter()
        .map(|b| format!("{}:{}: {}", path.display(), b.line, b.message))
        .collect::<Vec<_>>()
        .join("\n");
    if more > 0 {
        text.push_str(&format!(
            "\n... and {more} more bad line{}",
            if more == 1 { "" } else { "s" }
        ));
    }
    text
}

/// Parses one line, naming the field at fault (serde alone says "invalid type" without
/// saying where).
fn parse_line(line: &str) -> Result<Task, String> {
    let de = &mut serde_json::Deserializer::from_str(line);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = format!(
            "{} (column {})",
            strip_position(&inner.to_string()),
            inner.column()
        );
        if path == "." || path.is_empty() {
            msg
        } else {
            format!("field `{path}`: {msg}")
        }
    })
}

fn strip_position(msg: &str) -> &str {
    msg.find(" at line ").map_or(msg, |i| &msg[..i])
}

fn validate(task: &Task) -> Result<(), String> {
    if task.id.trim().is_empty() {
        return Err("field `id`: must not be empty".into());
    }
    // An id names a transcript file and is printed on terminals: a control character or a
    // bidi control (which can make one id read as another) has no place in it.
    if task.id.len() > 200
        || task
            .id
            .chars()
            .any(|c| crate::terminal::is_unsafe(c) || c == '/' || c == '\\')
    {
        return Err(format!(
            "field `id`: {:?} must be at most 200 characters with no control characters, bidi controls or slashes (it names a transcript file)",
            task.id
        ));
    }
    if task.instruction.trim().is_empty() {
        return Err("field `instruction`: must not be empty".into());
    }
    check_file_paths("files", &task.files)?;
    check_file_paths("tests", &task.tests)?;
    if !task.tests.is_empty() && task.verify.is_none() {
        return Err("field `tests`: only a task with a `verify` command can have tests".into());
    }
    for (field, value) in [
        ("timeout_s", task.timeout_s),
        ("verify_timeout_s", task.verify_timeout_s),
        ("build_timeout_s", task.build_timeout_s),
    ] {
        if let Some(t) = value {
            if !(t.is_finite() && t > 0.0 && t <= 86_400.0) {
                return Err(format!(
                    "field `{field}`: {t} must be a number of seconds in (0, 86400]"
                ));
            }
        }
    }
    if task.max_turns == Some(0) {
        return Err("field `max_turns`: must be at least 1".into());
    }
    if task.max_tokens == Some(0) {
        return Err("field `max_tokens`: must be at least 1".into());
    }
    if let Some(usd) = task.max_cost_usd.filter(|c| !(c.is_finite() && *c > 0.0)) {
        return Err(format!(
            "field `max_cost_usd`: {usd} must be a number of dollars above 0"
        ));
    }
    environment::check_verify_env(&task.verify_env)?;
    if let Some(solution) = &task.solution {
        check_file_paths("solution.files", &solution.files)?;
        if solution.command.trim().is_empty() {
            return Err("field `solution.command`: must not be empty".into());
        }
    }
    if let Some(limits) = &task.limits {
        limits
            .check()
            .map_err(|(field, why)| format!("field `limits.{field}`: {why}"))?;
    }
    for (field, script) in [
        ("model_script", &task.model_script),
        ("world_script", &task.world_script),
    ] {
        let Some(script) = script else { continue };
        for (i, step) in script.iter().enumerate() {
            for call in &step.tool_calls {
                if call.name.is_empty() {
                    return Err(format!(
                        "field `{field}[{i}].tool_calls`: a tool call has an empty name"
                    ));
                }
                if !(call.arguments.is_object() || call.arguments.is_string()) {
                    return Err(format!(
                        "field `{field}[{i}].tool_calls`: arguments of {:?} must be an object or a JSON string",
                        call.name
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Refuses paths that escape the workspace, and paths that could not all be written: two
/// keys naming one file (`a`, `./a`), or a file that another key needs as a directory (`a`,
/// `a/b`). Caught here, they would fail mid-run on a sandbox that did nothing wrong.
fn check_file_paths(field: &str, files: &BTreeMap<String, String>) -> Result<(), String> {
    let mut named: BTreeMap<String, &str> = BTreeMap::new();
    for key in files.keys() {
        let norm = crate::sandbox::normalize_relative(key)
            .map_err(|reason| format!("field `{field}`: path {key:?} is not allowed: {reason}"))?;
        if let Some(first) = named.get(&norm) {
            return Err(format!(
                "field `{field}`: {first:?} and {key:?} name the same file"
            ));
        }
        named.insert(norm, key);
    }
    for (norm, key) in &named {
        let mut parent = norm.as_str();
        while let Some(cut) = parent.rfind('/') {
            parent = &parent[..cut];
            if let Some(file) = named.get(parent) {
                return Err(format!(
                    "field `{field}`: {file:?} is a file, so it cannot also be the directory holding {key:?}"
                ));
            }
        }
    }
    Ok(())
}

/// The directory shard `index` of `count` writes under a run's shared `--out`:
/// `shard-I-of-N` (what `report` finds and merges).
pub fn shard_dir_name(index: u32, count: u32) -> String {
    format!("shard-{index}-of-{count}")
}

/// `(I, N)` of a `shard-I-of-N` directory name: plain decimal digits, N at least 1.
pub fn parse_shard_dir_name(name: &str) -> Option<(u32, u32)> {
    let (i, n) = name.strip_prefix("shard-")?.split_once("-of-")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(i) || !digits(n) {
        return None;
    }
    let (i, n) = (i.parse().ok()?, n.parse().ok()?);
    (n > 0).then_some((i, n))
}

/// A stable shard for `--shard I/N`: FNV-1a of the id, so every host agrees without
/// coordination and the split does not change between Rust versions.
pub fn shard_of(id: &str, shards: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(shards.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<Task>, TaskError> {
        parse_tasks(Path::new("t.jsonl"), text)
    }

    #[test]
    fn shard_directories_are_named_i_of_n() {
        assert_eq!(shard_dir_name(3, 4), "shard-3-of-4");
        assert_eq!(parse_shard_dir_name("shard-3-of-4"), Some((3, 4)));
        for other in [
            "shard-3-of-",
            "shard-x-of-4",
            "shard-3-4",
            "results.jsonl",
            "shard-1-of-4x",
            "shard-+1-of-4",
            "shard-1-of-0",
        ] {
            assert_eq!(parse_shard_dir_name(other), None, "{other}");
        }
    }

    #[test]
    fn parses_full_task() {
        let t = parse(
            r#"{"id":"a","instruction":"do","files":{"in.txt":"3"},"verify":"true","model_script":[{"tool_calls":[{"name":"submit","arguments":{"answer":"x"}}]}]}"#,
        )
        .unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(
            t[0].model_script.as_ref().unwrap()[0].tool_calls[0].name,
            "submit"
        );
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = parse("{\"id\":\"a\",\"instruction\":\"x\"}\n\n{\"instruction\":\"y\"}")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.jsonl:3:"), "{e}");
        assert!(e.contains("`id`"), "{e}");

        let e = parse("{\"id\":\"a\",\"instruction\":\"x\"}\n{\"id\":\"a\",\"instruction\":\"y\"}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.jsonl:2:") && e.contains("duplicate"), "{e}");

        let e = parse("{not json").unwrap_err().to_string();
        assert!(e.starts_with("t.jsonl:1:"), "{e}");

        let e = parse(r#"{"id":"a","instruction":"x","files":{"../x":""}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`files`") && e.contains(".."), "{e}");

        let e = parse(r#"{"id":"a","instruction":"x","timeout_s":-1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`timeout_s`"), "{e}");

        let e = parse(r#"{"id":"a","instruction":"x","verify_timeout_s":0}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`verify_timeout_s`"), "{e}");

        let e = parse(r#"{"id":"a","instruction":"x","bogus":1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");

        assert!(matches!(parse("\n\n"), Err(TaskError::Empty { .. })));
    }

    #[test]
    fn ids_with_control_or_bidi_characters_are_refused_naming_line_and_field() {
        // JSON escapes, as an attacker would write them: ESC, C1 NEL, DEL, a right-to-left
        // override, an isolate and the three marks.
        for bad in [
            r"\u001b[2J",
            r"\u0085",
            r"\u007f",
            r"x\u202etxt",
            r"\u2066a",
            r"\u200e",
            r"\u200f",
            r"\u061c",
        ] {
            let text = format!(
                "{{\"id\":\"ok\",\"instruction\":\"x\"}}\n{{\"id\":\"{bad}\",\"instruction\":\"x\"}}"
            );
            let e = parse(&text).unwrap_err().to_string();
            assert!(
                e.starts_with("t.jsonl:2:") && e.contains("`id`"),
                "{bad}: {e}"
            );
            assert!(
                !e.chars().any(crate::terminal::is_unsafe),
                "{bad}: the message shows the id escaped: {e:?}"
            );
        }
        // Other non-ASCII text stays a valid id.
        assert!(parse(r#"{"id":"café-日本","instruction":"x"}"#).is_ok());
    }

    #[test]
    fn file_paths_that_cannot_all_be_written_are_refused() {
        let with_files = |files: &str| {
            parse(&format!(
                r#"{{"id":"a","instruction":"x","files":{files}}}"#
            ))
        };
        for (files, needle) in [
            (r#"{"a":"1","a/b":"2"}"#, "directory"),
            (r#"{"x/a":"1","x/a/b/c":"2"}"#, "directory"),
            (r#"{"a":"1","./a":"2"}"#, "same file"),
            (r#"{"d//a":"1","d/a":"2"}"#, "same file"),
        ] {
            let e = with_files(files).unwrap_err().to_string();
            assert!(e.starts_with("t.jsonl:1:"), "{files}: {e}");
            assert!(e.contains("`files`") && e.contains(needle), "{files}: {e}");
        }
        // Siblings and a shared parent directory are fine.
        assert!(with_files(r#"{"a/b":"1","a/c":"2","ab":"3","a.txt":"4"}"#).is_ok());
    }

    #[test]
    fn every_bad_line_is_reported_up_to_a_bound() {
        let good = |id: &str| format!(r#"{{"id":"{id}","instruction":"x"}}"#);
        let mut lines = vec![good("a"), "{oops".to_string(), good("a")];
        lines.push(r#"{"id":"b","instruction":"x","timeout_s":-1}"#.into());
        let e = parse(&lines.join("\n")).unwrap_err().to_string();
        let reported: Vec<&str> = e.lines().collect();
        assert_eq!(reported.len(), 3, "{e}");
        assert!(reported[0].starts_with("t.jsonl:2:"), "{e}");
        assert!(
            reported[1].starts_with("t.jsonl:3:") && reported[1].contains("duplicate"),
            "{e}"
        );
        assert!(
            reported[2].starts_with("t.jsonl:4:") && reported[2].contains("`timeout_s`"),
            "{e}"
        );

        let many: Vec<String> = (0..25).map(|_| "{oops".to_string()).collect();
        let e = parse(&many.join("\n")).unwrap_err().to_string();
        let reported: Vec<&str> = e.lines().collect();
        assert_eq!(reported.len(), MAX_BAD_LINES + 1, "{e}");
        assert!(reported[19].starts_with("t.jsonl:20:"), "{e}");
        assert_eq!(reported[20], "... and 5 more bad lines", "{e}");
    }

    #[test]
    fn a_line_names_one_environment_read_relative_to_the_tasks_file() {
        let t = parse_tasks(
            Path::new("sets/t.jsonl"),
            concat!(
                r#"{"id":"i","instruction":"x","image":"alpine:3.20"}"#,
                "\n",
                r#"{"id":"d","instruction":"x","dockerfile":"envs/a/Dockerfile"}"#,
                "\n",
                r#"{"id":"n","instruction":"x","verify_env":{"K":"v"},"solution":{"command":"true"}}"#,
            ),
        )
        .unwrap();
        assert_eq!(
            t[0].environment,
            Some(EnvironmentSpec::Image("alpine:3.20".into()))
        );
        assert_eq!(
            t[1].environment,
            Some(EnvironmentSpec::Dockerfile {
                path: "sets/envs/a/Dockerfile".into(),
                context: "sets/envs/a".into(),
            })
        );
        assert_eq!(t[2].environment, None);
        assert_eq!(t[2].verify_env["K"], "v");

        for (line, field) in [
            (
                r#"{"id":"b","instruction":"x","image":"a","dockerfile":"Dockerfile"}"#,
                "`image` and `dockerfile`",
            ),
            (r#"{"id":"b","instruction":"x","image":"a b"}"#, "`image`"),
            (
                r#"{"id":"b","instruction":"x","dockerfile":"../Dockerfile"}"#,
                "`dockerfile`",
            ),
            (
                r#"{"id":"b","instruction":"x","solution":{"files":{"../x":""},"command":"true"}}"#,
                "`solution.files`",
            ),
            (
                r#"{"id":"b","instruction":"x","solution":{"command":" "}}"#,
                "`solution.command`",
            ),
            (
                r#"{"id":"b","instruction":"x","verify_env":{"PATH":"/x"}}"#,
                "`verify_env`",
            ),
        ] {
            let e = parse(&format!("{{\"id\":\"ok\",\"instruction\":\"x\"}}\n{line}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("t.jsonl:2:") && e.contains(field),
                "{line}: {e}"
            );
        }
    }

    #[test]
    fn shards_are_stable_and_cover_everything() {
        assert_eq!(shard_of("add", 4), shard_of("add", 4));
        let ids: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
        let counts = (0..4)
            .map(|s| ids.iter().filter(|id| shard_of(id, 4) == s).count())
            .collect::<Vec<_>>();
        assert_eq!(counts.iter().sum::<usize>(), 100);
        assert!(counts.iter().all(|&c| c > 10), "{counts:?}");
    }
}
