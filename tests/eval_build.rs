//! Tasks whose environment is a Dockerfile run on the image built from it, on the local
//! backend: built by buildah before any sandbox starts (from a base in a loopback registry,
//! named by `--build-arg`), once per content on the machine, each record pinned to the
//! Dockerfile and the image's digest; a build that fails stops the run naming its log.

#[path = "support/registry.rs"]
mod registry;
mod support;

use std::path::{Path, PathBuf};

use serde_json::json;
use support::{results_in, text, Env};

/// Image roots take an id range of the sandbox's own, which only root gets.
fn is_root() -> bool {
    support::is_root("sandboxes have no id range of their own, and so no image root")
}

fn dataset() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/harbor/built")
}

/// A registry holding the base the fixtures build from, and the `--build-arg` naming it.
fn base() -> (registry::Registry, String) {
    let registry = registry::Registry::start();
    let base = registry::Buildah::new().push_base(&registry.addr, "base:1");
    (registry, format!("BASE={base}"))
}

fn logs_in(out: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(out.join("builds"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn a_dataset_of_dockerfiles_builds_once_passes_under_oracle_and_fails_under_nop() {
    if !is_root() {
        return;
    }
    let (_registry, base) = base();
    let env = Env::new();
    let o = env.eval(
        &dataset(),
        &["--harness", "oracle", "-j", "2", "--build-arg", &base],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let oracle = env.results();
    assert_eq!(oracle.len(), 3, "{oracle:?}");
    for r in &oracle {
        assert_eq!(r["status"], "passed", "{r}");
        assert_eq!(r["reward"], 1.0, "{r}");
        let id = r["id"].as_str().unwrap();
        let pinned = r["provenance"]["image"].as_str().unwrap_or_default();
        let named = format!("dockerfile:{id}/environment/Dockerfile@sha256:");
        assert!(pinned.starts_with(&named), "{r}");
    }
    // Each build's log beside the results.
    let logs = logs_in(&env.out());
    assert_eq!(logs.len(), 3, "{logs:?}");
    assert!(logs.iter().all(|l| l.ends_with(".log")));

    // The same content again (another run, another output directory): nothing is built,
    // and the tasks run on the very images the first run built.
    let out = env.path("nop");
    let mut c = env.cmd(&["eval", "--tasks"]);
    c.arg(dataset()).arg("--out").arg(&out);
    c.args(["--harness", "nop", "-j", "2", "--build-arg", &base]);
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let nop = results_in(&out);
    assert_eq!(nop.len(), 3, "{nop:?}");
    for r in &nop {
        assert_eq!(r["status"], "failed", "{r}");
        assert_eq!(r["reward"], 0.0, "{r}");
        let first = support::result_in(&oracle, r["id"].as_str().unwrap());
        assert_eq!(r["provenance"]["image"], first["provenance"]["image"]);
    }
    assert!(logs_in(&out).is_empty(), "{:?}", logs_in(&out));
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn a_tasks_file_dockerfile_is_built_once_for_its_tasks_and_a_failed_build_stops_the_run() {
    if !is_root() {
        return;
    }
    let (_registry, base) = base();
    let env = Env::new();
    let dir = env.path("envs/marked");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("Dockerfile"),
        "ARG BASE\nFROM ${BASE}\nARG MARK=unset\nRUN echo \"$MARK\" > /marker\n",
    )
    .unwrap();
    let task = |id: &str, dockerfile: &str| {
        json!({
            "id": id,
            "instruction": "x",
            "dockerfile": dockerfile,
            "model_script": [{"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}],
            "verify": "[ \"$(cat /marker)\" = marked ]",
        })
        .to_string()
    };
    let path = env.write_tasks(&[
        task("one", "envs/marked/Dockerfile"),
        task("two", "envs/marked/Dockerfile"),
    ]);
    let o = env.eval(
        &path,
        &[
            "--harness",
            "nop",
            "--build-arg",
            &base,
            "--build-arg",
            "MARK=marked",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for id in ["one", "two"] {
        let r = env.result(id);
        assert_eq!(r["status"], "passed", "{r}");
        let pinned = r["provenance"]["image"].as_str().unwrap_or_default();
        assert!(
            pinned.starts_with("dockerfile:envs/marked/Dockerfile@sha256:"),
            "{r}"
        );
    }
    assert_eq!(logs_in(&env.out()).len(), 1);

    // A build that fails: nothing runs, no sandbox starts, and the error names the log.
    let env = Env::new();
    let dir = env.path("broken");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("Dockerfile"),
        "ARG BASE\nFROM ${BASE}\nRUN echo the-broken-step && exit 9\n",
    )
    .unwrap();
    let path = env.write_tasks(&[task("broken", "broken/Dockerfile")]);
    let o = env.eval(&path, &["--harness", "nop", "--build-arg", &base]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let logs = logs_in(&env.out());
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert!(stderr.contains(&logs[0]), "{stderr}");
    assert!(stderr.contains("broken/Dockerfile"), "{stderr}");
    assert!(env.results().is_empty());
    assert!(env.sandbox_list().is_empty());

    // A malformed build argument, or a Dockerfile that is not there, is the user's to fix.
    let o = env.eval(&path, &["--harness", "nop", "--build-arg", "no-equals"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let path = env.write_tasks(&[task("missing", "missing/Dockerfile")]);
    let o = env.eval(&path, &["--harness", "nop"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("missing/Dockerfile"), "{}", text(&o));
}
