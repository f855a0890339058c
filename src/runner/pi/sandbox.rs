//! pi inside a sandbox, for backends whose sandboxes cannot see the host's install cache.

use std::time::Duration;

use super::{specs, PI_VERSION, TEMPLATE_PI_MODULES};

/// How long an in-sandbox npm install may take.
pub const SANDBOX_INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Makes pi available inside a sandbox and returns its `node_modules` path as the runner
/// (working in `runner_dir`) should name it: the template's prebaked copy when present,
/// otherwise an install into the runner directory, done once per sandbox (a marker file
/// records it).
pub fn install_in_sandbox(
    sandbox: &dyn crate::sandbox::Sandbox,
    runner_dir: &str,
) -> Result<String, crate::runner::RunnerError> {
    let marker = format!("node_modules/.wmo-pi-{PI_VERSION}");
    let script = format!(
        "if [ -d {tpl}/@mariozechner/pi-agent-core ]; then echo {tpl}; exit 0; fi; \
         if [ ! -f {marker} ]; then \
           command -v npm >/dev/null || {{ echo 'npm is not installed in the sandbox' >&2; exit 127; }}; \
           npm install --no-audit --no-fund --ignore-scripts --save-exact {specs} >&2 && touch {marker} || exit 1; \
         fi; echo node_modules",
        tpl = TEMPLATE_PI_MODULES,
        specs = specs().join(" "),
    );
    let id = sandbox.id().to_string();
    // npm installs into the nearest package.json's directory: make it the runner's.
    sandbox
        .write_file(
            &format!("{runner_dir}/package.json"),
            br#"{"name":"wmo-runner","private":true,"type":"module"}"#,
        )
        .map_err(|source| crate::runner::RunnerError::Upload {
            id: id.clone(),
            source,
        })?;
    let out = sandbox
        .run(
            &script,
            &crate::sandbox::RunOpts {
                cwd: Some(runner_dir.to_string()),
                role: crate::sandbox::Role::System,
                timeout: SANDBOX_INSTALL_TIMEOUT,
                max_output: 16 * 1024,
                ..crate::sandbox::RunOpts::default()
            },
        )
        .map_err(|source| crate::runner::RunnerError::Upload {
            id: id.clone(),
            source,
        })?;
    let path = out.stdout.to_text().trim().to_string();
    if out.exit_code != Some(0) || path.is_empty() {
        return Err(crate::runner::RunnerError::PiUnavailable {
            id,
            reason: format!(
                "installing {} in the sandbox failed ({}): {}",
                specs().join(" "),
                if out.timed_out {
                    "timed out".to_string()
                } else {
                    format!("exit {:?}", out.exit_code)
                },
                out.stderr.to_text().trim()
            ),
        });
    }
    Ok(path)
}
