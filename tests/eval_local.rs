//! `wmo-e2b eval` end to end on the local backend: the real binary, the real Node runner, the
//! scripted model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write_tasks(&self, lines: &[String]) -> PathBuf {
        let p = self.path("tasks.jsonl");
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_wmo-e2b"));
        c.args(args)
            .env("WMO_E2B_HOME", self.home())
            .current_dir(self.dir.path());
        c
    }

    fn eval(&self, tasks: &Path, extra: &[&str]) -> Output {
        let out = self.out();
        let mut args = vec![
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        self.cmd(&args).output().unwrap()
    }

    fn results(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.out().join("results.jsonl")).unwrap_or_default();
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn result(&self, id: &str) -> Value {
        self.results()
            .into_iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no result for {id}"))
    }

    /// The directory of a live sandbox whose workspace holds `name`: the host sees what a
    /// confined sandbox writes only through the state directory.
    fn sandbox_with(&self, name: &str) -> Option<PathBuf> {
        std::fs::read_dir(self.home().join("sandboxes"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|d| d.join("root/workspace").join(name).exists())
    }

    /// SIGKILLs the runner of a sandbox behind the tool's back: its process group, found in
    /// the sandbox's process records.
    fn kill_runner(&self, sandbox: &Path) {
        for rec in std::fs::read_dir(sandbox.join("procs")).unwrap().flatten() {
            let text = std::fs::read_to_string(rec.path()).unwrap_or_default();
            if text.contains("runner.mjs") {
                let pid = rec.file_name().to_string_lossy().into_owned();
                let _ = Command::new("kill")
                    .args(["-9", "--", &format!("-{pid}")])
                    .status();
            }
        }
    }

    /// Sandboxes the local backend still holds.
    fn live_sandboxes(&self) -> Vec<String> {
        let dir = self.home().join("sandboxes");
        match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

fn task(id: &str, extra: &str) -> String {
    let body = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    format!(r#"{{"id": "{id}", "instruction": "do {id}"{body}}}"#)
}

const SUBMIT: &str = r#"{"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}"#;

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn example_tasks_all_pass_and_leave_nothing_behind() {
    let env = Env::new();
    let tasks = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tasks.jsonl");
    let o = env.eval(&tasks, &["-j", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let results = env.results();
    assert_eq!(results.len(), 5, "{}", text(&o));
    for r in &results {
        assert_eq!(r["status"], "passed", "{r}");
        for field in [
            "id",
            "stop_reason",
            "answer",
            "verify",
            "turns",
            "tool_calls",
            "tokens",
            "sandbox",
            "timings",
            "attempts",
            "error",
        ] {
            assert!(r.get(field).is_some(), "missing {field} in {r}");
        }
        assert!(r["tokens"]["calls"].as_u64().unwrap() >= 1);
        let id = r["id"].as_str().unwrap();
        assert!(env.out().join(format!("transcripts/{id}.jsonl")).exists());
    }
    let add = env.result("add");
    assert_eq!(add["stop_reason"], "submit");
    assert_eq!(add["answer"], "7");
    assert_eq!(add["verify"]["exit_code"], 0);
    assert_eq!(add["turns"], 3);
    assert_eq!(add["tool_calls"], 2);
    let two = env.result("two-calls-one-turn");
    assert_eq!(two["tool_calls"], 2);
    assert_eq!(two["turns"], 2);
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(env.out().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["passed"], 5);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("5 tasks: 5 passed"), "{stdout}");
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
}

#[test]
fn transcript_records_every_frame_in_order() {
    let env = Env::new();
    let tasks = env.write_tasks(&[task(
        "t",
        &format!(
            r#""model_script": [{{"tool_calls": [{{"name": "bash", "arguments": {{"command": "echo hi"}}}}]}}, {SUBMIT}]"#
        ),
    )]);
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let lines: Vec<Value> = std::fs::read_to_string(env.out().join("transcripts/t.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<String> = lines
        .iter()
        .filter_map(|l| l["frame"]["type"].as_str().map(String::from))
        .collect();
    assert_eq!(
        kinds,
        [
            "episode_start",
            "llm_request",
            "llm_response",
            "tool_request",
            "tool_response",
            "llm_request",
            "llm_response",
            "done"
        ],
        "{lines:?}"
    );
    let tool_response = lines
        .iter()
        .find(|l| l["frame"]["type"] == "tool_response")
        .unwrap();
    assert_eq!(tool_response["frame"]["content"], "hi\n");
    assert_eq!(tool_response["frame"]["is_error"], false);
}

#[test]
fn stop_reasons_follow_the_episode() {
    let env = Env::new();
    let bash = r#"{"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}"#;
    let tasks = env.write_tasks(&[
        // No tool call: nudged twice, then no_tool_call.
        task(
            "prose",
            r#""model_script": [{"content": "I think"}, {"content": "still"}, {"content": "no"}]"#,
        ),
        task("turns", &format!(r#""max_turns": 2, "model_script": [{bash}, {bash}, {bash}]"#)),
        task(
            "provider",
            r#""model_script": [{"error": "upstream exploded"}]"#,
        ),
        task(
            "truncated",
            r#""model_script": [{"content": "abc", "finish_reason": "length"}, {"content": "x", "finish_reason": "length"}, {"content": "y", "finish_reason": "length"}]"#,
        ),
        task(
            "budget",
            &format!(r#""timeout_s": 1, "model_script": [{{"delay_ms": 4000}}, {SUBMIT}]"#),
        ),
        task(
            "verify-fails",
            &format!(r#""verify": "exit 3", "model_script": [{SUBMIT}]"#),
        ),
    ]);
    let o = env.eval(&tasks, &["-j", "6"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let prose = env.result("prose");
    assert_eq!(prose["stop_reason"], "no_tool_call", "{prose}");
    assert_eq!(prose["status"], "failed");
    assert_eq!(prose["turns"], 3);
    let turns = env.result("turns");
    assert_eq!(turns["stop_reason"], "max_turns", "{turns}");
    assert_eq!(turns["turns"], 2);
    let provider = env.result("provider");
    assert_eq!(provider["stop_reason"], "provider_error", "{provider}");
    let truncated = env.result("truncated");
    assert_eq!(truncated["stop_reason"], "output_truncated", "{truncated}");
    let budget = env.result("budget");
    assert_eq!(budget["stop_reason"], "budget", "{budget}");
    assert!(budget["error"].as_str().unwrap().contains("wall budget"));
    let vf = env.result("verify-fails");
    assert_eq!(vf["status"], "failed");
    assert_eq!(vf["stop_reason"], "submit");
    assert_eq!(vf["verify"]["exit_code"], 3);
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn a_runner_killed_mid_episode_is_replayed_on_a_fresh_sandbox() {
    let env = Env::new();
    // The first attempt's runner is killed from outside while its tool call runs (a
    // confined task cannot see the runner to kill it itself); the replay runs undisturbed.
    let step = serde_json::json!({"tool_calls": [{"name": "bash",
        "arguments": {"command": "touch started; sleep 2; echo alive"}}]});
    let tasks = env.write_tasks(&[task(
        "phoenix",
        &format!(r#""model_script": [{step}, {SUBMIT}]"#),
    )]);
    // Runs the eval, killing the runner of the first sandbox whose tool call starts.
    let run = |extra: &[&str]| {
        let out = env.out();
        let mut args = vec![
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let child = env
            .cmd(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let first = loop {
            if let Some(dir) = env.sandbox_with("started") {
                break dir;
            }
            assert!(Instant::now() < deadline, "the tool call never started");
            std::thread::sleep(Duration::from_millis(20));
        };
        env.kill_runner(&first);
        child.wait_with_output().unwrap()
    };
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("phoenix");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["attempts"], 2, "{r}");
    assert_eq!(r["retries"]["transport"], 1, "{r}");
    assert!(env.live_sandboxes().is_empty());

    // With no retries allowed, the same death is an `error`, never `max_turns`.
    std::fs::remove_dir_all(env.out()).unwrap();
    let o = run(&["--transport-retries", "0"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("phoenix");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["stop_reason"], "error", "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("runner process exited"),
        "{r}"
    );
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn a_hanging_verify_is_bounded_by_the_task_timeout() {
    let env = Env::new();
    let tasks = env.write_tasks(&[task(
        "hang",
        &format!(r#""timeout_s": 2, "verify": "sleep 600", "model_script": [{SUBMIT}]"#),
    )]);
    let t0 = Instant::now();
    let o = env.eval(&tasks, &[]);
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "verify was not bounded"
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("hang");
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["verify"]["timed_out"], true, "{r}");
}

#[test]
fn malformed_tasks_are_rejected_before_any_sandbox_starts() {
    let env = Env::new();
    let cases = [
        ("{\"id\": \"a\", \"instruction\": \"x\"}\n{oops\n", ":2:"),
        ("{\"id\": \"a\"}\n", "instruction"),
        (
            "{\"id\": \"a\", \"instruction\": \"x\"}\n{\"id\": \"a\", \"instruction\": \"y\"}\n",
            "duplicate",
        ),
        (
            "{\"id\": \"a\", \"instruction\": \"x\", \"max_turns\": \"many\"}\n",
            "max_turns",
        ),
    ];
    for (content, needle) in cases {
        let p = env.path("bad.jsonl");
        std::fs::write(&p, content).unwrap();
        let o = env.eval(&p, &[]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("bad.jsonl"), "{err}");
        assert!(err.contains(needle), "{needle}: {err}");
        assert!(env.live_sandboxes().is_empty());
    }
    let o = env
        .cmd(&["eval", "--tasks", "x.jsonl", "--backend", "cloud9"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = env
        .cmd(&["eval", "--tasks", "missing.jsonl"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.jsonl"));
}

#[test]
fn task_files_that_cannot_all_be_written_are_refused_at_load() {
    let env = Env::new();
    let tasks = env.write_tasks(&[
        task("ok", &format!(r#""model_script": [{SUBMIT}]"#)),
        task("nested", r#""files": {"a": "1", "a/b": "2"}"#),
        task("same", r#""files": {"a": "1", "./a": "2"}"#),
    ]);
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tasks.jsonl:2: field `files`"), "{err}");
    assert!(err.contains("tasks.jsonl:3: field `files`"), "{err}");
    assert!(env.live_sandboxes().is_empty());
    assert!(env.results().is_empty());
}

#[test]
fn a_task_file_the_sandbox_refuses_is_the_tasks_error_not_a_replay() {
    let env = Env::new();
    // Longer than any file name may be: the sandbox refuses the write itself (a bad request,
    // not a transport failure), on this sandbox or any other.
    let long = "n".repeat(300);
    let tasks = env.write_tasks(&[task(
        "long",
        &format!(r#""files": {{"{long}": "x"}}, "model_script": [{SUBMIT}]"#),
    )]);
    let o = env.eval(&tasks, &["--transport-retries", "2"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("long");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["attempts"], 1, "{r}");
    assert_eq!(r["retries"]["transport"], 0, "{r}");
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("writing task files"), "{r}");
    let state = env.home();
    for host_path in [state.clone(), state.canonicalize().unwrap()] {
        let host_path = host_path.to_str().unwrap().to_string();
        assert!(!error.contains(&host_path), "{host_path} in {error}");
    }
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn out_of_range_durations_and_rates_exit_2_before_any_sandbox() {
    let env = Env::new();
    let tasks = env.write_tasks(&[task("a", &format!(r#""model_script": [{SUBMIT}]"#))]);
    let huge = "500000000000years";
    let mut cases: Vec<(&str, &str)> = vec![
        ("--episode-timeout", huge),
        ("--episode-timeout", "0s"),
        ("--bash-timeout", huge),
        ("--hello-timeout", huge),
        ("--request-timeout", huge),
        ("--request-timeout", "8d"),
    ];
    for rate in ["1e-300", "NaN", "inf", "0", "-1"] {
        cases.push(("--create-rate", rate));
    }
    for (option, value) in cases {
        // `=` so that a negative value is not read as an option.
        let o = env.eval(&tasks, &[&format!("{option}={value}")]);
        assert_eq!(o.status.code(), Some(2), "{option} {value}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(option), "{option} {value}: {err}");
        let range = if option == "--create-rate" {
            "from 0.01 to 1000"
        } else {
            "from 1s to 7days"
        };
        assert!(err.contains(range), "{option} {value}: {err}");
    }
    let o = env
        .cmd(&["reap", "--dry-run", "--older-than", huge])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--older-than"));

    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
    let leases = std::fs::read_dir(env.home().join("leases"))
        .map(|rd| rd.count())
        .unwrap_or(0);
    assert_eq!(leases, 0, "a sandbox was leased");
    assert!(env.results().is_empty());
}

#[test]
fn resume_and_shards() {
    let env = Env::new();
    let lines: Vec<String> = (0..12)
        .map(|i| task(&format!("t{i}"), &format!(r#""model_script": [{SUBMIT}]"#)))
        .collect();
    let tasks = env.write_tasks(&lines);
    let out = env.out();
    let o = env.eval(&tasks, &["--shard", "0/2", "-j", "4"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let first: Vec<String> = env
        .results()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    assert!(!first.is_empty() && first.len() < 12, "{first:?}");
    let o = env.eval(&tasks, &["--shard", "1/2", "-j", "4"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut all: Vec<String> = env
        .results()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 12);
    assert_eq!(env.results().len(), 12, "a task ran in both shards");

    // Everything is finished: a resume runs nothing.
    let o = env.eval(&tasks, &["--resume", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(env.results().len(), 12);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "summary");
    assert_eq!(last["summary"]["skipped"], 12);

    let o = env
        .cmd(&["eval", "--tasks", tasks.to_str().unwrap(), "--resume"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = env
        .cmd(&["eval", "--tasks", tasks.to_str().unwrap(), "--shard", "2/2"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let _ = out;
}

#[test]
fn json_mode_prints_only_json_lines() {
    let env = Env::new();
    let tasks = env.write_tasks(&[task("a", &format!(r#""model_script": [{SUBMIT}]"#))]);
    let o = env.eval(&tasks, &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let types: Vec<String> = stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{l}: {e}"))["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        types,
        ["run_started", "task_started", "task_finished", "summary"]
    );
}

#[test]
fn two_hundred_tasks_at_j16_all_land_and_nothing_is_left() {
    let env = Env::new();
    let bash =
        r#"{"tool_calls": [{"name": "bash", "arguments": {"command": "echo $RANDOM > r.txt"}}]}"#;
    let lines: Vec<String> = (0..200)
        .map(|i| {
            task(
                &format!("t{i:03}"),
                &format!(r#""verify": "test -s r.txt", "model_script": [{bash}, {SUBMIT}]"#),
            )
        })
        .collect();
    let tasks = env.write_tasks(&lines);
    let o = env.eval(&tasks, &["-j", "16"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let results = env.results();
    assert_eq!(results.len(), 200);
    assert!(results.iter().all(|r| r["status"] == "passed"));
    // Warm reuse: far fewer sandboxes than tasks.
    let reused = results
        .iter()
        .filter(|r| r["sandbox"]["reused"] == true)
        .count();
    assert!(
        reused >= 150,
        "only {reused} of 200 episodes reused a sandbox"
    );
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
}

/// Sends SIGINT to the child once `results.jsonl` has at least `n` lines.
fn interrupt_after(env: &Env, child: &mut std::process::Child, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while env.results().len() < n {
        assert!(Instant::now() < deadline, "no results appeared");
        assert!(child.try_wait().unwrap().is_none(), "eval ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
    unsafe { libc_kill(child.id() as i32, 2) };
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

fn wait_bounded(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("eval did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_second_eval_on_the_same_out_is_refused_and_the_first_finishes_intact() {
    let env = Env::new();
    let slow =
        r#"{"delay_ms": 3000, "tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}"#;
    let lines: Vec<String> = (0..4)
        .map(|i| task(&format!("t{i}"), &format!(r#""model_script": [{slow}]"#)))
        .collect();
    let tasks = env.write_tasks(&lines);
    let out = env.out();
    let mut first = env
        .cmd(&[
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "-j",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The first run is under way once it made its transcripts directory.
    let pid = first.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !out.join("transcripts").exists() {
        assert!(Instant::now() < deadline, "the first eval never started");
        assert!(
            first.try_wait().unwrap().is_none(),
            "the first eval ended early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("pid {pid}")), "{err}");

    let status = wait_bounded(&mut first, Duration::from_secs(120));
    assert_eq!(status.code(), Some(0));
    let results = env.results();
    let mut ids: Vec<&str> = results.iter().map(|r| r["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["t0", "t1", "t2", "t3"], "{results:?}");
    assert!(
        results.iter().all(|r| r["status"] == "passed"),
        "{results:?}"
    );
    for id in ids {
        let starts = transcript_frames(&env, id)
            .iter()
            .filter(|f| f["type"] == "episode_start")
            .count();
        assert_eq!(starts, 1, "{id}");
    }
}

#[test]
fn results_that_cannot_be_written_stop_the_run_with_exit_3() {
    use std::os::unix::process::CommandExt;
    // Files this eval may grow to at most (RLIMIT_FSIZE): the runner and transcripts fit,
    // results.jsonl, already nearly this big, does not.
    const LIMIT: usize = 1 << 20;
    let env = Env::new();
    let lines: Vec<String> = (0..3)
        .map(|i| task(&format!("t{i}"), &format!(r#""model_script": [{SUBMIT}]"#)))
        .collect();
    let tasks = env.write_tasks(&lines);
    let out = env.out();
    std::fs::create_dir_all(&out).unwrap();
    let frame = r#"{"id":"old","status":"passed","pad":""}"#.len() + 1;
    let old = format!(
        "{{\"id\":\"old\",\"status\":\"passed\",\"pad\":\"{}\"}}\n",
        "x".repeat(LIMIT - 10 - frame)
    );
    std::fs::write(out.join("results.jsonl"), &old).unwrap();

    let mut cmd = env.cmd(&[
        "eval",
        "--tasks",
        tasks.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "-j",
        "1",
        "--json",
    ]);
    // SAFETY: setrlimit and signal are async-signal-safe, as pre_exec requires. With
    // SIGXFSZ ignored, a write past the limit fails with EFBIG instead of killing the child.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: LIMIT as libc::rlim_t,
                rlim_max: LIMIT as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let events: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(
        events.iter().any(|e| e["type"] == "results_failed"),
        "{stdout}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "summary", "{stdout}");
    let fatal = last["summary"]["fatal"].as_str().unwrap_or_default();
    assert!(fatal.contains("cannot append to results file"), "{stdout}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["fatal"], last["summary"]["fatal"], "{summary}");
    // The run stopped scheduling after the failed write.
    assert!(summary["not_run"].as_u64().unwrap() >= 1, "{summary}");
    let results = std::fs::read(out.join("results.jsonl")).unwrap();
    assert_eq!(results.len(), LIMIT);
    assert!(results.starts_with(old.as_bytes()));
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn ctrl_c_keeps_finished_results_and_kills_every_sandbox() {
    let env = Env::new();
    let lines: Vec<String> = (0..40)
        .map(|i| {
            let delay = if i < 2 { 0 } else { 20_000 };
            task(
                &format!("t{i:02}"),
                &format!(r#""model_script": [{{"delay_ms": {delay}}}, {SUBMIT}]"#),
            )
        })
        .collect();
    let tasks = env.write_tasks(&lines);
    let out = env.out();
    let mut child = env
        .cmd(&[
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "-j",
            "4",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    interrupt_after(&env, &mut child, 1);
    let status = wait_bounded(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(130));
    let results = env.results();
    assert!(results.iter().any(|r| r["status"] == "passed"));
    assert!(results.len() < 40, "scheduling did not stop");
    for r in &results {
        assert!(r["status"] == "passed" || r["status"] == "cancelled", "{r}");
    }
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );

    // A resume runs what was cancelled or never started (quickly this time).
    let quick: Vec<String> = (0..40)
        .map(|i| {
            task(
                &format!("t{i:02}"),
                &format!(r#""model_script": [{SUBMIT}]"#),
            )
        })
        .collect();
    let tasks = env.write_tasks(&quick);
    let o = env.eval(&tasks, &["--resume", "-j", "8", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut ids: Vec<String> = env
        .results()
        .iter()
        .filter(|r| r["status"] == "passed")
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len(),
        40,
        "every task passed exactly once across the two runs"
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(
        last["summary"]["skipped"].as_u64().unwrap() as usize,
        results.iter().filter(|r| r["status"] == "passed").count()
    );
    let _ = o;
}

#[test]
fn a_second_ctrl_c_kills_sandboxes_and_exits_at_once() {
    let env = Env::new();
    let lines: Vec<String> = (0..8)
        .map(|i| {
            // A long bash call keeps the episode busy even after the first Ctrl-C.
            let step = if i == 0 {
                SUBMIT.to_string()
            } else {
                r#"{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}"#
                    .to_string()
            };
            task(
                &format!("t{i}"),
                &format!(r#""model_script": [{step}, {SUBMIT}]"#),
            )
        })
        .collect();
    let tasks = env.write_tasks(&lines);
    let out = env.out();
    let mut child = env
        .cmd(&[
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "-j",
            "8",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    interrupt_after(&env, &mut child, 1);
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc_kill(child.id() as i32, 2) };
    let status = wait_bounded(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(130));
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
    assert!(env.results().iter().any(|r| r["id"] == "t0"));
}

/// A PATH holding every tool of /usr/bin and /bin except `node`, plus `extra` scripts.
fn path_without_node(env: &Env, extra: &[(&str, &str)]) -> String {
    let bin = env.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for dir in ["/usr/bin", "/bin"] {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let name = entry.file_name();
            let link = bin.join(&name);
            if name == "node" || link.exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(entry.path(), link);
        }
    }
    for (name, body) in extra {
        let p = bin.join(name);
        std::fs::write(&p, body).unwrap();
        let mut perm = std::fs::metadata(&p).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
        std::fs::set_permissions(&p, perm).unwrap();
    }
    bin.display().to_string()
}

#[test]
fn missing_or_old_node_stops_the_run_with_a_clear_error() {
    let env = Env::new();
    let lines: Vec<String> = (0..6)
        .map(|i| task(&format!("t{i}"), &format!(r#""model_script": [{SUBMIT}]"#)))
        .collect();
    let tasks = env.write_tasks(&lines);
    let out = env.out();
    let args = [
        "eval",
        "--tasks",
        tasks.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    // Unconfined, the caller's PATH is the sandbox's; under bwrap the system directories
    // always hold this machine's own node.
    let path = path_without_node(&env, &[]);
    let o = env
        .cmd(&args)
        .args(["--isolation", "none"])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("Node.js is not installed"), "{err}");
    assert!(err.contains(">= 18"), "{err}");
    // It stopped instead of failing every task the same way.
    assert!(env.results().len() < 6, "{:?}", env.results());
    assert!(env.live_sandboxes().is_empty());

    // A node outside the system directories is bound into the sandbox where it is.
    std::fs::remove_dir_all(&out).unwrap();
    let old = "#!/bin/sh\necho 'wmo-e2b runner needs Node.js >= 18 (found v16.20.0)' >&2\nexit 3\n";
    let path = path_without_node(&env, &[("node", old)]);
    let o = env.cmd(&args).env("PATH", &path).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("too old"), "{err}");
    assert!(err.contains("v16.20.0"), "{err}");
    assert!(env.live_sandboxes().is_empty());
}

/// A chat-completions server: the first request of each conversation gets a 500, then the
/// agent runs `env`, then submits. Returns the bodies it saw.
fn serve_chat(server: tiny_http::Server, key: &'static str) -> std::thread::JoinHandle<Vec<Value>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut failed_once = false;
        while let Ok(Some(mut req)) = server.recv_timeout(Duration::from_secs(30)) {
            let auth = req
                .headers()
                .iter()
                .find(|h| h.field.equiv("Authorization"))
                .map(|h| h.value.as_str().to_string());
            let mut body = String::new();
            std::io::Read::read_to_string(req.as_reader(), &mut body).unwrap();
            let body: Value = serde_json::from_str(&body).unwrap();
            seen.push(body.clone());
            if auth.as_deref() != Some(&format!("Bearer {key}")) {
                let _ = req.respond(tiny_http::Response::from_string("{}").with_status_code(401));
                continue;
            }
            if !failed_once {
                failed_once = true;
                let _ = req.respond(tiny_http::Response::from_string("oops").with_status_code(500));
                continue;
            }
            let has_tool_result = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["role"] == "tool");
            let (name, args) = if has_tool_result {
                ("submit", r#"{"answer":"done"}"#)
            } else {
                ("bash", r#"{"command":"env"}"#)
            };
            let reply = serde_json::json!({
                "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": null,
                    "tool_calls": [{"id": "call_1", "type": "function",
                                    "function": {"name": name, "arguments": args}}]}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
            });
            let _ = req.respond(tiny_http::Response::from_string(reply.to_string()));
            if name == "submit" {
                break;
            }
        }
        seen
    })
}

#[test]
fn an_openai_compatible_model_drives_the_episode_and_its_key_stays_on_the_host() {
    const KEY: &str = "sk-test-a8f3e1c9d2b74f06";
    let env = Env::new();
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let port = server.server_addr().to_ip().unwrap().port();
    let seen = serve_chat(server, KEY);
    let tasks = env.write_tasks(&[task("real", "")]);
    let base = format!("http://127.0.0.1:{port}/v1");
    let out = env.out();
    let o = env
        .cmd(&[
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--model",
            "test-model",
            "--base-url",
            &base,
            "--api-key-env",
            "WMO_TEST_KEY",
        ])
        .env("WMO_TEST_KEY", KEY)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("real");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["answer"], "done");
    assert_eq!(r["retries"]["provider"], 1, "{r}");
    assert_eq!(r["tokens"]["input"], 22, "{r}");
    assert_eq!(r["tokens"]["calls"], 2, "{r}");
    let transcript = std::fs::read_to_string(out.join("transcripts/real.jsonl")).unwrap();
    assert!(transcript.contains("HOME="), "the env tool call ran");
    assert!(!transcript.contains(KEY), "the API key reached the sandbox");
    let bodies = seen.join().unwrap();
    assert_eq!(bodies.len(), 3);
    assert!(bodies.iter().all(|b| b["model"] == "test-model"));
    assert!(bodies[0]["tools"].as_array().unwrap().len() >= 4);

    // A missing key is a usage error naming the variable, before any sandbox starts.
    let o = env
        .cmd(&[
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--model",
            "m",
            "--api-key-env",
            "WMO_NO_SUCH_KEY",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("WMO_NO_SUCH_KEY"));
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn the_first_ctrl_c_cancels_a_long_tool_call_promptly() {
    let env = Env::new();
    let step = serde_json::json!({"tool_calls": [{"name": "bash",
        "arguments": {"command": "touch started; sleep 120"}}]});
    let tasks = env.write_tasks(&[task(
        "slow",
        &format!(r#""model_script": [{step}, {SUBMIT}]"#),
    )]);
    let out = env.out();
    let mut child = env
        .cmd(&[
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.sandbox_with("started").is_none() {
        assert!(Instant::now() < deadline, "the tool call never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc_kill(child.id() as i32, 2) };
    // Well under the 120 s the command would take.
    let status = wait_bounded(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(130));
    let r = env.result("slow");
    assert_eq!(r["status"], "cancelled", "{r}");
    assert_eq!(r["stop_reason"], "cancelled", "{r}");
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
}

fn transcript_frames(env: &Env, id: &str) -> Vec<Value> {
    std::fs::read_to_string(env.out().join(format!("transcripts/{id}.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l.get("frame").is_some())
        .map(|l| l["frame"].clone())
        .collect()
}

#[test]
fn a_user_harness_directory_runs_instead_of_the_builtin_loop() {
    let env = Env::new();
    let dir = env.path("harness");
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::write(
        dir.join("agent.mjs"),
        r#"import { tag } from "./lib/tag.mjs";
export async function runEpisode(ctx) {
  ctx.log("harness " + tag + " starting on " + ctx.taskId);
  const r = await ctx.tool("bash", { command: "echo from-harness > h.txt && cat h.txt" });
  const c = await ctx.llm({ messages: [{ role: "user", content: ctx.instruction }], tools: ctx.tools });
  ctx.submit(r.content.trim() + "|" + (c.choices[0].message.content || ""));
}
"#,
    )
    .unwrap();
    std::fs::write(dir.join("lib/tag.mjs"), "export const tag = 'v1';\n").unwrap();
    let tasks = env.write_tasks(&[task(
        "custom",
        r#""verify": "test -f h.txt", "model_script": [{"content": "hi"}]"#,
    )]);
    let o = env.eval(&tasks, &["--harness", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("custom");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["answer"], "from-harness|hi", "{r}");
    let frames = transcript_frames(&env, "custom");
    let start = frames
        .iter()
        .find(|f| f["type"] == "episode_start")
        .unwrap();
    assert_eq!(start["harness"], "user");
    // The transcript notes the harness files instead of copying them every episode.
    assert_eq!(start["files"]["count"], 2, "{start}");
    assert!(start["files"]["paths"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("lib/tag.mjs")));
    assert!(frames
        .iter()
        .any(|f| f["type"] == "log" && f["message"] == "harness v1 starting on custom"));

    // A harness directory that is not a plain tree is refused by name.
    std::os::unix::fs::symlink("/etc/hostname", dir.join("lib/link")).unwrap();
    let o = env.eval(&tasks, &["--harness", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("lib/link") && err.contains("symlink"), "{err}");
}

#[test]
fn a_lone_surrogate_from_a_harness_reaches_the_host_as_a_replacement_character() {
    let env = Env::new();
    let dir = env.path("harness");
    std::fs::create_dir_all(&dir).unwrap();
    // Half of a surrogate pair: JSON.stringify writes it as a lone "\ud83d" escape in the
    // log, the tool request and the done frame alike.
    std::fs::write(
        dir.join("agent.mjs"),
        r#"export async function runEpisode(ctx) {
  const half = "\u{1F680}".slice(0, 1);
  ctx.log("half " + half);
  const r = await ctx.tool("bash", { command: "printf %s '" + half + "' | wc -c" });
  ctx.submit("got " + half + "|" + r.content.trim());
}
"#,
    )
    .unwrap();
    // The timeout only bounds the failure this test guards against (a dropped frame leaves
    // the episode waiting for its wall budget).
    let tasks = env.write_tasks(&[task("half", r#""timeout_s": 30"#)]);
    let o = env.eval(&tasks, &["--harness", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("half");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["stop_reason"], "submit", "{r}");
    // U+FFFD is three bytes of UTF-8, and that is what the bash tool call printed.
    assert_eq!(r["answer"], "got \u{FFFD}|3", "{r}");
    let frames = transcript_frames(&env, "half");
    assert!(
        frames
            .iter()
            .any(|f| f["type"] == "log" && f["message"] == "half \u{FFFD}"),
        "{frames:?}"
    );
}

#[test]
fn a_world_model_answers_tool_calls_and_nothing_runs_in_the_sandbox() {
    let env = Env::new();
    let marker = env.path("must-not-exist");
    let bash = serde_json::json!({"tool_calls": [{"name": "bash",
        "arguments": {"command": format!("touch {} && cat in.txt", marker.display())}}]});
    let tasks = env.write_tasks(&[task(
        "simulated",
        &format!(
            r#""files": {{"in.txt": "3 4"}}, "verify": "false", "model_script": [{bash}, {SUBMIT}], "world_script": [{{"content": "3 4 (simulated)"}}]"#
        ),
    )]);
    let o = env.eval(&tasks, &["--env", "world-model"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("simulated");
    assert_eq!(r["status"], "passed", "{r}");
    assert!(
        r["verify"].is_null(),
        "verify ran in a simulated environment: {r}"
    );
    assert!(!marker.exists(), "a tool call ran for real");
    let frames = transcript_frames(&env, "simulated");
    let reply = frames
        .iter()
        .find(|f| f["type"] == "tool_response")
        .unwrap();
    assert_eq!(reply["content"], "3 4 (simulated)");
    assert_eq!(reply["is_error"], false);
}

/// Shares one pi install (the real npm packages) between tests: installed once under
/// `target/pi-cache`, linked into each test's state dir.
fn share_pi_install(env: &Env) {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pi-cache");
    wmo_e2b::runner::pi::ensure_installed(&cache)
        .expect("installing the pi packages (needs the npm registry once)");
    std::fs::create_dir_all(env.home()).unwrap();
    std::os::unix::fs::symlink(cache.join("npm"), env.home().join("npm")).unwrap();
}

#[test]
fn the_pi_harness_runs_episodes_end_to_end() {
    let env = Env::new();
    share_pi_install(&env);
    let bash =
        r#"{"tool_calls": [{"name": "bash", "arguments": {"command": "echo 7 > out.txt"}}]}"#;
    let tasks = env.write_tasks(&[
        task(
            "pi-submit",
            &format!(
                r#""verify": "test \"$(cat out.txt)\" = 7", "model_script": [{bash}, {SUBMIT}]"#
            ),
        ),
        task(
            "pi-turns",
            &format!(r#""max_turns": 2, "model_script": [{bash}, {bash}, {bash}]"#),
        ),
        task(
            "pi-provider",
            r#""model_script": [{"error": "upstream exploded"}]"#,
        ),
    ]);
    let o = env.eval(&tasks, &["--harness", "pi", "-j", "3"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("pi-submit");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["answer"], "ok");
    assert_eq!(r["turns"], 2, "{r}");
    let r = env.result("pi-turns");
    assert_eq!(r["stop_reason"], "max_turns", "{r}");
    let r = env.result("pi-provider");
    assert_eq!(r["stop_reason"], "provider_error", "{r}");
    let start = transcript_frames(&env, "pi-submit")
        .into_iter()
        .find(|f| f["type"] == "episode_start")
        .unwrap();
    assert_eq!(start["harness"], "pi");
    assert!(env.live_sandboxes().is_empty());
}

/// A chat-completions server that answers every request with one status, until dropped.
struct RefusingServer {
    base_url: String,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RefusingServer {
    fn start(status: u16) -> RefusingServer {
        use std::sync::atomic::Ordering;
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, s) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                if let Ok(Some(req)) = server.recv_timeout(Duration::from_millis(100)) {
                    h.fetch_add(1, Ordering::SeqCst);
                    let body = r#"{"error": {"message": "refused by the test server"}}"#;
                    let reply = tiny_http::Response::from_string(body).with_status_code(status);
                    let _ = req.respond(reply);
                }
            }
        });
        RefusingServer {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            hits,
            stop,
            thread: Some(thread),
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for RefusingServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn eval_against(env: &Env, tasks: &Path, base_url: &str, extra: &[&str]) -> Output {
    let out = env.out();
    let mut args = vec![
        "eval",
        "--tasks",
        tasks.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--model",
        "test-model",
        "--base-url",
        base_url,
        "--api-key-env",
        "WMO_TEST_KEY",
    ];
    args.extend_from_slice(extra);
    env.cmd(&args)
        .env("WMO_TEST_KEY", "sk-test")
        .output()
        .unwrap()
}

#[test]
fn a_refused_key_or_an_unknown_model_stops_the_run_and_scores_nothing() {
    // Every task would pass its verify without the agent doing anything.
    let lines: Vec<String> = (0..6)
        .map(|i| {
            task(
                &format!("t{i}"),
                &format!(r#""verify": "true", "model_script": [{SUBMIT}]"#),
            )
        })
        .collect();
    for (status, option) in [
        (401, "--api-key-env"),
        (403, "--api-key-env"),
        (404, "--model"),
    ] {
        let env = Env::new();
        let tasks = env.write_tasks(&lines);
        let server = RefusingServer::start(status);
        let o = eval_against(&env, &tasks, &server.base_url, &["-j", "2"]);
        assert_eq!(o.status.code(), Some(3), "HTTP {status}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("stopped early"), "{err}");
        assert!(err.contains(option), "HTTP {status}: {err}");
        if status != 404 {
            assert!(err.contains("WMO_TEST_KEY"), "{err}");
        }
        // Only the tasks already running when the first refusal came were written, and
        // none of them was scored.
        let results = env.results();
        assert!(!results.is_empty() && results.len() <= 2, "{results:?}");
        for r in &results {
            assert!(r["status"] == "error" || r["status"] == "cancelled", "{r}");
            assert!(r["verify"].is_null(), "verify ran: {r}");
            if r["status"] == "error" {
                assert_eq!(r["stop_reason"], "provider_error", "{r}");
                assert!(r["error"].as_str().unwrap().contains(option), "{r}");
            }
        }
        // One refusal per task at most: the refused key is never retried.
        assert!(server.hits() <= 2, "{} requests", server.hits());
        assert!(env.live_sandboxes().is_empty());

        // --resume runs every task again: none of them finished.
        let o = env.eval(&tasks, &["--resume"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let passed = env
            .results()
            .into_iter()
            .filter(|r| r["status"] == "passed")
            .count();
        assert_eq!(passed, 6, "{:?}", env.results());
    }
}

#[test]
fn an_unreachable_model_api_is_an_error_with_its_retries_counted_and_resume_reruns_it() {
    let env = Env::new();
    // Bind and drop to find a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tasks = env.write_tasks(&[task(
        "offline",
        &format!(r#""verify": "true", "model_script": [{SUBMIT}]"#),
    )]);
    let o = eval_against(&env, &tasks, &format!("http://127.0.0.1:{port}/v1"), &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("offline");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["stop_reason"], "provider_error", "{r}");
    assert!(r["verify"].is_null(), "verify ran without a model: {r}");
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("gave up after 5 attempts"), "{r}");
    assert!(error.contains("could not be reached"), "{r}");
    assert_eq!(r["retries"]["provider"], 4, "{r}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(env.out().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["errors"], 1, "{summary}");
    assert_eq!(summary["provider_retries"], 4, "{summary}");

    let o = env.eval(&tasks, &["--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let results = env.results();
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[1]["status"], "passed", "{results:?}");
}

#[test]
fn a_task_never_sees_what_an_earlier_task_left() {
    let env = Env::new();
    let tasks = env.write_tasks(&support::contamination::tasks());
    let o = env.eval(&tasks, &["-j", "1", "--isolation", "bwrap"]);
    support::contamination::check(&env.results());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn a_setup_ending_in_ampersand_backgrounds_only_itself() {
    let env = Env::new();
    // A whole `rm -rf ws && mkdir -p ws && cd ws && sleep 1 &` in the background is killed
    // with the setup's shell before it makes the workspace; the tool call and verify then
    // have nowhere to run.
    let tasks = env.write_tasks(&[task(
        "bg",
        &format!(
            r#""setup": "sleep 1 &", "verify": "test \"$(cat seen.txt)\" = here", "model_script": [{{"tool_calls": [{{"name": "bash", "arguments": {{"command": "echo here > seen.txt"}}}}]}}, {SUBMIT}]"#
        ),
    )]);
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(env.result("bg")["status"], "passed");
}

#[test]
fn unconfined_sandboxes_are_never_reused_and_say_so() {
    let env = Env::new();
    let tasks = env.write_tasks(&[
        task("one", &format!(r#""model_script": [{SUBMIT}]"#)),
        task("two", &format!(r#""model_script": [{SUBMIT}]"#)),
    ]);
    let o = env.eval(&tasks, &["-j", "1", "--isolation", "none"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--isolation none"),
        "{}",
        text(&o)
    );
    for r in env.results() {
        assert_eq!(r["sandbox"]["reused"], false, "{r}");
    }
    let summary: Value =
        serde_json::from_slice(&std::fs::read(env.out().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["sandboxes"]["count"], 2, "{summary}");
    assert_eq!(summary["sandboxes"]["unclean"], 2, "{summary}");
    assert!(env.live_sandboxes().is_empty());
}

/// The tools answered on the host (read_file, write_file) never follow a symlink the agent
/// made out of the sandbox, and name the path instead.
#[test]
fn sandbox_tools_never_follow_a_symlink_out_of_the_sandbox() {
    let env = Env::new();
    let secret = env.path("secret.txt");
    std::fs::write(&secret, "TOP SECRET").unwrap();
    let target = env.path("host.txt");
    std::fs::write(&target, "untouched").unwrap();
    let link = format!(
        "ln -s {} notes.txt && ln -s {} README.md",
        secret.display(),
        target.display()
    );
    let steps = [
        serde_json::json!({"tool_calls": [{"name": "bash", "arguments": {"command": link}}]}),
        serde_json::json!({"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}),
        serde_json::json!({"tool_calls": [{"name": "write_file",
            "arguments": {"path": "README.md", "content": "pwned"}}]}),
    ];
    let script = steps
        .iter()
        .map(Value::to_string)
        .chain([SUBMIT.to_string()])
        .collect::<Vec<_>>()
        .join(", ");
    let tasks = env.write_tasks(&[task("links", &format!(r#""model_script": [{script}]"#))]);
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let responses: Vec<Value> = transcript_frames(&env, "links")
        .into_iter()
        .filter(|f| f["type"] == "tool_response")
        .collect();
    assert_eq!(responses.len(), 3, "{responses:?}");
    for (r, path) in responses[1..].iter().zip(["notes.txt", "README.md"]) {
        let content = r["content"].as_str().unwrap();
        assert_eq!(r["is_error"], true, "{r}");
        assert!(content.contains(path) && content.contains("symlink"), "{r}");
        assert!(!content.contains("TOP SECRET"), "{r}");
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
}
