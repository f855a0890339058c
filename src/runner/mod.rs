//! The runner: its embedded JS source ([`assets`]), and the bootstrap that starts it in a
//! sandbox and waits for its `hello`.

pub mod agents;
pub mod assets;
mod bundle;
pub mod node_layer;
pub mod pi;

pub use assets::upload_runner_files;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::channel::{ChannelError, LeaseRenewal, StdioChannel};
use crate::sandbox::{Sandbox, SandboxError, SpawnOpts};

/// Frame protocol version the host speaks; `hello.protocol` must match.
pub const PROTOCOL: u64 = 1;

/// The version a hello without `protocol` speaks: the reference runner's.
const REFERENCE_PROTOCOL: u64 = 1;

/// The oldest Node.js the runner supports.
pub const MIN_NODE_MAJOR: u32 = 18;

/// Exit code the runner uses when Node.js is too old.
const EXIT_NODE_TOO_OLD: i32 = 3;

/// Exit code of `bash` when a command is not found.
const EXIT_NOT_FOUND: i32 = 127;

pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the runner lives inside a sandbox, relative to its `system_dir()`: out of reach of
/// the tasks it serves, and untouched by a reset between them.
pub const RUNNER_DIR: &str = "runner";

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("could not upload the runner to sandbox {id}")]
    Upload {
        id: String,
        #[source]
        source: SandboxError,
    },
    #[error("could not start the runner ({command:?}) in sandbox {id}")]
    Start {
        id: String,
        command: String,
        #[source]
        source: SandboxError,
    },
    #[error("Node.js is not installed in sandbox {id}: the runner needs node >= {MIN_NODE_MAJOR} on PATH ({command:?}); recent runner stderr:\n{stderr_tail}")]
    NodeMissing {
        id: String,
        command: String,
        stderr_tail: String,
    },
    #[error("Node.js in sandbox {id} is too old: the runner needs node >= {MIN_NODE_MAJOR}; recent runner stderr:\n{stderr_tail}")]
    NodeTooOld { id: String, stderr_tail: String },
    #[error("the runner sent no hello within {timeout:?} ({command:?})")]
    NoHello {
        command: String,
        timeout: Duration,
        #[source]
        source: Box<ChannelError>,
    },
    #[error("the runner speaks protocol {found}, this host speaks {PROTOCOL}: upgrade whichever is older")]
    Protocol { found: String },
    #[error("the pi harness cannot run in sandbox {id}: {reason}")]
    PiUnavailable { id: String, reason: String },
    #[error(
        "the pi bundle {file} in sandbox {id} is corrupt: its sha256 is {found}, not {expected}"
    )]
    PiBundleDigest {
        id: String,
        file: String,
        expected: String,
        found: String,
    },
    #[error("the agent {agent} could not be unpacked in sandbox {id} (it needs tar and gzip there): {output}")]
    AgentUnpack {
        id: String,
        agent: &'static str,
        output: String,
    },
}

impl RunnerError {
    /// Whether a fresh sandbox might succeed where this one failed.
    pub fn is_transport(&self) -> bool {
        match self {
            RunnerError::Upload { source, .. } | RunnerError::Start { source, .. } => {
                source.is_transport()
            }
            RunnerError::NoHello { source, .. } => !matches!(
                **source,
                ChannelError::Exited {
                    code: Some(EXIT_NODE_TOO_OLD | EXIT_NOT_FOUND),
                    ..
                }
            ),
            RunnerError::NodeMissing { .. }
            | RunnerError::NodeTooOld { .. }
            | RunnerError::Protocol { .. }
            | RunnerError::PiUnavailable { .. }
            | RunnerError::PiBundleDigest { .. }
            | RunnerError::AgentUnpack { .. } => false,
        }
    }
}

/// How to start a runner.
#[derive(Debug, Clone)]
pub struct BootstrapOpts {
    pub hello_timeout: Duration,
    /// Lease renewal for the channel (`None`: keepalives renew nothing).
    pub renewal: Option<LeaseRenewal>,
    /// Extra environment for the runner process.
    pub envs: Vec<(String, String)>,
    /// The pi bundle, enabling `"harness": "pi"` (whose module is among the runner files):
    /// where the sandbox sees it, or placed into it by the bootstrap; the runner is given
    /// its path and digest, and its hello must report that digest.
    pub pi: Option<pi::PiShipment>,
    /// An agent's install, placed by the bootstrap where the sandbox cannot see the host's.
    pub agent: Option<agents::AgentShipment>,
}

impl Default for BootstrapOpts {
    fn default() -> Self {
        BootstrapOpts {
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            renewal: None,
            envs: Vec::new(),
            pi: None,
            agent: None,
        }
    }
}

/// A started runner: its channel and the hello it sent.
pub struct Started {
    pub channel: StdioChannel,
    pub hello: Map<String, Value>,
}

/// A runner needs few threads. V8's platform workers and libuv's pool default to four each:
/// eleven threads an idle runner holds (five with these), which a thousand sandboxes
/// multiply into thousands of kernel tasks. Node reads the pool's size from the environment.
pub const RUNNER_THREADS: &str = "UV_THREADPOOL_SIZE=1";
/// Node's flag for V8's platform workers (see [`RUNNER_THREADS`]).
pub const NODE_THREADS: &str = "--v8-pool-size=1";

/// The absolute runner directory of a sandbox.
pub fn runner_dir(sandbox: &dyn Sandbox) -> String {
    format!(
        "{}/{RUNNER_DIR}",
        sandbox.system_dir().trim_end_matches('/')
    )
}

/// Uploads the runner files, starts the episode runner with stdin, and waits for its hello.
pub fn bootstrap(sandbox: &Arc<dyn Sandbox>, opts: &BootstrapOpts) -> Result<Started, RunnerError> {
    let dir = runner_dir(sandbox.as_ref());
    let id = sandbox.id().to_string();
    upload_runner_files(sandbox.as_ref(), &dir).map_err(|source| RunnerError::Upload {
        id: id.clone(),
        source,
    })?;
    if let Some(ship) = &opts.agent {
        agents::place_agent(sandbox.as_ref(), ship)?;
    }
    let mut envs = opts.envs.clone();
    // The pi bundle and where this runner finds it.
    let shipped = match &opts.pi {
        None => None,
        Some(ship) => {
            let file = match &ship.seen_at {
                Some(seen) => seen.clone(),
                None => pi::place_bundle(sandbox.as_ref(), &dir, &ship.bundle)?,
            };
            envs.push((pi::PI_BUNDLE_ENV.to_string(), file.clone()));
            envs.push((
                pi::PI_BUNDLE_SHA256_ENV.to_string(),
                ship.bundle.sha256.clone(),
            ));
            Some((ship, file))
        }
    };
    // `exec` so the runner is the process the sandbox reports, and its exit code is ours.
    // Command text never names absolute sandbox paths (the working directory is passed
    // separately), so it reads the same wherever a backend keeps the sandbox's home.
    // A template made of a task's image carries Node.js in its own directory (see
    // `node_layer`); where there is none, the `node` on `PATH` runs the runner.
    let command = format!(
        "PATH={}/bin:$PATH {RUNNER_THREADS} exec node {NODE_THREADS} {}",
        node_layer::NODE_LAYER_DIR,
        assets::EPISODE_RUNNER
    );
    let spawn = SpawnOpts {
        role: crate::sandbox::Role::System,
        cwd: Some(dir.clone()),
        envs,
        stdin: true,
        network_of: None,
        ends_after: None,
    };
    let mut channel = StdioChannel::spawn(sandbox.clone(), &command, &spawn, opts.renewal.clone())
        .map_err(|source| RunnerError::Start {
            id: id.clone(),
            command: command.clone(),
            source,
        })?;
    let pid = channel.pid();
    let hello = match channel.wait_hello(opts.hello_timeout) {
        Ok(hello) => hello.into_body(),
        Err(source) => {
            // A runner that never said hello is useless; make sure it is not left behind.
            let _ = sandbox.kill_process(pid);
            return Err(classify_start_failure(
                id,
                command,
                opts.hello_timeout,
                source,
            ));
        }
    };
    // The reference runner's hello has no `protocol` field; its frames are version 1, the
    // protocol this host was built to, so a missing field is that version, not a mismatch.
    let protocol = match hello.get("protocol") {
        None => Some(REFERENCE_PROTOCOL),
        Some(v) => v.as_u64(),
    };
    if protocol != Some(PROTOCOL) {
        let _ = sandbox.kill_process(pid);
        return Err(RunnerError::Protocol {
            found: hello
                .get("protocol")
                .map_or_else(|| "none".to_string(), |v| v.to_string()),
        });
    }
    if let Some((ship, file)) = &shipped {
        if let Err(e) = pi::check_hello(&hello, ship, file, &id) {
            let _ = sandbox.kill_process(pid);
            return Err(e);
        }
    }
    Ok(Started { channel, hello })
}

fn classify_start_failure(
    id: String,
    command: String,
    timeout: Duration,
    source: ChannelError,
) -> RunnerError {
    match &source {
        ChannelError::Exited {
            code: Some(EXIT_NOT_FOUND),
            stderr_tail,
        } => RunnerError::NodeMissing {
            id,
            command,
            stderr_tail: stderr_tail.clone(),
        },
        ChannelError::Exited {
            code: Some(EXIT_NODE_TOO_OLD),
            stderr_tail,
        } => RunnerError::NodeTooOld {
            id,
            stderr_tail: stderr_tail.clone(),
        },
        _ => RunnerError::NoHello {
            command,
            timeout,
            source: Box::new(source),
        },
    }
}
