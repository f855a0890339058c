//! Harbor task directories run as they are, on the local backend: a dataset passes under
//! `--harness oracle` and fails under `--harness nop`; the verifier's reward decides, read
//! strictly (an agent's attempt to leave one for it is among `support::attacks`).

mod support;

use std::path::{Path, PathBuf};

use serde_json::json;
use support::{text, Env};

fn dataset() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/harbor/dataset")
}

#[test]
fn a_dataset_passes_under_oracle_and_fails_under_nop() {
    let env = Env::new();
    let o = env.eval(&dataset(), &["--harness", "oracle", "-j", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let results = env.results();
    assert_eq!(results.len(), 3, "{results:?}");
    for r in &results {
        assert_eq!(r["status"], "passed", "{r}");
        assert_eq!(r["provenance"]["harness"], "oracle", "{r}");
    }
    assert_eq!(env.result("hello-file")["reward"], 1.0);
    // The env task passes only when its variable reached the verifier and not the agent.
    assert_eq!(env.result("verifier-env")["reward"], 1.0);
    assert_eq!(
        env.result("sum-numbers")["reward"],
        json!({"exact": 1.0, "present": 1.0, "reward": 1.0})
    );

    let env = Env::new();
    let o = env.eval(&dataset(), &["--harness", "nop", "-j", "2"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let results = env.results();
    assert_eq!(results.len(), 3, "{results:?}");
    for r in &results {
        assert_eq!(r["status"], "failed", "{r}");
        assert_eq!(r["stop_reason"], "submit", "{r}");
        assert_eq!(r["turns"], 1, "{r}");
    }
    assert_eq!(env.result("hello-file")["reward"], 0.0);
    assert!(env.live_sandboxes().is_empty());
}

/// `report` says a dataset is healthy when its oracle run passes every task and its nop run
/// none, and names the tasks that break that.
#[test]
fn report_judges_a_dataset_by_its_oracle_and_nop_runs() {
    let health = |tasks: &Path| -> serde_json::Value {
        let (oracle, nop) = (Env::new(), Env::new());
        oracle.eval(tasks, &["--harness", "oracle"]);
        nop.eval(tasks, &["--harness", "nop"]);
        let (o, n) = (oracle.out(), nop.out());
        let args = [
            n.to_str().unwrap(),
            "--compare",
            o.to_str().unwrap(),
            "--json",
        ];
        let out = nop.run(&["report", args[0], args[1], args[2], args[3]]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let text_out = nop.run(&["report", args[0], args[1], args[2]]);
        let said = String::from_utf8_lossy(&text_out.stdout).into_owned();
        let mut report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["dataset"]["text"] = json!(said);
        report["dataset"].clone()
    };
    let healthy = health(&dataset());
    assert_eq!(healthy["healthy"], true, "{healthy}");
    assert_eq!(healthy["tasks"], 3);
    assert_eq!(healthy["oracle_passed"], 3);
    assert!(healthy["text"]
        .as_str()
        .unwrap()
        .contains("dataset: healthy"));

    let env = Env::new();
    let solved = |id: &str, verify: &str| {
        json!({
            "id": id, "instruction": "x", "verify": verify,
            "solution": {"files": {}, "command": "touch out.txt"},
        })
        .to_string()
    };
    let tasks = env.write_tasks(&[
        solved("sound", "test -f out.txt"),
        // Passes whatever the agent does.
        solved("always", "true"),
        // Its solution does not solve it.
        solved("unsolved", "test -f other.txt"),
    ]);
    let broken = health(&tasks);
    assert_eq!(broken["healthy"], false, "{broken}");
    assert_eq!(broken["tasks"], 3);
    assert_eq!(broken["nop_passing"], json!(["always"]));
    assert_eq!(broken["oracle_failing"], json!(["unsolved"]));
    assert!(broken["text"].as_str().unwrap().contains("NOT healthy"));
}

/// A task whose verify writes `reward`, as `file` under `/logs/verifier`.
fn rewarded(id: &str, file: &str, reward: &str) -> String {
    json!({
        "id": id,
        "instruction": "x",
        "model_script": [{"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}],
        "tests": {"reward": reward},
        "verify": format!("cp /tests/reward /logs/verifier/{file}"),
    })
    .to_string()
}

#[test]
fn the_reward_decides_against_the_threshold_and_a_malformed_one_fails() {
    let tasks = [
        rewarded("half", "reward.txt", "0.5\n"),
        rewarded("full", "reward.txt", "1"),
        rewarded("metrics", "reward.json", r#"{"a": 1.0, "b": 0.5}"#),
        rewarded("keyed", "reward.json", r#"{"reward": 0.5, "b": 0.0}"#),
        rewarded("garbage", "reward.txt", "passed!"),
        rewarded("nan", "reward.txt", "NaN"),
        rewarded("not-metrics", "reward.json", r#"["1"]"#),
        rewarded("huge", "reward.txt", &"1".repeat(70_000)),
    ];
    let verdicts = |threshold: Option<&str>| {
        let env = Env::new();
        let path = env.write_tasks(&tasks);
        let mut extra = vec!["-j", "2"];
        if let Some(x) = threshold {
            extra.extend(["--pass-threshold", x]);
        }
        let o = env.eval(&path, &extra);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        env
    };
    let env = verdicts(None);
    let status = |env: &Env, id: &str| env.result(id)["status"].as_str().unwrap().to_string();
    assert_eq!(status(&env, "full"), "passed");
    assert_eq!(env.result("half")["reward"], 0.5);
    for id in ["half", "metrics", "keyed"] {
        assert_eq!(status(&env, id), "failed", "{id}");
    }
    assert_eq!(env.result("metrics")["reward"], json!({"a": 1.0, "b": 0.5}));
    // Malformed: failed with the reason, never a pass, never a crash; verify itself exited 0.
    for id in ["garbage", "nan", "not-metrics", "huge"] {
        let r = env.result(id);
        assert_eq!(r["status"], "failed", "{r}");
        assert_eq!(r["verify"]["exit_code"], 0, "{r}");
        assert!(r.get("reward").is_none(), "{r}");
        let error = r["error"].as_str().unwrap_or_default();
        assert!(error.contains("malformed reward"), "{id}: {r}");
    }

    let env = verdicts(Some("0.5"));
    for id in ["half", "full", "metrics", "keyed"] {
        assert_eq!(status(&env, id), "passed", "{id}");
    }
    assert_eq!(status(&env, "garbage"), "failed");
}

#[test]
fn an_oracle_task_without_a_solution_is_an_error_naming_why() {
    let env = Env::new();
    let path = env.write_tasks(&[
        json!({"id": "none", "instruction": "x", "verify": "true"}).to_string(),
        json!({
            "id": "own",
            "instruction": "x",
            "solution": {"files": {"answer": "7\n"}, "command": "cp /tmp/solution/answer out.txt"},
            "verify": "test \"$(cat out.txt)\" = 7",
        })
        .to_string(),
    ]);
    let o = env.eval(&path, &["--harness", "oracle"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("none");
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("no reference solution"),
        "{r}"
    );
    assert_eq!(env.result("own")["status"], "passed");

    let o = env.eval(&path, &["--harness", "nop", "--model", "gpt-x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("asks no model"), "{}", text(&o));
}

/// Refused before anything starts: no output directory, no sandbox.
fn refused(env: &Env, tasks: &Path, extra: &[&str]) -> String {
    let o = env.eval(tasks, extra);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!env.out().exists(), "the run started: {}", text(&o));
    assert!(env.live_sandboxes().is_empty());
    text(&o)
}

#[test]
fn a_task_naming_both_an_image_and_a_dockerfile_is_refused() {
    let env = Env::new();
    let path = env.write_tasks(&[json!({
        "id": "both", "instruction": "x", "image": "a", "dockerfile": "Dockerfile"
    })
    .to_string()]);
    let e = refused(&env, &path, &[]);
    assert!(
        e.contains(":1:") && e.contains("`image` and `dockerfile`"),
        "{e}"
    );
}

#[test]
fn a_bad_task_directory_is_refused_before_anything_starts() {
    let env = Env::new();
    let bad = env.path("dataset");
    let copy = |from: &Path, to: &Path| {
        let o = std::process::Command::new("cp")
            .arg("-r")
            .arg(from)
            .arg(to)
            .output()
            .unwrap();
        assert!(o.status.success());
    };
    copy(&dataset(), &bad);
    std::fs::write(
        bad.join("sum-numbers/task.toml"),
        "[agent]\ntimeout_sec = \"ten\"\n",
    )
    .unwrap();
    let e = refused(&env, &bad, &["--harness", "oracle"]);
    assert!(
        e.contains("sum-numbers/task.toml") && e.contains("agent.timeout_sec"),
        "{e}"
    );
}
