//! `wmo-e2b eval` and Ctrl-C: the first cancels running work and keeps what finished, the
//! second kills every sandbox and exits at once.

use std::process::Child;
use std::time::Duration;

use serde_json::Value;

mod support;

use support::{signal, task, text, wait_bounded, wait_for, Env, SUBMIT};

/// Sends SIGINT to the child once `results.jsonl` has at least `n` lines.
fn interrupt_after(env: &Env, child: &mut Child, n: usize) {
    wait_for("results", Duration::from_secs(60), || {
        assert!(child.try_wait().unwrap().is_none(), "eval ended early");
        env.results().len() >= n
    });
    signal(child, libc::SIGINT);
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
    let mut child = env.spawn_eval(&tasks, &["-j", "4"]);
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
        last["summary"]["already_finished"].as_u64().unwrap() as usize,
        results.iter().filter(|r| r["status"] == "passed").count()
    );
    let _ = o;
}

#[test]
fn a_second_ctrl_c_kills_sandboxes_and_exits_at_once() {
    let env = Env::new();
    // A verify that outlasts this test: the first Ctrl-C lets an episode that already ended
    // have its verdict, so only the second one can end the run before the verify does.
    let stuck = task(
        "stuck",
        &format!(
            r#""timeout_s": 120, "verify": "touch verifying; sleep 120", "model_script": [{SUBMIT}]"#
        ),
    );
    let tasks = env.write_tasks(&[stuck]);
    let mut child = env.spawn_eval(&tasks, &[]);
    wait_for("the verify to start", Duration::from_secs(60), || {
        env.sandbox_with("verifying").is_some()
    });
    signal(&child, libc::SIGINT);
    // The first Ctrl-C alone ends nothing while the verify runs.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first Ctrl-C ended the run: this test needs work that outlasts it"
    );
    signal(&child, libc::SIGINT);
    // Far less than the verify's 120 s: only a bound on a hang, not on speed.
    let status = wait_bounded(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(130));
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
    // It exited without waiting for the verdict: a worker may still record the task as
    // cancelled (its sandbox died under it), which resume reruns, but nothing was scored.
    let results = env.results();
    assert!(
        results.iter().all(|r| r["status"] == "cancelled"),
        "{results:?}"
    );
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
    let mut child = env.spawn_eval(&tasks, &[]);
    wait_for("the tool call to start", Duration::from_secs(30), || {
        env.sandbox_with("started").is_some()
    });
    signal(&child, libc::SIGINT);
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
