//! The runner's JavaScript, embedded in the binary, and its upload into a sandbox.
//!
//! The two runners (`runner.mjs` for eval episodes, `live.mjs` for live sessions) import
//! shared modules by relative path, and `runner.mjs` loads its harness modules from its own
//! directory at their first use; so every file goes to one directory, always all of them.
//! Each runner goes up assembled with the modules it imports statically (see
//! [`super::bundle`]), which is what makes its start as fast as one file's.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::bundle::{assemble, BundleError};
use crate::sandbox::{Result, Sandbox};

/// One file of the runner directory.
#[derive(Debug, Clone, Copy)]
pub struct RunnerFile {
    /// Its name in the runner directory (and in `runner/` of this repository).
    pub name: &'static str,
    pub text: &'static str,
}

macro_rules! runner_file {
    ($name:literal) => {
        RunnerFile {
            name: $name,
            text: include_str!(concat!("../../runner/", $name)),
        }
    };
}

/// The entry point of the episode runner.
pub const EPISODE_RUNNER: &str = "runner.mjs";

/// The entry point of the live-session runner.
pub const LIVE_RUNNER: &str = "live.mjs";

/// Every file either runner needs.
pub const RUNNER_FILES: [RunnerFile; 10] = [
    runner_file!("runner.mjs"),
    runner_file!("live.mjs"),
    runner_file!("frames.mjs"),
    runner_file!("loop.mjs"),
    runner_file!("tool_specs.mjs"),
    runner_file!("values.mjs"),
    runner_file!("outbox.mjs"),
    runner_file!("user_harness.mjs"),
    runner_file!("pi_harness.mjs"),
    runner_file!("endpoint_harness.mjs"),
];

/// Writes every runner file into `dir` of `sandbox` (replacing what is there), so either
/// runner can start from `dir`.
pub fn upload_runner_files(sandbox: &dyn Sandbox, dir: &str) -> Result<()> {
    for file in &RUNNER_FILES {
        sandbox.write_file(
            &format!("{dir}/{}", file.name),
            uploaded_text(file).as_bytes(),
        )?;
    }
    Ok(())
}

/// sha256 of the runner files as they go up (provenance).
pub fn runner_digest() -> String {
    crate::digest::sha256_parts(
        RUNNER_FILES
            .iter()
            .map(|f| (f.name, uploaded_text(f).as_bytes())),
    )
}

/// What goes up for `file`: a runner assembled, any other module as it is. A runner that
/// cannot be assembled (a test catches it) still runs as it is, only slower to start.
pub fn uploaded_text(file: &RunnerFile) -> &'static str {
    let text = match file.name {
        EPISODE_RUNNER => assembled(EPISODE_RUNNER, &EPISODE_ASSEMBLED),
        LIVE_RUNNER => assembled(LIVE_RUNNER, &LIVE_ASSEMBLED),
        _ => Ok(file.text),
    };
    text.unwrap_or(file.text)
}

static EPISODE_ASSEMBLED: OnceLock<std::result::Result<String, BundleError>> = OnceLock::new();
static LIVE_ASSEMBLED: OnceLock<std::result::Result<String, BundleError>> = OnceLock::new();

/// `entry` assembled with its static imports, once per process.
pub fn assembled(
    entry: &str,
    cell: &'static OnceLock<std::result::Result<String, BundleError>>,
) -> std::result::Result<&'static str, BundleError> {
    cell.get_or_init(|| {
        let files: BTreeMap<&str, &str> = RUNNER_FILES.iter().map(|f| (f.name, f.text)).collect();
        assemble(entry, &files)
    })
    .as_deref()
    .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    fn embedded() -> BTreeSet<&'static str> {
        RUNNER_FILES.iter().map(|f| f.name).collect()
    }

    #[test]
    fn every_runner_module_in_the_repository_is_embedded() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("runner");
        let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".mjs"))
            .collect();
        let embedded: BTreeSet<String> = embedded().into_iter().map(String::from).collect();
        assert_eq!(on_disk, embedded);
        assert!(embedded.contains(EPISODE_RUNNER) && embedded.contains(LIVE_RUNNER));
    }

    /// Each runner, assembled, starts and says hello (frames: base64 JSON lines) with no
    /// module file beside it but those it loads lazily.
    #[test]
    fn each_assembled_runner_starts_alone_and_says_hello() {
        for (entry, cell) in [
            (EPISODE_RUNNER, &EPISODE_ASSEMBLED),
            (LIVE_RUNNER, &LIVE_ASSEMBLED),
        ] {
            let text = assembled(entry, cell).unwrap();
            assert!(
                !text
                    .lines()
                    .any(|l| l.starts_with("import ") && l.contains("\"./")),
                "{entry} still imports a runner module"
            );
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(entry), text).unwrap();
            let mut child = std::process::Command::new("node")
                .arg(entry)
                .current_dir(dir.path())
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            let stdout = child.stdout.take().unwrap();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            let frame = crate::channel::frame::decode(line.trim_end().as_bytes());
            assert_eq!(
                frame.ok().and_then(|f| f.get("type").cloned()),
                Some(serde_json::json!("hello")),
                "{entry}: {line:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Every `"./name"` a runner file names (a static import, a lazy `import()`, a
    /// `new URL(...)`) is a file that is uploaded with it.
    #[test]
    fn every_file_a_runner_file_imports_is_embedded() {
        let names = embedded();
        for file in &RUNNER_FILES {
            let mut rest = file.text;
            while let Some(at) = rest.find("\"./") {
                let after = &rest[at + 3..];
                let end = after.find('"').unwrap();
                let target = &after[..end];
                assert!(
                    names.contains(target),
                    "{} names ./{target}, which is not uploaded",
                    file.name
                );
                rest = &after[end..];
            }
        }
    }
}
