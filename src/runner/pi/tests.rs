//! End to end with the real packages, bundled: built (or reused) in the repository's
//! `target/pi-cache`, shared with the runner's node tests.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::runner::{bootstrap, BootstrapOpts, RunnerError};
use crate::sandbox::local::{IsolationChoice, LocalBackend, LocalOptions};
use crate::sandbox::{Backend, CreateSpec, Role, RunOpts, Sandbox};

/// The bundle in `target/pi-cache`, built there first if needed (the npm registry, once).
fn cached_install() -> PiInstall {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pi-cache");
    let install = ensure_installed(&cache).unwrap_or_else(|e| {
        panic!("the pi end-to-end tests need pi bundled (the npm registry, once): {e}")
    });
    assert_eq!(find_installed(&cache).unwrap().as_ref(), Some(&install));
    install
}

fn spec() -> CreateSpec {
    CreateSpec {
        timeout_secs: 120,
        internet: true,
        ..CreateSpec::default()
    }
}

/// Runs `cmd` as the runner's role (which sees the system mounts).
fn system_sh(sandbox: &dyn Sandbox, cmd: &str) -> String {
    let out = sandbox
        .run(
            cmd,
            &RunOpts {
                role: Role::System,
                timeout: Duration::from_secs(60),
                ..RunOpts::default()
            },
        )
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{cmd}: {}", out.stderr.to_text());
    out.stdout.to_text()
}

/// Every `node_modules` directory with anything in it that the runner of a sandbox can see.
const FIND_NODE_MODULES: &str =
    "find / -path /proc -prune -o -type d -name node_modules -prune ! -empty -print 2>/dev/null; true";

/// The inputs pin exactly: pi's two packages and esbuild at their versions, and every
/// package of the lockfile by version and sha512 integrity, fetched from the npm registry
/// alone (no git, tarball URL or link dependency; esbuild's binary is its platform
/// package, an optional dependency like any other).
#[test]
fn the_inputs_pin_every_package_and_need_the_npm_registry_alone() {
    let input = |name: &str| -> Value {
        let text = BUILD_INPUTS.iter().find(|(n, _)| *n == name).unwrap().1;
        serde_json::from_str(text).unwrap()
    };
    let manifest = input("package.json");
    let deps = manifest["dependencies"].as_object().unwrap();
    let mut want: Vec<(String, &str)> = PI_PACKAGES
        .iter()
        .map(|p| (p.to_string(), PI_VERSION))
        .chain([("esbuild".to_string(), ESBUILD_VERSION)])
        .collect();
    want.sort();
    let mut pinned: Vec<(String, &str)> = deps
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap()))
        .collect();
    pinned.sort();
    assert_eq!(pinned, want, "package.json pins exactly the specs");

    let lock = input("package-lock.json");
    let packages = lock["packages"].as_object().unwrap();
    for (name, version) in &want {
        assert_eq!(
            packages[&format!("node_modules/{name}")]["version"],
            *version,
            "{name}"
        );
    }
    for (path, entry) in packages.iter().filter(|(p, _)| !p.is_empty()) {
        assert!(
            entry["integrity"]
                .as_str()
                .is_some_and(|i| i.starts_with("sha512-")),
            "{path} has no sha512 integrity"
        );
        assert!(entry.get("link").is_none(), "{path} is a link");
        if let Some(url) = entry.get("resolved").and_then(Value::as_str) {
            assert!(
                url.starts_with("https://registry.npmjs.org/"),
                "{path} is fetched from {url}"
            );
        }
    }
    let binary = &packages["node_modules/@esbuild/linux-x64"];
    assert_eq!(binary["version"], ESBUILD_VERSION);
    assert_eq!(binary["optional"], true);
}

/// Same inputs, same bytes: a second build, from its own `npm ci` in a fresh state
/// directory, gives the bundle the cache holds, to the byte (so its sha256 too).
#[test]
fn the_bundle_is_built_deterministically() {
    let cached = cached_install();
    let state = tempfile::tempdir().unwrap();
    let again = ensure_installed(state.path()).unwrap();
    assert_ne!(again.bundle.file, cached.bundle.file);
    assert_eq!(again.bundle.sha256, cached.bundle.sha256);
    assert_eq!(again.bundle.bytes(), cached.bundle.bytes());
    // what the host keeps: the bundle, its inputs and the build's report; no node_modules
    assert!(!again.dir.join("node_modules").exists());
    let report: Value =
        serde_json::from_slice(&std::fs::read(again.dir.join("bundle.json")).unwrap()).unwrap();
    assert_eq!(report["esbuild"], ESBUILD_VERSION);
    let mut bundled: Vec<&str> = report["packages"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    bundled.sort();
    assert_eq!(
        bundled,
        [
            "@mariozechner/pi-agent-core",
            "@mariozechner/pi-ai",
            "partial-json",
            "typebox"
        ]
    );
    assert!(again.bundle.bytes().len() < 2 << 20, "{:?}", again.bundle);
}

/// A pi episode from the bundle alone: the runner's sandbox (bwrap) is shown the install
/// directory, which holds no node_modules, and every other node_modules directory it could
/// see (npm's own, under /usr) is hidden behind an empty directory, so no package of any
/// kind can be resolved in it.
#[test]
fn a_pi_episode_runs_from_the_bundle_alone_with_no_node_modules_in_sight() {
    let install = cached_install();
    let state = tempfile::tempdir().unwrap();
    let open = |extra: Vec<(std::path::PathBuf, String)>| {
        let mut shown = vec![install.local_mount()];
        shown.extend(extra);
        LocalBackend::open_with(
            state.path(),
            LocalOptions {
                isolation: IsolationChoice::Bwrap,
                system_read_only: shown,
                ..LocalOptions::default()
            },
        )
        .unwrap()
    };
    // Which node_modules a runner would see, to hide each one.
    let probe = open(Vec::new());
    let sandbox = probe.create_local(&spec()).unwrap();
    let seen = system_sh(sandbox.as_ref(), FIND_NODE_MODULES);
    let _ = probe.kill(sandbox.id());
    drop(probe);
    let empty = tempfile::tempdir().unwrap();
    let masks = seen
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| (empty.path().to_path_buf(), l.to_string()))
        .collect();
    let backend = open(masks);
    let sandbox: Arc<dyn Sandbox> = backend.create_local(&spec()).unwrap();
    assert_eq!(
        system_sh(sandbox.as_ref(), FIND_NODE_MODULES),
        "",
        "(was: {seen})"
    );
    assert_eq!(
        system_sh(sandbox.as_ref(), &format!("ls -A {SANDBOX_PI_DIR}"))
            .lines()
            .filter(|f| f.ends_with(".mjs"))
            .collect::<Vec<_>>(),
        ["build.mjs", "entry.mjs", "pi.mjs"]
    );

    let opts = BootstrapOpts {
        pi: Some(install.local_shipment(backend.isolation())),
        ..BootstrapOpts::default()
    };
    let mut started = bootstrap(&sandbox, &opts).unwrap();
    assert_eq!(started.hello["pi_version"], PI_VERSION);
    assert_eq!(started.hello["pi_bundle_sha256"], install.bundle.sha256);
    assert_eq!(started.hello["harnesses"], json!(["builtin", "pi"]));
    let ch = &mut started.channel;
    let bash = json!({"type": "function", "function": {"name": "bash", "description": "run",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
        "required": ["command"]}}});
    let call = |id: &str, name: &str, args: Value| {
        json!({"id": id, "type": "function",
            "function": {"name": name, "arguments": args.to_string()}})
    };
    let completion = |calls: Value| {
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": calls}}]})
    };

    ch.send(
        &json!({"type": "episode_start", "episode_id": "e1", "harness": "pi",
        "instruction": "go", "system": "sys", "tools": [bash], "files": {}, "max_turns": 5}),
    )
    .unwrap();
    let req = next(ch, "llm_request");
    assert_eq!(req["openai_body"]["messages"][1]["content"], "go");
    ch.send(
        &json!({"type": "llm_response", "episode_id": "e1", "req_id": req["req_id"],
        "completion": completion(json!([call("c1", "bash", json!({"command": "echo hi"}))]))}),
    )
    .unwrap();
    let treq = next(ch, "tool_request");
    assert_eq!(treq["arguments"], json!({"command": "echo hi"}));
    ch.send(
        &json!({"type": "tool_response", "episode_id": "e1", "req_id": treq["req_id"],
        "content": "hi", "is_error": false}),
    )
    .unwrap();
    let req2 = next(ch, "llm_request");
    assert_eq!(
        req2["openai_body"]["messages"][3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "hi"})
    );
    ch.send(
        &json!({"type": "llm_response", "episode_id": "e1", "req_id": req2["req_id"],
        "completion": completion(json!([call("c2", "submit", json!({"answer": "42"}))]))}),
    )
    .unwrap();
    let done = next(ch, "done");
    assert_eq!(done["reason"], "submit");
    assert_eq!(done["answer"], "42");
    assert_eq!(done["turns"], 2);
    ch.close();
    let _ = backend.kill(sandbox.id());
}

/// A stand-in bundle (pi's banner, no pi) in `dir`.
fn fake_bundle(dir: &Path, body: &str) -> PiBundle {
    let file = dir.join(BUNDLE_FILE);
    std::fs::write(
        &file,
        format!("// wmo-e2b pi bundle: @mariozechner/pi-agent-core@{PI_VERSION} @mariozechner/pi-ai@{PI_VERSION}\n{body}\n"),
    )
    .unwrap();
    PiBundle::read(&file, None).unwrap()
}

#[test]
fn bootstrap_refuses_a_runner_that_cannot_read_the_bundle() {
    let state = tempfile::tempdir().unwrap();
    let backend = LocalBackend::open(state.path()).unwrap();
    let sandbox: Arc<dyn Sandbox> = backend.create_local(&spec()).unwrap();
    let opts = BootstrapOpts {
        pi: Some(PiShipment {
            bundle: fake_bundle(state.path(), ""),
            seen_at: Some("/no-such-dir/pi.mjs".into()),
        }),
        ..BootstrapOpts::default()
    };
    let e = bootstrap(&sandbox, &opts)
        .err()
        .expect("bootstrap must fail");
    assert!(matches!(e, RunnerError::PiUnavailable { .. }), "{e:?}");
    assert!(!e.is_transport());
    let msg = e.to_string();
    assert!(
        msg.contains("cannot read the pi bundle /no-such-dir/pi.mjs: ENOENT"),
        "{msg}"
    );
    // every runner file, the pi harness module with them, was uploaded next to the runner
    let dir = crate::runner::runner_dir(sandbox.as_ref());
    for file in &crate::runner::assets::RUNNER_FILES {
        let uploaded = sandbox.read_file(&format!("{dir}/{}", file.name)).unwrap();
        let sent = crate::runner::assets::uploaded_text(file);
        assert_eq!(uploaded, sent.as_bytes(), "{}", file.name);
    }
    let _ = backend.kill(sandbox.id());
}

/// A bundle that is not the one shipped (truncated on its way, say) is refused by its
/// digest, with a typed error naming the file the runner was given.
#[test]
fn bootstrap_refuses_a_bundle_whose_digest_differs() {
    let state = tempfile::tempdir().unwrap();
    let shipped = fake_bundle(state.path(), "export const runAgentLoop = 1;");
    let torn = state.path().join("torn.mjs");
    std::fs::write(&torn, &shipped.bytes()[..40]).unwrap();
    let backend = LocalBackend::open_with(
        state.path(),
        LocalOptions {
            isolation: IsolationChoice::None,
            ..LocalOptions::default()
        },
    )
    .unwrap();
    let sandbox: Arc<dyn Sandbox> = backend.create_local(&spec()).unwrap();
    let file = torn.to_string_lossy().into_owned();
    let opts = BootstrapOpts {
        pi: Some(PiShipment {
            bundle: shipped.clone(),
            seen_at: Some(file.clone()),
        }),
        ..BootstrapOpts::default()
    };
    let e = bootstrap(&sandbox, &opts)
        .err()
        .expect("bootstrap must fail");
    let RunnerError::PiBundleDigest {
        file: named,
        expected,
        found,
        ..
    } = &e
    else {
        panic!("{e:?}");
    };
    assert_eq!(named, &file);
    assert_eq!(expected, &shipped.sha256);
    assert_eq!(found, &crate::digest::sha256_hex(&shipped.bytes()[..40]));
    assert!(!e.is_transport());
    assert!(e.to_string().contains(&file), "{e}");
    let _ = backend.kill(sandbox.id());
}

fn next(ch: &mut crate::channel::StdioChannel, want: &str) -> crate::channel::Frame {
    let f = ch.recv(Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!(f["type"], want, "{f:?}");
    f
}
