//! `wmo-e2b eval` under spend caps: tokens, sandbox-seconds and dollars; tasks a cap keeps
//! from starting are written `skipped` and run by `--resume` with a higher cap; every record
//! carries its cost when prices are known.

use std::time::Duration;

use serde_json::Value;

mod support;

use support::{task, text, wait_bounded, Env, SUBMIT};

/// Exit code of a run a spend cap stopped.
const BUDGET_STOPPED: i32 = 4;

fn summary(env: &Env) -> Value {
    serde_json::from_slice(&std::fs::read(env.out().join("summary.json")).unwrap()).unwrap()
}

fn same_tasks(n: usize) -> Vec<String> {
    // Ids of one length, so every task's prompt (and so its scripted token count) is equal.
    (0..n)
        .map(|i| task(&format!("t{i}"), &format!(r#""model_script": [{SUBMIT}]"#)))
        .collect()
}

#[test]
fn a_token_cap_skips_what_would_pass_it_and_resume_with_more_runs_the_rest() {
    let env = Env::new();
    // What one task costs in tokens, measured on its own.
    let one = env.write_tasks(&same_tasks(1));
    let probe_dir = env.path("probe");
    let o = env.run(&[
        "eval",
        "--tasks",
        one.to_str().unwrap(),
        "--out",
        probe_dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let probe = support::results_in(&probe_dir);
    let per_task = probe[0]["tokens"]["input"].as_u64().unwrap()
        + probe[0]["tokens"]["output"].as_u64().unwrap();
    assert!(per_task > 0);

    // Room for two and a half tasks: the third would pass the cap, so it never starts.
    let cap = (per_task * 5 / 2).to_string();
    let tasks = env.write_tasks(&same_tasks(5));
    let o = env.eval(&tasks, &["-j", "1", "--max-tokens", &cap]);
    assert_eq!(o.status.code(), Some(BUDGET_STOPPED), "{}", text(&o));
    let results = env.results();
    assert_eq!(results.len(), 5, "{results:?}");
    let status = |s: &str| results.iter().filter(|r| r["status"] == s).count();
    assert_eq!((status("passed"), status("skipped")), (2, 3), "{results:?}");
    for r in results.iter().filter(|r| r["status"] == "skipped") {
        assert_eq!(r["stop_reason"], "budget", "{r}");
        assert_eq!(r["attempts"], 0, "{r}");
        let why = r["error"].as_str().unwrap();
        assert!(why.contains("--max-tokens") && why.contains(&cap), "{why}");
    }
    let s = summary(&env);
    assert_eq!(s["stopped_by"], "tokens", "{s}");
    assert_eq!(s["over_budget"], 3, "{s}");
    assert_eq!(s["spend"]["tokens"], per_task * 2, "{s}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("stopped at --max-tokens"));

    let more = (per_task * 10).to_string();
    let o = env.eval(&tasks, &["-j", "1", "--resume", "--max-tokens", &more]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let passed: Vec<Value> = env
        .results()
        .into_iter()
        .filter(|r| r["status"] == "passed")
        .collect();
    assert_eq!(passed.len(), 5, "{passed:?}");
}

#[test]
fn every_record_carries_its_cost_and_a_cost_cap_stops_the_run() {
    let env = Env::new();
    let failing = task(
        "fails",
        &format!(r#""verify": "exit 1", "model_script": [{SUBMIT}]"#),
    );
    let mut lines = vec![failing];
    lines.extend(same_tasks(3));
    let tasks = env.write_tasks(&lines);
    // Dearer than any real model, so a few scripted tokens make dollars.
    let prices = ["--price-in", "10000", "--price-out", "20000"];
    let o = env.eval(&tasks, &[&["-j", "1"][..], &prices].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let results = env.results();
    let mut total = 0.0;
    for r in &results {
        let (input, output) = (
            r["tokens"]["input"].as_f64().unwrap(),
            r["tokens"]["output"].as_f64().unwrap(),
        );
        let usd = r["cost"]["usd"]
            .as_f64()
            .unwrap_or_else(|| panic!("no cost: {r}"));
        assert!(
            (usd - (input * 10000.0 + output * 20000.0) / 1e6).abs() < 1e-9,
            "{r}"
        );
        assert_eq!(r["cost"]["prices"]["input"], 10000.0, "{r}");
        assert_eq!(r["cost"]["prices"]["sandbox_per_second"], 0.0, "{r}");
        total += usd;
    }
    assert_eq!(env.result("fails")["status"], "failed");
    assert!(env.result("fails")["cost"]["usd"].as_f64().unwrap() > 0.0);
    let s = summary(&env);
    assert!(
        (s["spend"]["cost_usd"].as_f64().unwrap() - total).abs() < 1e-6,
        "{s}"
    );

    // A cap below one task's cost: the first task runs (nothing is known of a task's cost
    // before one finishes), the rest are skipped.
    let cap = format!("{}", total / 8.0);
    let env = Env::new();
    let tasks = env.write_tasks(&same_tasks(3));
    let o = env.eval(
        &tasks,
        &[&["-j", "1", "--max-cost", &cap][..], &prices].concat(),
    );
    assert_eq!(o.status.code(), Some(BUDGET_STOPPED), "{}", text(&o));
    let skipped = env
        .results()
        .into_iter()
        .filter(|r| r["status"] == "skipped")
        .count();
    assert_eq!(skipped, 2);
    assert_eq!(summary(&env)["stopped_by"], "cost");
}

#[test]
fn a_hard_cap_cancels_running_tasks() {
    let env = Env::new();
    let sleeper = |id: &str| {
        task(
            id,
            r#""timeout_s": 120, "model_script": [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}]"#,
        )
    };
    // Two workers take two tasks, which sleep far past the cap; the cap cancels them, and
    // keeps the other two from starting.
    let tasks = env.write_tasks(&[sleeper("a"), sleeper("b"), sleeper("c"), sleeper("d")]);
    let mut child = env.spawn_eval(
        &tasks,
        &["-j", "2", "--max-sandbox-seconds", "2", "--max-cost-hard"],
    );
    // Far less than the tool calls' 60 s: a bound on a hang, not on speed.
    let status = wait_bounded(&mut child, Duration::from_secs(45));
    assert_eq!(status.code(), Some(BUDGET_STOPPED));
    let results = env.results();
    let status = |s: &str| results.iter().filter(|r| r["status"] == s).count();
    assert_eq!(
        (status("cancelled"), status("skipped")),
        (2, 2),
        "{results:?}"
    );
    assert_eq!(summary(&env)["stopped_by"], "sandbox_seconds");
    // Every record that did not pass says why, in the record.
    for r in results.iter().filter(|r| r["status"] == "cancelled") {
        let error = r["error"].as_str().unwrap_or_default();
        assert!(error.contains("--max-sandbox-seconds"), "{r}");
        // Cancelled at the cap, two sandbox-seconds in, not at some later check.
        let episode = r["timings"]["episode"].as_f64().unwrap();
        assert!(
            episode < 10.0,
            "cancelled {episode} s into its episode: {r}"
        );
    }
    for r in results.iter().filter(|r| r["status"] == "skipped") {
        assert!(r["error"].as_str().is_some_and(|e| !e.is_empty()), "{r}");
    }
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn caps_without_what_they_need_are_usage_errors() {
    let env = Env::new();
    let tasks = env.write_tasks(&same_tasks(1));
    let bad_prices = env.path("prices.toml");
    std::fs::write(&bad_prices, "[models.m]\ninput = 1.0\n").unwrap();
    let bad = bad_prices.to_str().unwrap();
    for (args, says) in [
        (&["--max-cost", "1"][..], "--max-cost needs prices"),
        (&["--max-cost-hard"], "--max-cost-hard needs a cap"),
        (&["--max-cost", "1", "--prices", bad], "prices.toml"),
        (&["--max-cost", "1", "--price-in", "1"], "--price-out"),
        (&["--max-tokens", "0"], "--max-tokens"),
        (&["--max-cost=-1"], "--max-cost"),
    ] {
        let o = env.eval(&tasks, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(env.results().is_empty());
}
