//! Tasks that name an image run on it, on the local backend: pulled from a real registry
//! and unpacked before any sandbox starts, each task's commands and verifier on its own
//! environment's root, tasks of different environments never sharing a sandbox, and each
//! record pinned to the image's digest.

#[path = "support/registry.rs"]
mod registry;
mod support;

use serde_json::json;
use support::{text, Env};

/// An image tree: busybox as `/bin/sh` and a few applets, `/etc/flavor` saying `flavor`,
/// and the working directory `/app`.
fn tree(dir: &std::path::Path, flavor: &str) -> std::path::PathBuf {
    let root = dir.join(flavor);
    for d in ["bin", "etc", "app"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in [
        "sh", "cat", "id", "test", "pwd", "echo", "ls", "mkdir", "rm",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/flavor"), flavor).unwrap();
    root
}

fn task(id: &str, image: Option<&str>, verify: &str) -> String {
    let mut t = json!({
        "id": id,
        "instruction": "x",
        "model_script": [{"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}],
        "verify": verify,
    });
    if let Some(image) = image {
        t["image"] = json!(image);
    }
    t.to_string()
}

#[test]
fn each_task_runs_on_its_own_image_and_its_record_names_the_digest() {
    if !support::local::image_roots_available() {
        return;
    }
    let registry = registry::Registry::start();
    let buildah = registry::Buildah::new();
    let trees = tempfile::tempdir().unwrap();
    for flavor in ["mint", "lime"] {
        let config = ["--env", &format!("FLAVOR={flavor}"), "--workingdir", "/app"];
        let repo = format!("env/{flavor}:1");
        buildah.push_tree(&registry.addr, &repo, &tree(trees.path(), flavor), &config);
    }
    let image = |flavor: &str| format!("{}/env/{flavor}:1", registry.addr);
    let on = |flavor: &str| {
        format!(
            "[ \"$(cat /etc/flavor)\" = {flavor} ] && [ \"$FLAVOR\" = {flavor} ] && \
             [ \"$(pwd)\" = /app ] && [ \"$(id -u)\" = 1001 ] && [ ! -e /usr/bin/env ]"
        )
    };
    let mint = image("mint");
    let lime = image("lime");
    let tasks = [
        task("mint-1", Some(&mint), &on("mint")),
        task("lime-1", Some(&lime), &on("lime")),
        // Its files and setup land in the image's working directory.
        {
            let mut t: serde_json::Value =
                serde_json::from_str(&task("mint-2", Some(&mint), &on("mint"))).unwrap();
            t["files"] = json!({"notes/a.txt": "from the task"});
            t["setup"] = json!("echo set > done.txt");
            t["verify"] = json!(format!(
                "{} && [ \"$(cat /app/notes/a.txt)\" = 'from the task' ] && [ -f /app/done.txt ]",
                on("mint")
            ));
            t.to_string()
        },
        task("host", None, "[ ! -e /etc/flavor ] && [ -x /usr/bin/env ]"),
        // A task that asks for the other image's file fails: environments do not mix.
        task("lime-wrong", Some(&lime), &on("mint")),
    ];
    let env = Env::new();
    let path = env.write_tasks(&tasks);
    let o = env.eval(&path, &["--harness", "nop", "-j", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    for id in ["mint-1", "lime-1", "mint-2", "host"] {
        assert_eq!(
            env.result(id)["status"],
            "passed",
            "{id}: {}",
            env.result(id)
        );
    }
    assert_eq!(env.result("lime-wrong")["status"], "failed");
    let sandbox = |id: &str| env.result(id)["sandbox"]["id"].clone();
    assert_ne!(sandbox("mint-1"), sandbox("lime-1"));
    assert_ne!(sandbox("lime-1"), sandbox("host"));
    let pinned = env.result("mint-1")["provenance"]["image"].clone();
    let pinned = pinned.as_str().unwrap_or_default().to_string();
    assert!(pinned.starts_with(&format!("{mint}@sha256:")), "{pinned}");
    assert_eq!(env.result("mint-2")["provenance"]["image"], pinned.as_str());
    assert!(env.result("host")["provenance"].get("image").is_none());
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn an_agent_cannot_change_what_its_image_gives_the_verifier() {
    if !support::local::image_roots_available() {
        return;
    }
    let registry = registry::Registry::start();
    let buildah = registry::Buildah::new();
    let trees = tempfile::tempdir().unwrap();
    let config = ["--workingdir", "/app"];
    buildah.push_tree(
        &registry.addr,
        "env/mint:1",
        &tree(trees.path(), "mint"),
        &config,
    );
    let image = format!("{}/env/mint:1", registry.addr);
    // The verify passes only if the agent changed the image's files or programs, which it
    // tries every way its user could: overwrite, replace, shadow on PATH.
    let attack = "echo forged > /etc/flavor; rm -f /bin/cat;                   printf '#!/bin/sh\necho forged\n' > /bin/cat;                   mkdir -p /usr/local/bin && printf '#!/bin/sh\necho forged\n' > /usr/local/bin/cat;                   chmod +x /usr/local/bin/cat; true";
    let forger = json!({
        "id": "forger",
        "instruction": "x",
        "image": image,
        "model_script": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": attack}}]},
            {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]},
        ],
        "verify": "[ \"$(cat /etc/flavor)\" = forged ]",
    });
    let env = Env::new();
    let path = env.write_tasks(&[forger.to_string()]);
    let o = env.eval(&path, &["--model", "scripted", "-j", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("forger");
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["tool_calls"], 1, "{r}");
}

#[test]
fn an_image_that_cannot_be_had_stops_the_run_before_any_sandbox() {
    let registry = registry::Registry::start();
    let missing = format!("{}/env/missing:1", registry.addr);
    let env = Env::new();
    let path = env.write_tasks(&[task("t", Some(&missing), "true")]);
    let o = env.eval(&path, &["--harness", "nop"]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("env/missing"), "{}", text(&o));
    assert!(env.results().is_empty());
    assert!(env.sandbox_list().is_empty());
}
