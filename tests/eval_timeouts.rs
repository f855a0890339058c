//! A task's `timeout_s` bounds its episode, the call running at the deadline included (its
//! `verify_timeout_s` bounds its verify: see `eval_local`).

use std::time::{Duration, Instant};

use serde_json::json;

mod support;

use support::local::running;
use support::{eventually, text, Env};

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
