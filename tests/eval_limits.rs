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

/// A run inside a cgroup whose CPU quota is below a sandbox's (a container's or a batch
/// job's limit, on cgroup v1, which refuses a child's quota above its parent's): its tasks
/// run, each sandbox held by the tighter quota it inherits.
#[test]
fn a_run_under_a_tighter_cpu_quota_than_its_sandboxes_runs_its_tasks() {
    let cpu = Path::new("/sys/fs/cgroup/cpu");
    if !cpu.join("cpu.cfs_quota_us").exists() {
        eprintln!("skipped: no cgroup v1 cpu controller at {}", cpu.display());
        return;
    }
    let group = cpu.join(format!("wmo-e2b-test-quota-{}", std::process::id()));
    std::fs::create_dir(&group).unwrap();
    // Half a CPU, against a sandbox's default of 2.
    std::fs::write(group.join("cpu.cfs_period_us"), "100000").unwrap();
    std::fs::write(group.join("cpu.cfs_quota_us"), "50000").unwrap();

    let env = Env::new();
    let tasks = env.write_tasks(&[
        task(
            "a",
            &format!(r#""verify": "true", "model_script": [{SUBMIT}]"#),
        ),
        task(
            "b",
            &format!(r#""verify": "true", "model_script": [{SUBMIT}]"#),
        ),
    ]);
    let procs = group.join("cgroup.procs");
    // The shell joins the group, then becomes the run.
    let join_then_run = r#"echo $$ > "$1" && shift && exec "$@""#;
    let mut wrapped = std::process::Command::new("sh");
    wrapped
        .args(["-c", join_then_run, "sh"])
        .arg(&procs)
        .arg(env!("CARGO_BIN_EXE_wmo-e2b"))
        .args([
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "-j",
            "2",
            "--out",
        ])
        .arg(env.out())
        .env("WMO_E2B_HOME", env.home());
    let out = wrapped.output().unwrap();
    remove_cgroup_tree(&group);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let results = env.results();
    assert_eq!(results.len(), 2);
    for r in &results {
        assert_eq!(r["status"], "passed", "{r}");
    }
}

/// Removes a cgroup and the groups the run made inside it, deepest first (a cgroup directory
/// goes with `rmdir` once it has no children and no processes).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
