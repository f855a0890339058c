//! A project turn's environment: the agent's tools, answered on the host through the project
//! (so every write is mirrored, and only inside the turn's write grant).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Map, Value};

use super::{Project, ProjectError};
use crate::cancel::CancelToken;
use crate::environment::{EnvError, Environment, ToolOutput};
use crate::errors::error_chain;
use crate::sandbox::{Captured, ErrorClass};
use crate::sync::lock;

pub struct ProjectEnvironment<'a> {
    project: Mutex<&'a mut Project>,
    /// Exact project paths the agent may write; `None` allows every path.
    writable: Option<BTreeSet<String>>,
    allow_bash: bool,
    bash_timeout: Duration,
}

impl<'a> ProjectEnvironment<'a> {
    pub fn new(
        project: &'a mut Project,
        writable: Option<BTreeSet<String>>,
        allow_bash: bool,
        bash_timeout: Duration,
    ) -> Self {
        ProjectEnvironment {
            project: Mutex::new(project),
            writable,
            allow_bash,
            bash_timeout,
        }
    }

    /// Answers one tool call. Agent mistakes are tool errors; a broken sandbox is an `Err`.
    fn answer(&self, name: &str, args: &Map<String, Value>) -> Result<ToolOutput, ProjectError> {
        let arg = |k: &str| args.get(k).and_then(Value::as_str);
        let mut project = lock(&self.project);
        match name {
            "read_file" => {
                let Some(path) = arg("path") else {
                    return Ok(ToolOutput::error("missing argument `path`"));
                };
                let rel = match agent_path(&project.workspace(), path) {
                    Ok(r) => r,
                    Err(msg) => return Ok(ToolOutput::error(msg)),
                };
                project.get(&rel).map(|bytes| {
                    let mut c = Captured::default();
                    c.push(&bytes, crate::environment::sandbox::MAX_TOOL_OUTPUT);
                    ToolOutput::ok(c.to_text())
                })
            }
            "write_file" => {
                let (Some(path), Some(content)) = (arg("path"), arg("content")) else {
                    return Ok(ToolOutput::error("write_file needs `path` and `content`"));
                };
                let rel = match agent_path(&project.workspace(), path) {
                    Ok(r) => r,
                    Err(msg) => return Ok(ToolOutput::error(msg)),
                };
                if let Some(grant) = &self.writable {
                    if !grant.contains(&rel) {
                        return Ok(ToolOutput::error(format!(
                            "path is not writable in this project turn: {rel:?}"
                        )));
                    }
                }
                project
                    .put(&rel, content.as_bytes())
                    .map(|rel| ToolOutput::ok(format!("wrote {} bytes to {rel}", content.len())))
            }
            "bash" if self.allow_bash => {
                let Some(cmd) = arg("command") else {
                    return Ok(ToolOutput::error("missing argument `command`"));
                };
                project.exec(cmd, self.bash_timeout).map(|o| {
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
                })
            }
            other => Ok(ToolOutput::error(format!("tool '{other}' not available"))),
        }
    }
}

impl Environment for ProjectEnvironment<'_> {
    fn execute(
        &self,
        name: &str,
        args: &Map<String, Value>,
        _cancel: &CancelToken,
    ) -> Result<ToolOutput, EnvError> {
        match self.answer(name, args) {
            Ok(out) => Ok(out),
            Err(ProjectError::Sandbox { source, .. })
                if source.class() != ErrorClass::BadRequest =>
            {
                Err(EnvError::Sandbox {
                    tool: name.to_string(),
                    source,
                })
            }
            Err(e) => Ok(ToolOutput::error(format!(
                "{name} failed: {}",
                error_chain(&e)
            ))),
        }
    }
}

/// An agent's path: relative to the workspace, or absolute inside it.
fn agent_path(workspace: &str, path: &str) -> Result<String, String> {
    let rel = match path.strip_prefix(workspace) {
        Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
        Some("") => "",
        _ if path.starts_with('/') => {
            return Err(format!("path escapes the project workspace: {path:?}"))
        }
        _ => path,
    };
    super::project_path(rel).map_err(|e| e.to_string())
}
