//! The `sandbox` environment: tool calls run in the episode's own sandbox, inside a fresh
//! per-episode workspace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;

use serde_json::{Map, Value};

use super::agent::{AgentLaunch, AgentRun, Endpoint, SandboxAgent};
use super::{EnvError, Environment, ToolOutput};
use crate::cancel::CancelToken;
use crate::sandbox::{
    Captured, ErrorClass, ProcessEvent, Sandbox, SandboxError, SpawnOpts, TERM_GRACE,
};

/// Bytes of tool output an agent sees, as head + tail.
pub const MAX_TOOL_OUTPUT: usize = 32 * 1024;
pub const DEFAULT_BASH_TIMEOUT: Duration = Duration::from_secs(120);

pub struct SandboxEnvironment {
    sandbox: Arc<dyn Sandbox>,
    workspace: String,
    bash_timeout: Duration,
    /// The runner's process, whose network an agent joins to reach its endpoint.
    runner_pid: Option<u32>,
}

impl SandboxEnvironment {
    /// `workspace` is an absolute directory inside the sandbox; it must exist.
    pub fn new(sandbox: Arc<dyn Sandbox>, workspace: String, bash_timeout: Duration) -> Self {
        SandboxEnvironment {
            sandbox,
            workspace,
            bash_timeout,
            runner_pid: None,
        }
    }

    /// Names the runner's process (see `start_agent`).
    pub fn with_runner(mut self, pid: u32) -> Self {
        self.runner_pid = Some(pid);
        self
    }

    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    /// Resolves an agent's path (relative, or absolute inside the workspace).
    fn resolve(&self, path: &str) -> Result<String, String> {
        let ws = self.workspace.trim_end_matches('/');
        let rel = match path.strip_prefix(ws) {
            Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
            Some("") => "",
            _ => path,
        };
        crate::sandbox::contained_path(ws, rel)
            .map_err(|e| format!("path {path:?} escapes the workspace {ws}: {e}"))
    }

    fn bash(&self, command: &str, cancel: &CancelToken) -> Result<ToolOutput, EnvError> {
        let secs = self.bash_timeout.as_secs().max(1);
        let sandbox_err = |source| EnvError::Sandbox {
            tool: "bash".into(),
            source,
        };
        // Spawned rather than run so that cancellation (Ctrl-C) ends a long command now, not
        // when it finishes. The sandbox ends it at the timeout (TERM, then KILL), in the
        // sandbox's shell; our own deadline below is the hard bound if even that does not.
        let started = Instant::now();
        let process = self
            .sandbox
            .spawn(
                command,
                &SpawnOpts {
                    role: crate::sandbox::Role::Task,
                    cwd: Some(self.workspace.clone()),
                    envs: Vec::new(),
                    stdin: false,
                    network_of: None,
                    ends_after: Some(self.bash_timeout),
                },
            )
            .map_err(sandbox_err)?;
        let deadline = started + self.bash_timeout + TERM_GRACE + Duration::from_secs(3);
        let (mut stdout, mut stderr) = (Captured::default(), Captured::default());
        let mut exit = None;
        let mut timed_out = false;
        loop {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(crate::cancel::POLL);
            match process.events.recv_timeout(wait) {
                Ok(ProcessEvent::Stdout(chunk)) => stdout.push(&chunk, MAX_TOOL_OUTPUT),
                Ok(ProcessEvent::Stderr(chunk)) => stderr.push(&chunk, MAX_TOOL_OUTPUT),
                Ok(ProcessEvent::Exit(code)) => {
                    exit = code;
                    break;
                }
                Ok(ProcessEvent::Failed(e)) => return Err(sandbox_err(e)),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(sandbox_err(SandboxError::NoSuchProcess {
                        id: self.sandbox.id().to_string(),
                        pid: process.pid,
                    }))
                }
                Err(RecvTimeoutError::Timeout) => {
                    if cancel.is_cancelled() {
                        let _ = self.sandbox.kill_process(process.pid);
                        return Ok(ToolOutput::error("interrupted"));
                    }
                    if Instant::now() >= deadline {
                        let _ = self.sandbox.kill_process(process.pid);
                        timed_out = true;
                        break;
                    }
                }
            }
        }
        let mut content = Captured::merged(&[&stdout, &stderr], MAX_TOOL_OUTPUT).to_text();
        // An end that came at the timeout or after it was the timeout's doing.
        let timed_out = timed_out || started.elapsed() >= self.bash_timeout;
        match exit {
            _ if timed_out => content.push_str(&format!("\n[timed out after {secs}s]")),
            Some(0) => {}
            Some(code) => content.push_str(&format!("\n[exit {code}]")),
            None => content.push_str("\n[killed by a signal]"),
        }
        Ok(ToolOutput {
            content,
            is_error: exit != Some(0) || timed_out,
        })
    }

    fn read_file(&self, path: &str) -> Result<ToolOutput, EnvError> {
        let full = match self.resolve(path) {
            Ok(p) => p,
            Err(msg) => return Ok(ToolOutput::error(msg)),
        };
        match self.sandbox.read_file(&full) {
            Ok(bytes) => {
                let mut c = Captured::default();
                c.push(&bytes, MAX_TOOL_OUTPUT);
                Ok(ToolOutput::ok(c.to_text()))
            }
            Err(e) if tool_level(&e) => Ok(ToolOutput::error(format!("read_file failed: {e}"))),
            Err(source) => Err(EnvError::Sandbox {
                tool: "read_file".into(),
                source,
            }),
        }
    }

    fn write_file(&self, path: &str, content: &str) -> Result<ToolOutput, EnvError> {
        let full = match self.resolve(path) {
            Ok(p) => p,
            Err(msg) => return Ok(ToolOutput::error(msg)),
        };
        match self.sandbox.write_file(&full, content.as_bytes()) {
            Ok(()) => Ok(ToolOutput::ok(format!(
                "wrote {} bytes to {path}",
                content.len()
            ))),
            Err(e) if tool_level(&e) => Ok(ToolOutput::error(format!("write_file failed: {e}"))),
            Err(source) => Err(EnvError::Sandbox {
                tool: "write_file".into(),
                source,
            }),
        }
    }
}

/// Errors the agent caused (a missing file, a bad path) go back to the agent; the rest mean
/// the sandbox is broken.
fn tool_level(e: &SandboxError) -> bool {
    matches!(e.class(), ErrorClass::BadRequest)
}

fn str_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ToolOutput> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ToolOutput::error(format!(
            "argument `{name}` must be a string"
        ))),
        None => Err(ToolOutput::error(format!("missing argument `{name}`"))),
    }
}

impl Environment for SandboxEnvironment {
    fn execute(
        &self,
        name: &str,
        args: &Map<String, Value>,
        cancel: &CancelToken,
    ) -> Result<ToolOutput, EnvError> {
        if cancel.is_cancelled() {
            return Ok(ToolOutput::error("interrupted"));
        }
        let result = match name {
            "bash" => str_arg(args, "command").map(|c| self.bash(c, cancel)),
            "read_file" => str_arg(args, "path").map(|p| self.read_file(p)),
            "write_file" => str_arg(args, "path")
                .and_then(|p| str_arg(args, "content").map(|c| self.write_file(p, c))),
            other => Err(ToolOutput::error(format!("tool '{other}' not available"))),
        };
        result.unwrap_or_else(Ok)
    }

    fn start_agent(
        &self,
        launch: &AgentLaunch,
        endpoint: &Endpoint,
        instruction: &str,
    ) -> Result<Box<dyn AgentRun>, EnvError> {
        let agent = SandboxAgent::start(
            self.sandbox.clone(),
            &self.workspace,
            launch,
            endpoint,
            instruction,
            self.runner_pid,
        )
        .map_err(|source| EnvError::AgentStart {
            agent: launch.name.clone(),
            source,
        })?;
        Ok(Box::new(agent))
    }
}
