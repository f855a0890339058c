//! The broker's side of an agent episode (the runner's `endpoint` harness): the agent runs as
//! a process of the task, the runner serves it the model APIs, and every request it makes
//! arrives here as an `llm_request` in the API it spoke. It is answered through the provider
//! like any other call (turns, token metering, caps, transcript) and sent back in that API.
//! Past a budget the answer is the API's own "limit reached" error, and the episode ends when
//! the agent's process does (or at the deadline, which ends the process).

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{Broker, Step};
use crate::environment::{AgentExit, Endpoint};
use crate::episode::{EpisodeError, StopReason};
use crate::provider::dialect::{self, Api, ErrorKind, Reply};
use crate::provider::ProviderError;

/// How often the broker looks at the agent's process while it runs.
pub(super) const AGENT_POLL: Duration = Duration::from_millis(50);
/// Bytes of the agent's output tails the transcript notes at its exit.
const EXIT_NOTE_BYTES: usize = 2048;

/// What an agent episode holds beside the broker's own state.
#[derive(Default)]
pub(super) struct AgentState {
    /// The endpoint's key for this episode.
    pub token: String,
    pub run: Option<Box<dyn crate::environment::AgentRun>>,
    pub exit: Option<AgentExit>,
    /// A budget the agent ran past: answered with an error, and the episode's stop reason
    /// once the agent has gone.
    pub budget_stop: Option<(StopReason, String)>,
}

impl Broker<'_, '_> {
    /// The runner listens: start the agent, pointed at it.
    pub(super) fn on_endpoint_ready(
        &mut self,
        frame: &Map<String, Value>,
    ) -> Result<Step, EpisodeError> {
        let Some(launch) = self.ep.config.agent.as_ref() else {
            return Ok(Step::Continue);
        };
        if self.agent.run.is_some() || self.agent.exit.is_some() {
            self.ep.observer.note("ignored a second endpoint_ready");
            return Ok(Step::Continue);
        }
        let port = frame
            .get("port")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p != 0);
        let Some(port) = port else {
            let note = "the runner's endpoint_ready named no port (1-65535)".to_string();
            return Ok(Step::End(self.outcome(
                StopReason::Error,
                String::new(),
                Some(note),
                false,
            )));
        };
        let endpoint = Endpoint {
            port,
            token: self.agent.token.clone(),
            model: launch.model.clone(),
        };
        let instruction = match self.ep.opening {
            crate::episode::Opening::Episode { instruction } => instruction,
            crate::episode::Opening::LiveTurn { message } => message,
        };
        let run = self
            .ep
            .environment
            .start_agent(launch, &endpoint, instruction)
            .map_err(|source| EpisodeError::Environment {
                source,
                partial: Box::new(self.counters),
            })?;
        self.agent.run = Some(run);
        Ok(Step::Continue)
    }

    /// Looks at the agent's process: once it has ended, the runner is told to close its
    /// endpoint, and its `done` ends the episode.
    pub(super) fn poll_agent(&mut self) -> Result<(), EpisodeError> {
        let Some(exit) = self.agent.run.as_mut().and_then(|r| r.exited()) else {
            return Ok(());
        };
        self.ep.observer.note(&exit_note(&exit));
        self.agent.exit = Some(exit);
        self.agent.run = None;
        let end = json!({"type": "episode_end", "episode_id": self.ep.config.episode_id});
        self.send(&end)
    }

    /// The outcome of an agent episode whose runner said `done`.
    pub(super) fn agent_done(&self) -> crate::episode::EpisodeOutcome {
        if let Some((stop, note)) = &self.agent.budget_stop {
            return self.outcome(*stop, String::new(), Some(note.clone()), true);
        }
        let note = match &self.agent.exit {
            Some(AgentExit { code: Some(0), .. }) => None,
            Some(exit) => Some(exit_summary(exit)),
            None => Some("the runner ended the episode before the agent did".into()),
        };
        self.outcome(StopReason::AgentExit, String::new(), note, true)
    }

    /// An `llm_request` in one of the APIs the endpoint serves.
    pub(super) fn on_api_request(
        &mut self,
        frame: &Map<String, Value>,
        req_id: u64,
    ) -> Result<Step, EpisodeError> {
        let api = frame
            .get("api")
            .and_then(Value::as_str)
            .and_then(Api::from_name);
        let Some(api) = api else {
            let kind = ErrorKind::InvalidRequest;
            return self.api_error(req_id, Api::OpenAiChat, kind, "unknown api");
        };
        let raw = frame.get("api_body").unwrap_or(&Value::Null);
        let inbound = match dialect::to_chat(api, raw) {
            Ok(i) => i,
            Err(e) => {
                return self.api_error(req_id, api, ErrorKind::InvalidRequest, &e.to_string())
            }
        };
        if let Some((stop, note)) = self.spent("agent") {
            self.agent.budget_stop.get_or_insert((stop, note.clone()));
            return self.api_error(req_id, api, ErrorKind::QuotaExhausted, &note);
        }
        if let Some(msg) = self.not_sent() {
            return self.api_error(req_id, api, ErrorKind::ServerError, &msg);
        }
        let mut body = inbound.chat_body;
        cap_output_tokens(&mut body, self.ep.config.max_output_tokens);
        let index = self.counters.turns;
        match self.call_model(&body) {
            Ok(done) => {
                let seed = format!("{}-{index}", self.ep.config.episode_id);
                let reply = dialect::from_completion(
                    api,
                    &done.body,
                    &done.usage,
                    &inbound.model,
                    inbound.stream,
                    &seed,
                );
                // The chat completion goes along for the transcript (and its readers: the
                // report, ATIF), which know that form; the runner sends only `api_reply`.
                let completion = done.body;
                let answer = match reply {
                    Ok(Reply::Json(v)) => json!({"status": 200, "body": v}),
                    Ok(Reply::Events(events)) => {
                        let events: Vec<Value> = events
                            .into_iter()
                            .map(|e| json!({"event": e.event, "data": e.data}))
                            .collect();
                        json!({"status": 200, "events": events})
                    }
                    Err(e) => {
                        let msg = format!("the model's answer cannot be given in this API: {e}");
                        return self.api_error(req_id, api, ErrorKind::ServerError, &msg);
                    }
                };
                let reply = self.reply(
                    "llm_response",
                    req_id,
                    json!({"api_reply": answer, "completion": completion}),
                );
                self.send_api_reply(reply)
            }
            Err(e) => {
                let msg = self.failed_call(&e);
                self.api_error(req_id, api, error_kind(&e), &msg)
            }
        }
    }

    fn api_error(
        &mut self,
        req_id: u64,
        api: Api,
        kind: ErrorKind,
        message: &str,
    ) -> Result<Step, EpisodeError> {
        let (status, body) = dialect::error_reply(api, kind, message);
        let api_reply = json!({"status": status, "body": body});
        // `error` is for the transcript's readers, which show it as a failed call.
        let reply = self.reply(
            "llm_response",
            req_id,
            json!({"api_reply": api_reply, "error": message}),
        );
        self.send_api_reply(reply)
    }

    /// Sends `reply`, unless the episode was interrupted while it was made.
    fn send_api_reply(&mut self, reply: Value) -> Result<Step, EpisodeError> {
        if let Some(end) = self.interrupted() {
            return Ok(Step::End(end));
        }
        self.send(&reply)?;
        Ok(self.after_answer())
    }
}

/// The run's output cap holds for an agent's calls too: what it asks beyond is cut to it,
/// and a call that names none gets it.
fn cap_output_tokens(body: &mut Value, cap: u32) {
    let Value::Object(map) = body else { return };
    let asked = ["max_tokens", "max_completion_tokens"]
        .iter()
        .filter_map(|k| map.remove(*k).and_then(|v| v.as_u64()))
        .min();
    let tokens = asked.map_or(u64::from(cap), |a| a.min(u64::from(cap)));
    map.insert("max_tokens".into(), json!(tokens));
}

/// The API error an agent is shown for a failed call, so it retries what may pass on a retry
/// and gives up on what will not.
fn error_kind(e: &ProviderError) -> ErrorKind {
    match e {
        ProviderError::Status { status: 429, .. } => ErrorKind::RateLimited,
        ProviderError::InvalidRequest { .. } => ErrorKind::InvalidRequest,
        ProviderError::ModelNotFound { .. } => ErrorKind::NotFound,
        ProviderError::Cancelled => ErrorKind::Timeout,
        ProviderError::Status { status, .. } if (400..500).contains(status) => {
            ErrorKind::InvalidRequest
        }
        _ => ErrorKind::ServerError,
    }
}

fn exit_summary(exit: &AgentExit) -> String {
    let how = match (exit.code, &exit.failure) {
        (_, Some(why)) => format!("the agent's process was lost: {why}"),
        (Some(code), None) => format!("the agent exited with code {code}"),
        (None, None) => "the agent was killed by a signal".to_string(),
    };
    let stderr = tail(&exit.stderr, 400);
    if stderr.trim().is_empty() {
        how
    } else {
        format!("{how}; its stderr ends: {}", stderr.trim())
    }
}

fn exit_note(exit: &AgentExit) -> String {
    format!(
        "{}\n--- stdout (tail) ---\n{}\n--- stderr (tail) ---\n{}",
        exit_summary(exit),
        tail(&exit.stdout, EXIT_NOTE_BYTES),
        tail(&exit.stderr, EXIT_NOTE_BYTES)
    )
}

/// The last `max` bytes of `text`, cut at a character boundary.
fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}
