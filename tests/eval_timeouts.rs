//! A task's `timeout_s` bounds its episode, the call running at the deadline included (its
//! `verify_timeout_s` bounds its verify: see `eval_local`).

use std::time::{Duration, Instant};

use serde_json::json;

mod support;

use support::local::running;
use support::{eventually, text, transcript_frames, Env};

/// Far above the 3 s deadline and the time an eval takes to start and end a sandbox on a
/// loaded machine, far below the 60 s the tool call would run: a bound, not a speed.
const BOUND: Duration = Duration::from_secs(30);

#[test]
fn a_tool_call_running_at_the_deadline_is_ended_with_its_processes() {
    let env = Env::new();
    // A sleep no other test runs, so its processes can be found on the host.
    let marker = "sleep 60.4242";
    let task = json!({"id": "slow", "instruction": "x", "timeout_s": 3, "model_script": [
        {"tool_calls": [{"name": "bash", "arguments": {"command": marker}}]},
        {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]},
    ]});
    let tasks = env.write_tasks(&[task.to_string()]);
    let started = Instant::now();
    let o = env.eval(&tasks, &[]);
    let took = started.elapsed();
    let r = env.result("slow");
    assert_eq!(r["stop_reason"], "timeout", "{r}\n{}", text(&o));
    assert!(
        took < BOUND,
        "the eval took {took:?}: the tool call outlived timeout_s"
    );
    assert!(
        r["error"].as_str().unwrap_or("").contains("3s timeout"),
        "{r}"
    );
    assert!(
        eventually(Duration::from_secs(10), || running(marker).is_empty()),
        "the tool call's sleep still runs: {:?}",
        running(marker)
    );
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
}

/// A bash call past `--bash-timeout` is ended as `timeout -k` would end it, with nothing
/// added to the command: SIGTERM to its processes first (a trap of it runs), SIGKILL two
/// seconds later for what ignores it. The agent reads that it timed out, and nothing of
/// the call lives on.
#[test]
fn a_bash_call_past_its_timeout_gets_term_then_kill() {
    let env = Env::new();
    // The next call looks for what is left of the first (the bracket keeps pgrep from
    // finding its own command line).
    let task = |id: &str, command: &str| {
        json!({"id": id, "instruction": "x", "model_script": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"tool_calls": [{"name": "bash", "arguments": {
                "command": "pgrep -f 'sleep 60[.]5' || echo nothing-''left"}}]},
            {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]},
        ]})
        .to_string()
    };
    let tasks = env.write_tasks(&[
        task(
            "polite",
            "trap 'echo got-\"\"term; exit 3' TERM; sleep 60.5151 & wait",
        ),
        task(
            "stubborn",
            "trap '' TERM; sleep 60.5252; echo not-ended-at-''once",
        ),
    ]);
    let o = env.eval(&tasks, &["--bash-timeout", "1s", "-j", "2"]);
    // What the agent read back from its calls.
    let said = |id: &str| {
        transcript_frames(&env, id)
            .iter()
            .filter(|f| f["type"] == "tool_response")
            .map(|f| f["content"].as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let polite = said("polite");
    assert!(polite.contains("got-term"), "{polite}\n{}", text(&o));
    assert!(polite.contains("[timed out after 1s]"), "{polite}");
    let stubborn = said("stubborn");
    assert!(stubborn.contains("[timed out after 1s]"), "{stubborn}");
    assert!(!stubborn.contains("not-ended-at-once"), "{stubborn}");
    for said in [&polite, &stubborn] {
        assert!(said.contains("nothing-left"), "{said}");
    }
    assert!(
        eventually(Duration::from_secs(10), || running("sleep 60.5").is_empty()),
        "the calls' sleeps still run: {:?}",
        running("sleep 60.5")
    );
}
