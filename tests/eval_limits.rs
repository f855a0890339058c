//! Limits per sandbox, attacked end to end: a fork bomb, a memory hog (in a process and in
//! /dev/shm) and a disk filler each end their task as the agent's failure with the limit as
//! its stop reason, the run goes on, and no cgroup of theirs is left behind.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod support;

use support::{task, text, Env, SUBMIT};

/// A task whose agent runs `command` once, then submits.
fn attack(id: &str, limits: &str, command: &str) -> String {
    let call =
        serde_json::json!({"tool_calls": [{"name": "bash", "arguments": {"command": command}}]});
    task(
        id,
        &format!(r#""limits": {limits}, "verify": "true", "model_script": [{call}, {SUBMIT}]"#),
    )
}

/// Directories named `name` under the cgroup mounts, to a bounded depth.
fn cgroup_dirs_named(name: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, name: &str, depth: usize, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name() == name {
                found.push(e.path());
            } else if depth > 0 {
                walk(&e.path(), name, depth - 1, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(Path::new("/sys/fs/cgroup"), name, 8, &mut found);
    found
}

fn sandbox_id(r: &Value) -> String {
    r["sandbox"]["id"].as_str().unwrap_or_default().to_string()
}

#[test]
fn each_limit_ends_its_task_as_a_failure_and_leaves_no_cgroup() {
    let env = Env::new();
    let tasks = env.write_tasks(&[
        attack("bomb", r#"{"pids": 64}"#, ":(){ :|:& };:"),
        attack(
            "hog",
            r#"{"memory_mb": 192}"#,
            "perl -e '$x = \"a\" x (1024 * 1024 * 1024); print length $x'",
        ),
        attack(
            "shm",
            r#"{"memory_mb": 192}"#,
            "head -c 1024M /dev/zero > /dev/shm/fill; ls -l /dev/shm",
        ),
        attack(
            "filler",
            r#"{"disk_mb": 16}"#,
            "head -c 64M /dev/zero > fill; sync",
        ),
        // The run goes on: a task after them passes.
        task("fine", &format!(r#""model_script": [{SUBMIT}]"#)),
    ]);
    let o = env.eval(&tasks, &["-j", "2", "--no-reuse"]);
    let out = text(&o);
    let results = env.results();
    assert_eq!(results.len(), 5, "{out}");
    assert_eq!(env.result("fine")["status"], "passed", "{out}");
    let filler = env.result("filler");
    assert_eq!(filler["status"], "failed", "{filler}");
    assert_eq!(filler["stop_reason"], "disk", "{filler}");
    if out.contains("sandboxes run without limits") {
        eprintln!("skipped the cgroup limits: {out}");
        return;
    }
    for (id, reason) in [("bomb", "pids"), ("hog", "oom"), ("shm", "oom")] {
        let r = env.result(id);
        assert_eq!(r["status"], "failed", "{id}: {r}");
        assert_eq!(r["stop_reason"], reason, "{id}: {r}");
    }
    for r in &results {
        let id = sandbox_id(r);
        assert!(!id.is_empty(), "{r}");
        let left = cgroup_dirs_named(&id);
        assert!(left.is_empty(), "cgroups of {id} left: {left:?}");
    }
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
}

#[test]
fn a_task_limit_out_of_range_names_its_line_and_field() {
    let env = Env::new();
    let tasks = env.write_tasks(&[
        task("ok", &format!(r#""model_script": [{SUBMIT}]"#)),
        task("bad", r#""limits": {"pids": 0}"#),
    ]);
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tasks.jsonl:2: field `limits.pids`"), "{err}");
    let o = env.eval(&tasks, &["--limit-cpus=-1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--limit-cpus"), "{}", text(&o));
}
