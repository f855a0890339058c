//! `read_file` and `write_file` on an image's own paths (its working directory, `/app`,
//! `/etc`). The host reaches only a sandbox's home, `/tmp` and system directories; an image's
//! tree exists only inside the task namespace, as an overlay, so these go through a command
//! there, as the task user, with exactly the permissions its `bash` has.

use std::time::Duration;

use super::isolation::BWRAP_TMP;
use super::sandbox::LocalSandbox;
use crate::sandbox::{ErrorClass, Result, Role, RunOpts, Sandbox, SandboxError};

/// Largest file read this way: the bytes cross a pipe into one buffer.
pub(super) const MAX_IMAGE_FILE_BYTES: u64 = 16 << 20;
/// How long one transfer may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(60);
/// Exit codes the scripts below use to say why (the shell's own stay below 64).
const NOT_A_FILE: i32 = 66;
const TOO_LARGE: i32 = 67;

/// Reads `path` in the task namespace. The path travels in the environment, never in the
/// command line, so no name can be read as shell.
const READ: &str = r#"f=$WMO_FILE
[ -f "$f" ] || { echo "not a regular file (or missing)" >&2; exit 66; }
n=$(wc -c < "$f") || exit 1
[ "$n" -le "$WMO_MAX" ] || { echo "$n" >&2; exit 67; }
exec cat -- "$f""#;

/// Moves the staged bytes into `path` (its parents made first) as the task user.
const WRITE: &str = r#"mkdir -p -- "$(dirname -- "$WMO_FILE")" && cat -- "$WMO_STAGED" > "$WMO_FILE"; rc=$?
rm -f -- "$WMO_STAGED"
exit $rc"#;

pub(super) fn read(sb: &LocalSandbox, path: &str) -> Result<Vec<u8>> {
    let max = MAX_IMAGE_FILE_BYTES.to_string();
    let out = sb.run(READ, &opts(&[("WMO_FILE", path), ("WMO_MAX", &max)]))?;
    match out.exit_code {
        Some(0) if out.stdout.dropped == 0 => Ok([out.stdout.head, out.stdout.tail].concat()),
        Some(TOO_LARGE) => Err(bad(format!(
            "{path} is {} bytes; read_file returns at most {MAX_IMAGE_FILE_BYTES} of a file in the image",
            out.stderr.to_text().trim()
        ))),
        Some(NOT_A_FILE) => Err(SandboxError::NotFound {
            path: path.to_string(),
        }),
        _ => Err(bad(format!(
            "reading {path} failed: {}",
            out.stderr.to_text().trim()
        ))),
    }
}

pub(super) fn write(sb: &LocalSandbox, path: &str, data: &[u8]) -> Result<()> {
    // Staged in the sandbox's /tmp, which the host reaches, then moved by the task user.
    let staged = format!(
        "{BWRAP_TMP}/.wmo-e2b-write-{}",
        crate::id::random_hex(8).map_err(|e| bad(format!("cannot name a staging file: {e}")))?
    );
    sb.write_file(&staged, data)?;
    let out = sb.run(WRITE, &opts(&[("WMO_FILE", path), ("WMO_STAGED", &staged)]));
    match out {
        Ok(o) if o.exit_code == Some(0) => Ok(()),
        Ok(o) => Err(bad(format!(
            "writing {path} failed: {}",
            o.stderr.to_text().trim()
        ))),
        Err(e) => Err(e),
    }
}

fn opts(envs: &[(&str, &str)]) -> RunOpts {
    RunOpts {
        cwd: None,
        role: Role::Task,
        envs: envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        timeout: TRANSFER_TIMEOUT,
        max_output: MAX_IMAGE_FILE_BYTES as usize + 1,
    }
}

fn bad(message: String) -> SandboxError {
    SandboxError::Remote {
        class: ErrorClass::BadRequest,
        message,
        source: None,
    }
}
