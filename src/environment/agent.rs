//! An agent the host runs as a process of the task: an off-the-shelf agent (Claude Code,
//! Codex, ...) that does its own tool calls inside the sandbox and asks the model through
//! the runner's endpoint (the `endpoint` harness), so its key stays on the host.

use std::sync::Arc;

use crossbeam_channel::TryRecvError;

use crate::sandbox::{Captured, ProcessEvent, Role, Sandbox, SpawnOpts};

/// Bytes of the agent's output kept for the record, as head + tail.
pub const MAX_AGENT_OUTPUT: usize = 64 * 1024;

/// How to start an agent: a shell command, run in the workspace as the task, with the
/// endpoint's variables added to `envs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLaunch {
    /// What records call it: `claude-code`, `codex`, `cmd`.
    pub name: String,
    pub command: String,
    pub envs: Vec<(String, String)>,
    /// The model the run asks, as the endpoint names it to the agent.
    pub model: String,
}

/// Where the runner serves the model APIs for this episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// A loopback port of the sandbox.
    pub port: u16,
    /// The key the endpoint answers to: a placeholder of this episode's, worth nothing
    /// beyond it.
    pub token: String,
    /// The model the run asks (what the endpoint's model list names).
    pub model: String,
}

impl Endpoint {
    /// The variables that point the agents we know of at the endpoint.
    pub fn variables(&self) -> Vec<(String, String)> {
        let base = format!("http://127.0.0.1:{}", self.port);
        [
            ("OPENAI_BASE_URL", format!("{base}/v1")),
            ("OPENAI_API_BASE", format!("{base}/v1")),
            ("OPENAI_API_KEY", self.token.clone()),
            ("ANTHROPIC_BASE_URL", base.clone()),
            ("ANTHROPIC_API_KEY", self.token.clone()),
            ("WMO_E2B_MODEL_ENDPOINT", base),
            ("WMO_E2B_MODEL", self.model.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// How an agent's process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentExit {
    /// `None`: killed by a signal, or its stream failed.
    pub code: Option<i32>,
    /// Its stdout and stderr, bounded (head + tail each).
    pub stdout: String,
    pub stderr: String,
    /// Why the stream to it failed, when it did.
    pub failure: Option<String>,
}

/// A running agent.
pub trait AgentRun: Send {
    /// The agent's end, once it has come; never blocks.
    fn exited(&mut self) -> Option<AgentExit>;
    /// Ends the agent now (best effort: the task's stop proves every process gone).
    fn stop(&mut self);
}

/// An agent started in a sandbox, read on the broker's thread.
pub(super) struct SandboxAgent {
    sandbox: Arc<dyn Sandbox>,
    pid: u32,
    events: crossbeam_channel::Receiver<ProcessEvent>,
    stdout: Captured,
    stderr: Captured,
    ended: bool,
}

impl SandboxAgent {
    pub(super) fn start(
        sandbox: Arc<dyn Sandbox>,
        workspace: &str,
        launch: &AgentLaunch,
        endpoint: &Endpoint,
        instruction: &str,
        runner_pid: Option<u32>,
    ) -> crate::sandbox::Result<SandboxAgent> {
        let mut envs = launch.envs.clone();
        envs.extend(endpoint.variables());
        envs.push(("WMO_E2B_INSTRUCTION".into(), instruction.to_string()));
        let opts = SpawnOpts {
            cwd: Some(workspace.to_string()),
            role: Role::Task,
            envs,
            stdin: false,
            // The endpoint is on the runner's loopback.
            network_of: runner_pid,
            ends_after: None,
        };
        let process = sandbox.spawn(&launch.command, &opts)?;
        Ok(SandboxAgent {
            sandbox,
            pid: process.pid,
            events: process.events,
            stdout: Captured::default(),
            stderr: Captured::default(),
            ended: false,
        })
    }

    fn exit(&mut self, code: Option<i32>, failure: Option<String>) -> AgentExit {
        self.ended = true;
        AgentExit {
            code,
            stdout: self.stdout.to_text(),
            stderr: self.stderr.to_text(),
            failure,
        }
    }
}

impl AgentRun for SandboxAgent {
    fn exited(&mut self) -> Option<AgentExit> {
        if self.ended {
            return None;
        }
        loop {
            match self.events.try_recv() {
                Ok(ProcessEvent::Stdout(b)) => self.stdout.push(&b, MAX_AGENT_OUTPUT),
                Ok(ProcessEvent::Stderr(b)) => self.stderr.push(&b, MAX_AGENT_OUTPUT),
                Ok(ProcessEvent::Exit(code)) => return Some(self.exit(code, None)),
                Ok(ProcessEvent::Failed(e)) => {
                    let why = crate::errors::error_chain(&e);
                    return Some(self.exit(None, Some(why)));
                }
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => {
                    return Some(self.exit(None, Some("its output stream ended".into())))
                }
            }
        }
    }

    fn stop(&mut self) {
        if !self.ended {
            let _ = self.sandbox.kill_process(self.pid);
        }
    }
}

impl Drop for SandboxAgent {
    fn drop(&mut self) {
        self.stop();
    }
}
