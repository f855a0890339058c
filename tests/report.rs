//! `wmo-e2b report` on real runs: the summary figures, `--json` read back into the library's
//! `Report`, ATIF trajectories judged by Harbor's own models, what a crash leaves, and bad
//! input.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use wmo_e2b::analysis::Note;

mod support;

use support::{kill_runner, report, report_json, task, text, wait_for, Env, SUBMIT};

fn bash(command: &str) -> String {
    serde_json::json!({"tool_calls": [{"name": "bash", "arguments": {"command": command}}]})
        .to_string()
}

/// A real run of four tasks: two pass, one fails its verify with seven lines of output, and
/// one passes on its second attempt (its runner killed mid tool call).
fn real_run(env: &Env) {
    let tasks = env.write_tasks(&[
        task(
            "add",
            &format!(
                r#""files": {{"in.txt": "3 4"}}, "verify": "test \"$(cat out.txt)\" = 7", "model_script": [{}, {}, {SUBMIT}]"#,
                bash("cat in.txt"),
                bash("echo 7 > out.txt")
            ),
        ),
        task("plain", &format!(r#""model_script": [{SUBMIT}]"#)),
        task(
            "wrong",
            &format!(
                r#""verify": "echo checking; for i in 1 2 3 4; do echo line $i; done; echo want 7; echo got 8; exit 1", "model_script": [{}, {SUBMIT}]"#,
                bash("echo 8 > out.txt")
            ),
        ),
        task(
            "phoenix",
            &format!(
                r#""model_script": [{}, {SUBMIT}]"#,
                bash("touch started; sleep 2; echo alive")
            ),
        ),
    ]);
    let child = env
        .eval_cmd(&tasks, &["-j", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = None;
    wait_for("the tool call to start", Duration::from_secs(60), || {
        first = env.sandbox_with("started");
        first.is_some()
    });
    kill_runner(&first.unwrap());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(env.result("phoenix")["attempts"], 2);
}

#[test]
fn a_real_run_is_summed_up_and_its_trajectories_validate_with_harbor() {
    let env = Env::new();
    real_run(&env);
    let out = env.out();
    let out = out.to_str().unwrap();
    let r = report_json(&env, &[out]);
    let s = &r.summary;
    assert_eq!((s.tasks, s.judged, s.passed), (4, 4, 3));
    assert_eq!(s.pass_rate, Some(0.75));
    // 3 of 4: the Wilson 95% interval is [0.3006, 0.9544].
    let [lo, hi] = s.pass_rate_ci95.unwrap();
    assert!(
        (lo - 0.3006).abs() < 1e-4 && (hi - 0.9544).abs() < 1e-4,
        "{lo} {hi}"
    );
    assert_eq!(s.by_status["passed"], 3);
    assert_eq!(s.by_status["failed"], 1);
    assert_eq!(s.by_stop_reason["submit"], 4);
    assert_eq!(s.retried_tasks, 1);
    let records = env.results();
    let sum = |f: &dyn Fn(&Value) -> u64| records.iter().map(f).sum::<u64>();
    assert_eq!(
        s.tokens.input,
        sum(&|r| r["tokens"]["input"].as_u64().unwrap())
    );
    assert_eq!(
        s.tokens.output,
        sum(&|r| r["tokens"]["output"].as_u64().unwrap())
    );
    assert_eq!(
        s.tokens.calls,
        sum(&|r| r["tokens"]["calls"].as_u64().unwrap())
    );
    let secs: f64 = records
        .iter()
        .map(|r| r["sandbox"]["seconds"].as_f64().unwrap())
        .sum();
    assert!((s.sandbox_seconds - secs).abs() < 1e-9);
    let per_task = s.task_seconds.unwrap();
    assert!(per_task.p50 <= per_task.p90 && per_task.p90 <= per_task.max);
    assert!(s.wall_seconds.unwrap() > 0.0);
    assert_eq!(s.cost_usd, None, "no prices, no cost");
    assert_eq!(r.failures.len(), 1);
    let f = &r.failures[0];
    assert_eq!((f.id.as_str(), f.status.as_str()), ("wrong", "failed"));
    assert_eq!(f.verify_exit_code, Some(1));
    // The last five lines of seven.
    assert_eq!(
        f.verify_tail,
        ["line 2", "line 3", "line 4", "want 7", "got 8"]
    );
    assert!(r.notes.is_empty(), "{:?}", r.notes);

    // The terminal says the same.
    let o = report(&env, &[out]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("pass rate: 75.0% (3 of 4 judged; 95% CI"), "{t}");
    assert!(t.contains("status: failed 1, passed 3"), "{t}");
    assert!(t.contains("wrong  failed / submit  verify exit 1"), "{t}");
    assert!(t.contains("| got 8"), "{t}");
    assert!(t.contains("per task: p50"), "{t}");

    // Trajectories: every file judged by Harbor's models.
    let atif = env.path("atif");
    let o = report(&env, &[out, "--atif", atif.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(validate_with_harbor(&atif), 4);
    let add = read_json(&atif.join("add.json"));
    assert_eq!(add["schema_version"], "ATIF-v1.8");
    assert_eq!(add["extra"]["verdict"]["status"], "passed");
    let steps = add["steps"].as_array().unwrap();
    let user: Vec<&Value> = steps.iter().filter(|s| s["source"] == "user").collect();
    assert_eq!(user.len(), 1);
    assert!(user[0]["message"].as_str().unwrap().starts_with("do add"));
    // The first model answer's bash call, and its output tied to it by id.
    let first = steps.iter().find(|s| s["source"] == "agent").unwrap();
    let call_id = first["tool_calls"][0]["tool_call_id"].as_str().unwrap();
    assert_eq!(first["tool_calls"][0]["arguments"]["command"], "cat in.txt");
    let result = &first["observation"]["results"][0];
    assert_eq!(result["source_call_id"], call_id);
    assert_eq!(result["content"], "3 4");
    let add_record = env.result("add");
    assert_eq!(
        add["final_metrics"]["total_prompt_tokens"],
        add_record["tokens"]["input"]
    );
    assert_eq!(
        add["final_metrics"]["total_completion_tokens"],
        add_record["tokens"]["output"]
    );
    assert_eq!(
        add["final_metrics"]["total_steps"].as_u64().unwrap() as usize,
        steps.len()
    );
    // A retried task keeps its attempts apart.
    let phoenix = read_json(&atif.join("phoenix.json"));
    let attempts: std::collections::BTreeSet<u64> = phoenix["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["extra"]["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts.into_iter().collect::<Vec<_>>(), [1, 2]);
    assert_eq!(phoenix["extra"]["verdict"]["attempts"], 2);
    let wrong = read_json(&atif.join("wrong.json"));
    assert_eq!(wrong["extra"]["verdict"]["verify"]["exit_code"], 1);
}

#[test]
fn crash_leftovers_are_notes_not_errors() {
    let env = Env::new();
    let tasks = env.write_tasks(&[
        task(
            "a",
            &format!(r#""model_script": [{}, {SUBMIT}]"#, bash("echo hi")),
        ),
        task("b", &format!(r#""model_script": [{SUBMIT}]"#)),
        task("c", &format!(r#""model_script": [{SUBMIT}]"#)),
    ]);
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = env.out();
    // A crash: c's record torn mid-line (so c's transcript has no result), b's transcript
    // gone, and no summary.json written.
    let results = out.join("results.jsonl");
    let whole = std::fs::read_to_string(&results).unwrap();
    let kept: Vec<&str> = whole
        .lines()
        .filter(|l| !l.contains("\"id\":\"c\""))
        .collect();
    let c_line = whole.lines().find(|l| l.contains("\"id\":\"c\"")).unwrap();
    let torn = format!("{}\n{}", kept.join("\n"), &c_line[..c_line.len() / 2]);
    std::fs::write(&results, torn).unwrap();
    std::fs::remove_file(out.join("transcripts/b.jsonl")).unwrap();
    std::fs::remove_file(out.join("summary.json")).unwrap();

    let atif = env.path("atif");
    let dir = out.to_str().unwrap();
    let r = report_json(&env, &[dir, "--atif", atif.to_str().unwrap()]);
    assert_eq!(r.summary.tasks, 2);
    assert_eq!(r.summary.wall_seconds, None);
    let file = results.display().to_string();
    for want in [
        Note::TornLastLine {
            file: file.clone(),
            line: 3,
        },
        Note::NoTranscript {
            id: "b".into(),
            shard: dir.into(),
        },
        Note::OrphanTranscript {
            id: "c".into(),
            shard: dir.into(),
        },
        Note::NoSummary { shard: dir.into() },
    ] {
        assert!(r.notes.contains(&want), "{want:?} not in {:?}", r.notes);
    }
    assert_eq!(r.notes.len(), 4, "{:?}", r.notes);
    // The orphan's trajectory is still written, with no verdict; b has none.
    assert_eq!(validate_with_harbor(&atif), 2);
    assert_eq!(
        read_json(&atif.join("c.json"))["extra"]["verdict"],
        Value::Null
    );
    assert!(!atif.join("b.json").exists());

    let o = report(&env, &[dir]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("torn last line"), "{t}");
    assert!(t.contains("task \"b\" has no transcript"), "{t}");
}

#[test]
fn a_directory_without_results_is_bad_input() {
    let env = Env::new();
    let empty = env.path("empty");
    std::fs::create_dir_all(empty.join("shard-0-of-2")).unwrap();
    for dir in [empty, env.path("absent")] {
        let o = report(&env, &[dir.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("no results.jsonl"), "{err}");
        assert!(err.contains(dir.to_str().unwrap()), "{err}");
    }
    let o = report(&env, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// Runs `scripts/validate_atif.py` with the venv holding Harbor's models over every file in
/// `dir`; returns how many validated (all of them, or the test fails naming why).
fn validate_with_harbor(dir: &Path) -> usize {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let venv = Command::new("bash")
        .arg(root.join("scripts/atif-venv.sh"))
        .output()
        .unwrap();
    assert!(
        venv.status.success(),
        "cannot set up Harbor's ATIF models (scripts/atif-venv.sh): {}",
        text(&venv)
    );
    let python = String::from_utf8_lossy(&venv.stdout).trim().to_string();
    let o = Command::new(&python)
        .arg(root.join("scripts/validate_atif.py"))
        .arg(dir)
        .output()
        .unwrap();
    let verdict: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("the validator said: {}", text(&o)));
    assert!(
        o.status.success(),
        "Harbor rejected trajectories: {verdict}"
    );
    assert_eq!(verdict["failed"], serde_json::json!([]));
    verdict["validated"].as_u64().unwrap() as usize
}
