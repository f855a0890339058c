//! A sandbox's control groups: what bounds its memory (tmpfs pages its processes write
//! included), its process count and its CPU time.
//!
//! Each sandbox gets a cgroup of its own, `wmo-e2b/<state>/<id>` (`<state>` names the state
//! directory, so sweeps of two state directories never touch each other's), under the cgroup this process runs
//! in (so a limit the host put on us still holds for our sandboxes): one per controller on
//! cgroup v1 (memory, pids, cpu), one on v2 (under the parent of ours, which is the subtree
//! systemd delegates to a user, since v2 gives controllers only to cgroups without processes
//! of their own). Every process of the sandbox joins it before its exec (see
//! `Spawn::join_cgroups`), so what it forks is counted from its first instruction. Where they
//! are is recorded in the sandbox's directory (`cgroups`), so any wmo-e2b process finds them;
//! they are removed when the sandbox dies, and any left by a crash at the next sweep.
//!
//! Where no hierarchy is ours to write (a user without a delegated subtree), sandboxes run
//! without limits and the backend says so once (see `unavailable`).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::sandbox::limits::Limits;

/// The record of a sandbox's cgroups, in its directory: `<controller> <path>` a line.
pub(super) const CGROUP_FILE: &str = "cgroups";
/// Our directory under each hierarchy's parent.
const OURS: &str = "wmo-e2b";
/// The CPU quota's period, in microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;
/// How long a removal waits for the processes it killed to leave the cgroup.
const REMOVE_WAIT: Duration = Duration::from_secs(5);
/// The most processes one removal signals per pass, and the most leftovers a sweep removes.
const MAX_LISTED: usize = 65_536;
/// Bytes of a cgroup file we read at most.
const MAX_READ: u64 = 64 * 1024;

/// One controller's cgroup (`Unified` on v2, which holds them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    Memory,
    Pids,
    Cpu,
    Unified,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Unified => "unified",
        }
    }

    fn parse(s: &str) -> Option<Controller> {
        [
            Controller::Memory,
            Controller::Pids,
            Controller::Cpu,
            Controller::Unified,
        ]
        .into_iter()
        .find(|c| c.name() == s)
    }
}

/// Where our sandboxes' cgroups go: `<parent>/wmo-e2b` per controller.
#[derive(Debug)]
struct Layout {
    parents: Vec<(Controller, PathBuf)>,
}

/// The layout of this host, found once; the error says why sandboxes run without limits.
fn layout() -> &'static Result<Layout, String> {
    static LAYOUT: OnceLock<Result<Layout, String>> = OnceLock::new();
    LAYOUT.get_or_init(find_layout)
}

/// Why sandboxes run without limits here, if they do: for one warning to the user.
pub(super) fn unavailable() -> Option<&'static str> {
    layout().as_ref().err().map(String::as_str)
}

/// How a sandbox's processes counted against its limits so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counters {
    /// Processes killed for want of memory.
    pub oom_kills: u64,
    /// Forks refused at the process limit.
    pub pids_refused: u64,
}

/// A sandbox's cgroups.
#[derive(Debug, Clone)]
pub(super) struct Cgroup {
    dirs: Vec<(Controller, PathBuf)>,
}

impl Cgroup {
    /// Makes the cgroups of sandbox `id` and records them in `sandbox_dir` (in the
    /// sandboxes directory). `None` where this host gives us none.
    pub fn create(sandbox_dir: &Path, id: &str) -> io::Result<Option<Cgroup>> {
        let Ok(layout) = layout() else {
            return Ok(None);
        };
        let scope = scope_of(sandbox_dir);
        let mut made = Cgroup { dirs: Vec::new() };
        for (controller, parent) in &layout.parents {
            let dir = parent.join(&scope).join(id);
            // Twice: a removal of the last sandbox of this scope may take the scope away
            // between its creation and ours.
            let created = fs::create_dir_all(&dir).or_else(|_| fs::create_dir_all(&dir));
            match created {
                Ok(()) => made.dirs.push((*controller, dir)),
                Err(e) => {
                    let _ = made.remove();
                    return Err(e);
                }
            }
        }
        let record: String = made
            .dirs
            .iter()
            .map(|(c, d)| format!("{} {}\n", c.name(), d.display()))
            .collect();
        if let Err(e) = fs::write(sandbox_dir.join(CGROUP_FILE), record) {
            let _ = made.remove();
            return Err(e);
        }
        Ok(Some(made))
    }

    /// The cgroups recorded for the sandbox in `sandbox_dir`, if it has any. Only a path
    /// under our own cgroups, named for a sandbox, is taken from the record.
    pub fn of(sandbox_dir: &Path) -> Option<Cgroup> {
        let text = read_bounded(&sandbox_dir.join(CGROUP_FILE)).ok()?;
        let layout = layout().as_ref().ok()?;
        let scope = scope_of(sandbox_dir);
        let dirs: Vec<(Controller, PathBuf)> = text
            .lines()
            .filter_map(|line| {
                let (name, path) = line.split_once(' ')?;
                let controller = Controller::parse(name)?;
                let path = PathBuf::from(path);
                let (_, parent) = layout.parents.iter().find(|(c, _)| *c == controller)?;
                let leaf = path.file_name()?.to_str()?;
                (path.parent() == Some(parent.join(&scope).as_path()) && is_sandbox_name(leaf))
                    .then_some((controller, path))
            })
            .collect();
        (!dirs.is_empty()).then_some(Cgroup { dirs })
    }

    /// Each cgroup's `cgroup.procs`, open for a child to write itself into.
    pub fn procs_files(&self) -> io::Result<Vec<OwnedFd>> {
        self.dirs
            .iter()
            .map(|(_, dir)| {
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(dir.join("cgroup.procs"))
                    .map(OwnedFd::from)
            })
            .collect()
    }

    /// Sets the limits; a resource `limits` leaves unbounded is unbounded again.
    pub fn apply(&self, limits: &Limits) -> io::Result<()> {
        let bytes = limits.memory_mb.map(|mb| mb << 20);
        let pids = limits.pids;
        let quota_us = limits
            .cpus
            .map(|c| ((c * CPU_PERIOD_US as f64) as u64).max(1_000));
        for (controller, dir) in &self.dirs {
            match controller {
                Controller::Memory => {
                    // The kernel's "no limit" on v1, rounded down to a page.
                    let v = bytes.map_or("-1".to_string(), |b| b.to_string());
                    // With swap accounted, memory plus swap must be bounded too, and never
                    // below memory alone: raised after it when lowering, before when raising.
                    let swap = dir.join("memory.memsw.limit_in_bytes");
                    let lowered = write(&dir.join("memory.limit_in_bytes"), &v);
                    if swap.exists() {
                        write(&swap, &v)?;
                    }
                    if lowered.is_err() {
                        write(&dir.join("memory.limit_in_bytes"), &v)?;
                    }
                }
                Controller::Pids => write(&dir.join("pids.max"), &max_or(pids))?,
                Controller::Cpu => {
                    write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                    let v = quota_us.map_or("-1".to_string(), |q| q.to_string());
                    let quota = dir.join("cpu.cfs_quota_us");
                    match write(&quota, &v) {
                        // v1 refuses a quota above an ancestor's (the cgroup this run is in:
                        // a container's or a batch job's CPU limit). That ancestor already
                        // holds the sandbox to less than asked, so it inherits that limit.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && quota_us.is_some() => {
                            write(&quota, "-1")?
                        }
                        written => written?,
                    }
                }
                Controller::Unified => {
                    write(&dir.join("memory.max"), &max_or(bytes))?;
                    // Swap would let memory past the limit; not every host accounts it.
                    if bytes.is_some() {
                        let _ = write(&dir.join("memory.swap.max"), "0");
                    }
                    write(&dir.join("pids.max"), &max_or(pids))?;
                    let cpu = match quota_us {
                        Some(q) => format!("{q} {CPU_PERIOD_US}"),
                        None => format!("max {CPU_PERIOD_US}"),
                    };
                    // cpu is the one controller a delegated subtree may lack.
                    let _ = write(&dir.join("cpu.max"), &cpu);
                }
            }
        }
        Ok(())
    }

    /// What the kernel counted against the limits so far (never reset).
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for (controller, dir) in &self.dirs {
            let field = |file: &str, key: &str| {
                read_bounded(&dir.join(file))
                    .ok()
                    .and_then(|text| keyed(&text, key))
                    .unwrap_or(0)
            };
            match controller {
                Controller::Memory => c.oom_kills = field("memory.oom_control", "oom_kill"),
                Controller::Pids => c.pids_refused = field("pids.events", "max"),
                Controller::Cpu => {}
                Controller::Unified => {
                    c.oom_kills = field("memory.events", "oom_kill");
                    c.pids_refused = field("pids.events", "max");
                }
            }
        }
        c
    }

    /// Kills whatever still runs in the cgroups and removes them, waiting a bounded time for
    /// the killed to leave; then their scope, if no other sandbox is left in it.
    pub fn remove(&self) -> io::Result<()> {
        let deadline = Instant::now() + REMOVE_WAIT;
        let mut last = Ok(());
        for (_, dir) in &self.dirs {
            last = last.and(remove_dir(dir, deadline));
            if let Some(scope) = dir.parent() {
                // Fails while another sandbox's cgroup is in it, as it should.
                let _ = fs::remove_dir(scope);
            }
        }
        last
    }
}

/// Removes one cgroup: a process left in it (one that escaped every other kill) is killed.
fn remove_dir(dir: &Path, deadline: Instant) -> io::Result<()> {
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => {}
        }
        // v2 kills the whole cgroup in one write; v1 lists its processes.
        if write(&dir.join("cgroup.kill"), "1").is_err() {
            let listed = read_bounded(&dir.join("cgroup.procs")).unwrap_or_default();
            for pid in listed.lines().take(MAX_LISTED) {
                if let Ok(pid) = pid.trim().parse::<libc::pid_t>() {
                    // SAFETY: a signal to a pid; no memory is involved.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes the cgroups of the sandboxes of `sandboxes` whose directory is gone (a crash
/// between a kill and the removal); `alive` says whether sandbox `id` still exists (or is
/// being made).
pub(super) fn sweep_leftovers(sandboxes: &Path, alive: impl Fn(&str) -> bool) {
    let Ok(layout) = layout() else { return };
    let deadline = Instant::now() + REMOVE_WAIT;
    let scope = scope_of(&sandboxes.join("-"));
    for (_, parent) in &layout.parents {
        for dir in leftovers(&parent.join(&scope), &alive) {
            let _ = remove_dir(&dir, deadline);
        }
    }
}

/// The sandbox cgroups in `scope_dir` whose sandbox is not `alive`. A scope holds the
/// kernel's own files too (`tasks`, `cgroup.procs`): only a directory is a sandbox's cgroup.
fn leftovers(scope_dir: &Path, alive: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(scope_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .take(MAX_LISTED)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|name| is_sandbox_name(name) && !alive(name))
        })
        .map(|e| e.path())
        .collect()
}

/// The scope of the sandboxes directory holding `sandbox_dir`: a short digest of its path.
fn scope_of(sandbox_dir: &Path) -> String {
    let sandboxes = sandbox_dir.parent().unwrap_or(sandbox_dir);
    let digest = crate::digest::sha256_hex(sandboxes.as_os_str().as_encoded_bytes());
    format!("s{}", &digest[..16])
}

/// A sandbox id as a cgroup name: nothing that could climb out of our directory.
fn is_sandbox_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn max_or(v: Option<u64>) -> String {
    v.map_or("max".to_string(), |v| v.to_string())
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value)
}

fn read_bounded(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    File::open(path)?.take(MAX_READ).read_to_string(&mut text)?;
    Ok(text)
}

/// The number after `key` on its line (`key N`), as cgroup event files write them.
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

fn find_layout() -> Result<Layout, String> {
    let mounts = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let ours = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let mounts = cgroup_mounts(&mounts);
    let v1 = |controller: &str| {
        mounts
            .iter()
            .find(|m| !m.unified && m.options.split(',').any(|o| o == controller))
    };
    let unified = mounts.iter().find(|m| m.unified);
    let v2_has = |want: &[&str]| {
        unified.is_some_and(|m| {
            read_bounded(&m.point.join("cgroup.controllers"))
                .is_ok_and(|c| want.iter().all(|w| c.split_whitespace().any(|x| x == *w)))
        })
    };
    if let (Some(memory), Some(pids)) = (v1("memory"), v1("pids")) {
        let mut parents = Vec::new();
        for (controller, mount) in [
            (Controller::Memory, Some(memory)),
            (Controller::Pids, Some(pids)),
            (Controller::Cpu, v1("cpu")),
        ] {
            let Some(mount) = mount else { continue };
            let own = own_path(&ours, controller.name()).ok_or_else(|| {
                format!("/proc/self/cgroup names no {} cgroup", controller.name())
            })?;
            let parent = mount.dir_of(&own).join(OURS);
            ensure_dir(&parent)?;
            parents.push((controller, parent));
        }
        return Ok(Layout { parents });
    }
    if let (Some(mount), true) = (unified, v2_has(&["memory", "pids"])) {
        let own = own_path(&ours, "").ok_or("/proc/self/cgroup names no cgroup v2 path")?;
        // Our own cgroup holds processes (ours), so v2 would give its children no
        // controllers; its parent is the delegated subtree's root or a slice.
        let own_dir = mount.dir_of(&own);
        let base = match own.trim_end_matches('/') {
            "" => own_dir,
            _ => own_dir.parent().map_or(own_dir.clone(), Path::to_path_buf),
        };
        let parent = base.join(OURS);
        ensure_dir(&parent)?;
        for controllers in [&base, &parent] {
            for c in ["memory", "pids", "cpu"] {
                let enabled = write(
                    &controllers.join("cgroup.subtree_control"),
                    &format!("+{c}"),
                );
                if enabled.is_err() && c != "cpu" {
                    return Err(format!(
                        "cannot give the {c} controller to {}: sandboxes run without limits",
                        parent.display()
                    ));
                }
            }
        }
        return Ok(Layout {
            parents: vec![(Controller::Unified, parent)],
        });
    }
    Err("no cgroup hierarchy with the memory and pids controllers is mounted: sandboxes run without limits".into())
}

fn ensure_dir(dir: &Path) -> Result<(), String> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!(
            "cannot make {} ({e}); as root, or with a cgroup subtree delegated to this user, sandboxes get limits: they run without",
            dir.display()
        )),
    }
}

/// A cgroup filesystem mounted here.
#[derive(Debug)]
struct CgroupMount {
    /// The hierarchy's path that is mounted (not `/` inside a container, say).
    root: String,
    point: PathBuf,
    unified: bool,
    /// Its super options, which name its controllers on v1.
    options: String,
}

impl CgroupMount {
    /// The directory of cgroup `path` (as `/proc/self/cgroup` names it).
    fn dir_of(&self, path: &str) -> PathBuf {
        let rel = path.strip_prefix(self.root.as_str()).unwrap_or(path);
        self.point.join(rel.trim_start_matches('/'))
    }
}

/// The cgroup mounts of a mountinfo text.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let _source = right.next()?;
            let options = right.next().unwrap_or("").to_string();
            let unified = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(CgroupMount {
                root: (*fields.get(3)?).to_string(),
                point: PathBuf::from(fields.get(4)?),
                unified,
                options,
            })
        })
        .collect()
}

/// Our cgroup's path for `controller` (`""` for v2's line) in a `/proc/self/cgroup` text.
fn own_path(text: &str, controller: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = match controller {
            "" => names.is_empty(),
            c => names.split(',').any(|n| n == c),
        };
        matches.then(|| path.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_and_own_paths_are_read() {
        let info = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                    35 31 0:31 /outer /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                    40 31 0:36 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let mounts = cgroup_mounts(info);
        assert_eq!(mounts.len(), 2);
        assert!(!mounts[0].unified && mounts[0].options.contains("memory"));
        assert_eq!(
            mounts[0].dir_of("/outer/job"),
            PathBuf::from("/sys/fs/cgroup/memory/job")
        );
        let own = "4:memory:/outer/job\n1:cpu,cpuacct:/\n0::/user.slice/s.scope\n";
        assert_eq!(own_path(own, "memory").as_deref(), Some("/outer/job"));
        assert_eq!(own_path(own, "cpu").as_deref(), Some("/"));
        assert_eq!(own_path(own, "").as_deref(), Some("/user.slice/s.scope"));
    }

    #[test]
    fn event_counts_are_read_by_key() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed(text, "oom_kill"), Some(3));
        assert_eq!(keyed("max 7\n", "max"), Some(7));
        assert_eq!(keyed("low 1\n", "max"), None);
    }

    #[test]
    fn only_the_directories_of_sandboxes_gone_are_leftovers() {
        let scope = tempfile::tempdir().unwrap();
        for dir in ["lsb-gone", "lsb-live"] {
            fs::create_dir(scope.path().join(dir)).unwrap();
        }
        // The kernel's files in a v1 cgroup, named as a sandbox could be.
        for file in ["tasks", "notify_on_release"] {
            fs::write(scope.path().join(file), "").unwrap();
        }
        let found = leftovers(scope.path(), |id| id == "lsb-live");
        assert_eq!(found, vec![scope.path().join("lsb-gone")]);
    }

    #[test]
    fn a_recorded_name_cannot_climb_out() {
        assert!(is_sandbox_name("lsb-1234abcd"));
        for bad in ["", ".", "..", "a/b", "a b"] {
            assert!(!is_sandbox_name(bad), "{bad:?}");
        }
    }
}
