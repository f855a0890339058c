//! `eval --backend e2b` on tasks with an `image`: each image becomes a template, built through
//! E2B's template API (the emulator building it with buildah from a loopback registry), named
//! by its content and built once; the task runs in the image's working directory.

use std::path::Path;

use serde_json::json;

#[path = "support/registry.rs"]
mod registry;
mod support;

use registry::{require, Buildah, Registry};
use support::e2b_cli::{eval_cmd, Emulator};
use support::{text, Env};

/// An image of busybox (every applet, and a `/bin/bash` that runs it, as E2B's commands start
/// with bash) with `user` as uid 1000, a marker file, and `/app` as its working directory.
fn push_image(registry: &Registry, repo_tag: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in ["bin", "etc", "tmp", "app", "home/user"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    let list = std::process::Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" && applet != "bash" {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
    }
    std::fs::write(
        root.join("bin/bash"),
        "#!/bin/sh\nexec /bin/busybox sh \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        root.join("bin/bash"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n\
         app:x:1000:1000::/home/app:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        root.join("etc/group"),
        "root:x:0:\nuser:x:1000:\napp:x:1000:\n",
    )
    .unwrap();
    std::fs::write(root.join("etc/wmo-image-marker"), "on the image\n").unwrap();
    std::fs::write(root.join("app/given.txt"), "from the image\n").unwrap();
    Buildah::new().push_tree(
        &registry.addr,
        repo_tag,
        root,
        &["--env", "PATH=/bin", "--workingdir", "/app"],
    );
    format!("{}/{repo_tag}", registry.addr)
}

fn tasks(env: &Env, image: &str) -> std::path::PathBuf {
    let step = |command: &str| json!({"tool_calls": [{"name": "bash", "arguments": {"command": command}}]});
    let submit = json!({"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]});
    env.write_tasks(&[
        json!({
            "id": "on-image", "instruction": "x", "image": image,
            "files": {"in.txt": "3 4"},
            // The template carries the runner's Node.js, which runs on an image with no
            // C library of its own.
            "verify": "test \"$(pwd)\" = /app && test -f /etc/wmo-image-marker \
                       && test \"$(cat out.txt)\" = 7 && grep -q image given.txt \
                       && test ! -e /lib/libc.so.6 \
                       && test \"$(/opt/wmo-e2b-node/bin/node -p 6*7)\" = 42",
            "model_script": [step("echo $((3 + 4)) > out.txt"), submit],
        })
        .to_string(),
        json!({
            "id": "on-base", "instruction": "x",
            "verify": "test ! -f /etc/wmo-image-marker && test -s done.txt",
            "model_script": [step("echo done > done.txt"), submit],
        })
        .to_string(),
    ])
}

/// A loopback registry holding an image pushed as `repo_tag`, and an emulator building
/// templates from it on a scratch environment's state.
struct Scene {
    _registry: Registry,
    image: String,
    env: Env,
    log: std::path::PathBuf,
    emu: Emulator,
}

impl Scene {
    fn new(repo_tag: &str) -> Scene {
        require("buildah", "buildah");
        let registry = Registry::start();
        let image = push_image(&registry, repo_tag);
        let env = Env::new();
        let log = env.path("emulator.log");
        let emu = Emulator::start_on(&env, &[], &log);
        Scene {
            _registry: registry,
            image,
            env,
            log,
            emu,
        }
    }
}

fn build_requests(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("POST /v3/templates"))
        .count()
}

#[test]
fn an_image_task_runs_on_its_own_template_built_once() {
    let scene = Scene::new("wmo/app:1");
    let (env, log, emu, image) = (&scene.env, &scene.log, &scene.emu, &scene.image);
    let tasks = tasks(env, image);

    let o = eval_cmd(env, emu, &tasks, &env.out(), &["-j", "2"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rs = env.results();
    assert_eq!(rs.len(), 2);
    assert!(rs.iter().all(|r| r["status"] == "passed"), "{rs:?}");
    let on_image = rs.iter().find(|r| r["id"] == "on-image").unwrap();
    let pinned = on_image["provenance"]["image"].as_str().unwrap_or("");
    assert!(
        pinned.starts_with(&format!("{image}@sha256:")),
        "{on_image}"
    );
    assert_eq!(build_requests(log), 1, "one build for one image");
    assert_eq!(records(env), 1);

    // Another run on the same content finds the template, and builds nothing.
    let again = env.path("out-again");
    let o = eval_cmd(env, emu, &tasks, &again, &["-j", "2"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(build_requests(log), 1, "the second run built again");
    assert!(emu.live().is_empty(), "{:?}", emu.live());
}

fn records(env: &Env) -> usize {
    std::fs::read_dir(env.home().join("e2b-templates"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("json".as_ref()))
        .count()
}

#[test]
fn runs_started_together_build_their_template_once() {
    let scene = Scene::new("wmo/together:1");
    let (env, log, emu, image) = (&scene.env, &scene.log, &scene.emu, &scene.image);
    let tasks = tasks(env, image);
    let runs: Vec<_> = (0..2)
        .map(|i| {
            eval_cmd(env, emu, &tasks, &env.path(&format!("out-{i}")), &[])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for run in runs {
        let o = run.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    assert_eq!(build_requests(log), 1, "both runs built the template");
    assert_eq!(records(env), 1);
    assert!(emu.live().is_empty(), "{:?}", emu.live());
}

#[test]
fn an_image_no_registry_has_stops_the_run_before_any_sandbox() {
    let registry = Registry::start();
    let env = Env::new();
    let log = env.path("emulator.log");
    let emu = Emulator::start_on(&env, &[], &log);
    let missing = format!("{}/wmo/never-pushed:1", registry.addr);
    let tasks = tasks(&env, &missing);
    let o = eval_cmd(&env, &emu, &tasks, &env.out(), &[])
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("never-pushed"), "{}", text(&o));
    assert_eq!(build_requests(&log), 0);
    assert!(emu.live().is_empty());
    assert!(!env.out().join("results.jsonl").exists());
}

#[test]
fn harbor_dockerfiles_become_templates_and_their_verdicts_hold() {
    let scene = Scene::new("wmo/base:1");
    let (env, log, emu, base) = (&scene.env, &scene.log, &scene.emu, &scene.image);
    let dataset = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/harbor/built");
    let build_arg = format!("BASE={base}");
    let run = |harness: &str, out: &Path| {
        let extra = ["--harness", harness, "-j", "2", "--build-arg", &build_arg];
        let o = eval_cmd(env, emu, &dataset, out, &extra).output().unwrap();
        let results = std::fs::read_to_string(out.join("results.jsonl")).unwrap_or_default();
        (o, results)
    };
    let (o, results) = run("oracle", &env.out());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rs: Vec<serde_json::Value> = results
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rs.len(), 3);
    assert!(rs.iter().all(|r| r["status"] == "passed"), "{rs:?}");
    for r in &rs {
        let pinned = r["provenance"]["image"].as_str().unwrap_or("");
        assert!(
            pinned.starts_with("dockerfile:") && pinned.contains("@sha256:"),
            "{r}"
        );
    }
    assert_eq!(build_requests(log), 3, "one template per Dockerfile");

    // The same templates, and an agent that does nothing: every verdict fails.
    let (o, results) = run("nop", &env.path("out-nop"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(results.lines().count(), 3);
    assert!(!results.contains("\"passed\""), "{results}");
    assert_eq!(build_requests(log), 3, "the second run built again");
    assert!(emu.live().is_empty(), "{:?}", emu.live());
}

#[test]
fn a_dockerfile_tasks_environment_reaches_its_commands_and_its_verifier() {
    let scene = Scene::new("wmo/base:1");
    let (env, log, emu, base) = (&scene.env, &scene.log, &scene.emu, &scene.image);
    let ctx = env.path("env");
    std::fs::create_dir_all(ctx.join("data/nested")).unwrap();
    std::fs::write(ctx.join("data/nested/x.txt"), "copied\n").unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "ARG BASE\nFROM ${BASE}\nCOPY data/ /srv/data/\nENV MARKER=from-dockerfile\n\
         RUN test -f /srv/data/nested/x.txt\nWORKDIR /srv/work\nCMD [\"sh\"]\n",
    )
    .unwrap();
    let step = json!({"tool_calls": [{"name": "bash", "arguments": {"command": "echo \"$MARKER\" > out.txt"}}]});
    let submit = json!({"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]});
    let tasks = env.write_tasks(&[json!({
        "id": "built", "instruction": "x", "dockerfile": "env/Dockerfile",
        // The Dockerfile's ENV reaches the agent's commands and the verifier alike.
        "verify": "test \"$(pwd)\" = /srv/work && test \"$MARKER\" = from-dockerfile \
                   && test \"$(cat out.txt)\" = from-dockerfile \
                   && test \"$(cat /srv/data/nested/x.txt)\" = copied",
        "model_script": [step, submit],
    })
    .to_string()]);
    let build_arg = format!("BASE={base}");
    let o = eval_cmd(env, emu, &tasks, &env.out(), &["--build-arg", &build_arg])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rs = env.results();
    assert_eq!(rs[0]["status"], "passed", "{:?}", rs[0]);
    assert_eq!(build_requests(log), 1);
}
