//! `eval --attempts K` end to end on the local backend (the real binary and runner, the
//! scripted model): K records per task, each attempt on a sandbox proven clean, `--resume`
//! running only the attempts missing, and `report`'s pass@k read back as values.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

mod support;

use support::{report, report_json, task, text, Env, SUBMIT};

/// (id, attempt) of every record, sorted, with how many times each is there.
fn attempts_of(results: &[Value]) -> BTreeMap<(String, u64), usize> {
    let mut seen = BTreeMap::new();
    for r in results {
        let id = r["id"].as_str().unwrap().to_string();
        let attempt = r["attempt"]
            .as_u64()
            .unwrap_or_else(|| panic!("no attempt: {r}"));
        *seen.entry((id, attempt)).or_insert(0) += 1;
    }
    seen
}

/// Every one of `ids` × 1..=k recorded exactly once.
fn each_once(ids: &[&str], k: u64) -> BTreeMap<(String, u64), usize> {
    ids.iter()
        .flat_map(|id| (1..=k).map(move |a| ((id.to_string(), a), 1)))
        .collect()
}

fn passing(ids: &[&str]) -> Vec<String> {
    ids.iter()
        .map(|id| task(id, &format!(r#""model_script": [{SUBMIT}]"#)))
        .collect()
}

/// The last JSON line of a `--json` eval: its summary.
fn summary_of(stdout: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stdout);
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "summary", "{last}");
    last["summary"].clone()
}

#[test]
fn each_attempt_runs_on_a_sandbox_proven_clean() {
    let env = Env::new();
    // Passes only where no earlier attempt's marker is found: in /tmp, the home, the
    // workspace. One worker, so attempts 2 and 3 get the sandbox attempt 1 left, reset.
    let work = "rm -f out.txt; test ! -e /tmp/marker && test ! -e ~/marker && test ! -e marker \
                && touch /tmp/marker ~/marker marker && echo fresh > out.txt; echo ran";
    let step = json!({"tool_calls": [{"name": "bash", "arguments": {"command": work}}]});
    let tasks = env.write_tasks(&[task(
        "marker",
        &format!(
            r#""verify": "test \"$(cat out.txt)\" = fresh", "model_script": [{step}, {SUBMIT}]"#
        ),
    )]);
    let o = env.eval(
        &tasks,
        &["--attempts", "3", "-j", "1", "--isolation", "bwrap"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let results = env.results();
    assert_eq!(attempts_of(&results), each_once(&["marker"], 3));
    for r in &results {
        assert_eq!(r["status"], "passed", "{r}");
    }
    // The sandbox was reused, so its reset is what kept the markers away.
    let reused: Vec<&Value> = results.iter().map(|r| &r["sandbox"]["reused"]).collect();
    assert_eq!(
        reused.iter().filter(|r| **r == true).count(),
        2,
        "{results:?}"
    );
    // Each attempt an episode of its own, with a transcript of its own.
    let transcripts = env.out().join("transcripts");
    for path in [
        transcripts.join("marker.jsonl"),
        transcripts.join("attempt-2/marker.jsonl"),
        transcripts.join("attempt-3/marker.jsonl"),
    ] {
        let t = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        assert_eq!(t.matches("\"attempt 1\"").count(), 1, "{path:?}: {t}");
    }
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("1 task × 3 attempts: 3 passed"), "{stdout}");
    let summary: Value =
        serde_json::from_slice(&std::fs::read(env.out().join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        (&summary["attempts"], &summary["tasks"], &summary["total"]),
        (&json!(3), &json!(1), &json!(3)),
        "{summary}"
    );
    let r = report_json(&env, &[env.out().to_str().unwrap()]);
    let p = r.summary.pass_at_k.expect("pass@k of three attempts");
    let values: Vec<Option<f64>> = p.overall.iter().map(|a| a.value).collect();
    assert_eq!(values, [Some(1.0); 3]);
}

#[test]
fn resume_after_a_cut_runs_only_the_missing_attempts() {
    let env = Env::new();
    let ids = ["a", "b", "c", "d"];
    let tasks = env.write_tasks(&passing(&ids));
    let o = env.eval(&tasks, &["--attempts", "3", "-j", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(attempts_of(&env.results()), each_once(&ids, 3));

    // What a crash leaves: five whole records and a torn sixth.
    let path = env.out().join("results.jsonl");
    let all = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = all.lines().collect();
    let kept: Vec<Value> = lines[..5]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let torn = &lines[5][..lines[5].len() / 2];
    std::fs::write(&path, lines[..5].join("\n") + "\n" + torn).unwrap();

    let o = env.eval(
        &tasks,
        &["--attempts", "3", "-j", "3", "--resume", "--json"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let summary = summary_of(&o.stdout);
    assert_eq!(summary["already_finished"], 5, "{summary}");
    // The whole run's attempts, and this invocation's share of them.
    assert_eq!(summary["total"], 12, "{summary}");
    let this = &summary["invocations"][1];
    assert_eq!(
        (&this["total"], &this["already_finished"]),
        (&json!(7), &json!(5)),
        "{summary}"
    );
    let text_after = std::fs::read_to_string(&path).unwrap();
    let after: Vec<Value> = text_after
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(attempts_of(&after), each_once(&ids, 3));
    // Append-only: what was kept is still there, first and unchanged.
    assert_eq!(&after[..5], &kept[..]);
}

#[test]
fn raising_k_on_resume_runs_only_the_new_attempts() {
    let env = Env::new();
    let ids = ["x", "y"];
    let tasks = env.write_tasks(&passing(&ids));
    let o = env.eval(&tasks, &["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let before = env.results();
    assert_eq!(attempts_of(&before), each_once(&ids, 1));

    let o = env.eval(&tasks, &["--resume", "--attempts", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("2 tasks × 3 attempts") && stdout.contains("(2 attempts already finished"),
        "{stdout}"
    );
    let after = env.results();
    assert_eq!(attempts_of(&after), each_once(&ids, 3));
    assert_eq!(&after[..2], &before[..]);
    let summary: Value =
        serde_json::from_slice(&std::fs::read(env.out().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["attempts"], 3, "{summary}");

    // Nothing is missing now: another resume runs nothing.
    let o = env.eval(&tasks, &["--resume", "--attempts", "3", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let summary = summary_of(&o.stdout);
    let runs = summary["invocations"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{summary}");
    assert_eq!(runs[2]["total"], 0, "{summary}");
    // The summary still describes the whole run, not the invocation that ran nothing.
    assert_eq!(
        (&summary["total"], &summary["passed"]),
        (&json!(6), &json!(6)),
        "{summary}"
    );
    let wall: f64 = runs
        .iter()
        .map(|r| r["wall_seconds"].as_f64().unwrap())
        .sum();
    assert!(
        (summary["wall_seconds"].as_f64().unwrap() - wall).abs() < 1e-6,
        "{summary}"
    );
    assert!(
        summary["sandboxes"]["count"].as_u64().unwrap() >= 2,
        "{summary}"
    );
    assert_eq!(env.results().len(), 6);
}

#[test]
fn attempts_out_of_bounds_are_refused() {
    let env = Env::new();
    let tasks = env.write_tasks(&passing(&["a"]));
    for k in ["0", "101", "-1", "many"] {
        let o = env.eval(&tasks, &["--attempts", k]);
        assert_eq!(o.status.code(), Some(2), "--attempts {k}: {}", text(&o));
    }
    assert!(!env.out().join("results.jsonl").exists());
}

/// A record as eval writes it, of `id`'s attempt `attempt`.
fn record(id: &str, attempt: Option<u32>, passed: bool) -> String {
    let mut r = json!({
        "id": id,
        "status": if passed { "passed" } else { "failed" },
        "stop_reason": "submit",
    });
    if let Some(a) = attempt {
        r["attempt"] = json!(a);
    }
    r.to_string()
}

fn write_run(dir: &Path, lines: &[String]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("results.jsonl"), lines.join("\n") + "\n").unwrap();
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn report_shows_pass_at_k_of_a_known_mix() {
    let env = Env::new();
    let now = env.path("now");
    // `once` passes 1 of 3, `always` 3 of 3, `never` 0 of 3.
    write_run(
        &now,
        &[
            record("once", Some(1), false),
            record("once", Some(2), true),
            record("once", Some(3), false),
            record("always", Some(1), true),
            record("always", Some(2), true),
            record("always", Some(3), true),
            record("never", Some(1), false),
            record("never", Some(2), false),
            record("never", Some(3), false),
        ],
    );
    let r = report_json(&env, &[now.to_str().unwrap()]);
    let p = r.summary.pass_at_k.clone().expect("pass@k");
    assert_eq!(p.k, 3);
    let once = p.tasks.iter().find(|t| t.id == "once").unwrap();
    assert_eq!((once.n, once.c), (3, 1));
    assert!(close(once.pass_at[0], 1.0 / 3.0), "{once:?}");
    assert!(close(once.pass_at[1], 2.0 / 3.0), "{once:?}");
    assert!(close(once.pass_at[2], 1.0), "{once:?}");
    // Overall: the mean over the three tasks.
    assert!(close(p.at(1), (1.0 / 3.0 + 1.0) / 3.0), "{p:?}");
    assert!(close(p.at(2), (2.0 / 3.0 + 1.0) / 3.0), "{p:?}");
    assert!(close(p.at(3), 2.0 / 3.0), "{p:?}");
    let o = report(&env, &[now.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        shown.contains("pass@1 44.4%, pass@2 55.6%, pass@3 66.7%")
            && shown.contains("once  1/3  33.3% 66.7% 100.0%")
            && shown.contains("9 attempts of 3 tasks"),
        "{shown}"
    );

    // Compared with a run of two attempts: pass@1 and pass@2 only.
    let base = env.path("base");
    write_run(
        &base,
        &[
            record("once", Some(1), false),
            record("once", Some(2), false),
            record("always", Some(1), true),
            record("always", Some(2), true),
            record("never", Some(1), true),
            record("never", Some(2), false),
        ],
    );
    let r = report_json(
        &env,
        &[now.to_str().unwrap(), "--compare", base.to_str().unwrap()],
    );
    let c = r.compare.expect("a comparison");
    let ks: Vec<u32> = c.pass_at_k.iter().map(|d| d.k).collect();
    assert_eq!(ks, [1, 2]);
    // Baseline pass@1: (0 + 1 + 1/2) / 3; pass@2: (0 + 1 + 1) / 3.
    assert!(close(c.pass_at_k[0].delta.baseline, 0.5), "{c:?}");
    assert!(close(c.pass_at_k[1].delta.baseline, 2.0 / 3.0), "{c:?}");
    assert!(close(c.pass_at_k[1].delta.current, 5.0 / 9.0), "{c:?}");
    let o = report(
        &env,
        &[now.to_str().unwrap(), "--compare", base.to_str().unwrap()],
    );
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(shown.contains("  pass@2: "), "{shown}");
    assert!(!shown.contains("  pass@3: "), "{shown}");
}

#[test]
fn a_run_of_one_attempt_reads_as_before() {
    let env = Env::new();
    let old = env.path("old");
    // Records written before attempts existed, and one that says attempt 1.
    write_run(
        &old,
        &[
            record("a", None, true),
            record("b", None, false),
            record("c", Some(1), true),
        ],
    );
    let o = report(&env, &[old.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let printed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(printed["summary"].get("pass_at_k").is_none(), "{printed}");
    assert_eq!(printed["summary"]["tasks"], 3, "{printed}");
    assert!(printed["failures"][0].get("attempt").is_none(), "{printed}");
    let o = report(&env, &[old.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        !shown.contains("pass@") && shown.contains(", 3 tasks"),
        "{shown}"
    );
}

#[test]
fn a_tasks_attempts_share_its_shard_and_merge_back() {
    let env = Env::new();
    let ids = ["p", "q", "r", "s", "t", "u"];
    let tasks = env.write_tasks(&passing(&ids));
    for shard in ["0/2", "1/2"] {
        let o = env.eval(&tasks, &["--attempts", "2", "--shard", shard, "-j", "3"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let in_shard = |i: u32| {
        attempts_of(&support::results_in(
            &env.out().join(format!("shard-{i}-of-2")),
        ))
    };
    let (zero, one) = (in_shard(0), in_shard(1));
    for id in ids {
        let here = |m: &BTreeMap<(String, u64), usize>| {
            (1..=2)
                .filter(|&a| m.contains_key(&(id.to_string(), a)))
                .count()
        };
        assert!(
            (here(&zero), here(&one)) == (2, 0) || (here(&zero), here(&one)) == (0, 2),
            "{id}: {zero:?} {one:?}"
        );
    }
    let out = env.out();
    let r = report_json(&env, &[out.to_str().unwrap()]);
    assert_eq!(r.summary.tasks, 12, "{:?}", r.summary);
    assert!(r.notes.is_empty(), "{:?}", r.notes);
    let p = r.summary.pass_at_k.expect("pass@k");
    assert_eq!((p.k, p.tasks.len()), (2, 6));
    assert!(p.tasks.iter().all(|t| (t.n, t.c) == (2, 2)), "{p:?}");

    let atif = env.path("atif");
    let o = report(
        &env,
        &[out.to_str().unwrap(), "--atif", atif.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for id in ids {
        assert!(atif.join(format!("{id}.json")).is_file(), "{id}");
        assert!(atif.join(format!("attempt-2/{id}.json")).is_file(), "{id}");
    }
    // The page has a row per attempt, each with its own conversation.
    let page = env.path("report.html");
    let o = report(
        &env,
        &[out.to_str().unwrap(), "--html", page.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches(r#""attempt":2"#).count(), 6);
    assert!(
        !html.contains("no transcript"),
        "a later attempt lost its transcript"
    );
}
