//! `wmo-e2b project run` on the local backend: an agent's turn through the mirror, within its
//! grant, without network, and host-answered tools that never follow a symlink out.

use serde_json::Value;

mod support;

use support::project::{lies_beside_the_project, stdout, Env};
use support::text;

fn script(env: &Env, steps: Value) -> String {
    let p = env.path(&format!("script-{}.json", rand_suffix()));
    std::fs::write(&p, steps.to_string()).unwrap();
    p.to_str().unwrap().to_string()
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn call(name: &str, args: Value) -> Value {
    serde_json::json!({"tool_calls": [{"name": name, "arguments": args}]})
}

fn events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn an_agent_turn_writes_through_the_mirror_within_its_grant() {
    let env = Env::new();
    let steps = serde_json::json!([
        call(
            "write_file",
            serde_json::json!({"path": "notes/plan.md", "content": "step 1\n"})
        ),
        call(
            "write_file",
            serde_json::json!({"path": "other.md", "content": "nope"})
        ),
        call(
            "write_file",
            serde_json::json!({"path": "../escape.md", "content": "nope"})
        ),
        call("bash", serde_json::json!({"command": "echo hi"})),
        call("read_file", serde_json::json!({"path": "notes/plan.md"})),
        call("submit", serde_json::json!({"answer": "planned"})),
    ]);
    let log = env.path("events.jsonl");
    let o = env.run(&[
        "project",
        "run",
        "demo",
        "--instruction",
        "make a plan",
        "--script",
        &script(&env, steps),
        "--writable",
        "notes/plan.md",
        "--events",
        log.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(stdout(&o), "planned\n");
    let ev = events(&log);
    let results: Vec<&Value> = ev.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 5, "{ev:?}");
    assert_eq!(results[0]["payload"]["is_error"], false);
    assert!(results[1]["payload"]["content"]
        .as_str()
        .unwrap()
        .contains("not writable"));
    assert!(results[2]["payload"]["content"]
        .as_str()
        .unwrap()
        .contains("'..'"));
    assert!(results[3]["payload"]["content"]
        .as_str()
        .unwrap()
        .contains("not available"));
    assert_eq!(results[4]["payload"]["content"], "step 1\n");
    // The granted write went through the mirror; the denied ones touched nothing.
    let o = env.run(&["project", "get", "demo", "notes/plan.md"]);
    assert_eq!(stdout(&o), "step 1\n");
    let o = env.run(&["project", "get", "demo", "other.md"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!env.path("state/projects/demo/mirror/other.md").exists());
    assert!(!lies_beside_the_project(&env, "escape.md"));
}

#[test]
fn bash_in_a_turn_runs_without_network() {
    let env = Env::new();
    let steps = serde_json::json!([
        call(
            "bash",
            serde_json::json!({"command": "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"})
        ),
        call("submit", serde_json::json!({"answer": "ok"})),
    ]);
    let log = env.path("events.jsonl");
    let o = env.run(&[
        "project",
        "run",
        "demo",
        "--instruction",
        "look",
        "--script",
        &script(&env, steps),
        "--allow-bash",
        "--events",
        log.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ev = events(&log);
    let r = ev.iter().find(|e| e["kind"] == "tool_result").unwrap();
    assert_eq!(r["payload"]["content"], "lo\n", "{r}");
}

/// Symlinks the sandbox made to host files (which it cannot see) and to a system directory
/// (which it can): every tool the host answers refuses to follow them, naming the path.
#[test]
fn host_answered_tools_never_follow_a_symlink_out_of_the_sandbox() {
    let env = Env::new();
    let secret = env.path("secret.txt");
    std::fs::write(&secret, "TOP SECRET").unwrap();
    let target = env.path("host.txt");
    std::fs::write(&target, "untouched").unwrap();
    let host_dir = env.path("hostdir");
    std::fs::create_dir(&host_dir).unwrap();
    let o = env.exec(&format!(
        "ln -s {} notes.txt && ln -s {} README.md && ln -s {} out && ln -s /etc secret \
         && mkdir -p real && ln -s ../real/x loop",
        secret.display(),
        target.display(),
        host_dir.display()
    ));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let o = env.run(&["project", "get", "demo", "notes.txt"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!stdout(&o).contains("TOP SECRET"));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("notes.txt"),
        "{}",
        text(&o)
    );
    assert_ne!(env.put("README.md", "pwned").status.code(), Some(0));
    assert_ne!(env.put("out/new.txt", "pwned").status.code(), Some(0));
    let skeleton = env.path("skeleton");
    std::fs::create_dir(&skeleton).unwrap();
    std::fs::write(skeleton.join("a.txt"), "a").unwrap();
    let o = env.run(&[
        "project",
        "stage",
        "demo",
        "--from",
        skeleton.to_str().unwrap(),
        "--to",
        "out/staged",
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    for root in ["secret", "secret/ssl"] {
        let o = env.run(&["project", "snapshot", "demo", root, "--json"]);
        assert_eq!(o.status.code(), Some(2), "{root}: {}", text(&o));
        assert!(stdout(&o).is_empty(), "{root}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("symlink"),
            "{root}: {}",
            text(&o)
        );
    }

    // The same through an agent turn's host-answered tools.
    let steps = serde_json::json!([
        call("read_file", serde_json::json!({"path": "notes.txt"})),
        call(
            "write_file",
            serde_json::json!({"path": "README.md", "content": "pwned"})
        ),
        call("submit", serde_json::json!({"answer": "tried"})),
    ]);
    let log = env.path("events.jsonl");
    let o = env.run(&[
        "project",
        "run",
        "demo",
        "--instruction",
        "read the notes",
        "--script",
        &script(&env, steps),
        "--writable",
        "README.md",
        "--events",
        log.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ev = events(&log);
    let results: Vec<&Value> = ev.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 2, "{ev:?}");
    for (r, path) in results.iter().zip(["notes.txt", "README.md"]) {
        let content = r["payload"]["content"].as_str().unwrap();
        assert_eq!(r["payload"]["is_error"], true, "{r}");
        assert!(content.contains(path) && content.contains("symlink"), "{r}");
        assert!(!content.contains("TOP SECRET"), "{r}");
    }

    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
    assert!(std::fs::read_dir(&host_dir).unwrap().next().is_none());
}
