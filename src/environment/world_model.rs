//! The `world-model` environment: a model simulates what each tool call would return.
//!
//! No sandbox command runs for a tool call. The simulator sees the task (instruction and
//! files), the tool and its arguments, and every earlier observation of the episode, so its
//! answers can stay consistent with each other.

use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

use super::{EnvError, Environment, ToolOutput};
use crate::cancel::CancelToken;
use crate::provider::{ModelCall, Provider};
use crate::sync::lock;
use crate::task::Task;

/// Characters of earlier observations the simulator is shown, newest kept.
const MAX_HISTORY_CHARS: usize = 64 * 1024;

const SYSTEM: &str = "You simulate the environment an AI agent acts in. For each tool call, \
reply with exactly the output that tool would produce in this environment, and nothing else: \
no commentary, no code fences. Stay consistent with the task's files and with every earlier \
observation. bash returns what the command prints (and `[exit N]` on a non-zero exit); \
read_file returns the file's content; write_file returns `wrote N bytes to PATH`.";

pub struct WorldModelEnvironment {
    provider: Arc<dyn Provider>,
    /// The task the agent was given; a scripted world model replays its `world_script`.
    task: Task,
    history: Mutex<Vec<(String, String)>>,
}

impl WorldModelEnvironment {
    pub fn new(provider: Arc<dyn Provider>, task: &Task) -> Self {
        WorldModelEnvironment {
            provider,
            task: task.clone(),
            history: Mutex::new(Vec::new()),
        }
    }

    fn prompt(&self, name: &str, args: &Map<String, Value>) -> Value {
        let history = lock(&self.history);
        let mut earlier = String::new();
        for (call, observation) in history.iter().rev() {
            let entry = format!("### {call}\n{observation}\n\n");
            if earlier.len() + entry.len() > MAX_HISTORY_CHARS {
                break;
            }
            earlier.insert_str(0, &entry);
        }
        let files: String = self
            .task
            .files
            .iter()
            .map(|(p, c)| format!("--- {p}\n{c}\n"))
            .collect();
        let user = format!(
            "## Task given to the agent\n{}\n\n## Files in the workspace at the start\n{}\n\
             ## Earlier tool calls and their observations\n{}\n## The tool call to answer now\n{}",
            self.task.instruction,
            if files.is_empty() {
                "(none)\n".into()
            } else {
                files
            },
            if earlier.is_empty() {
                "(none)\n".into()
            } else {
                earlier
            },
            describe(name, args),
        );
        json!({"messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": user},
        ]})
    }
}

fn describe(name: &str, args: &Map<String, Value>) -> String {
    format!("{name} {}", Value::Object(args.clone()))
}

impl Environment for WorldModelEnvironment {
    fn execute(
        &self,
        name: &str,
        args: &Map<String, Value>,
        cancel: &CancelToken,
    ) -> Result<ToolOutput, EnvError> {
        if cancel.is_cancelled() {
            return Ok(ToolOutput::error("interrupted"));
        }
        let body = self.prompt(name, args);
        let index = lock(&self.history).len();
        let call = ModelCall {
            label: &self.task.id,
            script: self.task.world_script.as_deref(),
            index,
            body: &body,
            cancel,
        };
        let observation = match self.provider.complete(&call) {
            Ok(done) => done.body["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            Err(e) => {
                return Ok(ToolOutput::error(format!(
                    "the world model could not answer: {}",
                    crate::errors::error_chain(&e)
                )))
            }
        };
        lock(&self.history).push((describe(name, args), observation.clone()));
        Ok(ToolOutput::ok(observation))
    }
}
