//! The host side of one episode: sends `episode_start`, answers the runner's model and tool
//! requests, enforces the budgets, and ends with a stop reason.
//!
//! Correlation is strict: every reply carries the `req_id` of the request it answers, and a
//! request must be of a kind the host answers. Frames the host does not know are ignored
//! (forward compatible); a runner that dies mid-episode is a transport error for the caller to
//! retry, never a `max_turns`.

pub mod transcript;

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::cancel::CancelToken;
use crate::channel::{frame_type, ChannelError, Frame, StdioChannel};
use crate::environment::{EnvError, Environment, ToolOutput, ENV_TOOLS};
use crate::errors::error_chain;
use crate::provider::{FailureScope, ModelCall, Provider, Usage};
use crate::task::Task;
pub use transcript::Transcript;

/// How often a blocked receive wakes to look at cancellation.
pub const CANCEL_POLL: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Submit,
    NoToolCall,
    OutputTruncated,
    UnparsedToolCall,
    MaxTurns,
    ProviderError,
    Budget,
    Error,
    Cancelled,
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
            StopReason::Error => "error",
            StopReason::Cancelled => "cancelled",
        }
    }

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

/// Token usage summed over an episode's model calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TokenMeter {
    pub input: u64,
    pub output: u64,
    pub calls: u64,
}

impl TokenMeter {
    fn add(&mut self, u: Usage) {
        self.input += u.input_tokens;
        self.output += u.output_tokens;
        self.calls += 1;
    }
}

/// Limits and inputs of one episode.
#[derive(Debug, Clone)]
pub struct EpisodeConfig {
    pub episode_id: String,
    /// Which harness the runner runs: `builtin`, `pi`, or `user` (files hold `agent.mjs`).
    pub harness: String,
    pub system: String,
    pub tools: Vec<Value>,
    /// Harness files sent with `episode_start` (empty for the builtin harness).
    pub files: Map<String, Value>,
    pub max_turns: u32,
    pub max_tool_actions: u32,
    pub max_output_tokens: u32,
    pub temperature: Option<f64>,
    /// Wall-clock budget of the episode.
    pub wall: Duration,
}

/// How an episode ended.
#[derive(Debug, Clone, Serialize)]
pub struct EpisodeOutcome {
    pub stop_reason: StopReason,
    pub answer: String,
    /// Model calls made.
    pub turns: u32,
    /// Tool requests answered (including rejected ones).
    pub tool_calls: u32,
    pub tokens: TokenMeter,
    /// Model-call retries the provider needed.
    pub provider_retries: u32,
    /// Why the episode ended badly, when it did.
    pub note: Option<String>,
    /// A model call the provider could not serve at all (see [`FailureScope`]): the episode's
    /// end says nothing about the agent then.
    pub provider_failure: Option<ProviderFailure>,
    /// False when the runner may still be mid-episode (budget, cancel): its sandbox must not
    /// be reused.
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

/// The episode could not finish in this sandbox; a fresh one may succeed.
#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    #[error("lost the runner")]
    Channel {
        #[source]
        source: ChannelError,
        partial: Box<PartialProgress>,
    },
    #[error("the environment failed")]
    Environment {
        #[source]
        source: EnvError,
        partial: Box<PartialProgress>,
    },
}

/// What an attempt achieved before it failed, for the record.
#[derive(Debug, Clone, Default)]
pub struct PartialProgress {
    pub turns: u32,
    pub tool_calls: u32,
    pub tokens: TokenMeter,
    pub provider_retries: u32,
}

impl EpisodeError {
    pub fn partial(&self) -> &PartialProgress {
        match self {
            EpisodeError::Channel { partial, .. } | EpisodeError::Environment { partial, .. } => {
                partial
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

/// Everything one episode needs.
pub struct Episode<'a> {
    pub task: &'a Task,
    pub config: &'a EpisodeConfig,
    pub provider: &'a dyn Provider,
    pub environment: &'a dyn Environment,
    pub cancel: &'a CancelToken,
    pub transcript: &'a mut Transcript,
}

struct Broker<'a, 'b> {
    ep: &'b mut Episode<'a>,
    channel: &'b mut StdioChannel,
    deadline: Instant,
    turns: u32,
    tool_calls: u32,
    env_actions: u32,
    tokens: TokenMeter,
    provider_retries: u32,
    provider_failure: Option<ProviderFailure>,
}

/// Runs one episode over `channel` to its end.
pub fn run_episode(
    ep: &mut Episode<'_>,
    channel: &mut StdioChannel,
) -> Result<EpisodeOutcome, EpisodeError> {
    let deadline = Instant::now() + ep.config.wall;
    let mut broker = Broker {
        ep,
        channel,
        deadline,
        turns: 0,
        tool_calls: 0,
        env_actions: 0,
        tokens: TokenMeter::default(),
        provider_retries: 0,
        provider_failure: None,
    };
    let result = broker.run();
    broker.channel.episode_ended();
    result
}

enum Step {
    Continue,
    End(EpisodeOutcome),
}

impl Broker<'_, '_> {
    fn run(&mut self) -> Result<EpisodeOutcome, EpisodeError> {
        let c = self.ep.config;
        let start = json!({
            "type": "episode_start",
            "episode_id": c.episode_id,
            "task_id": self.ep.task.id,
            "harness": c.harness,
            "instruction": self.ep.task.instruction,
            "system": c.system,
            "tools": c.tools,
            "files": c.files,
            "max_turns": c.max_turns,
            "max_output_tokens": c.max_output_tokens,
            "temperature": c.temperature,
            "episode_timeout_s": c.wall.as_secs_f64(),
        });
        self.send(&start)?;
        loop {
            if let Some(end) = self.interrupted() {
                return Ok(end);
            }
            let wait = self
                .deadline
                .saturating_duration_since(Instant::now())
                .min(CANCEL_POLL);
            let frame = match self.channel.recv(wait) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    return Err(self.channel_error(ChannelError::Exited {
                        code: None,
                        stderr_tail: "the channel was closed".into(),
                    }))
                }
                Err(ChannelError::Timeout { .. }) => continue,
                Err(e) => {
                    if let Some(end) = self.interrupted() {
                        return Ok(end);
                    }
                    return Err(self.channel_error(e));
                }
            };
            self.ep.transcript.record("runner", &frame);
            match self.dispatch(frame)? {
                Step::Continue => {}
                Step::End(outcome) => return Ok(outcome),
            }
        }
    }

    fn dispatch(&mut self, frame: Frame) -> Result<Step, EpisodeError> {
        match frame_type(&frame) {
            "llm_request" => self.on_llm_request(&frame),
            "tool_request" => self.on_tool_request(&frame),
            "done" => {
                let reason = frame.get("reason").and_then(Value::as_str).unwrap_or("");
                let answer = frame
                    .get("answer")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                Ok(Step::End(match StopReason::from_done(reason) {
                    Some(stop) => self.outcome(stop, answer, None, true),
                    None => self.outcome(
                        StopReason::Error,
                        answer,
                        Some(format!(
                            "the runner ended with an unknown reason {reason:?}"
                        )),
                        true,
                    ),
                }))
            }
            "episode_error" => {
                let note = frame
                    .get("note")
                    .and_then(Value::as_str)
                    .unwrap_or("runner error")
                    .to_string();
                Ok(Step::End(self.outcome(
                    StopReason::Error,
                    String::new(),
                    Some(note),
                    true,
                )))
            }
            // hello, log, and anything newer than this host: recorded, not answered.
            _ => Ok(Step::Continue),
        }
    }

    fn on_llm_request(&mut self, frame: &Frame) -> Result<Step, EpisodeError> {
        let Some(req_id) = req_id(frame) else {
            self.ep
                .transcript
                .note("ignored an llm_request without an integer req_id");
            return Ok(Step::Continue);
        };
        if self.turns >= self.ep.config.max_turns {
            // The runner enforces the cap itself; one that asks for more is not trusted
            // with another call.
            return Ok(Step::End(self.outcome(
                StopReason::MaxTurns,
                String::new(),
                Some(format!(
                    "the runner asked for model call {} past max_turns {}",
                    self.turns + 1,
                    self.ep.config.max_turns
                )),
                false,
            )));
        }
        let empty = Value::Object(Map::new());
        let body = frame
            .get("openai_body")
            .filter(|b| b.is_object())
            .unwrap_or(&empty);
        let call = ModelCall {
            task: self.ep.task,
            index: self.turns as usize,
            body,
            cancel: self.ep.cancel,
        };
        self.turns += 1;
        let reply = if let Some(failure) = &self.provider_failure {
            // The episode's record is an error whatever happens next, so a harness that
            // keeps asking is answered at once instead of waiting out the retries again.
            let msg = format!(
                "not sent: an earlier model call failed: {}",
                failure.message
            );
            json!({"type": "llm_response", "episode_id": self.ep.config.episode_id,
                   "req_id": req_id, "error": msg})
        } else {
            match self.ep.provider.complete(&call) {
                Ok(done) => {
                    self.tokens.add(done.usage);
                    self.provider_retries += done.retries;
                    json!({"type": "llm_response", "episode_id": self.ep.config.episode_id,
                           "req_id": req_id, "completion": done.body})
                }
                Err(e) => {
                    self.provider_retries += e.retries();
                    let msg = error_chain(&e);
                    self.ep
                        .transcript
                        .note(&format!("model call failed: {msg}"));
                    let scope = e.scope();
                    if scope != FailureScope::Episode {
                        self.provider_failure = Some(ProviderFailure {
                            message: msg.clone(),
                            stops_run: scope == FailureScope::Run,
                        });
                    }
                    json!({"type": "llm_response", "episode_id": self.ep.config.episode_id,
                           "req_id": req_id, "error": msg})
                }
            }
        };
        // A reply computed past the deadline or after cancellation is never sent.
        if let Some(end) = self.interrupted() {
            return Ok(Step::End(end));
        }
        self.send(&reply)?;
        if let Some(failure) = self.provider_failure.as_ref().filter(|f| f.stops_run) {
            // Not waiting for the runner to end: the run stops at the first such answer,
            // whatever the harness does with the error. The runner may still be mid-episode.
            let note = Some(failure.message.clone());
            return Ok(Step::End(self.outcome(
                StopReason::ProviderError,
                String::new(),
                note,
                false,
            )));
        }
        Ok(Step::Continue)
    }

    fn on_tool_request(&mut self, frame: &Frame) -> Result<Step, EpisodeError> {
        let Some(req_id) = req_id(frame) else {
            self.ep
                .transcript
                .note("ignored a tool_request without an integer req_id");
            return Ok(Step::Continue);
        };
        let name = frame.get("name").and_then(Value::as_str).unwrap_or("");
        let empty = Map::new();
        let args = frame
            .get("arguments")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        self.tool_calls += 1;
        let output = if !ENV_TOOLS.contains(&name) || !self.advertised(name) {
            ToolOutput::error(format!("tool '{name}' not available"))
        } else if self.env_actions >= self.ep.config.max_tool_actions {
            ToolOutput::error(format!(
                "environment action budget exhausted ({} tool actions)",
                self.ep.config.max_tool_actions
            ))
        } else {
            self.env_actions += 1;
            match self.ep.environment.execute(name, args, self.ep.cancel) {
                Ok(out) => out,
                Err(source) => {
                    return Err(EpisodeError::Environment {
                        source,
                        partial: Box::new(self.partial()),
                    })
                }
            }
        };
        if let Some(end) = self.interrupted() {
            return Ok(Step::End(end));
        }
        self.send(&json!({
            "type": "tool_response",
            "episode_id": self.ep.config.episode_id,
            "req_id": req_id,
            "content": output.content,
            "is_error": output.is_error,
        }))?;
        Ok(Step::Continue)
    }

    fn advertised(&self, name: &str) -> bool {
        self.ep
            .config
            .tools
            .iter()
            .any(|t| t["function"]["name"].as_str() == Some(name))
    }

    fn send(&mut self, frame: &Value) -> Result<(), EpisodeError> {
        if let Value::Object(map) = frame {
            match map.get("files").and_then(Value::as_object) {
                // Harness files are the same every episode: the transcript notes their size
                // rather than copying them again (hundreds of KB per episode otherwise).
                Some(files) if !files.is_empty() => {
                    let mut brief: Map<String, Value> = map
                        .iter()
                        .filter(|(k, _)| k.as_str() != "files")
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let bytes: usize = files.values().filter_map(Value::as_str).map(str::len).sum();
                    brief.insert(
                        "files".into(),
                        json!({"count": files.len(), "bytes": bytes, "paths": files.keys().collect::<Vec<_>>()}),
                    );
                    self.ep.transcript.record("host", &brief);
                }
                _ => self.ep.transcript.record("host", map),
            }
        }
        self.channel.send(frame).map_err(|e| self.channel_error(e))
    }

    /// The outcome when cancellation or the wall budget stopped the episode.
    fn interrupted(&self) -> Option<EpisodeOutcome> {
        if self.ep.cancel.is_cancelled() {
            return Some(self.outcome(StopReason::Cancelled, String::new(), None, false));
        }
        if Instant::now() >= self.deadline {
            let note = format!(
                "the episode exceeded its {}s wall budget",
                self.ep.config.wall.as_secs_f64()
            );
            return Some(self.outcome(StopReason::Budget, String::new(), Some(note), false));
        }
        None
    }

    fn outcome(
        &self,
        stop_reason: StopReason,
        answer: String,
        note: Option<String>,
        runner_idle: bool,
    ) -> EpisodeOutcome {
        EpisodeOutcome {
            stop_reason,
            answer,
            turns: self.turns,
            tool_calls: self.tool_calls,
            tokens: self.tokens,
            provider_retries: self.provider_retries,
            note,
            provider_failure: self.provider_failure.clone(),
            runner_idle,
        }
    }

    fn partial(&self) -> PartialProgress {
        PartialProgress {
            turns: self.turns,
            tool_calls: self.tool_calls,
            tokens: self.tokens,
            provider_retries: self.provider_retries,
        }
    }

    fn channel_error(&self, source: ChannelError) -> EpisodeError {
        EpisodeError::Channel {
            source,
            partial: Box::new(self.partial()),
        }
    }
}

fn req_id(frame: &Frame) -> Option<u64> {
    frame.get("req_id").and_then(Value::as_u64)
}
