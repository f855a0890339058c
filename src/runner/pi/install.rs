//! The host's pi install cache: the bundle built from the pinned packages under
//! `<state_dir>/npm/pi-<version>/`, once, and reused.
//!
//! The install directory is filled under an exclusive `flock` (so concurrent wmo-e2b
//! processes build once), in a temporary directory renamed into place, and is only used
//! once its marker names exactly this binary's build inputs. What it holds is small: the
//! bundle, its build inputs and the build's report (npm's `node_modules` is removed once the
//! bundle is made).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::build::{build_into, marked_digest, InstallOpts, MARKER};
use super::bundle::PiBundle;
use super::error::{io_err, PiError};
use super::{PiInstall, BUNDLE_FILE, PI_VERSION};

/// Where [`ensure_installed`] puts pi: `<state_dir>/npm/pi-<version>`.
pub fn install_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("npm").join(format!("pi-{PI_VERSION}"))
}

/// The install in `dir`, if its marker names this binary's build inputs. `Ok(None)`: none,
/// or one built from other inputs (build again). An error: a bundle that is not what its
/// marker says was built, refused (see [`PiError::Digest`]), or one that cannot be read.
fn complete_install(dir: &Path) -> Result<Option<PiInstall>, PiError> {
    let Ok(marker) = fs::read_to_string(dir.join(MARKER)) else {
        return Ok(None);
    };
    let Some(expected) = marked_digest(&marker) else {
        return Ok(None);
    };
    let bundle = PiBundle::read(&dir.join(BUNDLE_FILE), Some(expected))?;
    Ok(Some(PiInstall {
        dir: dir.to_path_buf(),
        bundle,
        version: PI_VERSION.to_string(),
    }))
}

/// The pinned pi, if its bundle is already built under `state_dir` (never runs npm).
pub fn find_installed(state_dir: &Path) -> Result<Option<PiInstall>, PiError> {
    complete_install(&install_dir(state_dir))
}

/// Builds the pi bundle under `state_dir` unless it already is, and returns it. Runs npm
/// and the bundler at most once per state directory, also across concurrent processes; a
/// later call reads the marker and the bundle (and checks the bundle's digest).
pub fn ensure_installed(state_dir: &Path) -> Result<PiInstall, PiError> {
    ensure_installed_with(state_dir, &InstallOpts::default())
}

/// [`ensure_installed`] with given npm and node programs and timeout.
pub fn ensure_installed_with(state_dir: &Path, opts: &InstallOpts) -> Result<PiInstall, PiError> {
    let dir = install_dir(state_dir);
    if let Some(found) = complete_install(&dir)? {
        share_read_only(&dir)?;
        return Ok(found);
    }
    let npm_dir = state_dir.join("npm");
    fs::create_dir_all(&npm_dir).map_err(io_err("create", &npm_dir))?;
    let lock_path = npm_dir.join(format!("pi-{PI_VERSION}.lock"));
    let _lock = Flock::exclusive(&lock_path)?;
    // Someone may have finished while we waited for the lock.
    if let Some(found) = complete_install(&dir)? {
        return Ok(found);
    }
    remove_leftovers(&npm_dir);

    let tmp = npm_dir.join(format!(
        ".pi-{PI_VERSION}.tmp.{}.{}",
        std::process::id(),
        unique_suffix()
    ));
    let result = build_into(&tmp, opts).and_then(|_| {
        if dir.exists() {
            // An incomplete or older install: move it aside, then drop it.
            let stale = npm_dir.join(format!(
                ".pi-{PI_VERSION}.stale.{}.{}",
                std::process::id(),
                unique_suffix()
            ));
            fs::rename(&dir, &stale).map_err(io_err("move aside", &dir))?;
            let _ = fs::remove_dir_all(&stale);
        }
        fs::rename(&tmp, &dir).map_err(io_err("rename the new install to", &dir))
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result?;
    share_read_only(&dir)?;
    complete_install(&dir)?.ok_or_else(|| PiError::Incomplete {
        what: "its marker".to_string(),
        dir: dir.clone(),
        why: "the marker did not survive the rename".to_string(),
    })
}

/// Makes the install readable by everyone: a confined runner reads it as the sandbox user,
/// which (when the host runs as root) is not the install's owner. Nothing in it is secret.
fn share_read_only(dir: &Path) -> Result<(), PiError> {
    use std::os::unix::fs::PermissionsExt;
    let shared = |m: &fs::Metadata| m.permissions().mode() & 0o005 == 0o005;
    match fs::symlink_metadata(dir) {
        Ok(m) if shared(&m) => return Ok(()),
        Ok(_) => {}
        Err(e) => return Err(io_err("read", dir)(e)),
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let m = fs::symlink_metadata(&path).map_err(io_err("read", &path))?;
        if m.file_type().is_symlink() {
            continue;
        }
        let mode = m.permissions().mode();
        let want = if m.is_dir() {
            mode | 0o555
        } else {
            mode | 0o444
        };
        if want != mode {
            fs::set_permissions(&path, fs::Permissions::from_mode(want))
                .map_err(io_err("share", &path))?;
        }
        if m.is_dir() {
            for e in fs::read_dir(&path).map_err(io_err("list", &path))? {
                stack.push(e.map_err(io_err("list", &path))?.path());
            }
        }
    }
    Ok(())
}

/// Removes temporary and stale directories left by crashed installs. Called under the
/// lock, so none of them is in use by a wmo-e2b process.
fn remove_leftovers(npm_dir: &Path) {
    let Ok(entries) = fs::read_dir(npm_dir) else {
        return;
    };
    let tmp = format!(".pi-{PI_VERSION}.tmp.");
    let stale = format!(".pi-{PI_VERSION}.stale.");
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&tmp) || name.starts_with(&stale) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn unique_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// An exclusive `flock` on a file, released when dropped (or when the process dies).
struct Flock {
    _file: File,
}

impl Flock {
    fn exclusive(path: &Path) -> Result<Flock, PiError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(io_err("open the lock file", path))?;
        loop {
            // SAFETY: flock(2) on a descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(Flock { _file: file });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(io_err("lock", path)(e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::pi::build::{inputs_text, marker_text, REPORT_FILE};
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    /// A fake program: a shell script named `name` that records each run (as `program
    /// args`, the program being `name` up to a `-`) and does `body`.
    fn fake(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        let program = name.split('-').next().unwrap_or(name);
        let runs = dir.join("runs");
        fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"{program} $*\" >> '{}'\n{body}\n",
                runs.display()
            ),
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// npm's part: what `npm ci` leaves behind, a node_modules directory.
    fn good_npm(dir: &Path) -> PathBuf {
        fake(dir, "npm", "sleep 0.2\nmkdir -p node_modules/esbuild")
    }

    const BUNDLE: &str = "export const runAgentLoop = 1;\n";

    /// The bundler's part: the bundle (`$2`), and its report on stdout.
    fn node_printing(dir: &Path, name: &str, report: &str) -> PathBuf {
        fake(
            dir,
            name,
            &format!(
                "printf '{}' > \"$2\"\necho '{report}'",
                BUNDLE.replace('\n', "\\n")
            ),
        )
    }

    fn good_node(dir: &Path) -> PathBuf {
        node_printing(
            dir,
            "node",
            &format!(
                r#"{{"versions":{{"@mariozechner/pi-agent-core":"{PI_VERSION}","@mariozechner/pi-ai":"{PI_VERSION}"}},"esbuild":"{}"}}"#,
                crate::runner::pi::ESBUILD_VERSION
            ),
        )
    }

    fn runs(dir: &Path) -> Vec<String> {
        fs::read_to_string(dir.join("runs"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn opts(tools: &Path) -> InstallOpts {
        InstallOpts {
            npm: good_npm(tools),
            node: good_node(tools),
            timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_marked_install_is_reused_without_running_npm() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let dir = install_dir(state.path());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(BUNDLE_FILE), BUNDLE).unwrap();
        let sha = crate::digest::sha256_hex(BUNDLE.as_bytes());
        fs::write(dir.join(MARKER), marker_text(&sha)).unwrap();
        let found = ensure_installed_with(state.path(), &opts(tools.path())).unwrap();
        assert_eq!(runs(tools.path()), Vec::<String>::new(), "npm or node ran");
        assert_eq!(found.dir, dir);
        assert_eq!(found.bundle.file, dir.join(BUNDLE_FILE));
        assert_eq!(found.bundle.sha256, sha);
        assert_eq!(found.version, PI_VERSION);
        assert_eq!(find_installed(state.path()).unwrap(), Some(found));
        // the fast path takes no lock and creates nothing
        assert!(!state.path().join("npm").join("pi-0.73.1.lock").exists());
    }

    #[test]
    fn builds_once_then_reuses_keeping_only_the_bundle_and_its_inputs() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let o = opts(tools.path());
        let first = ensure_installed_with(state.path(), &o).unwrap();
        assert_eq!(first.bundle.bytes(), BUNDLE.as_bytes());
        assert_eq!(
            runs(tools.path()),
            [
                "npm ci --no-audit --no-fund --ignore-scripts --include=optional",
                "node build.mjs pi.mjs",
            ]
        );
        let mut kept: Vec<String> = fs::read_dir(&first.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        kept.sort();
        let mut want: Vec<String> = crate::runner::pi::BUILD_INPUTS
            .iter()
            .map(|(n, _)| n.to_string())
            .chain([BUNDLE_FILE, REPORT_FILE, MARKER].map(String::from))
            .collect();
        want.sort();
        assert_eq!(kept, want, "node_modules is removed after bundling");
        assert!(fs::read_to_string(first.dir.join(MARKER))
            .unwrap()
            .starts_with(&inputs_text()));

        let second = ensure_installed_with(state.path(), &o).unwrap();
        assert_eq!(first, second);
        assert_eq!(runs(tools.path()).len(), 2, "the second call built again");
        // nothing temporary left beside it
        let names: Vec<String> = fs::read_dir(state.path().join("npm"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(".pi-")),
            "leftovers: {names:?}"
        );
    }

    #[test]
    fn concurrent_callers_build_once() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let o = opts(tools.path());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let state = state.path().to_path_buf();
                let o = o.clone();
                std::thread::spawn(move || ensure_installed_with(&state, &o).unwrap())
            })
            .collect();
        let results: Vec<PiInstall> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(results.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(runs(tools.path()).len(), 2, "one npm ci, one build");
    }

    #[test]
    fn an_install_from_other_inputs_is_built_again() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let dir = install_dir(state.path());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(MARKER), "@mariozechner/pi-ai@0.1.0\n").unwrap();
        fs::write(dir.join("old-file"), "x").unwrap();
        let found = ensure_installed_with(state.path(), &opts(tools.path())).unwrap();
        assert_eq!(runs(tools.path()).len(), 2);
        assert!(!dir.join("old-file").exists());
        assert_eq!(
            fs::read_to_string(dir.join(MARKER)).unwrap(),
            marker_text(&found.bundle.sha256)
        );
    }

    /// A bundle that is not what was built (truncated, edited) is refused by its digest,
    /// naming the file, and nothing is rebuilt over it behind the user's back.
    #[test]
    fn a_corrupted_bundle_is_refused_by_its_digest() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let o = opts(tools.path());
        let built = ensure_installed_with(state.path(), &o).unwrap();
        let file = built.bundle.file.clone();
        fs::write(&file, &BUNDLE[..10]).unwrap();
        for e in [
            ensure_installed_with(state.path(), &o).unwrap_err(),
            find_installed(state.path()).unwrap_err(),
        ] {
            let PiError::Digest {
                file: named,
                expected,
                ..
            } = &e
            else {
                panic!("{e:?}");
            };
            assert_eq!(named, &file);
            assert_eq!(expected, &built.bundle.sha256);
            let msg = e.to_string();
            assert!(msg.contains(&file.display().to_string()), "{msg}");
            assert!(msg.contains("remove"), "{msg}");
        }
        assert_eq!(runs(tools.path()).len(), 2, "it was rebuilt");
    }

    #[test]
    fn npm_or_node_missing_is_named() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let missing = PathBuf::from("wmo-e2b-no-such-program-here");
        for (npm, node, program) in [
            (missing.clone(), good_node(tools.path()), "npm"),
            (good_npm(tools.path()), missing.clone(), "node"),
        ] {
            let e = ensure_installed_with(
                state.path(),
                &InstallOpts {
                    npm,
                    node,
                    timeout: Duration::from_secs(30),
                },
            )
            .unwrap_err();
            assert!(
                matches!(e, PiError::ToolMissing { program: p, .. } if p == program),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{program} is not installed")),
                "{msg}"
            );
            assert!(msg.contains("@mariozechner/pi-agent-core@0.73.1"), "{msg}");
            assert!(find_installed(state.path()).unwrap().is_none());
        }
    }

    #[test]
    fn a_failed_install_quotes_npm_stderr_and_leaves_nothing() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = fake(
            tools.path(),
            "npm-failing",
            "echo 'npm error code E404' >&2\necho 'npm error 404 Not Found - GET https://registry.npmjs.org/x' >&2\nexit 1",
        );
        let e = ensure_installed_with(
            state.path(),
            &InstallOpts {
                npm,
                ..opts(tools.path())
            },
        )
        .unwrap_err();
        assert!(matches!(e, PiError::Install { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("npm error 404 Not Found"), "{msg}");
        assert!(msg.contains("exit status: 1"), "{msg}");
        assert!(!install_dir(state.path()).exists());
        let names: Vec<_> = fs::read_dir(state.path().join("npm"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "only the lock file: {names:?}");
    }

    #[test]
    fn a_failed_or_wrong_build_is_its_own_error() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let failing = fake(
            tools.path(),
            "node-failing",
            "echo 'build.mjs: packages outside the list were pulled in: openai' >&2\nexit 1",
        );
        let e = ensure_installed_with(
            state.path(),
            &InstallOpts {
                node: failing,
                ..opts(tools.path())
            },
        )
        .unwrap_err();
        assert!(matches!(e, PiError::Bundle { .. }), "{e:?}");
        assert!(e.to_string().contains("pulled in: openai"), "{e}");

        let older = node_printing(
            tools.path(),
            "node-older",
            r#"{"versions":{"@mariozechner/pi-agent-core":"0.1.0","@mariozechner/pi-ai":"0.1.0"},"esbuild":"0.1.0"}"#,
        );
        let e = ensure_installed_with(
            state.path(),
            &InstallOpts {
                node: older,
                ..opts(tools.path())
            },
        )
        .unwrap_err();
        assert!(matches!(e, PiError::Incomplete { .. }), "{e:?}");
        assert!(e.to_string().contains("found version \"0.1.0\""), "{e}");
        assert!(find_installed(state.path()).unwrap().is_none());
    }

    /// Whether process `pid` is gone (or a zombie: dead, but not yet reaped by whichever
    /// process adopted it), waiting a bounded while for a kill to land.
    fn gone(pid: u32) -> bool {
        let stat = format!("/proc/{pid}/stat");
        for _ in 0..200 {
            match fs::read_to_string(&stat) {
                Err(_) => return true,
                Ok(text) => {
                    let state = text.rsplit(')').next().unwrap_or("").trim_start();
                    if state.starts_with('Z') {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// npm is killed at the timeout, with everything it started: the install fails before
    /// npm could finish, and npm's own child does not outlive the call.
    #[test]
    fn a_hanging_npm_is_killed_at_the_timeout() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let child_pid = tools.path().join("child.pid");
        let finished = tools.path().join("finished");
        // The child does not hold npm's pipes, so only a kill of the group ends it early.
        let npm = fake(
            tools.path(),
            "npm",
            &format!(
                "sleep 30 >/dev/null 2>&1 &\necho $! > '{}'\necho working >&2\nwait\ntouch '{}'",
                child_pid.display(),
                finished.display()
            ),
        );
        let e = ensure_installed_with(
            state.path(),
            &InstallOpts {
                npm,
                node: good_node(tools.path()),
                timeout: Duration::from_secs(1),
            },
        )
        .unwrap_err();
        assert!(matches!(e, PiError::Timeout { .. }), "{e:?}");
        assert!(e.to_string().contains("working"), "{e}");
        assert!(
            !finished.exists(),
            "the install waited for npm instead of killing it"
        );
        let pid: u32 = fs::read_to_string(&child_pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(gone(pid), "npm's child {pid} outlived the timeout");
    }
}
