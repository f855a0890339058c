//! The sandbox seam: what every backend offers, and the error classes callers act on.
//!
//! Everything above this module (runner bootstrap, channel, pool, environment, projects) is
//! written against [`Sandbox`] and [`Backend`] only, so the same code drives local process
//! sandboxes and E2B microVMs. Paths handed to a sandbox are absolute paths built from
//! [`Sandbox::home`].

mod captured;
pub use captured::Captured;
pub mod e2b;
pub mod inventory;
pub mod leased;
pub mod ledger;
pub mod limits;
pub mod local;
pub mod sink;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;

pub use limits::{LimitHit, Limits};
pub use sink::{Delivery, EventSink, OutputSink};

/// Metadata attached to a sandbox at create time and used as a list filter.
pub type Metadata = BTreeMap<String, String>;

/// How a sandbox error should be handled, decided where the error is born.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The connection or the process stream failed; a fresh sandbox may succeed.
    Transport,
    /// The backend has no room right now (429, 5xx, a full host); retry later.
    Capacity,
    /// The sandbox (or process) no longer exists.
    Gone,
    /// Credentials were refused.
    Auth,
    /// The request itself is wrong; retrying cannot help.
    BadRequest,
    /// The backend cannot do this at all on this host.
    Unsupported,
}

/// A failure of a sandbox or backend operation.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox {id} is gone")]
    Gone { id: String },
    /// The sandbox lives but is paused: nothing runs in it until [`Backend::connect`]
    /// resumes it.
    #[error("sandbox {id} is paused; connecting to it resumes it")]
    Paused { id: String },
    #[error("process {pid} is not running in sandbox {id}")]
    NoSuchProcess { id: String, pid: u32 },
    #[error("{what} failed in sandbox {id}")]
    Io {
        id: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("path {path:?} is not allowed: {reason}")]
    BadPath { path: String, reason: &'static str },
    /// A file or directory the request names does not exist in the sandbox.
    #[error("{path} does not exist")]
    NotFound { path: String },
    #[error("{0}")]
    Unsupported(String),
    /// `reset` could not prove the sandbox back in its sealed state; it must not serve again.
    #[error("sandbox {id} cannot be proven clean: {reason}")]
    Unclean { id: String, reason: String },
    #[error("{message}")]
    Remote {
        class: ErrorClass,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A create that failed in a way that may have made a sandbox all the same (its answer
    /// was lost to a timeout, a cut connection, or a 5xx that can follow the work). Such a
    /// sandbox carries the create's metadata, so it is found by its lease tag.
    #[error("the create may have made a sandbox that no answer named")]
    CreateUnconfirmed {
        #[source]
        source: Box<SandboxError>,
    },
}

impl SandboxError {
    pub fn class(&self) -> ErrorClass {
        match self {
            // A paused sandbox serves no call, as on E2B, whose envd answers as for a gone one.
            SandboxError::Gone { .. }
            | SandboxError::Paused { .. }
            | SandboxError::NoSuchProcess { .. } => ErrorClass::Gone,
            SandboxError::Io { .. } | SandboxError::Unclean { .. } => ErrorClass::Transport,
            SandboxError::BadPath { .. } | SandboxError::NotFound { .. } => ErrorClass::BadRequest,
            SandboxError::Unsupported(_) => ErrorClass::Unsupported,
            SandboxError::Remote { class, .. } => *class,
            SandboxError::CreateUnconfirmed { source } => source.class(),
        }
    }

    /// Whether a fresh sandbox might succeed where this one failed.
    pub fn is_transport(&self) -> bool {
        matches!(
            self.class(),
            ErrorClass::Transport | ErrorClass::Gone | ErrorClass::Capacity
        )
    }
}

pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// Who a process runs for, which decides what [`Sandbox::reset`] ends and what it may write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    /// Everything a task does (setup, tool calls, verify, project commands): ended by
    /// `reset`, and never able to write [`Sandbox::system_dir`]. E2B's default user `user`.
    #[default]
    Task,
    /// The host's own machinery in the sandbox (the runner and what it installs): outlives
    /// `reset` and alone writes `system_dir`. E2B's `root`.
    System,
    /// A task's verifier, run once [`Sandbox::stop_agent`] has proven every process of the
    /// agent gone: an identity the agent never had (locally the sandbox user `verifier`, a
    /// member of the agent's group so it can write where the agent let its group write; on
    /// E2B `root`), a fixed environment ([`VERIFY_PATH`], `HOME` and `TMPDIR` made empty for
    /// it, `PYTHONNOUSERSITE=1`, no variable of the sandbox's or the agent's) and a shell that
    /// reads no dotfiles. Ended by `reset` like a task's processes. The caller's `envs` are
    /// the only variables added.
    Verify,
}

/// Where a task's `tests` arrive for its verifier, on every backend: written after the agent
/// is stopped, read-only to whatever runs in the sandbox, gone after the reset.
pub const TESTS_DIR: &str = "/tests";
/// The verifier's `PATH`, the same on every backend.
pub const VERIFY_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Options for a foreground command.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// Working directory (absolute); `None` leaves it to the backend: the local backend
    /// starts in `home()`, E2B where the template says for the user (envd's default). A
    /// command that names paths relative to home must say `home()`.
    pub cwd: Option<String>,
    pub role: Role,
    pub envs: Vec<(String, String)>,
    /// The process group is killed when this passes.
    pub timeout: Duration,
    /// Bytes kept per stream, as head + tail; the middle is counted, not kept.
    pub max_output: usize,
}

impl Default for RunOpts {
    fn default() -> Self {
        RunOpts {
            cwd: None,
            role: Role::Task,
            envs: Vec::new(),
            timeout: Duration::from_secs(60),
            max_output: 1 << 20,
        }
    }
}

/// The result of a foreground command. A non-zero exit is a result, not an error.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// `None` when the process was killed by a signal (including the timeout).
    pub exit_code: Option<i32>,
    pub stdout: Captured,
    pub stderr: Captured,
    pub timed_out: bool,
}

/// Options for a background process.
#[derive(Debug, Clone, Default)]
pub struct SpawnOpts {
    /// As [`RunOpts::cwd`].
    pub cwd: Option<String>,
    pub role: Role,
    pub envs: Vec<(String, String)>,
    /// Keep stdin open so the caller can `send_stdin`.
    pub stdin: bool,
    /// Where a sandbox's commands get networks of their own (no internet), this one shares
    /// the network of that process of the same sandbox instead (an agent reaching the
    /// runner's endpoint on loopback). Elsewhere they share one network already.
    pub network_of: Option<u32>,
    /// Ends the process once this long has passed, as coreutils `timeout -k` would: SIGTERM
    /// to its process group, then SIGKILL [`TERM_GRACE`] later.
    pub ends_after: Option<Duration>,
}

/// How long a process ended at its deadline (see [`SpawnOpts::ends_after`]) has between
/// SIGTERM and SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(2);

/// What a background process reports, in order, on its event channel.
#[derive(Debug)]
pub enum ProcessEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The process ended; `None` means killed by a signal.
    Exit(Option<i32>),
    /// The stream to the process failed; no more events follow.
    Failed(SandboxError),
}

/// A handle on a background process: its pid and the events of its output stream.
pub struct Process {
    pub pid: u32,
    pub events: Receiver<ProcessEvent>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub cmd: String,
}

/// One live sandbox. Methods block; none of them waits without a bound.
pub trait Sandbox: Send + Sync {
    fn id(&self) -> &str;
    /// The absolute directory user files live under ("/home/user" on E2B).
    fn home(&self) -> &str;
    /// The absolute directory of the host's own machinery (the runner): written only by
    /// [`Role::System`] processes and the host, untouched by [`Sandbox::reset`].
    fn system_dir(&self) -> &str;
    /// Takes the home and `/tmp` as they are now as the state [`Sandbox::reset`] returns to.
    fn seal(&self) -> Result<()>;
    /// Ends every [`Role::Task`] process (however it detached: `setsid`, `nohup`, double
    /// forks) and returns the home and `/tmp` to the sealed state, proven. An error means the
    /// sandbox cannot be proven clean and must not serve another task.
    fn reset(&self) -> Result<()>;
    /// Ends every [`Role::Task`] process (as `reset` does) and, with `runner_too`, every
    /// [`Role::System`] process as well, and proves them gone; then readies the sandbox for a
    /// [`Role::Verify`] command: nothing of the agent runs while it does, and its `HOME` and
    /// [`TESTS_DIR`] are empty. Without `runner_too` only the runner's own processes may live
    /// on (what a harness started beside them is ended); with it the sandbox has no runner
    /// afterwards and must not serve another task. An error means the agent cannot be proven
    /// stopped: nothing may be verified, and the sandbox must not serve again.
    fn stop_agent(&self, runner_too: bool) -> Result<()>;
    fn run(&self, cmd: &str, opts: &RunOpts) -> Result<Output>;
    /// Starts a background process whose output `sink` takes, on the thread that reads it;
    /// returns its pid.
    fn spawn_into(&self, cmd: &str, opts: &SpawnOpts, sink: Box<dyn OutputSink>) -> Result<u32>;
    /// Starts a background process whose output arrives as events.
    fn spawn(&self, cmd: &str, opts: &SpawnOpts) -> Result<Process> {
        let (sink, events) = EventSink::new();
        let pid = self.spawn_into(cmd, opts, Box::new(sink))?;
        Ok(Process { pid, events })
    }
    /// A new event stream of a background process; the previous subscriber's ends.
    fn connect(&self, pid: u32) -> Result<Process>;
    fn send_stdin(&self, pid: u32, data: &[u8]) -> Result<()>;
    fn close_stdin(&self, pid: u32) -> Result<()>;
    fn processes(&self) -> Result<Vec<ProcessInfo>>;
    fn kill_process(&self, pid: u32) -> Result<()>;
    fn read_file(&self, path: &str) -> Result<Vec<u8>>;
    fn write_file(&self, path: &str, data: &[u8]) -> Result<()>;
    /// Makes `path` an empty directory of the sandbox user's, its parents too, removing
    /// whatever was there (never following a symlink), without starting a process: `Ok(true)`
    /// where the backend can (the local one, beneath the home); `Ok(false)` where it cannot,
    /// and the caller runs a command instead.
    fn empty_dir(&self, _path: &str) -> Result<bool> {
        Ok(false)
    }
    /// Moves the deadline to `secs` from now.
    fn set_timeout(&self, secs: u64) -> Result<()>;
    fn set_internet(&self, allowed: bool) -> Result<()>;
    /// Puts `limits` in force for the task about to run, and counts what it runs into from
    /// now. A backend without limits of its own (E2B, whose template's resources are the
    /// limits) ignores them.
    fn apply_limits(&self, _limits: &Limits) -> Result<()> {
        Ok(())
    }
    /// The limit the sandbox ran into since [`Sandbox::apply_limits`], if any.
    fn limit_reached(&self) -> Option<LimitHit> {
        None
    }
}

/// How a sandbox is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseKind {
    /// Every process is stopped where it is and continues on resume; the files stay.
    Memory,
    /// Every process ends and the files stay: a resume starts the sandbox again, without
    /// its runner or services (a reboot).
    Filesystem,
}

/// What a sandbox does when its deadline passes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnTimeout {
    /// It dies.
    #[default]
    Kill,
    /// It is paused, and lives on (at no deadline) until it is resumed or killed.
    Pause(PauseKind),
}

/// How a sandbox with `internet` reaches the network (`--network`), narrowest first.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Loopback only: every command in a network namespace of its own (what `internet:
    /// false` always gives).
    None,
    /// A network namespace of the sandbox's own with outbound access through a user-mode
    /// network stack: never the host's loopback, its abstract sockets or another sandbox.
    Internet,
    /// The host's network itself, shared: no boundary.
    #[default]
    Host,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Internet => "internet",
            Network::Host => "host",
        }
    }
}

/// What a new sandbox should be.
#[derive(Debug, Clone, Default)]
pub struct CreateSpec {
    pub template: Option<String>,
    pub timeout_secs: u64,
    pub metadata: Metadata,
    pub envs: Vec<(String, String)>,
    pub internet: bool,
    pub on_timeout: OnTimeout,
    /// What the sandbox may take of its host (the local backend; E2B ignores them).
    pub limits: Limits,
    /// How it reaches the network when `internet` allows it at all (the local backend; on
    /// E2B `internet` alone decides).
    pub network: Network,
    /// The root filesystem of its task processes: an unpacked image (the local backend);
    /// none is the host's own system directories.
    pub image: Option<ImageRoot>,
}

/// An unpacked image that task processes see as their root filesystem, read-only beneath a
/// writable layer of each task namespace's own, and what its config asks of their commands.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageRoot {
    /// What names its content (the image's manifest digest): sandboxes of one serve only
    /// tasks of the same.
    pub id: String,
    /// The unpacked tree on this host (owned by the image's own ids, mapped into each
    /// sandbox's range as it is mounted).
    pub rootfs: std::path::PathBuf,
    /// The config's `Env`, beneath what a command sets itself.
    pub env: Vec<(String, String)>,
    /// The config's `WorkingDir`: where a task's commands start when they name no directory.
    pub workdir: Option<String>,
    /// The image's user (its config's `User`, root when it names none): what it owns in the
    /// working directory is the sandbox user's, as it would be in a container.
    pub user: u32,
    /// The shell commands run with: `/bin/bash` when the image has it, else `/bin/sh`.
    pub shell: String,
    /// On E2B: the template made from the image, which sandboxes for it are created from
    /// (`rootfs` is then not used: E2B holds the image).
    #[serde(default)]
    pub template: Option<String>,
}

/// Whether a sandbox runs or is paused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RunState {
    #[default]
    Running,
    Paused,
}

impl RunState {
    /// The word E2B uses (`running`, `paused`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Paused => "paused",
        }
    }
}

/// A sandbox as a list call reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSummary {
    pub id: String,
    pub template: Option<String>,
    pub metadata: Metadata,
    /// Unix seconds.
    pub created: u64,
    /// Unix seconds; for a paused sandbox, when it was to end before it was paused.
    pub deadline: u64,
    pub state: RunState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    Now,
    AlreadyGone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    Now,
    /// It was paused before this call (E2B's 409).
    AlreadyPaused,
}

pub trait Backend: Send + Sync {
    /// A short name for messages and metadata ("local", "e2b").
    fn name(&self) -> &'static str;
    fn create(&self, spec: &CreateSpec) -> Result<Arc<dyn Sandbox>>;
    /// Opens a sandbox by id, resuming it first when it is paused (as E2B's connect does).
    fn connect(&self, id: &str) -> Result<Arc<dyn Sandbox>>;
    /// Live sandboxes, running and paused, whose metadata holds every pair of `filter`.
    fn list(&self, filter: &Metadata) -> Result<Vec<SandboxSummary>>;
    /// One sandbox as [`Backend::list`] reports it, without resuming it; `Gone` when it no
    /// longer exists.
    fn describe(&self, id: &str) -> Result<SandboxSummary>;
    /// Kills a sandbox, running or paused, repeating as far as repeating can help (each
    /// backend knows how far); callers do not repeat it. An error means the kill is not
    /// proven.
    fn kill(&self, id: &str) -> Result<Killed>;
    /// Pauses a running sandbox; it keeps no deadline while paused, and the next
    /// [`Backend::connect`] resumes it.
    fn pause(&self, id: &str, kind: PauseKind) -> Result<Paused>;
    /// Accounts for this process's creates whose outcome is unknown
    /// ([`SandboxError::CreateUnconfirmed`]): finds what they made, kills it and closes
    /// their books, waiting a bounded while for sandboxes that appear late. Called once no
    /// create is in flight; an error names what could not be accounted for.
    fn settle_creates(&self) -> Result<()> {
        Ok(())
    }
}

/// Refuses an id the backend could never have made (`well_formed` says whether `id` is one),
/// so that none reaches a path or a URL: a bad request, which no retry cures. `kind` names
/// the ids the backend makes ("a local sandbox id").
pub(crate) fn check_id(id: &str, well_formed: bool, kind: &str) -> Result<()> {
    if well_formed {
        Ok(())
    } else {
        Err(SandboxError::Remote {
            class: ErrorClass::BadRequest,
            message: format!("{id:?} is not {kind}"),
            source: None,
        })
    }
}

/// Normalizes a relative path (`a//./b` → `a/b`), refusing absolute paths, `..`, NUL bytes
/// and paths that name nothing; the error is the reason.
pub fn normalize_relative(rel: &str) -> std::result::Result<String, &'static str> {
    if rel.is_empty() {
        return Err("the path is empty");
    }
    if rel.starts_with('/') {
        return Err("absolute paths are not allowed");
    }
    if rel.contains('\0') {
        return Err("the path contains a NUL byte");
    }
    let mut parts = Vec::new();
    for part in rel.split('/') {
        match part {
            "" | "." => continue,
            ".." => return Err("'..' is not allowed"),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err("the path names no file");
    }
    Ok(parts.join("/"))
}

/// Quotes `s` for bash as one word.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Joins `rel` under `base`, refusing absolute paths, `..`, and empty components that would
/// let a caller escape `base`.
pub fn contained_path(base: &str, rel: &str) -> Result<String> {
    let rel_norm = normalize_relative(rel).map_err(|reason| SandboxError::BadPath {
        path: rel.to_string(),
        reason,
    })?;
    Ok(format!("{}/{rel_norm}", base.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quote_quotes_only_when_needed() {
        assert_eq!(
            shell_quote("/home/user/.wmo-runner"),
            "/home/user/.wmo-runner"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn contained_path_rejects_escapes() {
        assert_eq!(contained_path("/h/w", "a/./b").unwrap(), "/h/w/a/b");
        for bad in ["", "/etc/passwd", "../x", "a/../../x", ".", "a\0b"] {
            assert!(contained_path("/h/w", bad).is_err(), "{bad:?} accepted");
        }
    }
}
