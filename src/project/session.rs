//! `project run`: one agent turn in a project, over the live-session runner and the durable
//! channel.
//!
//! Tools are answered on the host: `read_file`, `write_file` (through the project, so writes
//! are mirrored, and only inside the turn's write grant), `submit`, and `bash` only when the
//! user allows it. The sandbox's network is locked before the session starts, so no agent
//! action ever has internet access.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::events::{self, EventLog};
use super::tools::ProjectEnvironment;
use super::{Project, ProjectError};
use crate::cancel::CancelToken;
use crate::channel::{frame_type, ChannelError, DurableChannel};
use crate::environment::{default_tools, EnvError};
use crate::episode::{self, Episode, EpisodeConfig, EpisodeError, Opening, StopReason, TokenMeter};
use crate::errors::error_chain;
use crate::provider::Provider;
use crate::sandbox::SpawnOpts;
use crate::skills::SkillSet;

#[derive(Debug, Clone)]
pub struct TurnOptions {
    pub instruction: String,
    pub allow_bash: bool,
    /// Exact project paths the agent may write; `None` allows every path.
    pub writable: Option<BTreeSet<String>>,
    pub timeout: Duration,
    pub turn_cap: u32,
    pub actions_per_turn: u32,
    pub max_output_tokens: u32,
    pub bash_timeout: Duration,
    pub hello_timeout: Duration,
    /// Skills offered to the agent (`--skills`).
    pub skills: Option<Arc<SkillSet>>,
}

impl Default for TurnOptions {
    fn default() -> Self {
        TurnOptions {
            instruction: String::new(),
            allow_bash: false,
            writable: None,
            timeout: super::DEFAULT_TURN_TIMEOUT,
            turn_cap: 60,
            actions_per_turn: 40,
            max_output_tokens: 4096,
            bash_timeout: Duration::from_secs(60),
            hello_timeout: Duration::from_secs(60),
            skills: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TurnResult {
    /// What the agent submitted; `None` when it ended without submitting.
    pub answer: Option<String>,
    /// How the turn ended.
    pub reason: StopReason,
    pub tokens: TokenMeter,
    pub tool_calls: u32,
    pub attempts: u32,
    /// Frames the host had to read from the outbox because the output stream was lost.
    pub frames_from_disk: u64,
    pub stream_lost: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Project(#[from] ProjectError),
    #[error("the live runner failed")]
    Channel(#[source] ChannelError),
    #[error("the live runner did not become ready: {0}")]
    NotReady(String),
    #[error("the agent turn failed: {0}")]
    Agent(String),
    #[error("the agent did not finish within {0:?}")]
    Timeout(Duration),
    #[error("the turn was cancelled")]
    Cancelled,
    #[error("the turn lost its sandbox ({cause}), and it cannot be replayed on a replacement because --allow-bash was given: commands may have written files the mirror does not hold")]
    NotReplayable { cause: String },
}

impl TurnError {
    /// A failure of the transport or the sandbox, which a replacement sandbox may not have.
    fn is_transport(&self) -> bool {
        match self {
            TurnError::Channel(_) | TurnError::NotReady(_) => true,
            TurnError::Project(ProjectError::Sandbox { source, .. }) => source.is_transport(),
            _ => false,
        }
    }
}

/// Runs one agent turn, retrying once on a replacement sandbox after a transport failure
/// (unless bash was allowed: its writes bypass the mirror).
pub fn run_turn(
    project: &mut Project,
    provider: &dyn Provider,
    opts: &TurnOptions,
    cancel: &CancelToken,
    events: &mut dyn Write,
) -> Result<TurnResult, TurnError> {
    let mut attempt = 1;
    loop {
        let held = project.hold_for(opts.timeout)?;
        match one_turn(project, provider, opts, cancel, events) {
            Ok(mut r) => {
                r.attempts = attempt;
                if held {
                    project.renew_idle()?;
                }
                return Ok(r);
            }
            Err(e) if e.is_transport() && attempt == 1 && !cancel.is_cancelled() => {
                if opts.allow_bash {
                    return Err(TurnError::NotReplayable {
                        cause: error_chain(&e),
                    });
                }
                events::log(events, "retry", json!({"reason": error_chain(&e)}));
                project.replace()?;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// One attempt at the turn, on the project's current sandbox.
fn one_turn(
    project: &mut Project,
    provider: &dyn Provider,
    opts: &TurnOptions,
    cancel: &CancelToken,
    events: &mut dyn Write,
) -> Result<TurnResult, TurnError> {
    // No agent action may reach the network: lock it before the session exists.
    project
        .sandbox()
        .set_internet(false)
        .map_err(|source| ProjectError::Sandbox {
            what: "lock the sandbox's network".into(),
            source,
        })?;
    let mut channel = start_live_runner(project, opts)?;
    let tools: Vec<Value> = default_tools()
        .into_iter()
        .filter(|t| opts.allow_bash || t["function"]["name"] != "bash")
        .collect();
    let mut config = EpisodeConfig {
        episode_id: crate::id::new_episode_id(),
        harness: "builtin".into(),
        system: crate::environment::system_prompt(&project.workspace(), &tools),
        tools,
        files: Map::new(),
        files_digest: None,
        max_turns: opts.turn_cap,
        max_tool_actions: opts.actions_per_turn,
        max_output_tokens: opts.max_output_tokens,
        budget: Default::default(),
        temperature: None,
        wall: opts.timeout,
        skills: None,
        agent: None,
    };
    if let Some(skills) = &opts.skills {
        config.offer_skills(skills.clone());
    }
    let label = project.state().name.clone();
    let environment = ProjectEnvironment::new(
        project,
        opts.writable.clone(),
        opts.allow_bash,
        opts.bash_timeout,
    );
    let mut log = EventLog::new(events);
    let result = episode::run_episode(
        &mut Episode {
            opening: Opening::LiveTurn {
                message: &opts.instruction,
            },
            label: &label,
            script: None,
            config: &config,
            provider,
            environment: &environment,
            cancel,
            observer: &mut log,
        },
        &mut channel,
    );
    let from_disk = channel.frames_from_disk;
    let lost = channel.stream_lost();
    channel.close();
    let outcome = match result {
        Ok(o) => o,
        Err(EpisodeError::Channel { source, .. }) => return Err(TurnError::Channel(source)),
        Err(EpisodeError::Environment { source, .. }) => {
            let (what, source) = match source {
                EnvError::Sandbox { tool, source } => (format!("run tool {tool}"), source),
                EnvError::AgentStart { agent, source } => (format!("start agent {agent}"), source),
                other @ EnvError::NoAgents { .. } => {
                    return Err(TurnError::Agent(other.to_string()))
                }
            };
            return Err(TurnError::Project(ProjectError::Sandbox { what, source }));
        }
    };
    match outcome.stop_reason {
        StopReason::Cancelled => return Err(TurnError::Cancelled),
        StopReason::Timeout => return Err(TurnError::Timeout(opts.timeout)),
        StopReason::Error => {
            return Err(TurnError::Agent(
                outcome.note.unwrap_or_else(|| "runner error".into()),
            ))
        }
        _ => {}
    }
    Ok(TurnResult {
        answer: (outcome.stop_reason == StopReason::Submit).then_some(outcome.answer),
        reason: outcome.stop_reason,
        tokens: outcome.counters.tokens,
        tool_calls: outcome.counters.tool_calls,
        attempts: 1,
        frames_from_disk: from_disk,
        stream_lost: lost,
    })
}

/// Uploads and starts the live runner with a fresh outbox; waits for its hello.
fn start_live_runner(project: &Project, opts: &TurnOptions) -> Result<DurableChannel, TurnError> {
    let sandbox = project.sandbox().clone();
    let dir = crate::runner::runner_dir(sandbox.as_ref());
    let outbox = format!("outbox-{}", crate::id::new_episode_id());
    let root = format!("{dir}/{outbox}");
    let sandbox_err = |what: &str| {
        let what = what.to_string();
        move |source| TurnError::Project(ProjectError::Sandbox { what, source })
    };
    crate::runner::upload_runner_files(sandbox.as_ref(), &dir)
        .map_err(sandbox_err("upload the live runner"))?;
    sandbox
        .write_file(&format!("{root}/head"), b"0\n")
        .map_err(sandbox_err("create the outbox"))?;
    // Paths in the command and the environment are relative to the runner directory (its
    // working directory), so they hold wherever the backend keeps the sandbox's home.
    let cmd = format!(
        "mkdir -p {outbox}/frames && {} exec node {} live.mjs 2>> {outbox}/stderr.log",
        crate::runner::RUNNER_THREADS,
        crate::runner::NODE_THREADS
    );
    let process = sandbox
        .spawn(
            &cmd,
            &SpawnOpts {
                role: crate::sandbox::Role::System,
                cwd: Some(dir.clone()),
                envs: vec![("WMO_LIVE_OUTBOX".into(), outbox.clone())],
                stdin: true,
                network_of: None,
                ends_after: None,
            },
        )
        .map_err(sandbox_err("start the live runner"))?;
    let mut channel = DurableChannel::new(sandbox, process, root);
    let deadline = Instant::now() + opts.hello_timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match channel.recv(left) {
            Ok(Some(f)) if frame_type(&f) == "hello" => return Ok(channel),
            Ok(Some(_)) => continue,
            Ok(None) => return Err(TurnError::NotReady("the channel closed".into())),
            Err(e) => return Err(TurnError::NotReady(error_chain(&e))),
        }
    }
}
