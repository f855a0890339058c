//! `wmo-e2b eval` end to end on the local backend: the real binary, the real Node runner, the
//! scripted model.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;

use support::{kill_runner, task, text, transcript_frames, wait_for, Env, SUBMIT};
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
            "timeout",
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
    let timeout = env.result("timeout");
    assert_eq!(timeout["stop_reason"], "timeout", "{timeout}");
    assert!(timeout["error"].as_str().unwrap().contains("1s timeout"));
    let vf = env.result("verify-fails");
    assert_eq!(vf["status"], "failed");
    assert_eq!(vf["stop_reason"], "submit");
    assert_eq!(vf["verify"]["exit_code"], 3);
    // A record that did not pass says why in the record.
    assert_eq!(vf["error"], "verify exited 3", "{vf}");
    assert_eq!(
        prose["error"],
        "the episode ended without a submit (no_tool_call)"
    );
    assert!(
        provider["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{provider}"
    );
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
        let child = env
            .eval_cmd(&tasks, extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = None;
        wait_for("the tool call to start", Duration::from_secs(30), || {
            first = env.sandbox_with("started");
            first.is_some()
        });
        kill_runner(&first.unwrap());
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
fn a_hanging_verify_is_bounded_by_the_task_verify_timeout() {
    let env = Env::new();
    // The verify's own bound, not the episode's: a long timeout_s leaves it as it is.
    let tasks = env.write_tasks(&[task(
        "hang",
        &format!(
            r#""timeout_s": 900, "verify_timeout_s": 2, "verify": "sleep 600", "model_script": [{SUBMIT}]"#
        ),
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
    // Bounded by its 2 s (and the kill's grace), not by something far longer.
    let verify = r["timings"]["verify"].as_f64().unwrap();
    assert!(
        verify < 10.0,
        "verify took {verify} s under a 2 s bound: {r}"
    );
}

#[test]
fn resume_and_shards() {
    let env = Env::new();
    let lines: Vec<String> = (0..12)
        .map(|i| task(&format!("t{i}"), &format!(r#""model_script": [{SUBMIT}]"#)))
        .collect();
    let tasks = env.write_tasks(&lines);
    // Each shard writes its own directory under the shared --out.
    let ids_in = |shard: &str| -> Vec<String> {
        support::results_in(&env.out().join(shard))
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    };
    let o = env.eval(&tasks, &["--shard", "0/2", "-j", "4"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let first = ids_in("shard-0-of-2");
    assert!(!first.is_empty() && first.len() < 12, "{first:?}");
    let o = env.eval(&tasks, &["--shard", "1/2", "-j", "4"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        ids_in("shard-0-of-2"),
        first,
        "shard 1 touched shard 0's results"
    );
    let mut all = [first.clone(), ids_in("shard-1-of-2")].concat();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 12);
    assert_eq!(
        first.len() + ids_in("shard-1-of-2").len(),
        12,
        "a task ran in both shards"
    );

    // Everything in shard 0 is finished: resuming it runs nothing.
    let o = env.eval(&tasks, &["--shard", "0/2", "--resume", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(ids_in("shard-0-of-2").len(), first.len());
    let stdout = String::from_utf8_lossy(&o.stdout);
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "summary");
    assert_eq!(last["summary"]["already_finished"], first.len());

    let o = env.run(&["eval", "--tasks", tasks.to_str().unwrap(), "--resume"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = env.run(&["eval", "--tasks", tasks.to_str().unwrap(), "--shard", "2/2"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
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
        [
            "run_started",
            "task_started",
            "task_phase",
            "task_phase",
            "task_phase",
            "task_finished",
            "summary"
        ]
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
            r#""setup": "sleep 40 &", "verify": "test \"$(cat seen.txt)\" = here", "model_script": [{{"tool_calls": [{{"name": "bash", "arguments": {{"command": "echo here > seen.txt"}}}}]}}, {SUBMIT}]"#
        ),
    )]);
    let t0 = Instant::now();
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(env.result("bg")["status"], "passed");
    // The setup returned without waiting for what it backgrounded.
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "the setup waited for its `&`"
    );
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

/// Off a terminal a run is never silent for long: a heartbeat names each running task, its
/// phase and how long it has run, as a line, or with --json as an event.
#[test]
fn a_heartbeat_says_what_running_tasks_are_doing() {
    let env = Env::new();
    let tasks = env.write_tasks(&[task(
        "slow-verify",
        &format!(r#""verify": "sleep 4", "model_script": [{SUBMIT}]"#),
    )]);
    let o = env.eval(&tasks, &["--heartbeat", "1s"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let beats: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("running ") && l.contains("slow-verify (verify "))
        .collect();
    assert!(beats.len() >= 2, "{err}");
    assert!(beats[0].contains("0/1 done · 1 task: slow-verify"), "{err}");

    let env = Env::new();
    let tasks = env.write_tasks(&[task(
        "slow-verify",
        &format!(r#""verify": "sleep 3", "model_script": [{SUBMIT}]"#),
    )]);
    let o = env.eval(&tasks, &["--heartbeat", "1s", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let beats: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "heartbeat" && e["running"][0]["phase"] == "verify")
        .collect();
    assert!(!beats.is_empty(), "{}", text(&o));
    assert_eq!(beats[0]["running"][0]["id"], "slow-verify");
    assert_eq!(beats[0]["total"], 1);
}
