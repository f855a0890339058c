//! Environments: where an agent's tool calls land, on the host side of the channel.

pub mod agent;
pub mod sandbox;
pub mod world_model;

use serde_json::{json, Map, Value};

use crate::cancel::CancelToken;
use crate::sandbox::SandboxError;

pub use agent::{AgentExit, AgentLaunch, AgentRun, Endpoint};
pub use sandbox::SandboxEnvironment;
pub use world_model::WorldModelEnvironment;

/// What a tool call returns to the agent. `is_error` is information for the agent, not a
/// failure of the episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub content: String,
    pub is_error: bool,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: false,
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: true,
        }
    }
}

/// An environment that could not answer at all: the episode cannot go on in this sandbox.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("the sandbox failed while running tool {tool}")]
    Sandbox {
        tool: String,
        #[source]
        source: SandboxError,
    },
    #[error("the sandbox could not start the agent {agent}")]
    AgentStart {
        agent: String,
        #[source]
        source: SandboxError,
    },
    #[error("this environment runs no agent process: {what}")]
    NoAgents { what: &'static str },
}

impl EnvError {
    /// Whether a fresh sandbox might succeed.
    pub fn is_transport(&self) -> bool {
        match self {
            EnvError::Sandbox { source, .. } | EnvError::AgentStart { source, .. } => {
                source.is_transport()
            }
            EnvError::NoAgents { .. } => false,
        }
    }
}

pub trait Environment: Send + Sync {
    /// Runs one tool call. A tool that fails (bad path, non-zero exit) is an `Ok` output with
    /// `is_error`; `Err` means the environment itself is broken.
    fn execute(
        &self,
        name: &str,
        args: &Map<String, Value>,
        cancel: &CancelToken,
    ) -> Result<ToolOutput, EnvError>;

    /// Starts `launch` as a process of the task, pointed at `endpoint`, with `instruction`
    /// in `WMO_E2B_INSTRUCTION`.
    fn start_agent(
        &self,
        _launch: &AgentLaunch,
        _endpoint: &Endpoint,
        _instruction: &str,
    ) -> Result<Box<dyn AgentRun>, EnvError> {
        Err(EnvError::NoAgents {
            what: "an agent harness needs a sandbox environment",
        })
    }
}

/// Tools an environment answers; `submit` is handled by the runner.
pub const ENV_TOOLS: [&str; 3] = ["bash", "read_file", "write_file"];

/// The default tool list in OpenAI's function-tool form. Every argument is a required string.
pub fn default_tools() -> Vec<Value> {
    let spec = |name: &str, description: &str, args: &[(&str, &str)]| {
        let properties: Map<String, Value> = args
            .iter()
            .map(|(a, d)| (a.to_string(), json!({"type": "string", "description": d})))
            .collect();
        let required: Vec<&str> = args.iter().map(|(a, _)| *a).collect();
        json!({"type": "function", "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        }})
    };
    vec![
        spec(
            "bash",
            "Run a shell command in the environment; returns stdout+stderr and exit status.",
            &[("command", "the shell command to run")],
        ),
        spec(
            "read_file",
            "Read a file from the environment.",
            &[(
                "path",
                "path of the file to read (relative to the workspace, or absolute inside it)",
            )],
        ),
        spec(
            "write_file",
            "Write a file in the environment (parent dirs are created).",
            &[
                (
                    "path",
                    "path to write (relative to the workspace, or absolute inside it)",
                ),
                ("content", "full file content"),
            ],
        ),
        spec(
            "submit",
            "Finish the task and submit your answer/result summary. This ends the run.",
            &[("answer", "your final answer or a summary of what you did")],
        ),
    ]
}

/// The system prompt for the builtin harness: the task framing plus the tool list.
pub fn system_prompt(workspace: &str, tools: &[Value]) -> String {
    let mut s = format!(
        "You are an agent working in a sandbox. Your working directory is {workspace}. \
         Use the tools to complete the task, then call `submit` with your final answer.\n\n## Tools\n"
    );
    for t in tools {
        let f = &t["function"];
        s.push_str(&format!(
            "- {}: {}\n",
            f["name"].as_str().unwrap_or(""),
            f["description"].as_str().unwrap_or("")
        ));
    }
    s
}
