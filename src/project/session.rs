//! `project run`: one agent turn in a project, over the live-session runner and the durable
//! channel.
//!
//! Tools are answered on the host: `read_file`, `write_file` (through the project, so writes
//! are mirrored, and only inside the turn's write grant), `submit`, and `bash` only when the
//! user allows it. The sandbox's network is locked before the session starts, so no agent
//! action ever has internet access.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{Project, ProjectError};
use crate::cancel::CancelToken;
use crate::channel::durable::{DurableChannel, DurableError};
use crate::channel::{frame_type, Frame};
use crate::environment::{default_tools, ToolOutput};
use crate::episode::TokenMeter;
use crate::errors::error_chain;
use crate::provider::{ModelCall, Provider};
use crate::sandbox::{ErrorClass, SpawnOpts};
use crate::task::Task;

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
}

impl Default for TurnOptions {
    fn default() -> Self {
        TurnOptions {
            instruction: String::new(),
            allow_bash: false,
            writable: None,
            timeout: Duration::from_secs(6 * 3600),
            turn_cap: 60,
            actions_per_turn: 40,
            max_output_tokens: 4096,
            bash_timeout: Duration::from_secs(60),
            hello_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TurnResult {
    pub answer: Option<String>,
    /// How the runner ended the turn (`completed`, `turn_limit`, `aborted`, ...).
    pub reason: String,
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
    Channel(#[source] DurableError),
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
        match one_turn(project, provider, opts, cancel, events) {
            Ok(mut r) => {
                r.attempts = attempt;
                return Ok(r);
            }
            Err(e) if e.is_transport() && attempt == 1 && !cancel.is_cancelled() => {
                if opts.allow_bash {
                    return Err(TurnError::NotReplayable {
                        cause: error_chain(&e),
                    });
                }
                log(events, "retry", json!({"reason": error_chain(&e)}));
                project.replace()?;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

fn log(events: &mut dyn Write, kind: &str, payload: Value) {
    let line = json!({"t": crate::sandbox::ledger::unix_now(), "kind": kind, "payload": payload});
    // The event log is for people; a full disk must not fail the turn.
    let _ = writeln!(events, "{line}");
}

struct Turn<'a> {
    project: &'a mut Project,
    provider: &'a dyn Provider,
    opts: &'a TurnOptions,
    cancel: &'a CancelToken,
    events: &'a mut dyn Write,
    task: Task,
    llm_calls: usize,
    tokens: TokenMeter,
    tool_calls: u32,
    actions: u32,
    answer: Option<String>,
}

fn one_turn(
    project: &mut Project,
    provider: &dyn Provider,
    opts: &TurnOptions,
    cancel: &CancelToken,
    events: &mut dyn Write,
) -> Result<TurnResult, TurnError> {
    let mut channel = start_live_runner(project, opts)?;
    let task = Task {
        id: project.state().name.clone(),
        instruction: opts.instruction.clone(),
        files: Default::default(),
        setup: None,
        verify: None,
        timeout_s: None,
        max_turns: None,
        metadata: Map::new(),
        model_script: None,
        world_script: None,
    };
    let mut turn = Turn {
        project,
        provider,
        opts,
        cancel,
        events,
        task,
        llm_calls: 0,
        tokens: TokenMeter::default(),
        tool_calls: 0,
        actions: 0,
        answer: None,
    };
    let result = turn.drive(&mut channel);
    let from_disk = channel.frames_from_disk;
    let lost = channel.stream_lost();
    channel.close();
    let (reason, answer) = result?;
    Ok(TurnResult {
        answer,
        reason,
        tokens: turn.tokens,
        tool_calls: turn.tool_calls,
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
    let cmd = format!("mkdir -p {outbox}/frames && exec node live.mjs 2>> {outbox}/stderr.log");
    let process = sandbox
        .spawn(
            &cmd,
            &SpawnOpts {
                role: crate::sandbox::Role::System,
                cwd: Some(dir.clone()),
                envs: vec![("WMO_LIVE_OUTBOX".into(), outbox.clone())],
                stdin: true,
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

impl Turn<'_> {
    fn tools(&self) -> Vec<Value> {
        default_tools()
            .into_iter()
            .filter(|t| self.opts.allow_bash || t["function"]["name"] != "bash")
            .collect()
    }

    /// Runs the session to the end of the turn; returns the reason and the answer.
    fn drive(&mut self, ch: &mut DurableChannel) -> Result<(String, Option<String>), TurnError> {
        // No agent action may reach the network: lock it before the session exists.
        self.project
            .sandbox()
            .set_internet(false)
            .map_err(|source| ProjectError::Sandbox {
                what: "lock the sandbox's network".into(),
                source,
            })?;
        let tools = self.tools();
        let system = crate::environment::system_prompt(&self.project.workspace(), &tools);
        ch.send(
            &json!({"type": "session_start", "session_id": crate::id::new_episode_id(),
            "system": system, "tools": tools, "turn_cap": self.opts.turn_cap,
            "max_output_tokens": self.opts.max_output_tokens, "conversation_scope": "turn"}),
        )
        .map_err(TurnError::Channel)?;
        // The session is ready at its first idle.
        self.wait_state(ch, |f| f["status"] == "idle", self.opts.hello_timeout)?;
        let msg_id = crate::id::new_episode_id();
        log(
            self.events,
            "user_message",
            json!({"msg_id": msg_id, "text": self.opts.instruction}),
        );
        ch.send(&json!({"type": "user_message", "msg_id": msg_id, "text": self.opts.instruction}))
            .map_err(TurnError::Channel)?;
        let mut running_seen = false;
        let deadline = Instant::now() + self.opts.timeout;
        loop {
            if self.cancel.is_cancelled() {
                let _ = ch.send(&json!({"type": "abort", "reason": "cancelled"}));
                return Err(TurnError::Cancelled);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let _ = ch.send(&json!({"type": "abort", "reason": "project_run_timeout"}));
                return Err(TurnError::Timeout(self.opts.timeout));
            }
            let frame = match ch.recv(left.min(Duration::from_millis(250))) {
                Ok(Some(f)) => f,
                Ok(None) => return Err(TurnError::NotReady("the channel closed".into())),
                Err(DurableError::Timeout(_)) => continue,
                Err(e) => return Err(TurnError::Channel(e)),
            };
            match frame_type(&frame) {
                "llm_request" => self.on_llm(ch, &frame)?,
                "tool_request" => self.on_tool(ch, &frame)?,
                "state" => {
                    log(self.events, "state", Value::Object(frame.clone()));
                    if frame["status"] == "running" {
                        running_seen = true;
                    } else if frame["status"] == "idle"
                        && running_seen
                        && frame["msg_id"].as_str() == Some(msg_id.as_str())
                    {
                        let reason = frame["reason"].as_str().unwrap_or("completed").to_string();
                        return Ok((reason, self.answer.clone()));
                    }
                }
                "episode_error" => {
                    let note = frame["note"].as_str().unwrap_or("runner error").to_string();
                    log(self.events, "error", json!({"message": note}));
                    return Err(TurnError::Agent(note));
                }
                _ => {}
            }
        }
    }

    fn wait_state(
        &mut self,
        ch: &mut DurableChannel,
        accept: impl Fn(&Frame) -> bool,
        timeout: Duration,
    ) -> Result<(), TurnError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match ch.recv(left) {
                Ok(Some(f)) if frame_type(&f) == "state" && accept(&f) => return Ok(()),
                Ok(Some(f)) if frame_type(&f) == "episode_error" => {
                    return Err(TurnError::NotReady(
                        f["note"].as_str().unwrap_or("runner error").to_string(),
                    ))
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err(TurnError::NotReady("the channel closed".into())),
                Err(e) => return Err(TurnError::NotReady(error_chain(&e))),
            }
        }
    }

    fn on_llm(&mut self, ch: &mut DurableChannel, frame: &Frame) -> Result<(), TurnError> {
        let Some(req_id) = frame.get("req_id").and_then(Value::as_u64) else {
            return Ok(());
        };
        let empty = json!({});
        let body = frame
            .get("openai_body")
            .filter(|b| b.is_object())
            .unwrap_or(&empty);
        let call = ModelCall {
            task: &self.task,
            index: self.llm_calls,
            body,
            cancel: self.cancel,
        };
        self.llm_calls += 1;
        let reply = match self.provider.complete(&call) {
            Ok(done) => {
                self.tokens.input += done.usage.input_tokens;
                self.tokens.output += done.usage.output_tokens;
                self.tokens.calls += 1;
                if let Some(text) = done.body["choices"][0]["message"]["content"].as_str() {
                    if !text.trim().is_empty() {
                        log(self.events, "assistant_message", json!({"text": text}));
                    }
                }
                json!({"type": "llm_response", "req_id": req_id, "completion": done.body})
            }
            Err(e) => {
                let msg = error_chain(&e);
                log(
                    self.events,
                    "error",
                    json!({"message": format!("model call failed: {msg}")}),
                );
                json!({"type": "llm_response", "req_id": req_id, "error": msg})
            }
        };
        ch.send(&reply).map_err(TurnError::Channel)
    }

    fn on_tool(&mut self, ch: &mut DurableChannel, frame: &Frame) -> Result<(), TurnError> {
        let Some(req_id) = frame.get("req_id").and_then(Value::as_u64) else {
            return Ok(());
        };
        let name = frame
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let empty = Map::new();
        let args = frame
            .get("arguments")
            .and_then(Value::as_object)
            .unwrap_or(&empty)
            .clone();
        let out = if name == "submit" {
            let answer = args
                .get("answer")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            log(self.events, "submit", json!({"answer": answer}));
            self.answer = Some(answer);
            ToolOutput::ok("submitted")
        } else {
            self.tool_calls += 1;
            log(
                self.events,
                "tool_call",
                json!({"name": name, "arguments": args}),
            );
            let out = self.execute(&name, &args)?;
            log(
                self.events,
                "tool_result",
                json!({"name": name, "content": out.content, "is_error": out.is_error}),
            );
            out
        };
        ch.send(&json!({"type": "tool_response", "req_id": req_id,
                        "content": out.content, "is_error": out.is_error}))
            .map_err(TurnError::Channel)
    }

    /// Answers one tool call. Agent mistakes are tool errors; a broken sandbox is an `Err`.
    fn execute(&mut self, name: &str, args: &Map<String, Value>) -> Result<ToolOutput, TurnError> {
        if self.actions >= self.opts.actions_per_turn {
            return Ok(ToolOutput::error(format!(
                "environment action budget exhausted ({} tool actions)",
                self.opts.actions_per_turn
            )));
        }
        self.actions += 1;
        let arg = |k: &str| args.get(k).and_then(Value::as_str);
        let result = match name {
            "read_file" => match arg("path").map(|p| self.agent_path(p)) {
                None => return Ok(ToolOutput::error("missing argument `path`")),
                Some(Err(msg)) => return Ok(ToolOutput::error(msg)),
                Some(Ok(rel)) => self.project.get(&rel).map(|bytes| {
                    let mut c = crate::sandbox::Captured::default();
                    c.push(&bytes, crate::environment::sandbox::MAX_TOOL_OUTPUT);
                    ToolOutput::ok(c.to_text())
                }),
            },
            "write_file" => {
                let (Some(path), Some(content)) = (arg("path"), arg("content")) else {
                    return Ok(ToolOutput::error("write_file needs `path` and `content`"));
                };
                let rel = match self.agent_path(path) {
                    Ok(r) => r,
                    Err(msg) => return Ok(ToolOutput::error(msg)),
                };
                if let Some(grant) = &self.opts.writable {
                    if !grant.contains(&rel) {
                        return Ok(ToolOutput::error(format!(
                            "path is not writable in this project turn: {rel:?}"
                        )));
                    }
                }
                self.project
                    .put(&rel, content.as_bytes())
                    .map(|rel| ToolOutput::ok(format!("wrote {} bytes to {rel}", content.len())))
            }
            "bash" if self.opts.allow_bash => match arg("command") {
                None => return Ok(ToolOutput::error("missing argument `command`")),
                Some(cmd) => self.project.exec(cmd, self.opts.bash_timeout).map(|o| {
                    let mut content = o.output;
                    match o.exit_code {
                        Some(0) => {}
                        Some(c) => content.push_str(&format!("\n[exit {c}]")),
                        None => content.push_str("\n[killed]"),
                    }
                    ToolOutput {
                        content,
                        is_error: o.exit_code != Some(0),
                    }
                }),
            },
            other => return Ok(ToolOutput::error(format!("tool '{other}' not available"))),
        };
        match result {
            Ok(out) => Ok(out),
            Err(ProjectError::Sandbox { source, what })
                if source.class() != ErrorClass::BadRequest =>
            {
                Err(TurnError::Project(ProjectError::Sandbox { source, what }))
            }
            Err(e) => Ok(ToolOutput::error(format!(
                "{name} failed: {}",
                error_chain(&e)
            ))),
        }
    }

    /// An agent's path: relative to the workspace, or absolute inside it.
    fn agent_path(&self, path: &str) -> Result<String, String> {
        let ws = self.project.workspace();
        let rel = match path.strip_prefix(&ws) {
            Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
            Some("") => "",
            _ if path.starts_with('/') => {
                return Err(format!("path escapes the project workspace: {path:?}"))
            }
            _ => path,
        };
        super::project_path(rel).map_err(|e| e.to_string())
    }
}
