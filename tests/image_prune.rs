//! `image prune` reclaims the store's space and never what a sandbox or a run uses: an image a
//! live sandbox runs on keeps its record, blobs and unpacked root; a run that may still start
//! sandboxes on its images holds the store, and a prune waits for it.

#[path = "support/registry.rs"]
mod registry;
mod support;

use std::time::Duration;

use serde_json::Value;
use support::{text, Env};
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{Backend, CreateSpec, ImageRoot, RunOpts};

fn json_of(o: &std::process::Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", text(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_prune_keeps_what_a_live_sandbox_runs_on_and_waits_for_runs() {
    if !support::local::image_roots_available() {
        return;
    }
    let registry = registry::Registry::start();
    let buildah = registry::Buildah::new();
    let trees = tempfile::tempdir().unwrap();
    for name in ["kept", "dropped"] {
        let tree = trees.path().join(name);
        let root = support::local::busybox_image(&tree, name).rootfs;
        std::fs::write(root.join("etc/name"), name).unwrap();
        buildah.push_tree(&registry.addr, &format!("p/{name}:1"), &root, &[]);
    }
    let env = Env::new();
    let pull = |name: &str| {
        json_of(&env.run(&[
            "image",
            "pull",
            "--json",
            &format!("{}/p/{name}:1", registry.addr),
        ]))
    };
    let (kept, dropped) = (pull("kept"), pull("dropped"));
    let root_of = |v: &Value| std::path::PathBuf::from(v["rootfs"].as_str().unwrap());
    assert!(root_of(&kept).is_dir() && root_of(&dropped).is_dir());

    // A sandbox on `kept`, as eval makes one.
    let backend = LocalBackend::open(&env.home()).unwrap();
    let sandbox = backend
        .create(&CreateSpec {
            timeout_secs: 300,
            image: Some(ImageRoot {
                id: kept["manifest_digest"].as_str().unwrap().into(),
                rootfs: root_of(&kept),
                env: Vec::new(),
                workdir: None,
                user: 0,
                shell: "/bin/sh".into(),
                template: None,
            }),
            ..CreateSpec::default()
        })
        .unwrap();
    let pruned = json_of(&env.run(&["image", "prune", "--json"]));
    assert_eq!(pruned["records"], 1, "{pruned}");
    assert_eq!(pruned["roots"], 1, "{pruned}");
    assert_eq!(pruned["kept_in_use"], 1, "{pruned}");
    assert!(root_of(&kept).is_dir() && !root_of(&dropped).exists());
    let listed = json_of(&env.run(&["image", "list", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["manifest_digest"], kept["manifest_digest"]);
    let out = sandbox.run("cat /etc/name", &RunOpts::default()).unwrap();
    assert_eq!(out.stdout.to_text(), "kept");

    // A run on the store's images holds its shared lock: the prune waits for it.
    let store = wmo_e2b::image::Store::open(&env.home().join("images")).unwrap();
    let held = store.pull_lock().unwrap();
    backend.kill(sandbox.id()).unwrap();
    let mut waiting = env
        .cmd(&["image", "prune", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "the prune did not wait for the run"
    );
    assert!(root_of(&kept).is_dir());
    drop(held);
    let done = waiting.wait_with_output().unwrap();
    let pruned = json_of(&done);
    assert_eq!(pruned["records"], 1, "{pruned}");
    assert_eq!(pruned["kept_in_use"], 0, "{pruned}");
    assert!(!root_of(&kept).exists());
    let blobs = std::fs::read_dir(env.home().join("images/blobs/sha256"))
        .unwrap()
        .count();
    assert_eq!(blobs, 0);
}
