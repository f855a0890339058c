//! How local sandbox processes are confined: under bubblewrap (`bwrap`), or not at all.
//!
//! Under bwrap a sandbox's processes live in mount namespaces of its own (one per role, made
//! by its namespace holders, see `ns`) in which only the system directories (read-only, with
//! the host's secrets masked), a fresh `/proc` and `/dev`, and the sandbox's own directories
//! exist: its home at `/home/user`, a private `/tmp`, and, for [`Role::System`] processes
//! only, the system directory at `/opt/wmo-e2b`. Nothing of the host's home or of the state
//! directory is visible. Processes join the sandbox's namespaces (see `enter`), run as uid
//! 1000 (`user`, as on E2B) without capabilities, and get their own network namespace when
//! the network is locked.
//!
//! Run as root, each sandbox gets a user namespace of its own mapping its ids onto a host id
//! range no one else has (see `id_range`), in which bwrap runs as that namespace's root; every
//! process that enters a sandbox drops to uid 1000 (host `base + 1000`) with no capability
//! before it runs (see `enter`), so sandboxed code never holds host root (which could write
//! `/proc/sys` files it owns), and nothing keyed by a uid crosses sandboxes. Where the kernel
//! refuses user namespaces, root's sandboxes run without one, as host uid 1000. Run as anyone
//! else, bwrap makes a user namespace mapping uid 1000 inside to the caller outside.
//!
//! The probe that decides whether bwrap works here runs once per wmo-e2b process.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::spawn::Spawn;
use super::sys;
use crate::sandbox::Role;

/// The uid and gid sandbox processes run as, inside and (when the host runs as root) outside.
pub const SANDBOX_UID: u32 = 1000;
/// The uid and gid a task's verifier runs as when the host runs as root: an identity the
/// agent never had, so nothing the agent left can signal or trace it. It is also a member of
/// the sandbox user's group, so it may write where the agent let that group write (task
/// processes start with umask 002, see `enter`). In a user namespace (not root) only
/// [`SANDBOX_UID`] is mapped, and the verifier runs as that.
pub const VERIFIER_UID: u32 = 1001;
/// Where a sandbox's verifier `HOME` and `TMPDIR` live, as task namespaces see them: the
/// host makes both anew, owned by the verifier, before each verify.
pub const BWRAP_VERIFIER: &str = "/verifier";
/// The home, `/tmp` and system directory as sandbox processes see them under bwrap.
pub const BWRAP_HOME: &str = "/home/user";
pub const BWRAP_TMP: &str = "/tmp";
pub const BWRAP_SYSTEM: &str = "/opt/wmo-e2b";

/// Where a Node.js installed outside the system directories appears in a sandbox.
const NODE_MOUNT: &str = "/opt/node";
/// System directories bound read-only (or recreated as the symlinks they are on the host).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
/// Host secrets under `/etc` that sandboxed code must not read: files are covered with an
/// empty file, directories with an empty tmpfs.
const MASKED_FILES: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
];
const MASKED_DIRS: &[&str] = &["/etc/ssh", "/etc/ssl/private"];
/// The identity sandboxed code sees, as on E2B; written beside the sandboxes and bound over
/// the host's files, which name the host's own accounts.
const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
    user:x:1000:1000:user:/home/user:/bin/bash\n\
    verifier:x:1001:1001:verifier:/verifier/home:/bin/bash\n\
    nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nuser:x:1000:verifier\nverifier:x:1001:\nnogroup:x:65534:\n";
/// A PATH that finds the usual tools in the sandbox; the directory holding `node` is added
/// when it lies elsewhere.
const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How a sandbox's processes are confined; recorded in its `meta.json`, so every wmo-e2b
/// process that connects to it starts processes the same way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Namespaces by bubblewrap: a boundary.
    Bwrap,
    /// Plain host processes in their own process groups: **not** a boundary. Sandboxes made
    /// before isolation existed read as this.
    #[default]
    None,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Bwrap => "bwrap",
            Isolation::None => "none",
        }
    }
}

/// What the user asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IsolationChoice {
    /// bwrap when it works here, otherwise none (with a warning for the user).
    #[default]
    Auto,
    Bwrap,
    None,
}

/// The isolation a backend will use, and why it is not bwrap when `auto` fell back.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub isolation: Isolation,
    /// Set when `auto` fell back to none: what is missing and how to install it.
    pub fallback_reason: Option<String>,
}

/// Decides the isolation for `choice`; `Err` only when bwrap was asked for and cannot run.
pub fn resolve(choice: IsolationChoice) -> Result<Resolved, String> {
    match choice {
        IsolationChoice::None => Ok(Resolved {
            isolation: Isolation::None,
            fallback_reason: None,
        }),
        IsolationChoice::Bwrap => probe().map(|_| Resolved {
            isolation: Isolation::Bwrap,
            fallback_reason: None,
        }),
        IsolationChoice::Auto => Ok(match probe() {
            Ok(_) => Resolved {
                isolation: Isolation::Bwrap,
                fallback_reason: None,
            },
            Err(why) => Resolved {
                isolation: Isolation::None,
                fallback_reason: Some(why),
            },
        }),
    }
}

/// How bwrap gets its privileges on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Privilege {
    /// We are root: bwrap needs no user namespace; processes drop to [`SANDBOX_UID`].
    Root,
    /// Anyone else: bwrap maps [`SANDBOX_UID`] to us in a user namespace.
    UserNamespace,
}

/// Everything about bwrap that is the same for every sandbox on this host, found once.
#[derive(Debug)]
pub(super) struct Bwrap {
    pub privilege: Privilege,
    pub setsid: PathBuf,
    pub bwrap: PathBuf,
    /// The system part of every bwrap command line, before the per-sandbox binds: the
    /// host's system directories as the root (unless an image is), then the mounts and
    /// namespaces every sandbox has, then Node.js when it lives outside them (see
    /// [`system_args`]).
    host_root: Vec<OsString>,
    mounts: Vec<OsString>,
    host_node: Vec<OsString>,
    /// The host's resolver configuration, which an image root gets in place of its own.
    resolv_conf: Option<PathBuf>,
    /// PATH inside the sandbox.
    pub path_env: String,
}

/// How many ids a sandbox's user namespace maps (as root; see `id_range`).
pub(super) const RANGE_SIZE: u32 = 65_536;

/// A sandbox's ids on the host, as root: id `n` inside is `base + n` outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub base: u32,
}

impl IdRange {
    /// The host id of the sandbox's id `inside`.
    pub fn host(self, inside: u32) -> u32 {
        self.base + inside.min(RANGE_SIZE - 1)
    }
}

/// bwrap as found and tested on this host, or why it cannot be used; probed once per process.
pub(super) fn probe() -> Result<&'static Bwrap, String> {
    static PROBE: OnceLock<Result<Bwrap, String>> = OnceLock::new();
    PROBE.get_or_init(probe_now).as_ref().map_err(Clone::clone)
}

fn probe_now() -> Result<Bwrap, String> {
    let install = "install the `bubblewrap` package (e.g. `apt-get install bubblewrap`), or pass \
                   --isolation none to run unconfined";
    let find = |name: &'static str| -> Result<PathBuf, String> {
        let p = sys::program(name);
        if p.is_absolute() {
            Ok(p)
        } else {
            Err(format!("`{name}` is not on PATH"))
        }
    };
    let bwrap = find("bwrap").map_err(|e| format!("{e}: {install}"))?;
    // SAFETY: geteuid cannot fail and touches no memory.
    let privilege = if unsafe { libc::geteuid() } == 0 {
        Privilege::Root
    } else {
        Privilege::UserNamespace
    };
    let mut b = Bwrap {
        privilege,
        setsid: find("setsid").map_err(|e| format!("{e} (util-linux)"))?,
        bwrap,
        host_root: Vec::new(),
        mounts: Vec::new(),
        host_node: Vec::new(),
        resolv_conf: std::fs::canonicalize("/etc/resolv.conf").ok(),
        path_env: SANDBOX_PATH.to_string(),
    };
    [b.host_root, b.mounts, b.host_node] = system_args(&mut b.path_env, privilege);
    check(&b).map_err(|why| format!("bwrap cannot create sandboxes here ({why}): {install}"))?;
    Ok(b)
}

/// The mounts every sandbox process shares: the host's system directories as its root, the
/// mounts every sandbox has over whatever root, and Node.js where it lives outside the
/// system directories.
fn system_args(path_env: &mut String, privilege: Privilege) -> [Vec<OsString>; 3] {
    let mut a = Args::default();
    for dir in SYSTEM_DIRS {
        let p = Path::new(dir);
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(p) {
                    a.push(["--symlink"]);
                    a.path(&target);
                    a.push([*dir]);
                }
            }
            Ok(m) if m.is_dir() => a.push(["--ro-bind", dir, dir]),
            _ => {}
        }
    }
    for file in MASKED_FILES {
        if Path::new(file).is_file() {
            a.push(["--ro-bind", "/dev/null", file]);
        }
    }
    for dir in MASKED_DIRS {
        if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
            a.push(["--tmpfs", dir]);
        }
    }
    // A resolv.conf that is a symlink (into /run, say) must find its target inside too.
    if let Ok(target) = std::fs::canonicalize("/etc/resolv.conf") {
        if !SYSTEM_DIRS.iter().any(|d| target.starts_with(d)) {
            a.push(["--ro-bind-try"]);
            a.path(&target);
            a.path(&target);
        }
    }
    let host_root = std::mem::take(&mut a.0);
    a.push([
        "--proc",
        "/proc",
        // Files under /proc/sys belong to root; never writable from a sandbox.
        "--ro-bind",
        "/proc/sys",
        "/proc/sys",
        "--ro-bind-try",
        "/proc/sysrq-trigger",
        "/proc/sysrq-trigger",
    ]);
    match privilege {
        Privilege::Root => a.push([
            "--dev",
            "/dev",
            // Sandbox processes share wmo-e2b's session: its terminal, if it has one, must
            // not be reachable (TIOCSTI would type into it).
            "--ro-bind",
            "/dev/null",
            "/dev/tty",
        ]),
        // bwrap's `--dev` mounts a devpts, for which it nests a second user namespace whose
        // PID namespace no other command could then enter; plain devices do without (and
        // without pseudo-terminals, or a terminal to reach).
        Privilege::UserNamespace => {
            a.push(["--tmpfs", "/dev"]);
            for dev in [
                "/dev/null",
                "/dev/zero",
                "/dev/full",
                "/dev/random",
                "/dev/urandom",
            ] {
                a.push(["--dev-bind", dev, dev]);
            }
            a.push([
                "--symlink",
                "/proc/self/fd",
                "/dev/fd",
                "--symlink",
                "/proc/self/fd/0",
                "/dev/stdin",
                "--symlink",
                "/proc/self/fd/1",
                "/dev/stdout",
                "--symlink",
                "/proc/self/fd/2",
                "/dev/stderr",
            ]);
        }
    }
    a.push([
        "--perms", "1777", "--tmpfs", "/dev/shm",
        // Parents of the sandbox's own mounts, world-readable (bwrap makes them 0700).
        "--dir", "/home", "--dir", "/opt",
    ]);
    let mounts = std::mem::take(&mut a.0);
    // Node.js installed outside the system directories (nvm, a tarball under /opt): bind its
    // installation, and only that, at a place of its own, where no directory of the
    // sandbox's (its home, its /tmp) can hide it.
    if let Ok(node) = std::fs::canonicalize(sys::program("node")) {
        let bin = node.parent();
        if let Some((bin, prefix)) = bin.zip(bin.and_then(Path::parent)) {
            if !SYSTEM_DIRS.iter().any(|d| node.starts_with(d)) && prefix != Path::new("/") {
                a.push(["--ro-bind"]);
                a.path(prefix);
                a.push([NODE_MOUNT]);
                if let Some(name) = bin.file_name().and_then(|n| n.to_str()) {
                    *path_env = format!("{NODE_MOUNT}/{name}:{path_env}");
                }
            }
        }
    }
    [host_root, mounts, a.0]
}

/// A command line under construction.
#[derive(Default)]
pub(super) struct Args(pub Vec<OsString>);

impl Args {
    pub fn push<const N: usize>(&mut self, args: [&str; N]) {
        self.0.extend(args.iter().map(OsString::from));
    }

    pub fn path(&mut self, p: &Path) {
        self.0.push(p.as_os_str().to_owned());
    }
}

/// One sandbox's directories on the host, as bwrap binds them.
#[derive(Clone, Copy)]
pub(super) struct Binds<'a> {
    pub home: &'a Path,
    pub tmp: &'a Path,
    pub system: &'a Path,
    /// The task's tests (read-only at `/tests`) and the verifier's directory, in task
    /// namespaces only.
    pub tests: &'a Path,
    pub verifier: &'a Path,
    /// `/logs`, in every namespace.
    pub logs: &'a Path,
    /// The identity files written beside the sandboxes.
    pub passwd: &'a Path,
    pub group: &'a Path,
    /// Host directories shared read-only with `Role::System` processes, and where.
    pub shared: &'a [(PathBuf, String)],
    /// Host directories shown read-only to every process, and where.
    pub everyone: &'a [(PathBuf, String)],
    /// The system directory shown read-only to every role, not only to `Role::System`.
    pub system_to_tasks: bool,
    /// The root of task processes when they run on an image (see `image_root`), in place
    /// of the host's system directories.
    pub root: Option<&'a Path>,
    /// The sandbox's boot id file (see `boot_id`), over the kernel's.
    pub boot_id: Option<&'a Path>,
}

impl Bwrap {
    /// `bwrap <namespace options> <system mounts> <sandbox binds>` up to (not including) the
    /// `--` before the program: a namespace holder's (see `ns`). `join` is the namespace
    /// options (`--unshare-pid`, `--pidns 10`, ...). The holder keeps no capability; the
    /// processes that enter it drop theirs themselves (see `enter`).
    pub fn command_line(&self, binds: &Binds<'_>, role: Role, join: &[&str]) -> Args {
        let mut a = Args::default();
        a.path(&self.bwrap);
        a.0.extend(join.iter().map(OsString::from));
        if self.privilege == Privilege::Root {
            a.push(["--cap-drop", "ALL"]);
        }
        a.push(["--unshare-ipc", "--unshare-uts", "--hostname", "sandbox"]);
        match binds.root.filter(|_| role != Role::System) {
            Some(root) => {
                a.push(["--bind"]);
                a.path(root);
                a.push(["/"]);
                // The image's own would name no resolver of this host's network.
                if let Some(resolv_conf) = &self.resolv_conf {
                    a.push(["--ro-bind-try"]);
                    a.path(resolv_conf);
                    a.push(["/etc/resolv.conf"]);
                }
                a.0.extend(self.mounts.iter().cloned());
            }
            None => {
                a.0.extend(self.host_root.iter().cloned());
                a.0.extend(self.mounts.iter().cloned());
                a.0.extend(self.host_node.iter().cloned());
            }
        }
        for (host, at) in binds.everyone {
            // bwrap makes missing mount points its own (0700): every process must pass.
            let ancestors: Vec<&Path> = Path::new(at).ancestors().skip(1).collect();
            for dir in ancestors.iter().rev().filter(|d| d.parent().is_some()) {
                a.push(["--perms", "0755", "--dir"]);
                a.path(dir);
            }
            a.push(["--ro-bind"]);
            a.path(host);
            a.push([at.as_str()]);
        }
        if let Some(boot_id) = binds.boot_id {
            // `-try`: a sandbox made before boot ids has none until it boots again.
            a.push(["--ro-bind-try"]);
            a.path(boot_id);
            a.push([super::boot_id::INSIDE]);
        }
        a.push(["--ro-bind"]);
        a.path(binds.passwd);
        a.push(["/etc/passwd", "--ro-bind"]);
        a.path(binds.group);
        a.push(["/etc/group", "--bind"]);
        a.path(binds.home);
        a.push([BWRAP_HOME, "--bind"]);
        a.path(binds.tmp);
        a.push([BWRAP_TMP]);
        if role != Role::System && binds.system_to_tasks {
            a.push(["--ro-bind"]);
            a.path(binds.system);
            a.push([BWRAP_SYSTEM]);
        }
        if role != Role::System {
            // Present in sandboxes made before verifiers existed only as empty places.
            a.push(["--ro-bind-try"]);
            a.path(binds.tests);
            a.push([crate::sandbox::TESTS_DIR, "--bind-try"]);
            a.path(binds.verifier);
            a.push([BWRAP_VERIFIER]);
        }
        // Harbor's tests leave their reward in `/logs/verifier`, emptied and made the
        // verifier's own after the agent is stopped (see `stop`); E2B's root (the emulator
        // runs its commands as `System`) makes it there.
        a.push(["--bind-try"]);
        a.path(binds.logs);
        a.push(["/logs"]);
        if role == Role::System {
            // E2B's root empties it (see `stop`); the emulator runs root's commands here.
            a.push(["--bind-try"]);
            a.path(binds.tests);
            a.push([crate::sandbox::TESTS_DIR, "--bind"]);
            a.path(binds.system);
            a.push([BWRAP_SYSTEM]);
            for (host, at) in binds.shared {
                a.push(["--ro-bind"]);
                a.path(host);
                a.push([at.as_str()]);
            }
        }
        a
    }

    /// The options that make a sandbox's first holder: its own PID namespace (and user
    /// namespace when not root).
    pub fn holder_options(&self) -> Vec<&'static str> {
        match self.privilege {
            Privilege::Root => vec!["--unshare-pid"],
            Privilege::UserNamespace => vec![
                "--unshare-user",
                "--uid",
                "1000",
                "--gid",
                "1000",
                "--unshare-pid",
            ],
        }
    }

    /// The identity a command of `role` that enters a holder drops to itself: as root, the
    /// sandbox user's (the verifier's for [`Role::Verify`]); in a user namespace it already
    /// is the sandbox user.
    pub fn drops_to(&self, role: Role) -> Option<Identity> {
        match (self.privilege, role) {
            (Privilege::UserNamespace, _) => None,
            (Privilege::Root, Role::Verify) => Some(Identity {
                uid: VERIFIER_UID,
                group: Some(SANDBOX_UID),
            }),
            (Privilege::Root, _) => Some(Identity {
                uid: SANDBOX_UID,
                group: None,
            }),
        }
    }

    /// Whether joining a sandbox's holder means entering its user namespace too: always
    /// when not root, and as root when the sandbox has an id range.
    pub fn in_user_namespace(&self, ids: Option<IdRange>) -> bool {
        self.privilege == Privilege::UserNamespace || ids.is_some()
    }

    /// Whether wmo-e2b runs as root (and so writes files for the sandbox user, hands them
    /// over, and sweeps task namespaces from inside).
    pub fn is_root(&self) -> bool {
        self.privilege == Privilege::Root
    }

    /// The host uid that owns what the host writes for a sandbox's `inside` user (as root).
    pub fn host_owner(&self, ids: Option<IdRange>, inside: u32) -> Option<u32> {
        self.is_root()
            .then(|| ids.map_or(inside, |r| r.host(inside)))
    }
}

/// Who an entered command becomes: `uid` as its uid and gid, and `group` as its one
/// supplementary group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    pub uid: u32,
    pub group: Option<u32>,
}

/// Writes the identity files sandboxes see into `dir` (once per backend).
pub(super) fn write_identity(dir: &Path) -> io::Result<(PathBuf, PathBuf)> {
    let passwd = dir.join("passwd");
    let group = dir.join("group");
    for (path, text) in [(&passwd, PASSWD), (&group, GROUP)] {
        if std::fs::read(path).ok().as_deref() != Some(text.as_bytes()) {
            std::fs::write(path, text)?;
        }
        // Readable by bwrap's sandbox user in a user namespace, which binds it as itself.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok((passwd, group))
}

/// Starts a throwaway sandbox with the namespaces sandboxes use and checks that it runs.
fn check(b: &Bwrap) -> Result<(), String> {
    let scratch = tempfile_dir().map_err(|e| format!("no scratch directory: {e}"))?;
    let home = scratch.join("home");
    let tmp = scratch.join("tmp");
    let result = (|| {
        std::fs::create_dir_all(&home).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
        let (passwd, group) = write_identity(&scratch).map_err(|e| e.to_string())?;
        if b.is_root() {
            for d in [&home, &tmp] {
                sys::chown(d, SANDBOX_UID).map_err(|e| e.to_string())?;
            }
        }
        let binds = Binds {
            home: &home,
            tmp: &tmp,
            system: &home,
            tests: &home,
            verifier: &home,
            logs: &home,
            passwd: &passwd,
            group: &group,
            shared: &[],
            everyone: &[],
            system_to_tasks: false,
            root: None,
            boot_id: None,
        };
        let mut opts = b.holder_options();
        opts.push("--unshare-net");
        let mut args = b.command_line(&binds, Role::Task, &opts).0;
        args.extend(["--".into(), "/bin/true".into()]);
        let mut cmd = Spawn::new(&args[0]);
        cmd.args(&args[1..]).env("PATH", &b.path_env);
        super::probe::runs(cmd, "a test sandbox").map_err(|f| f.why)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// A fresh private directory under the system temp directory for the probe.
fn tempfile_dir() -> io::Result<PathBuf> {
    let name = sys::random_hex(8)?;
    let dir = std::env::temp_dir().join(format!("wmo-e2b-probe-{name}"));
    std::fs::create_dir(&dir)?;
    Ok(dir)
}
