//! The harnesses that ask no model: their turns are scripts the host plays through the
//! runner's own loop, exactly as a task's `model_script` is played, so every tool call goes
//! through the same broker, sandbox and transcript an agent's does.

use serde_json::json;

use super::Harness;
use crate::task::{ScriptStep, ScriptedToolCall, Task};

/// What answers the runner's model calls for `task` under `harness`: `Ok(None)` leaves them
/// to the run's provider (and the task's own `model_script`); `Err` says why the task cannot
/// run under it.
pub(super) fn harness_script(
    harness: &Harness,
    task: &Task,
) -> Result<Option<Vec<ScriptStep>>, String> {
    match harness {
        Harness::Nop => Ok(Some(vec![submit("nop")])),
        Harness::Oracle => {
            let Some(solution) = &task.solution else {
                return Err(format!(
                    "--harness oracle: task {:?} has no reference solution (a Harbor solution/ directory, or a `solution` field)",
                    task.id
                ));
            };
            let run = ScriptStep {
                tool_calls: vec![ScriptedToolCall {
                    name: "bash".into(),
                    arguments: json!({ "command": solution.command }),
                }],
                ..ScriptStep::default()
            };
            Ok(Some(vec![run, submit("oracle")]))
        }
        _ => Ok(None),
    }
}

fn submit(answer: &str) -> ScriptStep {
    ScriptStep {
        tool_calls: vec![ScriptedToolCall {
            name: "submit".into(),
            arguments: json!({ "answer": answer }),
        }],
        ..ScriptStep::default()
    }
}
