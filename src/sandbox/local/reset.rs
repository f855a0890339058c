//! Proven clean reuse: `seal` keeps a copy of the home and `/tmp` as they are; `reset` ends
//! every task process and puts both back, then checks that they match the copy.
//!
//! Processes: every [`Role::Task`] process lives in the sandbox's task PID namespace, so
//! killing its PID 1 ends them all, `setsid`, `nohup` and double forks included, and PID 1 is
//! not gone until they are. Only then are the directories touched, so nothing of the task can
//! write behind the reset. A fresh task namespace is started for the next task.
//!
//! Only bwrap sandboxes can be proven clean: an unconfined process can leave its process group
//! and the host's `/tmp` is shared, so `reset` refuses under `--isolation none` and the caller
//! retires the sandbox instead.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::meta::{self, PROCS_DIR, ROOT_DIR, SEALED_DIR, TMP_DIR};
use super::ns::{self, Space};
use super::process::KILL_WAIT;
use super::sandbox::{Mode, SandboxState};
use super::sys;
use crate::sandbox::{Result, Role, SandboxError};
use crate::sync::lock;

/// Files a sealed copy may hold at most; a home bigger than this is not worth copying back.
const MAX_SEALED_ENTRIES: usize = 10_000;

/// What `reset` returns to.
pub(super) struct Sealed {
    /// The sealed copy of each directory and what it holds.
    trees: Vec<(PathBuf, PathBuf, Vec<Entry>)>,
}

/// One entry of a directory tree, as a reset compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    path: String,
    kind: Kind,
    mode: u32,
    size: u64,
    link: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
    Other,
}

/// The sandbox's own directories that a reset restores, with the mode each must have.
fn restored(state: &SandboxState) -> [(PathBuf, &'static str, u32); 2] {
    [
        (state.dir.join(ROOT_DIR), "home", 0o755),
        (state.dir.join(TMP_DIR), "tmp", 0o1777),
    ]
}

pub(super) fn seal(state: &SandboxState) -> Result<()> {
    let unclean = |reason: String| SandboxError::Unclean {
        id: state.id.clone(),
        reason,
    };
    if let Mode::None = state.mode {
        // Nothing to keep: a reset under --isolation none is refused anyway.
        return Ok(());
    }
    let mut guard = lock(&state.sealed);
    let base = state.dir.join(SEALED_DIR);
    remove_tree(&base).map_err(|e| unclean(format!("cannot clear the sealed copy: {e}")))?;
    meta::private_dir(&base).map_err(|e| unclean(format!("cannot keep a sealed copy: {e}")))?;
    let mut trees = Vec::new();
    for (live, name, _) in restored(state) {
        let copy = base.join(name);
        let mut count = 0;
        copy_tree(&live, &copy, None, &mut count)
            .map_err(|e| unclean(format!("cannot copy the {name} directory aside: {e}")))?;
        let listing = manifest(&copy).map_err(|e| unclean(format!("cannot list {name}: {e}")))?;
        trees.push((live, copy, listing));
    }
    *guard = Some(Sealed { trees });
    Ok(())
}

pub(super) fn reset(state: &Arc<SandboxState>) -> Result<()> {
    let unclean = |reason: String| SandboxError::Unclean {
        id: state.id.clone(),
        reason,
    };
    let Mode::Bwrap(bwrap) = state.mode else {
        return Err(unclean(
            "under --isolation none a task's processes can leave their process group and its \
             /tmp is the host's, so the sandbox is not reused"
                .into(),
        ));
    };
    let guard = lock(&state.sealed);
    let Some(sealed) = guard.as_ref() else {
        return Err(unclean("it was never sealed".into()));
    };
    end_task_processes(state).map_err(unclean)?;
    let owner = state.file_owner();
    for ((live, copy, listing), (_, name, mode)) in sealed.trees.iter().zip(restored(state)) {
        let restore = || -> io::Result<Vec<Entry>> {
            empty_dir(live)?;
            let mut count = 0;
            copy_tree(copy, live, owner, &mut count)?;
            fs::set_permissions(live, fs::Permissions::from_mode(mode))?;
            if let Some(uid) = owner {
                sys::chown(live, uid)?;
            }
            manifest(live)
        };
        match restore() {
            Ok(now) if now == *listing => {}
            Ok(now) => {
                let first = first_difference(listing, &now);
                return Err(unclean(format!(
                    "its {name} directory differs from the sealed copy after the reset ({first})"
                )));
            }
            Err(e) => return Err(unclean(format!("cannot restore its {name} directory: {e}"))),
        }
    }
    drop(guard);
    state.replace_task_namespace(bwrap)?;
    Ok(())
}

/// Kills every task process and proves them gone: all of them by the task namespace's PID 1,
/// then the recorded ones by their groups (which hold their host-side launchers; see
/// `Holder::kill` for the order).
fn end_task_processes(state: &SandboxState) -> std::result::Result<(), String> {
    let records = meta::read_proc_records(&state.dir.join(PROCS_DIR))
        .map_err(|e| format!("cannot read its process records: {e}"))?;
    if let Ok(holder) = ns::read(&state.dir, Space::Task) {
        match holder.kill(KILL_WAIT) {
            Ok(true) => {}
            Ok(false) => {
                return Err("its task namespace still runs 5 s after SIGKILL".into());
            }
            Err(e) => return Err(format!("cannot kill its task namespace: {e}")),
        }
    }
    let mut signalled = Vec::new();
    for rec in records.iter().filter(|r| r.role == Role::Task) {
        let ours = lock(&state.procs).get(&rec.pid).cloned();
        let killed = match ours {
            Some(entry) => entry.kill_group(),
            None => sys::kill_recorded_group(rec.pid, rec.start_time),
        };
        match killed {
            Ok(true) => signalled.push(rec.pid),
            Ok(false) => {}
            Err(e) => return Err(format!("cannot kill process group {}: {e}", rec.pid)),
        }
    }
    let alive = sys::wait_groups_gone(&signalled, KILL_WAIT);
    if !alive.is_empty() {
        return Err(format!(
            "task process groups {alive:?} still run 5 s after SIGKILL"
        ));
    }
    let mut table = lock(&state.procs);
    for rec in records.iter().filter(|r| r.role == Role::Task) {
        table.remove(&rec.pid);
        meta::remove_proc_record(&state.dir, rec.pid);
    }
    Ok(())
}

/// Removes everything inside `dir`, never following a symlink.
fn empty_dir(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        remove_tree(&entry?.path())?;
    }
    Ok(())
}

/// Removes a file, symlink or tree. A directory the sandbox made unreadable to its owner is
/// opened up first (as root the host needs no such help; in a user namespace it does).
fn remove_tree(path: &Path) -> io::Result<()> {
    let m = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !m.is_dir() {
        return fs::remove_file(path);
    }
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            open_up(path)?;
            fs::remove_dir_all(path)
        }
        other => other,
    }
}

fn open_up(dir: &Path) -> io::Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            open_up(&entry.path())?;
        }
    }
    Ok(())
}

/// Copies a tree: directories, regular files and symlinks (as symlinks), with their modes;
/// anything else is left out. `owner` receives what is made.
fn copy_tree(from: &Path, to: &Path, owner: Option<u32>, count: &mut usize) -> io::Result<()> {
    if !to.exists() {
        fs::create_dir(to)?;
    }
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        *count += 1;
        if *count > MAX_SEALED_ENTRIES {
            return Err(io::Error::other(format!(
                "more than {MAX_SEALED_ENTRIES} entries"
            )));
        }
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let m = fs::symlink_metadata(&src)?;
        let ft = m.file_type();
        if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&src)?, &dst)?;
        } else if ft.is_dir() {
            fs::create_dir(&dst)?;
            copy_tree(&src, &dst, owner, count)?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(m.mode() & 0o7777))?;
        } else if ft.is_file() {
            fs::copy(&src, &dst)?;
        } else {
            continue;
        }
        if let Some(uid) = owner {
            sys::chown(&dst, uid)?;
        }
    }
    Ok(())
}

/// What a tree holds, sorted by path.
fn manifest(root: &Path) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    walk(root, "", &mut out)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<Entry>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if out.len() >= MAX_SEALED_ENTRIES {
            return Err(io::Error::other(format!(
                "more than {MAX_SEALED_ENTRIES} entries"
            )));
        }
        let m = fs::symlink_metadata(entry.path())?;
        let ft = m.file_type();
        let kind = if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else {
            Kind::Other
        };
        out.push(Entry {
            path: path.clone(),
            kind,
            mode: m.mode() & 0o7777,
            size: if kind == Kind::File { m.len() } else { 0 },
            link: (kind == Kind::Symlink)
                .then(|| fs::read_link(entry.path()))
                .transpose()?,
        });
        if kind == Kind::Dir {
            walk(&entry.path(), &path, out)?;
        }
    }
    Ok(())
}

fn first_difference(want: &[Entry], got: &[Entry]) -> String {
    for (w, g) in want.iter().zip(got) {
        if w != g {
            return format!("{} is not as sealed", g.path);
        }
    }
    match (want.len(), got.len()) {
        (w, g) if g > w => format!("{} was left behind", got[w].path),
        (w, g) if w > g => format!("{} is missing", want[g].path),
        _ => "the listings differ".into(),
    }
}
