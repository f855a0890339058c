//! The runner's JavaScript, embedded in the binary, and its upload into a sandbox.
//!
//! The two runners (`runner.mjs` for eval episodes, `live.mjs` for live sessions) import
//! shared modules by relative path, and `runner.mjs` loads its harness modules from its own
//! directory at their first use; so every file goes to one directory, always all of them.

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
pub const RUNNER_FILES: [RunnerFile; 9] = [
    runner_file!("runner.mjs"),
    runner_file!("live.mjs"),
    runner_file!("frames.mjs"),
    runner_file!("loop.mjs"),
    runner_file!("tool_specs.mjs"),
    runner_file!("values.mjs"),
    runner_file!("outbox.mjs"),
    runner_file!("user_harness.mjs"),
    runner_file!("pi_harness.mjs"),
];

/// Writes every runner file into `dir` of `sandbox` (replacing what is there), so either
/// runner can start from `dir`.
pub fn upload_runner_files(sandbox: &dyn Sandbox, dir: &str) -> Result<()> {
    for file in &RUNNER_FILES {
        sandbox.write_file(&format!("{dir}/{}", file.name), file.text.as_bytes())?;
    }
    Ok(())
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
