//! `wmo-e2b report` over several directories: shards of one run merged (duplicate ids,
//! absent shards, tasks no shard ran, and shards of different provenance named), and a run
//! compared with a baseline.

use std::path::Path;

use serde_json::{json, Value};
use wmo_e2b::analysis::notes::ShardValue;
use wmo_e2b::analysis::Note;

mod support;

use support::{report, report_json, text, Env};

fn lines_of(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn shards_merge_and_what_does_not_add_up_is_named() {
    let env = Env::new();
    // Two tasks for each of three shards.
    let ids: Vec<String> = (0..3)
        .flat_map(|shard| {
            (0..)
                .map(|n| format!("t{n}"))
                .filter(move |id| wmo_e2b::task::shard_of(id, 3) == shard)
                .take(2)
        })
        .collect();
    let lines: Vec<String> = ids
        .iter()
        .map(|id| support::task(id, &format!(r#""model_script": [{}]"#, support::SUBMIT)))
        .collect();
    let tasks = env.write_tasks(&lines);
    let run = env.path("run");
    // Two of three shards ran; the third never did.
    for i in 0..2 {
        let o = env
            .cmd(&["eval", "--tasks"])
            .arg(&tasks)
            // A sharded eval writes its shard-I-of-N/ inside the shared --out.
            .arg("--out")
            .arg(&run)
            .args(["--shard", &format!("{i}/3")])
            .output()
            .unwrap();
        assert!(matches!(o.status.code(), Some(0)), "{}", text(&o));
    }
    let (s0, s1) = (run.join("shard-0-of-3"), run.join("shard-1-of-3"));
    let ids_in = |dir: &Path| -> Vec<String> {
        lines_of(&dir.join("results.jsonl"))
            .iter()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let (ids0, ids1) = (ids_in(&s0), ids_in(&s1));
    assert_eq!((ids0.len(), ids1.len()), (2, 2));
    // Shard 1 also has shard 0's first task (a host that ran the wrong shard), and was made
    // with another model.
    let dup = ids0[0].clone();
    let mut one = lines_of(&s1.join("results.jsonl"));
    one.push(lines_of(&s0.join("results.jsonl"))[0].clone());
    let other = |l: &String| l.replace("\"model\":\"scripted\"", "\"model\":\"other\"");
    let one: Vec<String> = one.iter().map(other).collect();
    std::fs::write(s1.join("results.jsonl"), one.join("\n") + "\n").unwrap();
    std::fs::copy(
        s0.join(format!("transcripts/{dup}.jsonl")),
        s1.join(format!("transcripts/{dup}.jsonl")),
    )
    .unwrap();
    let summary = std::fs::read_to_string(s1.join("summary.json")).unwrap();
    let summary = summary.replace("\"model\": \"scripted\"", "\"model\": \"other\"");
    std::fs::write(s1.join("summary.json"), summary).unwrap();

    let dir = run.to_str().unwrap();
    let r = report_json(&env, &[dir, "--tasks", tasks.to_str().unwrap()]);
    let (l0, l1) = (s0.display().to_string(), s1.display().to_string());
    assert_eq!(r.shards, [l0.clone(), l1.clone()]);
    assert_eq!(
        r.summary.tasks,
        ids0.len() + ids1.len(),
        "the duplicate counts once"
    );
    assert!(r.notes.contains(&Note::DuplicateId {
        id: dup.clone(),
        shards: vec![l0.clone(), l1.clone()],
    }));
    assert!(r.notes.contains(&Note::ProvenanceMismatch {
        field: "model".into(),
        values: vec![
            ShardValue {
                shard: l0.clone(),
                value: "scripted".into()
            },
            ShardValue {
                shard: l1.clone(),
                value: "other".into()
            },
        ],
    }));
    assert!(r.notes.contains(&Note::MissingShard {
        dir: run.join("shard-2-of-3").display().to_string(),
    }));
    // The third shard's tasks have no result anywhere.
    assert!(r.notes.contains(&Note::MissingTasks {
        count: 2,
        ids: ids[4..].to_vec(),
        tasks_file: tasks.display().to_string(),
    }));
    assert_eq!(r.notes.len(), 4, "{:?}", r.notes);

    // The shards given one by one merge the same way.
    let r2 = report_json(&env, &[&l0, &l1]);
    assert_eq!(r2.summary, r.summary);
    let o = report(&env, &[dir]);
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("shards: 2"), "{t}");
    assert!(t.contains("shards differ in provenance `model`"), "{t}");
    assert!(t.contains(&format!("task {dup:?} is in 2 shards")), "{t}");
}

fn record(id: &str, status: &str, stop: &str, input: u64, seconds: f64) -> String {
    json!({"id": id, "status": status, "stop_reason": stop, "answer": "",
        "verify": null, "turns": 1, "tool_calls": 0,
        "tokens": {"input": input, "output": 10, "cached_input": 0, "reasoning": 0, "calls": 1},
        "sandbox": {"id": null, "reused": false, "seconds": seconds},
        "timings": {"acquire": 0.0, "episode": seconds, "verify": 0.0},
        "attempts": 1, "retries": {"transport": 0, "provider": 0}, "error": null,
        "cost": {"usd": 0.5, "prices": {}}})
    .to_string()
}

fn write_run(dir: &Path, records: &[String]) {
    std::fs::create_dir_all(dir.join("transcripts")).unwrap();
    std::fs::write(dir.join("results.jsonl"), records.join("\n") + "\n").unwrap();
    std::fs::write(dir.join("summary.json"), r#"{"wall_seconds": 10.0}"#).unwrap();
    for r in records {
        let id = serde_json::from_str::<Value>(r).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        std::fs::write(dir.join(format!("transcripts/{id}.jsonl")), "").unwrap();
    }
}

#[test]
fn compare_names_flips_new_and_missing_tasks_and_the_changes() {
    let env = Env::new();
    let (base, cur) = (env.path("base"), env.path("cur"));
    write_run(
        &base,
        &[
            record("regressed", "passed", "submit", 100, 1.0),
            record("fixed", "failed", "max_turns", 100, 1.0),
            record("steady", "passed", "submit", 100, 1.0),
            record("interrupted", "passed", "submit", 100, 1.0),
            record("gone", "passed", "submit", 100, 1.0),
        ],
    );
    write_run(
        &cur,
        &[
            record("regressed", "failed", "no_tool_call", 200, 3.0),
            record("fixed", "passed", "submit", 200, 3.0),
            record("steady", "passed", "submit", 200, 3.0),
            // Cancelled is no verdict: not a flip.
            record("interrupted", "cancelled", "cancelled", 200, 3.0),
            record("added", "passed", "submit", 200, 3.0),
        ],
    );
    let (b, c) = (base.to_str().unwrap(), cur.to_str().unwrap());
    let r = report_json(&env, &[c, "--compare", b]);
    let cmp = r.compare.as_ref().unwrap();
    let ids = |flips: &[wmo_e2b::analysis::compare::Flip]| -> Vec<String> {
        flips.iter().map(|f| f.id.clone()).collect()
    };
    assert_eq!(ids(&cmp.now_failing), ["regressed"]);
    assert_eq!(cmp.now_failing[0].before, "passed/submit");
    assert_eq!(cmp.now_failing[0].after, "failed/no_tool_call");
    assert_eq!(ids(&cmp.now_passing), ["fixed"]);
    assert_eq!(cmp.new, ["added"]);
    assert_eq!(cmp.missing, ["gone"]);
    // Baseline 4 of 5 judged passed; now 3 of 4.
    assert_eq!(cmp.pass_rate.baseline, Some(0.8));
    assert_eq!(cmp.pass_rate.current, Some(0.75));
    assert!((cmp.pass_rate.change.unwrap() + 0.05).abs() < 1e-9);
    assert_eq!(cmp.tokens.baseline, Some(550.0));
    assert_eq!(cmp.tokens.current, Some(1050.0));
    assert_eq!(cmp.task_seconds_p50.change, Some(2.0));
    assert_eq!(cmp.wall_seconds.change, Some(0.0));
    assert_eq!(r.summary.cost_usd, Some(2.5));
    assert_eq!(r.summary.costed_tasks, 5);

    let o = report(&env, &[c, "--compare", b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("pass rate: 80.0% -> 75.0% (-5.0%)"), "{t}");
    // Token counts are whole numbers.
    let tokens = t
        .lines()
        .find(|l| l.contains("tokens:"))
        .unwrap_or_default();
    assert!(!tokens.contains('.'), "{tokens}");
    assert!(
        t.contains("regressed  passed/submit -> failed/no_tool_call"),
        "{t}"
    );
    assert!(t.contains("not passed -> passed (1):\n    fixed"), "{t}");
    assert!(t.contains("new (not in the baseline) (1): added"), "{t}");
    assert!(
        t.contains("missing (only in the baseline) (1): gone"),
        "{t}"
    );
    assert!(t.contains("cost: $2.5000"), "{t}");
}
