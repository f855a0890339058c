//! `project create --network`: the project's sandbox, and every sandbox that replaces it,
//! gets the network asked for.

use std::process::Output;

mod support;

use serde_json::Value;
use support::{text, Env};

fn exec(env: &Env, name: &str, command: &str) -> Output {
    env.run(&["project", "exec", name, "--shell", command])
}

fn interfaces(env: &Env, name: &str) -> String {
    let o = exec(
        env,
        name,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn a_project_keeps_its_network_across_replacements() {
    let env = Env::new();
    let o = env.run(&["project", "create", "locked", "--network", "none"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(interfaces(&env, "locked"), "lo");

    let o = env.run(&["project", "create", "open", "--network", "internet"]);
    if text(&o).contains("--network internet needs") {
        eprintln!("skipped the internet project: {}", text(&o));
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(interfaces(&env, "open"), "lo tap0");
    // Its sandbox killed under it, the next command's replacement has the same network.
    let o = env.run(&["project", "list", "--json"]);
    let list: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let id = list
        .iter()
        .find(|p| p["name"] == "open")
        .and_then(|p| p["sandbox_id"].as_str())
        .unwrap()
        .to_string();
    let o = env.run(&["sandbox", "kill", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(interfaces(&env, "open"), "lo tap0");
}
