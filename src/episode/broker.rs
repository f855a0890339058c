//! The broker's loop: open, answer requests, watch the budgets, end.

use std::time::Instant;

use serde_json::{json, Map, Value};

use super::skills::{self, READ_SKILL};
use super::{
    Counters, Episode, EpisodeError, EpisodeOutcome, Opening, Peer, ProviderFailure, StopReason,
    CANCEL_POLL,
};
use crate::cancel::CancelToken;
use crate::channel::{frame_type, ChannelError, Frame, FrameChannel};
use crate::environment::{ToolOutput, ENV_TOOLS};
use crate::errors::error_chain;
use crate::provider::{Completion, FailureScope, ModelCall, ProviderError};

mod endpoint;

pub(super) struct Broker<'a, 'b> {
    ep: &'b mut Episode<'a>,
    channel: &'b mut dyn FrameChannel,
    deadline: Instant,
    /// Cancelled by the run or at the deadline: what the calls the episode makes (tools,
    /// model) poll, so a call still running at the deadline ends there.
    calls_cancel: CancelToken,
    counters: Counters,
    env_actions: u32,
    provider_failure: Option<ProviderFailure>,
    /// A live turn's message, once sent, and whether the runner has taken it up.
    message_id: Option<String>,
    running_seen: bool,
    /// What a live turn's agent submitted (an episode runner reports its answer in `done`).
    submitted: Option<String>,
    aborted: bool,
    /// An agent episode's endpoint and process (see `endpoint`).
    agent: endpoint::AgentState,
}

enum Step {
    Continue,
    End(EpisodeOutcome),
}

impl<'a, 'b> Broker<'a, 'b> {
    pub(super) fn new(ep: &'b mut Episode<'a>, channel: &'b mut dyn FrameChannel) -> Self {
        let deadline = Instant::now() + ep.config.wall;
        let calls_cancel = ep.cancel.until(deadline);
        Broker {
            ep,
            channel,
            deadline,
            calls_cancel,
            counters: Counters::default(),
            env_actions: 0,
            provider_failure: None,
            message_id: None,
            running_seen: false,
            submitted: None,
            aborted: false,
            agent: endpoint::AgentState {
                // The endpoint's key: unguessable, since a sandbox on the host's network
                // shares its loopback with every other process there.
                token: crate::id::unique_hex(24),
                ..endpoint::AgentState::default()
            },
        }
    }

    pub(super) fn run(mut self) -> Result<EpisodeOutcome, EpisodeError> {
        let opening = self.opening_frame();
        self.send(&opening)?;
        loop {
            if let Some(end) = self.interrupted() {
                return Ok(end);
            }
            let poll = match self.agent.run {
                Some(_) => endpoint::AGENT_POLL,
                None => CANCEL_POLL,
            };
            let wait = self
                .deadline
                .saturating_duration_since(Instant::now())
                .min(poll);
            let frame = match self.channel.recv(wait) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    return Err(self.channel_error(ChannelError::Exited {
                        code: None,
                        stderr_tail: "the channel was closed".into(),
                    }))
                }
                Err(ChannelError::Timeout { .. }) => {
                    self.poll_agent()?;
                    continue;
                }
                Err(e) => {
                    if let Some(end) = self.interrupted() {
                        return Ok(end);
                    }
                    return Err(self.channel_error(e));
                }
            };
            self.ep.observer.runner_frame(&frame);
            match self.dispatch(frame)? {
                Step::Continue => self.poll_agent()?,
                Step::End(outcome) => return Ok(outcome),
            }
        }
    }

    fn opening_frame(&self) -> Value {
        let c = self.ep.config;
        match self.ep.opening {
            Opening::Episode { instruction } => json!({
                "type": "episode_start",
                "episode_id": c.episode_id,
                "task_id": self.ep.label,
                "harness": c.harness,
                "endpoint": c.agent.as_ref().map(|a| json!({"token": self.agent.token, "model": a.model})),
                "instruction": instruction,
                "system": c.system,
                "tools": c.tools,
                "files": c.files,
                "files_digest": c.files_digest,
                "max_turns": c.max_turns,
                "max_output_tokens": c.max_output_tokens,
                "temperature": c.temperature,
                "episode_timeout_s": c.wall.as_secs_f64(),
            }),
            Opening::LiveTurn { .. } => json!({
                "type": "session_start",
                "session_id": c.episode_id,
                "system": c.system,
                "tools": c.tools,
                "turn_cap": c.max_turns,
                "max_output_tokens": c.max_output_tokens,
                // Every turn starts a fresh conversation: the project's files carry what
                // earlier turns did.
                "conversation_scope": "turn",
            }),
        }
    }

    fn dispatch(&mut self, frame: Frame) -> Result<Step, EpisodeError> {
        let live = matches!(self.ep.opening, Opening::LiveTurn { .. });
        match frame_type(&frame) {
            "llm_request" => self.on_llm_request(&frame),
            "endpoint_ready" => self.on_endpoint_ready(frame.body()),
            "done" if !live && self.ep.config.agent.is_some() => Ok(Step::End(self.agent_done())),
            "tool_request" => self.on_tool_request(&frame),
            "done" if !live => {
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
            "state" if live => self.on_state(&frame),
            // hello, log, keepalives, and anything newer than this host: recorded, not
            // answered.
            _ => Ok(Step::Continue),
        }
    }

    /// A live turn's states: the first idle means the session is ready for the message; the
    /// idle that answers the message, after the runner took it up, ends the turn.
    fn on_state(&mut self, frame: &Frame) -> Result<Step, EpisodeError> {
        let Opening::LiveTurn { message } = self.ep.opening else {
            return Ok(Step::Continue);
        };
        match frame.get("status").and_then(Value::as_str) {
            Some("running") => self.running_seen = true,
            Some("idle") => match &self.message_id {
                None => {
                    let msg_id = crate::id::new_episode_id();
                    self.send(&json!({"type": "user_message", "msg_id": msg_id, "text": message}))?;
                    self.message_id = Some(msg_id);
                }
                Some(sent)
                    if self.running_seen
                        && frame.get("msg_id").and_then(Value::as_str) == Some(sent.as_str()) =>
                {
                    let reason = frame.get("reason").and_then(Value::as_str).unwrap_or("");
                    return Ok(Step::End(self.turn_end(reason)));
                }
                Some(_) => {}
            },
            _ => {}
        }
        Ok(Step::Continue)
    }

    /// A live turn's end, from the reason on its last idle (reference §2.2).
    fn turn_end(&self, reason: &str) -> EpisodeOutcome {
        let answer = self.submitted.clone().unwrap_or_default();
        let (stop, note) = match reason {
            "completed" if self.submitted.is_some() => (StopReason::Submit, None),
            "completed" => (StopReason::NoToolCall, None),
            "turn_limit" => (StopReason::MaxTurns, None),
            "aborted" => (StopReason::Cancelled, None),
            other => (
                StopReason::Error,
                Some(format!("the runner ended the turn with reason {other:?}")),
            ),
        };
        self.outcome(stop, answer, note, true)
    }

    fn on_llm_request(&mut self, frame: &Frame) -> Result<Step, EpisodeError> {
        let Some(req_id) = frame.req_id() else {
            self.ep
                .observer
                .note("ignored an llm_request without an integer req_id");
            return Ok(Step::Continue);
        };
        // An agent's request through the runner's endpoint, in the API it spoke.
        if frame.get("api").is_some() {
            return self.on_api_request(frame.body(), req_id);
        }
        if let Some((stop, note)) = self.spent("runner") {
            // The runner enforces max_turns itself; one that asks for more is not trusted
            // with another call. Like a spend cap, a token or cost limit ends the episode
            // rather than the call: the runner is not answered and so may still be mid-turn.
            return Ok(Step::End(self.outcome(
                stop,
                String::new(),
                Some(note),
                false,
            )));
        }
        let empty = Value::Object(Map::new());
        let body = frame
            .get("openai_body")
            .filter(|b| b.is_object())
            .unwrap_or(&empty);
        let reply = if let Some(msg) = self.not_sent() {
            // Counted as a call all the same: the harness asked for one.
            self.counters.turns += 1;
            self.reply("llm_response", req_id, json!({"error": msg}))
        } else {
            match self.call_model(body) {
                Ok(done) => self.reply("llm_response", req_id, json!({"completion": done.body})),
                Err(e) => {
                    let msg = self.failed_call(&e);
                    self.reply("llm_response", req_id, json!({"error": msg}))
                }
            }
        };
        // A reply computed past the deadline or after cancellation is never sent.
        if let Some(end) = self.interrupted() {
            return Ok(Step::End(end));
        }
        self.send(&reply)?;
        Ok(self.after_answer())
    }

    /// The budget the next model call would pass, and the note that says so: `max_turns`, or
    /// the task's token or cost limit. `who` asked (the runner, an agent).
    fn spent(&self, who: &str) -> Option<(StopReason, String)> {
        let config = self.ep.config;
        if self.counters.turns >= config.max_turns {
            let note = format!(
                "the {who} asked for model call {} past max_turns {}",
                self.counters.turns + 1,
                config.max_turns
            );
            return Some((StopReason::MaxTurns, note));
        }
        let note = config.budget.reached(self.counters.tokens)?;
        Some((StopReason::Budget, note))
    }

    /// Why a model call is not sent: an earlier one failed beyond the episode. The
    /// conversation's record is an error whatever happens next, so a harness that keeps
    /// asking is answered at once instead of waiting out the retries again.
    fn not_sent(&self) -> Option<String> {
        let failure = self.provider_failure.as_ref()?;
        Some(format!(
            "not sent: an earlier model call failed: {}",
            failure.message
        ))
    }

    /// Model call number `turns` with `body`, through the provider: counted, and metered when
    /// it is answered. A failure is the caller's to record (see `failed_call`).
    fn call_model(&mut self, body: &Value) -> Result<Completion, ProviderError> {
        let call = ModelCall {
            label: self.ep.label,
            script: self.ep.script,
            index: self.counters.turns as usize,
            body,
            cancel: &self.calls_cancel,
        };
        self.counters.turns += 1;
        let done = self.ep.provider.complete(&call)?;
        self.counters.tokens.add_call(done.usage);
        self.counters.provider_retries += done.retries;
        Ok(done)
    }

    /// Counts a failed model call and keeps a failure that reaches beyond the episode (see
    /// `after_answer`); returns the error as the agent is told it.
    fn failed_call(&mut self, e: &ProviderError) -> String {
        self.counters.provider_retries += e.retries();
        let msg = error_chain(e);
        self.ep.observer.note(&format!("model call failed: {msg}"));
        let scope = e.scope();
        if scope != FailureScope::Episode {
            self.provider_failure = Some(ProviderFailure {
                message: msg.clone(),
                stops_run: scope == FailureScope::Run,
            });
        }
        msg
    }

    /// What follows an answered model call: the run stops at the first answer of a failure
    /// that stops it, not waiting for the runner to end, whatever the harness does with the
    /// error (the runner may still be mid-turn).
    fn after_answer(&self) -> Step {
        match self.provider_failure.as_ref().filter(|f| f.stops_run) {
            Some(failure) => Step::End(self.outcome(
                StopReason::ProviderError,
                String::new(),
                Some(failure.message.clone()),
                false,
            )),
            None => Step::Continue,
        }
    }

    fn on_tool_request(&mut self, frame: &Frame) -> Result<Step, EpisodeError> {
        let Some(req_id) = frame.req_id() else {
            self.ep
                .observer
                .note("ignored a tool_request without an integer req_id");
            return Ok(Step::Continue);
        };
        let name = frame.get("name").and_then(Value::as_str).unwrap_or("");
        let empty = Map::new();
        let args = frame
            .get("arguments")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let skill_set = self
            .ep
            .config
            .skills
            .as_deref()
            .filter(|_| name == READ_SKILL);
        let output = if let Some(set) = skill_set {
            // Answered here, from the host's skills: neither an environment action nor a
            // tool call of the record, though its frames are in the transcript.
            skills::answer(set, args)
        } else if name == "submit" && matches!(self.ep.opening, Opening::LiveTurn { .. }) {
            // The live runner hands the answer to the host; it ends the run, not the
            // session, and is not an action in the environment.
            let answer = args.get("answer").and_then(Value::as_str).unwrap_or("");
            self.submitted = Some(answer.to_string());
            ToolOutput::ok("submitted")
        } else {
            self.counters.tool_calls += 1;
            self.environment_call(name, args)?
        };
        if let Some(end) = self.interrupted() {
            return Ok(Step::End(end));
        }
        let reply = self.reply(
            "tool_response",
            req_id,
            json!({"content": output.content, "is_error": output.is_error}),
        );
        self.send(&reply)?;
        Ok(Step::Continue)
    }

    fn environment_call(
        &mut self,
        name: &str,
        args: &Map<String, Value>,
    ) -> Result<ToolOutput, EpisodeError> {
        if !ENV_TOOLS.contains(&name) || !self.advertised(name) {
            return Ok(ToolOutput::error(format!("tool '{name}' not available")));
        }
        if self.env_actions >= self.ep.config.max_tool_actions {
            return Ok(ToolOutput::error(format!(
                "environment action budget exhausted ({} tool actions)",
                self.ep.config.max_tool_actions
            )));
        }
        self.env_actions += 1;
        self.ep
            .environment
            .execute(name, args, &self.calls_cancel)
            .map_err(|source| EpisodeError::Environment {
                source,
                partial: Box::new(self.counters),
            })
    }

    fn advertised(&self, name: &str) -> bool {
        self.ep
            .config
            .tools
            .iter()
            .any(|t| t["function"]["name"].as_str() == Some(name))
    }

    /// A reply to request `req_id`; an episode's replies also name the episode (a live
    /// session's never do, reference §2.1).
    fn reply(&self, kind: &str, req_id: u64, fields: Value) -> Value {
        let mut frame = json!({"type": kind, "req_id": req_id});
        if let Opening::Episode { .. } = self.ep.opening {
            frame["episode_id"] = json!(self.ep.config.episode_id);
        }
        if let (Value::Object(f), Value::Object(extra)) = (&mut frame, fields) {
            f.extend(extra);
        }
        frame
    }

    fn send(&mut self, frame: &Value) -> Result<(), EpisodeError> {
        if let Value::Object(map) = frame {
            self.ep.observer.frame(Peer::Host, map);
        }
        self.channel.send(frame).map_err(|e| self.channel_error(e))
    }

    /// The outcome when cancellation or the wall deadline stopped the conversation. A live
    /// turn is told to stop (once, best effort: the outcome stands either way).
    fn interrupted(&mut self) -> Option<EpisodeOutcome> {
        let (stop, note, why) = if self.ep.cancel.is_cancelled() {
            (StopReason::Cancelled, None, "cancelled")
        } else if Instant::now() >= self.deadline {
            let note = format!(
                "the episode reached its {}s timeout",
                self.ep.config.wall.as_secs_f64()
            );
            (StopReason::Timeout, Some(note), "timeout")
        } else {
            return None;
        };
        if let Some(agent) = self.agent.run.as_mut() {
            agent.stop();
        }
        if matches!(self.ep.opening, Opening::LiveTurn { .. }) && !self.aborted {
            self.aborted = true;
            let abort = json!({"type": "abort", "reason": why});
            let _ = self.send(&abort);
        }
        Some(self.outcome(stop, String::new(), note, false))
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
            counters: self.counters,
            note,
            provider_failure: self.provider_failure.clone(),
            runner_idle,
        }
    }

    fn channel_error(&self, source: ChannelError) -> EpisodeError {
        EpisodeError::Channel {
            source,
            partial: Box::new(self.counters),
        }
    }
}
