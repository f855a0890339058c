//! A task's own model budget (`max_tokens`, `max_cost_usd`, or the run's `--task-max-tokens`
//! and `--task-max-cost`): the episode ends `budget` before the model call that would start
//! at or past it, the workspace is still judged, and a cost limit without prices is refused
//! before anything runs.

mod support;

use support::{task, text, Env, SUBMIT};

/// Three model calls: the first writes `one.txt`, the second `two.txt`, the third submits.
fn three_calls() -> String {
    let write = |f: &str| {
        format!(
            r#"{{"tool_calls": [{{"name": "bash", "arguments": {{"command": "echo x > {f}"}}}}]}}"#
        )
    };
    format!(
        r#""model_script": [{}, {}, {SUBMIT}]"#,
        write("one.txt"),
        write("two.txt")
    )
}

/// Passes when exactly the first model call's command ran.
const ONLY_THE_FIRST_CALL: &str = r#""verify": "test -f one.txt && ! test -f two.txt""#;

#[test]
fn a_token_limit_ends_the_episode_before_the_call_past_it_and_verify_still_judges() {
    let env = Env::new();
    let limited = task(
        "limited",
        &format!(
            r#"{}, {ONLY_THE_FIRST_CALL}, "max_tokens": 1"#,
            three_calls()
        ),
    );
    let free = task(
        "free",
        &format!(r#"{}, "verify": "test -f two.txt""#, three_calls()),
    );
    let tasks = env.write_tasks(&[limited, free]);
    let o = env.eval(&tasks, &["-j", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let r = env.result("limited");
    assert_eq!(r["stop_reason"], "budget", "{r}");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["turns"], 1, "{r}");
    let used = r["tokens"]["input"].as_u64().unwrap() + r["tokens"]["output"].as_u64().unwrap();
    let why = r["error"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("token limit was reached: {used} of 1 tokens")),
        "{why}"
    );

    let r = env.result("free");
    assert_eq!(
        (&r["stop_reason"], r["turns"].as_u64()),
        (&"submit".into(), Some(3)),
        "{r}"
    );
}

#[test]
fn the_runs_task_limit_applies_where_a_task_sets_none() {
    let env = Env::new();
    let unset = task(
        "unset",
        &format!("{}, {ONLY_THE_FIRST_CALL}", three_calls()),
    );
    let own = task(
        "own",
        &format!(r#"{}, "max_tokens": 100000000"#, three_calls()),
    );
    let tasks = env.write_tasks(&[unset, own]);
    let o = env.eval(&tasks, &["-j", "1", "--task-max-tokens", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("unset");
    assert_eq!(
        (&r["stop_reason"], r["turns"].as_u64()),
        (&"budget".into(), Some(1)),
        "{r}"
    );
    // A task's own limit wins over the run's.
    let r = env.result("own");
    assert_eq!(
        (&r["stop_reason"], r["turns"].as_u64()),
        (&"submit".into(), Some(3)),
        "{r}"
    );
}

#[test]
fn a_cost_limit_counts_dollars_at_the_runs_prices() {
    let env = Env::new();
    // A dollar a token: the first call alone passes a half-dollar limit.
    let prices = ["--price-in", "1000000", "--price-out", "1000000"];
    let limited = task(
        "limited",
        &format!(
            r#"{}, {ONLY_THE_FIRST_CALL}, "max_cost_usd": 0.5"#,
            three_calls()
        ),
    );
    let roomy = task(
        "roomy",
        &format!(r#"{}, "max_cost_usd": 100000000"#, three_calls()),
    );
    let tasks = env.write_tasks(&[limited, roomy]);
    let o = env.eval(&tasks, &[&["-j", "1"][..], &prices].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("limited");
    assert_eq!(
        (&r["stop_reason"], r["turns"].as_u64()),
        (&"budget".into(), Some(1)),
        "{r}"
    );
    let usd = r["cost"]["usd"].as_f64().unwrap();
    let why = r["error"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("cost limit was reached: ${usd:.4} of $0.5 spent")),
        "{why}"
    );
    let r = env.result("roomy");
    assert_eq!(
        (&r["stop_reason"], r["turns"].as_u64()),
        (&"submit".into(), Some(3)),
        "{r}"
    );
}

#[test]
fn limits_that_cannot_be_counted_are_usage_errors() {
    let env = Env::new();
    let plain = env.write_tasks(&[task("plain", &format!(r#""model_script": [{SUBMIT}]"#))]);
    let o = env.eval(&plain, &["--task-max-cost", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--task-max-cost needs prices"),
        "{}",
        text(&o)
    );

    let costly = env.write_tasks(&[
        task("plain", &format!(r#""model_script": [{SUBMIT}]"#)),
        task(
            "costly",
            &format!(r#""max_cost_usd": 1, "model_script": [{SUBMIT}]"#),
        ),
    ]);
    let o = env.eval(&costly, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let says = format!(
        "{}:2: task \"costly\": field `max_cost_usd` needs prices",
        costly.display()
    );
    assert!(text(&o).contains(&says), "{}", text(&o));

    for (field, value) in [
        ("max_tokens", "0"),
        ("max_cost_usd", "0"),
        ("max_cost_usd", "-1"),
    ] {
        let bad = env.write_tasks(&[task("bad", &format!(r#""{field}": {value}"#))]);
        let o = env.eval(&bad, &[]);
        assert_eq!(o.status.code(), Some(2), "{field}={value}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("field `{field}`")),
            "{}",
            text(&o)
        );
    }
    assert!(env.results().is_empty());
}
