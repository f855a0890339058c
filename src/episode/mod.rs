//! THE broker: one agent conversation with a runner over a frame channel.
//!
//! An eval episode (the stdio channel, the sandbox or world-model environment) and a project
//! turn (the durable channel, host-answered tools with write grants) are this same broker with
//! a different channel, environment and [`Opening`]: it opens the conversation, answers the
//! runner's model requests through the provider (credentials stay on the host) and its tool
//! requests through the environment, enforces the budgets, reports every frame to an
//! [`Observer`], and ends with a [`StopReason`].
//!
//! `read_skill` is answered here too, from the skills on the host (see [`skills`]): it is
//! no action in the environment and spends none of the tool budget.
//!
//! Correlation is strict: every reply carries the `req_id` of the request it answers, and a
//! request must be of a kind the host answers. Frames the host does not know are ignored
//! (forward compatible); a runner that dies mid-conversation is a transport error for the
//! caller to retry, never a `max_turns`.

mod broker;
pub mod counters;
pub mod skills;
pub mod transcript;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::cancel::CancelToken;
use crate::channel::{ChannelError, Frame, FrameChannel};
use crate::environment::{EnvError, Environment};
use crate::provider::Provider;
use crate::skills::SkillSet;
use crate::task::ScriptStep;
pub use counters::{Counters, ModelBudget, ModelPrice, TokenMeter};
pub use transcript::Transcript;

/// How often a blocked receive wakes to look at cancellation.
pub const CANCEL_POLL: Duration = Duration::from_millis(250);

/// How a conversation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Submit,
    NoToolCall,
    OutputTruncated,
    UnparsedToolCall,
    MaxTurns,
    ProviderError,
    /// A spend cap kept the task from starting (see `eval::verdict`), or the task's own
    /// token or cost limit ([`ModelBudget`]) ended its episode before a model call.
    Budget,
    /// The episode reached its wall deadline (`timeout_s`); the call running then was
    /// cancelled.
    Timeout,
    Error,
    Cancelled,
    /// The sandbox killed a process for want of memory.
    Oom,
    /// The sandbox refused a process past its process limit.
    Pids,
    /// The sandbox's writable directories held more than they may.
    Disk,
    /// An agent run as a process of the task (`--harness agent:NAME`, `cmd:`) ended on its own.
    AgentExit,
}

impl From<crate::sandbox::LimitHit> for StopReason {
    fn from(hit: crate::sandbox::LimitHit) -> StopReason {
        match hit {
            crate::sandbox::LimitHit::Memory => StopReason::Oom,
            crate::sandbox::LimitHit::Pids => StopReason::Pids,
            crate::sandbox::LimitHit::Disk => StopReason::Disk,
        }
    }
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Submit => "submit",
            StopReason::NoToolCall => "no_tool_call",
            StopReason::OutputTruncated => "output_truncated",
            StopReason::UnparsedToolCall => "unparsed_tool_call",
            StopReason::MaxTurns => "max_turns",
            StopReason::ProviderError => "provider_error",
            StopReason::Budget => "budget",
            StopReason::Timeout => "timeout",
            StopReason::Error => "error",
            StopReason::Cancelled => "cancelled",
            StopReason::Oom => "oom",
            StopReason::Pids => "pids",
            StopReason::Disk => "disk",
            StopReason::AgentExit => "agent_exit",
        }
    }

    /// The reason an episode runner's `done` frame names (reference §1).
    fn from_done(reason: &str) -> Option<StopReason> {
        Some(match reason {
            "submit" => StopReason::Submit,
            "no_tool_call" => StopReason::NoToolCall,
            "output_truncated" => StopReason::OutputTruncated,
            "unparsed_tool_call" => StopReason::UnparsedToolCall,
            "max_turns" => StopReason::MaxTurns,
            "provider_error" => StopReason::ProviderError,
            _ => return None,
        })
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the conversation opens, and so how the runner says it is over.
#[derive(Debug, Clone, Copy)]
pub enum Opening<'a> {
    /// An eval episode (reference §1): `episode_start` with the task; over at `done` or
    /// `episode_error`. The runner answers `submit` itself.
    Episode { instruction: &'a str },
    /// One turn of a live session (reference §2): `session_start`, then at its first idle the
    /// `user_message`; over at the idle that answers that message. `submit` arrives as a tool
    /// request, which the broker answers. An interrupted turn is sent `abort`.
    LiveTurn { message: &'a str },
}

/// Limits and inputs of one conversation.
#[derive(Debug, Clone)]
pub struct EpisodeConfig {
    pub episode_id: String,
    /// Which harness the runner runs: `builtin`, `pi`, or `user` (files hold `agent.mjs`).
    pub harness: String,
    pub system: String,
    pub tools: Vec<Value>,
    /// Harness files sent with `episode_start`: empty for the builtin and pi harnesses, and
    /// for a runner that already holds the files `files_digest` names.
    pub files: Map<String, Value>,
    /// The digest of the user harness's files (`sha256:<hex>`): a runner keeps the files it
    /// was sent under it, so later episodes name them instead of sending them again.
    pub files_digest: Option<String>,
    pub max_turns: u32,
    pub max_tool_actions: u32,
    pub max_output_tokens: u32,
    /// The task's own token and cost limits.
    pub budget: ModelBudget,
    pub temperature: Option<f64>,
    /// Wall-clock budget of the conversation.
    pub wall: Duration,
    /// Skills the broker answers `read_skill` from; set with
    /// [`EpisodeConfig::offer_skills`], which also tells the agent about them.
    pub skills: Option<Arc<SkillSet>>,
    /// An agent the host runs as a task process, served the model APIs by the runner (the
    /// `endpoint` harness) instead of the runner's own loop.
    pub agent: Option<crate::environment::AgentLaunch>,
}

/// Where a frame came from, for an [`Observer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Host,
    Runner,
}

/// Hears everything the broker sees: the transcript of an eval episode, the event log of a
/// project turn.
pub trait Observer {
    fn frame(&mut self, from: Peer, frame: &Map<String, Value>);
    /// A frame from the runner; by default heard as [`Observer::frame`] hears one, which
    /// parses all of it.
    fn runner_frame(&mut self, frame: &Frame) {
        self.frame(Peer::Runner, frame.body());
    }
    /// Something the broker noticed that no frame says (a failed model call, an ignored
    /// request).
    fn note(&mut self, message: &str);
}

/// Everything one conversation needs.
pub struct Episode<'a> {
    pub opening: Opening<'a>,
    /// What runs: the task's id, or the project's name. It names scripted completions.
    pub label: &'a str,
    /// The steps a scripted model plays (the task's `model_script`).
    pub script: Option<&'a [ScriptStep]>,
    pub config: &'a EpisodeConfig,
    pub provider: &'a dyn Provider,
    pub environment: &'a dyn Environment,
    pub cancel: &'a CancelToken,
    pub observer: &'a mut dyn Observer,
}

/// How a conversation ended.
#[derive(Debug, Clone, Serialize)]
pub struct EpisodeOutcome {
    pub stop_reason: StopReason,
    pub answer: String,
    pub counters: Counters,
    /// Why the conversation ended badly, when it did.
    pub note: Option<String>,
    /// A model call the provider could not serve at all (see
    /// [`crate::provider::FailureScope`]): the end says nothing about the agent then.
    pub provider_failure: Option<ProviderFailure>,
    /// False when the runner may still be mid-conversation (budget, cancel): its sandbox
    /// must not be reused.
    #[serde(skip)]
    pub runner_idle: bool,
}

/// A model call that failed beyond the episode: the API could not be reached or would not
/// serve this run.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderFailure {
    /// The provider's error and its causes, on one line.
    pub message: String,
    /// Every call of the run would fail the same way (a refused key, an unknown model).
    pub stops_run: bool,
}

/// The conversation could not finish in this sandbox; a fresh one may succeed.
#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    #[error("lost the runner")]
    Channel {
        #[source]
        source: ChannelError,
        /// What was done before the failure, for the record.
        partial: Box<Counters>,
    },
    #[error("the environment failed")]
    Environment {
        #[source]
        source: EnvError,
        partial: Box<Counters>,
    },
}

impl EpisodeError {
    pub fn partial(&self) -> Counters {
        match self {
            EpisodeError::Channel { partial, .. } | EpisodeError::Environment { partial, .. } => {
                **partial
            }
        }
    }

    pub fn is_transport(&self) -> bool {
        match self {
            EpisodeError::Channel { .. } => true,
            EpisodeError::Environment { source, .. } => source.is_transport(),
        }
    }
}

/// Runs one conversation over `channel` to its end.
pub fn run_episode(
    ep: &mut Episode<'_>,
    channel: &mut dyn FrameChannel,
) -> Result<EpisodeOutcome, EpisodeError> {
    let result = broker::Broker::new(ep, &mut *channel).run();
    channel.conversation_ended();
    result
}
