//! Every result says what produced it (`provenance`), and `--resume` refuses to mix results
//! of another harness, runner or model unless asked to.

use serde_json::Value;
use sha2::{Digest, Sha256};

mod support;

use support::{task, text, Env, SUBMIT};

#[test]
fn every_record_and_the_summary_name_what_produced_them() {
    let env = Env::new();
    // A comment and a blank line first, so a task's line is not its index.
    let lines = [
        "// two tasks".to_string(),
        String::new(),
        task("a", &format!(r#""model_script": [{SUBMIT}]"#)),
        task("b", &format!(r#""model_script": [{SUBMIT}]"#)),
    ];
    let tasks = env.write_tasks(&lines);
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let file_digest = {
        let hash = Sha256::digest(std::fs::read(&tasks).unwrap());
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    };
    for (id, line) in [("a", 3), ("b", 4)] {
        let p = env.result(id)["provenance"].clone();
        assert_eq!(p["wmo_e2b"], env!("CARGO_PKG_VERSION"), "{p}");
        assert!(p["runner"].as_str().unwrap().starts_with("sha256:"), "{p}");
        assert_eq!(p["harness"], "builtin", "{p}");
        assert!(p.get("harness_digest").is_none(), "{p}");
        assert_eq!(p["environment"], "sandbox", "{p}");
        assert_eq!(p["backend"], "local", "{p}");
        assert!(p.get("template").is_none(), "{p}");
        assert_eq!(p["model"], "scripted", "{p}");
        assert!(p.get("provider_host").is_none(), "{p}");
        assert_eq!(p["tasks_file"]["sha256"], file_digest.as_str(), "{p}");
        assert_eq!(p["tasks_file"]["line"], line, "{p}");
    }
    let summary: Value =
        serde_json::from_slice(&std::fs::read(env.out().join("summary.json")).unwrap()).unwrap();
    let p = &summary["provenance"];
    assert_eq!(p["runner"], env.result("a")["provenance"]["runner"]);
    assert!(p["tasks_file"].get("line").is_none(), "{p}");
}

#[test]
fn resume_refuses_results_of_another_harness_unless_mixing_is_asked_for() {
    let env = Env::new();
    let first = task("a", &format!(r#""model_script": [{SUBMIT}]"#));
    let tasks = env.write_tasks(std::slice::from_ref(&first));
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // A user harness doing what the builtin loop does: submit.
    let harness = env.path("harness");
    std::fs::create_dir_all(&harness).unwrap();
    std::fs::write(
        harness.join("agent.mjs"),
        "export async function runEpisode(ctx) { ctx.submit(\"ok\"); }\n",
    )
    .unwrap();
    let tasks = env.write_tasks(&[first, task("b", &format!(r#""model_script": [{SUBMIT}]"#))]);
    let h = harness.to_str().unwrap();
    let o = env.eval(&tasks, &["--resume", "--harness", h]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("harness builtin") && err.contains("--allow-mixed"),
        "{err}"
    );
    assert_eq!(env.results().len(), 1);

    let o = env.eval(&tasks, &["--resume", "--harness", h, "--allow-mixed"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(env.result("b")["provenance"]["harness"], "user");
    let digest = env.result("b")["provenance"]["harness_digest"].clone();
    assert!(digest.as_str().unwrap().starts_with("sha256:"), "{digest}");
}

/// An edited harness is another harness: resuming with it is refused, naming its digest,
/// unless `--allow-mixed`.
#[test]
fn resume_refuses_an_edited_harness() {
    let env = Env::new();
    let harness = env.path("harness");
    std::fs::create_dir_all(&harness).unwrap();
    let agent = |answer: &str| {
        let code = format!("export async function runEpisode(ctx) {{ ctx.submit({answer:?}); }}\n");
        std::fs::write(harness.join("agent.mjs"), code).unwrap();
    };
    agent("first");
    let h = harness.to_str().unwrap();
    let one = [task("a", "")];
    let o = env.eval(&env.write_tasks(&one), &["--harness", h]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    agent("edited");
    let two = [task("a", ""), task("b", "")];
    let o = env.eval(&env.write_tasks(&two), &["--resume", "--harness", h]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("harness_digest"), "{err}");
    assert_eq!(env.results().len(), 1);
}
