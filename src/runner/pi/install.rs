//! The host's pi install cache: the pinned packages under `<state_dir>/npm/pi-<version>/`,
//! installed once and reused.
//!
//! The install directory is filled under an exclusive `flock` (so concurrent wmo-e2b
//! processes run npm once), in a temporary directory renamed into place, and is only used
//! once its marker file lists exactly [`specs`].

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::npm::{install_into, io_err, marker_text, InstallOpts, PiError, MARKER};
use super::{specs, PiInstall, PI_VERSION};

/// Where [`ensure_installed`] puts pi: `<state_dir>/npm/pi-<version>`.
pub fn install_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("npm").join(format!("pi-{PI_VERSION}"))
}

/// The install in `dir` if its marker lists exactly the pinned specs.
fn complete_install(dir: &Path) -> Option<PiInstall> {
    let marker = fs::read_to_string(dir.join(MARKER)).ok()?;
    let modules_dir = dir.join("node_modules");
    (marker == marker_text() && modules_dir.is_dir()).then(|| PiInstall {
        modules_dir,
        version: PI_VERSION.to_string(),
    })
}

/// The pinned pi, if it is already installed under `state_dir` (never runs npm).
pub fn find_installed(state_dir: &Path) -> Option<PiInstall> {
    complete_install(&install_dir(state_dir))
}

/// Installs the pinned pi packages under `state_dir` unless they already are, and returns
/// where they are. Runs `npm install` at most once per state directory, also across
/// concurrent processes; a later call only reads the marker.
pub fn ensure_installed(state_dir: &Path) -> Result<PiInstall, PiError> {
    ensure_installed_with(state_dir, &InstallOpts::default())
}

/// [`ensure_installed`] with a given npm program and timeout.
pub fn ensure_installed_with(state_dir: &Path, opts: &InstallOpts) -> Result<PiInstall, PiError> {
    let dir = install_dir(state_dir);
    if let Some(found) = complete_install(&dir) {
        share_read_only(&dir)?;
        return Ok(found);
    }
    let npm_dir = dir
        .parent()
        .expect("install_dir has a parent")
        .to_path_buf();
    fs::create_dir_all(&npm_dir).map_err(io_err("create", &npm_dir))?;
    let lock_path = npm_dir.join(format!("pi-{PI_VERSION}.lock"));
    let _lock = Flock::exclusive(&lock_path)?;
    // Someone may have finished while we waited for the lock.
    if let Some(found) = complete_install(&dir) {
        return Ok(found);
    }
    remove_leftovers(&npm_dir);

    let tmp = npm_dir.join(format!(
        ".pi-{PI_VERSION}.tmp.{}.{}",
        std::process::id(),
        unique_suffix()
    ));
    let result = install_into(&tmp, opts).and_then(|()| {
        if dir.exists() {
            // An incomplete or foreign install: move it aside, then drop it.
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
    complete_install(&dir).ok_or_else(|| PiError::Incomplete {
        specs: specs().join(" "),
        package: "marker".to_string(),
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
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    /// A fake npm: a shell script that records each run and creates the packages.
    fn fake_npm(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("fake-npm");
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn good_npm(dir: &Path) -> PathBuf {
        let runs = dir.join("runs");
        fake_npm(
            dir,
            &format!(
                "echo \"$@\" >> '{}'\nsleep 0.2\nfor p in pi-agent-core pi-ai; do\n  mkdir -p node_modules/@mariozechner/$p\n  echo '{{\"version\":\"{PI_VERSION}\"}}' > node_modules/@mariozechner/$p/package.json\ndone",
                runs.display()
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

    fn opts(npm: PathBuf) -> InstallOpts {
        InstallOpts {
            npm,
            timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_marked_install_is_reused_without_running_npm() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let dir = install_dir(state.path());
        fs::create_dir_all(dir.join("node_modules/@mariozechner/pi-ai")).unwrap();
        fs::write(dir.join(MARKER), marker_text()).unwrap();
        let found = ensure_installed_with(state.path(), &opts(good_npm(tools.path()))).unwrap();
        assert_eq!(runs(tools.path()), Vec::<String>::new(), "npm ran");
        assert_eq!(found.modules_dir, dir.join("node_modules"));
        assert_eq!(found.version, PI_VERSION);
        assert_eq!(find_installed(state.path()), Some(found));
        // the fast path takes no lock and creates nothing
        assert!(!state.path().join("npm").join("pi-0.73.1.lock").exists());
    }

    #[test]
    fn installs_once_then_reuses() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = good_npm(tools.path());
        let first = ensure_installed_with(state.path(), &opts(npm.clone())).unwrap();
        let pj = first
            .modules_dir
            .join("@mariozechner/pi-agent-core/package.json");
        assert!(pj.is_file());
        let r = runs(tools.path());
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0],
            "install --no-audit --no-fund --ignore-scripts --save-exact \
             @mariozechner/pi-agent-core@0.73.1 @mariozechner/pi-ai@0.73.1"
        );
        let second = ensure_installed_with(state.path(), &opts(npm)).unwrap();
        assert_eq!(first, second);
        assert_eq!(runs(tools.path()).len(), 1, "the second call ran npm");
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
    fn concurrent_callers_run_npm_once() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = good_npm(tools.path());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let state = state.path().to_path_buf();
                let o = opts(npm.clone());
                std::thread::spawn(move || ensure_installed_with(&state, &o).unwrap())
            })
            .collect();
        let results: Vec<PiInstall> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(results.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(runs(tools.path()).len(), 1);
    }

    #[test]
    fn a_mismatched_marker_reinstalls() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let dir = install_dir(state.path());
        fs::create_dir_all(dir.join("node_modules")).unwrap();
        fs::write(dir.join(MARKER), "@mariozechner/pi-ai@0.1.0\n").unwrap();
        fs::write(dir.join("old-file"), "x").unwrap();
        let found = ensure_installed_with(state.path(), &opts(good_npm(tools.path()))).unwrap();
        assert_eq!(runs(tools.path()).len(), 1);
        assert!(!dir.join("old-file").exists());
        assert_eq!(fs::read_to_string(dir.join(MARKER)).unwrap(), marker_text());
        assert!(found.modules_dir.join("@mariozechner/pi-ai").is_dir());
    }

    #[test]
    fn npm_missing_is_named() {
        let state = tempfile::tempdir().unwrap();
        let e = ensure_installed_with(
            state.path(),
            &opts(PathBuf::from("wmo-e2b-no-such-npm-here")),
        )
        .unwrap_err();
        assert!(matches!(e, PiError::NpmMissing { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("npm is not installed"), "{msg}");
        assert!(msg.contains("@mariozechner/pi-agent-core@0.73.1"), "{msg}");
        assert!(find_installed(state.path()).is_none());
    }

    #[test]
    fn a_failed_install_quotes_npm_stderr_and_leaves_nothing() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = fake_npm(
            tools.path(),
            "echo 'npm error code E404' >&2\necho 'npm error 404 Not Found - GET https://registry.npmjs.org/x' >&2\nexit 1",
        );
        let e = ensure_installed_with(state.path(), &opts(npm)).unwrap_err();
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
    fn an_install_without_the_packages_is_incomplete() {
        let state = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let npm = fake_npm(tools.path(), "exit 0");
        let e = ensure_installed_with(state.path(), &opts(npm)).unwrap_err();
        assert!(matches!(e, PiError::Incomplete { .. }), "{e:?}");
        assert!(find_installed(state.path()).is_none());
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
        let npm = fake_npm(
            tools.path(),
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
