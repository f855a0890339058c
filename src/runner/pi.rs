//! The pi harness: the real pi agent loop (`@mariozechner/pi-agent-core`'s `runAgentLoop`)
//! run by the runner in place of its builtin loop, for episodes whose `episode_start` says
//! `"harness": "pi"`.
//!
//! The host installs the pinned packages once into `<state_dir>/npm/pi-<version>/` with
//! npm ([`ensure_installed`]) and bootstraps the runner with `WMO_PI_MODULES` naming that
//! `node_modules` directory (see `BootstrapOpts::pi_modules`); a backend whose sandboxes
//! cannot see the host's install gets pi inside the sandbox instead
//! ([`install_in_sandbox`]). The runner imports pi lazily at its first pi episode, through
//! `pi_harness.mjs`, one of the runner files uploaded next to `runner.mjs`.

mod install;
mod npm;
mod sandbox;

use std::path::{Path, PathBuf};

pub use install::{ensure_installed, ensure_installed_with, find_installed, install_dir};
pub use npm::{InstallOpts, PiError, DEFAULT_INSTALL_TIMEOUT};
pub use sandbox::{install_in_sandbox, SANDBOX_INSTALL_TIMEOUT};

/// The exact version of both pi packages.
pub const PI_VERSION: &str = "0.73.1";

/// The packages installed, each at [`PI_VERSION`].
pub const PI_PACKAGES: [&str; 2] = ["@mariozechner/pi-agent-core", "@mariozechner/pi-ai"];

/// The runner's environment variable naming the `node_modules` directory holding pi.
pub const PI_MODULES_ENV: &str = "WMO_PI_MODULES";

/// Where pi lives in a sandbox's system directory: the template recipe
/// (`scripts/e2b-template/`) prebakes it there, and a local bwrap sandbox is shown the host's
/// install there (read-only, to the runner only).
pub const SANDBOX_PI_DIR: &str = "/opt/wmo-e2b/pi";

/// pi's `node_modules` under [`SANDBOX_PI_DIR`].
pub const TEMPLATE_PI_MODULES: &str = "/opt/wmo-e2b/pi/node_modules";

/// The exact package specs, e.g. `@mariozechner/pi-ai@0.73.1`.
pub fn specs() -> Vec<String> {
    PI_PACKAGES
        .iter()
        .map(|p| format!("{p}@{PI_VERSION}"))
        .collect()
}

/// An installed pi.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PiInstall {
    /// The `node_modules` directory holding both packages (what `WMO_PI_MODULES` names).
    pub modules_dir: PathBuf,
    /// The installed version ([`PI_VERSION`]).
    pub version: String,
}

impl PiInstall {
    /// npm's lockfile of this install, where there is one (provenance names pi by it).
    pub fn lockfile(&self) -> Option<PathBuf> {
        let lock = self.modules_dir.parent()?.join("package-lock.json");
        lock.is_file().then_some(lock)
    }

    /// How a local backend shows this install to confined runners: the host directory
    /// (holding `node_modules`), and the sandbox path it is mounted at, read-only.
    pub fn local_mount(&self) -> (PathBuf, String) {
        let dir = self
            .modules_dir
            .parent()
            .map_or_else(|| self.modules_dir.clone(), Path::to_path_buf);
        (dir, SANDBOX_PI_DIR.to_string())
    }

    /// The `node_modules` directory as a local runner sees it: where a template would keep
    /// it under bwrap, the host path when unconfined.
    pub fn modules_seen_by(&self, isolation: crate::sandbox::local::Isolation) -> PathBuf {
        match isolation {
            crate::sandbox::local::Isolation::Bwrap => PathBuf::from(TEMPLATE_PI_MODULES),
            crate::sandbox::local::Isolation::None => self.modules_dir.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// End to end with the real packages: install (or reuse) pi in the repository's
    /// `target/pi-cache` (shared with the runner's node tests; `WMO_PI_MODULES` names an
    /// existing install instead), bootstrap a runner on a local sandbox with it, and run a
    /// pi episode over the channel.
    #[test]
    fn a_pi_episode_runs_in_a_bootstrapped_runner() {
        use crate::runner::{bootstrap, BootstrapOpts};
        use crate::sandbox::local::LocalBackend;
        use crate::sandbox::{Backend, CreateSpec, Sandbox};
        use serde_json::{json, Value};
        use std::sync::Arc;

        let install = match std::env::var_os(PI_MODULES_ENV).filter(|v| !v.is_empty()) {
            Some(dir) => PiInstall {
                modules_dir: PathBuf::from(dir),
                version: PI_VERSION.into(),
            },
            None => {
                let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pi-cache");
                let install = ensure_installed(&cache).unwrap_or_else(|e| {
                    panic!(
                        "the pi end-to-end test needs pi installed (the npm registry, once): {e}"
                    )
                });
                assert_eq!(find_installed(&cache).as_ref(), Some(&install));
                install
            }
        };
        let state = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open_with(
            state.path(),
            crate::sandbox::local::LocalOptions {
                system_read_only: vec![install.local_mount()],
                ..Default::default()
            },
        )
        .unwrap();
        let modules = install.modules_seen_by(backend.isolation());
        let sandbox: Arc<dyn Sandbox> = backend
            .create_local(&CreateSpec {
                timeout_secs: 120,
                internet: true,
                ..CreateSpec::default()
            })
            .unwrap();
        let opts = BootstrapOpts {
            pi_modules: Some(modules),
            ..BootstrapOpts::default()
        };
        let mut started = bootstrap(&sandbox, &opts).unwrap();
        assert_eq!(started.hello["pi_version"], PI_VERSION);
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

    #[test]
    fn bootstrap_refuses_a_runner_that_cannot_run_pi() {
        use crate::runner::{bootstrap, BootstrapOpts, RunnerError};
        use crate::sandbox::local::LocalBackend;
        use crate::sandbox::{Backend, CreateSpec, Sandbox};
        use std::sync::Arc;

        let state = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open(state.path()).unwrap();
        let sandbox: Arc<dyn Sandbox> = backend
            .create_local(&CreateSpec {
                timeout_secs: 60,
                internet: true,
                ..CreateSpec::default()
            })
            .unwrap();
        let opts = BootstrapOpts {
            pi_modules: Some(state.path().join("no-such-node_modules")),
            ..BootstrapOpts::default()
        };
        let e = bootstrap(&sandbox, &opts)
            .err()
            .expect("bootstrap must fail");
        assert!(matches!(e, RunnerError::PiUnavailable { .. }), "{e:?}");
        assert!(!e.is_transport());
        let msg = e.to_string();
        assert!(msg.contains("pi-agent-core/package.json: ENOENT"), "{msg}");
        // every runner file, the pi harness module with them, was uploaded next to the runner
        let dir = crate::runner::runner_dir(sandbox.as_ref());
        for file in &crate::runner::assets::RUNNER_FILES {
            let uploaded = sandbox.read_file(&format!("{dir}/{}", file.name)).unwrap();
            let sent = crate::runner::assets::uploaded_text(file);
            assert_eq!(uploaded, sent.as_bytes(), "{}", file.name);
        }
        let _ = backend.kill(sandbox.id());
    }

    fn next(ch: &mut crate::channel::StdioChannel, want: &str) -> crate::channel::Frame {
        let f = ch.recv(Duration::from_secs(30)).unwrap().unwrap();
        assert_eq!(f["type"], want, "{f:?}");
        f
    }
}
