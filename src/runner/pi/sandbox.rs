//! The pi bundle in a sandbox that cannot see the host's: placed by the bootstrap (a
//! template's baked copy when its digest matches, otherwise one upload into the runner
//! directory, kept there under its digest so a later runner of the sandbox is not sent it
//! again), and the runner's hello checked for the digest it found.

use std::time::Duration;

use serde_json::{Map, Value};

use super::{PiBundle, PiShipment, TEMPLATE_PI_BUNDLE};
use crate::runner::RunnerError;
use crate::sandbox::{shell_quote, RunOpts, Sandbox};

/// How long the look for a bundle already in the sandbox may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Where an uploaded bundle lives: in the runner directory, named by its digest.
pub fn uploaded_path(runner_dir: &str, bundle: &PiBundle) -> String {
    format!("{runner_dir}/pi-{}.mjs", bundle.sha256)
}

/// Makes `bundle` readable in `sandbox` and returns its path there: the template's copy
/// ([`TEMPLATE_PI_BUNDLE`]) or an earlier upload when one has the same sha256, otherwise an
/// upload now. A copy whose digest differs (a template baked from other inputs, a torn
/// upload) is never used. One command runs to look; without `sha256sum` in the sandbox
/// nothing is found, and the bundle is uploaded.
pub fn place_bundle(
    sandbox: &dyn Sandbox,
    runner_dir: &str,
    bundle: &PiBundle,
) -> Result<String, RunnerError> {
    let id = sandbox.id().to_string();
    let upload = uploaded_path(runner_dir, bundle);
    let script = format!(
        "for f in {tpl} {up}; do \
           if [ -f \"$f\" ] && [ \"$(sha256sum < \"$f\" 2>/dev/null | cut -c1-64)\" = {sha} ]; then echo \"$f\"; exit 0; fi; \
         done",
        tpl = shell_quote(TEMPLATE_PI_BUNDLE),
        up = shell_quote(&upload),
        sha = bundle.sha256,
    );
    let out = sandbox
        .run(
            &script,
            &RunOpts {
                role: crate::sandbox::Role::System,
                timeout: PROBE_TIMEOUT,
                max_output: 4096,
                ..RunOpts::default()
            },
        )
        .map_err(|source| RunnerError::Upload {
            id: id.clone(),
            source,
        })?;
    let found = out.stdout.to_text();
    let found = found.trim();
    if out.exit_code == Some(0) && (found == TEMPLATE_PI_BUNDLE || found == upload) {
        return Ok(found.to_string());
    }
    sandbox
        .write_file(&upload, bundle.bytes())
        .map_err(|source| RunnerError::Upload { id, source })?;
    Ok(upload)
}

/// Checks a pi runner's hello: the bundle it found at `file` must have the shipment's
/// digest, and the runner must say pi can run.
pub fn check_hello(
    hello: &Map<String, Value>,
    shipment: &PiShipment,
    file: &str,
    id: &str,
) -> Result<(), RunnerError> {
    let found = hello
        .get("pi_bundle_sha256")
        .and_then(serde_json::Value::as_str);
    if let Some(found) = found {
        if found != shipment.bundle.sha256 {
            return Err(RunnerError::PiBundleDigest {
                id: id.to_string(),
                file: file.to_string(),
                expected: shipment.bundle.sha256.clone(),
                found: found.to_string(),
            });
        }
    }
    if hello.get("pi_version").is_none() {
        return Err(RunnerError::PiUnavailable {
            id: id.to_string(),
            reason: hello
                .get("pi_error")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("its hello reports no pi_version")
                .to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::pi::{BUNDLE_FILE, SANDBOX_PI_DIR};
    use crate::runner::{bootstrap, runner_dir, BootstrapOpts};
    use crate::sandbox::local::{IsolationChoice, LocalBackend, LocalOptions};
    use crate::sandbox::{Backend, CreateSpec};
    use std::path::Path;
    use std::sync::Arc;

    fn bundle_in(dir: &Path, body: &str) -> PiBundle {
        std::fs::create_dir_all(dir).unwrap();
        let file = dir.join(BUNDLE_FILE);
        std::fs::write(
            &file,
            format!("// wmo-e2b pi bundle: @mariozechner/pi-agent-core@{v} @mariozechner/pi-ai@{v}\n{body}\n", v = crate::runner::pi::PI_VERSION),
        )
        .unwrap();
        PiBundle::read(&file, None).unwrap()
    }

    /// A bwrap sandbox whose system directory shows `template` at [`SANDBOX_PI_DIR`], as a
    /// template that baked the bundle does.
    fn sandbox_with(state: &Path, template: &Path) -> (Arc<LocalBackend>, Arc<dyn Sandbox>) {
        let backend = LocalBackend::open_with(
            state,
            LocalOptions {
                isolation: IsolationChoice::Bwrap,
                system_read_only: vec![(template.to_path_buf(), SANDBOX_PI_DIR.to_string())],
                ..LocalOptions::default()
            },
        )
        .unwrap();
        let sandbox: Arc<dyn Sandbox> = backend
            .create_local(&CreateSpec {
                timeout_secs: 120,
                ..CreateSpec::default()
            })
            .unwrap();
        (backend, sandbox)
    }

    fn system(sandbox: &dyn Sandbox, cmd: &str) -> String {
        let out = sandbox
            .run(
                cmd,
                &RunOpts {
                    role: crate::sandbox::Role::System,
                    ..RunOpts::default()
                },
            )
            .unwrap();
        out.stdout.to_text().trim().to_string()
    }

    #[test]
    fn a_template_copy_with_the_digest_is_used_and_nothing_is_uploaded() {
        let state = tempfile::tempdir().unwrap();
        let template = state.path().join("template");
        let bundle = bundle_in(&template, "export const x = 1;");
        let (backend, sandbox) = sandbox_with(state.path(), &template);
        let dir = runner_dir(sandbox.as_ref());
        system(sandbox.as_ref(), &format!("mkdir -p {dir}"));
        assert_eq!(
            place_bundle(sandbox.as_ref(), &dir, &bundle).unwrap(),
            TEMPLATE_PI_BUNDLE
        );
        assert_eq!(system(sandbox.as_ref(), &format!("ls {dir}")), "");

        // and a runner runs from it: its hello reports the digest
        let opts = BootstrapOpts {
            pi: Some(PiShipment {
                bundle: bundle.clone(),
                seen_at: None,
            }),
            ..BootstrapOpts::default()
        };
        let started = bootstrap(&sandbox, &opts).unwrap();
        assert_eq!(started.hello["pi_bundle_sha256"], bundle.sha256);
        assert!(
            !system(sandbox.as_ref(), &format!("ls {dir}")).contains("pi-"),
            "the bundle was uploaded beside a matching template copy"
        );
        drop(started);
        let _ = backend.kill(sandbox.id());
    }

    /// A template baked from other inputs is ignored; the upload is made once, and a later
    /// runner of the sandbox finds it instead of being sent it again, unless it was torn.
    #[test]
    fn without_a_matching_copy_the_bundle_is_uploaded_once_under_its_digest() {
        let state = tempfile::tempdir().unwrap();
        let template = state.path().join("template");
        bundle_in(&template, "export const older = 1;");
        let bundle = bundle_in(&state.path().join("host"), "export const x = 1;");
        let (backend, sandbox) = sandbox_with(state.path(), &template);
        let dir = runner_dir(sandbox.as_ref());
        system(sandbox.as_ref(), &format!("mkdir -p {dir}"));
        let up = uploaded_path(&dir, &bundle);
        assert_eq!(up, format!("{dir}/pi-{}.mjs", bundle.sha256));
        assert_eq!(place_bundle(sandbox.as_ref(), &dir, &bundle).unwrap(), up);
        assert_eq!(sandbox.read_file(&up).unwrap(), bundle.bytes());

        // found again without a write: its mtime stays where we set it
        system(sandbox.as_ref(), &format!("touch -d @0 {up}"));
        assert_eq!(place_bundle(sandbox.as_ref(), &dir, &bundle).unwrap(), up);
        assert_eq!(system(sandbox.as_ref(), &format!("stat -c %Y {up}")), "0");

        // a torn copy is replaced
        system(sandbox.as_ref(), &format!("truncate -s 10 {up}"));
        assert_eq!(place_bundle(sandbox.as_ref(), &dir, &bundle).unwrap(), up);
        assert_eq!(sandbox.read_file(&up).unwrap(), bundle.bytes());
        let _ = backend.kill(sandbox.id());
    }
}
