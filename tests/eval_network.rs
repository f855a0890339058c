//! `eval --network` and a task's `network`: a task may narrow the run's network (and the
//! pooled sandbox gets the run's back for the next task), never widen it; what cannot be
//! given here is refused before anything starts.

mod support;

use support::{task, text, Env, SUBMIT};

/// Exits 0 when the sandbox has loopback alone.
const LOOPBACK_ONLY: &str = "test \"$(tail -n +3 /proc/net/dev | wc -l)\" = 1";

#[test]
fn a_task_narrows_the_network_and_the_next_task_gets_the_runs_back() {
    let env = Env::new();
    let tasks = env.write_tasks(&[
        task(
            "locked",
            &format!(
                r#""network": "none", "verify": "{}", "model_script": [{SUBMIT}]"#,
                LOOPBACK_ONLY.replace('"', "\\\"")
            ),
        ),
        task(
            "open",
            &format!(
                r#""verify": "! {}", "model_script": [{SUBMIT}]"#,
                LOOPBACK_ONLY.replace('"', "\\\"")
            ),
        ),
    ]);
    let o = env.eval(&tasks, &["-j", "1", "--network", "host"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for id in ["locked", "open"] {
        assert_eq!(env.result(id)["status"], "passed", "{}", env.result(id));
    }
    // One sandbox served both: the second saw the run's network again after a reset.
    assert_eq!(
        env.result("open")["sandbox"]["reused"],
        true,
        "{}",
        env.result("open")
    );
}

#[test]
fn a_network_this_host_cannot_give_or_a_bad_field_is_refused() {
    let env = Env::new();
    let tasks = env.write_tasks(&[task("t", &format!(r#""model_script": [{SUBMIT}]"#))]);
    let o = env.eval(&tasks, &["--isolation", "none", "--network", "internet"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--network internet needs"),
        "{}",
        text(&o)
    );
    let tasks = env.write_tasks(&[task("t", r#""network": "wide""#)]);
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("tasks.jsonl:1: field `network`"),
        "{}",
        text(&o)
    );
}
