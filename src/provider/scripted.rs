//! The scripted model: answers each call from the task's `model_script`, so episodes can be
//! run end to end (tests, smoke runs, the E2B emulator) without a model API or a key.
//!
//! The answer is a real OpenAI chat-completion object, so the runner cannot tell it apart
//! from a live model and the same code paths are exercised.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::{Completion, ModelCall, Provider, ProviderError, Usage};
use crate::task::ScriptStep;

/// What the scripted model says once its script has run out (or the task has none): plain
/// text with finish reason "stop", which ends a well-behaved agent loop instead of failing it.
pub const EXHAUSTED_CONTENT: &str = "(the scripted model has no more steps)";

/// Stateless: the step to play is `call.index` into the task's script, so one instance serves
/// every worker thread and every retry of an episode replays the same script.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScriptedProvider;

impl ScriptedProvider {
    pub fn new() -> Self {
        Self
    }
}

impl Provider for ScriptedProvider {
    fn complete(&self, call: &ModelCall<'_>) -> Result<Completion, ProviderError> {
        let step = call.script.and_then(|script| script.get(call.index));
        let Some(step) = step else {
            let exhausted = ScriptStep {
                content: Some(EXHAUSTED_CONTENT.to_string()),
                finish_reason: Some("stop".to_string()),
                ..ScriptStep::default()
            };
            return Ok(answer(call, &exhausted));
        };
        if let Some(ms) = step.delay_ms {
            if !call.cancel.sleep(Duration::from_millis(ms)) {
                return Err(ProviderError::Cancelled);
            }
        }
        if let Some(msg) = &step.error {
            return Err(ProviderError::Scripted(msg.clone()));
        }
        Ok(answer(call, step))
    }
}

/// Builds the chat completion for one step, with a deterministic token estimate.
fn answer(call: &ModelCall<'_>, step: &ScriptStep) -> Completion {
    let tool_calls: Vec<Value> = step
        .tool_calls
        .iter()
        .enumerate()
        .map(|(j, tc)| {
            // The OpenAI schema carries arguments as a JSON *string*. A string in the script
            // is passed through untouched so tasks can feed the harness malformed JSON.
            let arguments = match &tc.arguments {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            json!({
                "id": format!("call_{}_{}", call.index, j),
                "type": "function",
                "function": { "name": tc.name, "arguments": arguments },
            })
        })
        .collect();

    let finish_reason = match &step.finish_reason {
        Some(r) => r.clone(),
        None if !tool_calls.is_empty() => "tool_calls".to_string(),
        None => "stop".to_string(),
    };

    let prompt_tokens = estimate_tokens(json_len(call.body));
    let content_bytes = step.content.as_ref().map_or(0, String::len);
    let tool_call_bytes = if tool_calls.is_empty() {
        0
    } else {
        json_len(&tool_calls)
    };
    let completion_tokens = estimate_tokens(content_bytes + tool_call_bytes);

    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert(
        "content".into(),
        step.content.clone().map_or(Value::Null, Value::String),
    );
    // OpenAI omits `tool_calls` when there are none; some harnesses treat `[]` differently
    // from absent, so match the real API.
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(tool_calls));
    }

    // A clock before 1970 is not worth failing a scripted call over.
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());

    let body = json!({
        "id": format!("scripted-{}-{}", call.label, call.index),
        "object": "chat.completion",
        "created": created,
        "model": "scripted",
        "choices": [{
            "index": 0,
            "message": Value::Object(message),
            "finish_reason": finish_reason,
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    });
    Completion {
        body,
        usage: Usage {
            input_tokens: prompt_tokens,
            output_tokens: completion_tokens,
            ..Usage::default()
        },
        retries: 0,
    }
}

/// The length of `value` as JSON text, counted as it is written rather than kept: a request
/// body carries the whole conversation.
fn json_len(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Counting never fails, and serde_json never fails on a Value whose keys are strings.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// About four bytes per token: close enough for budgets and reports, and reproducible.
fn estimate_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// A scripted model whose steps come from one list rather than from each task (for
/// `project run --script`).
#[derive(Debug, Clone)]
pub struct FixedScript(pub Vec<ScriptStep>);

impl Provider for FixedScript {
    fn complete(&self, call: &ModelCall<'_>) -> Result<Completion, ProviderError> {
        ScriptedProvider::new().complete(&ModelCall {
            script: Some(&self.0),
            ..*call
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::CancelToken;
    use crate::task::{ScriptedToolCall, Task};

    fn task(script: Option<Vec<ScriptStep>>) -> Task {
        let mut task = Task::default();
        task.id = "t1".into();
        task.instruction = "do it".into();
        task.model_script = script;
        task.line = 1;
        task
    }

    fn complete(
        task: &Task,
        index: usize,
        cancel: &CancelToken,
    ) -> Result<Completion, ProviderError> {
        let body = json!({"messages": [{"role": "user", "content": "hi"}]});
        ScriptedProvider::new().complete(&ModelCall {
            label: &task.id,
            script: task.model_script.as_deref(),
            index,
            body: &body,
            cancel,
        })
    }

    fn message(c: &Completion) -> &Value {
        &c.body["choices"][0]["message"]
    }

    #[test]
    fn no_script_or_past_the_end_says_so_and_stops() {
        let cancel = CancelToken::new();
        for (t, index) in [
            (task(None), 0),
            (task(Some(vec![ScriptStep::default()])), 1),
        ] {
            let c = complete(&t, index, &cancel).unwrap();
            assert_eq!(message(&c)["content"], EXHAUSTED_CONTENT);
            assert_eq!(c.body["choices"][0]["finish_reason"], "stop");
            assert!(message(&c).get("tool_calls").is_none());
        }
    }

    #[test]
    fn tool_calls_follow_the_openai_schema() {
        let t = task(Some(vec![ScriptStep {
            content: Some("thinking".into()),
            tool_calls: vec![
                ScriptedToolCall {
                    name: "run".into(),
                    arguments: json!({"cmd": "ls"}),
                },
                ScriptedToolCall {
                    name: "broken".into(),
                    arguments: json!("{not json"),
                },
            ],
            ..ScriptStep::default()
        }]));
        let c = complete(&t, 0, &CancelToken::new()).unwrap();
        let b = &c.body;
        assert_eq!(b["id"], "scripted-t1-0");
        assert_eq!(b["object"], "chat.completion");
        assert_eq!(b["model"], "scripted");
        assert!(b["created"].as_u64().unwrap() > 0);
        assert_eq!(b["choices"][0]["finish_reason"], "tool_calls");
        let m = message(&c);
        assert_eq!(m["role"], "assistant");
        assert_eq!(m["content"], "thinking");
        let calls = m["tool_calls"].as_array().unwrap();
        assert_eq!(calls[0]["id"], "call_0_0");
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "run");
        assert_eq!(calls[0]["function"]["arguments"], r#"{"cmd":"ls"}"#);
        assert_eq!(calls[1]["id"], "call_0_1");
        assert_eq!(calls[1]["function"]["arguments"], "{not json");
    }

    #[test]
    fn usage_is_a_deterministic_estimate() {
        let t = task(Some(vec![ScriptStep {
            content: Some("12345".into()),
            ..ScriptStep::default()
        }]));
        let c = complete(&t, 0, &CancelToken::new()).unwrap();
        // The request body serializes to 45 bytes -> 12 tokens; 5 content bytes -> 2 tokens.
        let body = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(body.to_string().len(), 45);
        assert_eq!(
            c.usage,
            Usage {
                input_tokens: 12,
                output_tokens: 2,
                ..Usage::default()
            }
        );
        assert_eq!(c.body["usage"]["prompt_tokens"], 12);
        assert_eq!(c.body["usage"]["completion_tokens"], 2);
        assert_eq!(c.body["usage"]["total_tokens"], 14);
        assert_eq!(message(&c)["content"], "12345");
        assert_eq!(c.body["choices"][0]["finish_reason"], "stop");
        assert_eq!(c.retries, 0);
    }

    #[test]
    fn content_absent_is_null_and_finish_reason_can_be_overridden() {
        let t = task(Some(vec![ScriptStep {
            finish_reason: Some("length".into()),
            ..ScriptStep::default()
        }]));
        let c = complete(&t, 0, &CancelToken::new()).unwrap();
        assert!(message(&c)["content"].is_null());
        assert_eq!(c.body["choices"][0]["finish_reason"], "length");
        assert_eq!(c.usage.output_tokens, 0);
    }

    #[test]
    fn scripted_errors_and_cancelled_delays() {
        let t = task(Some(vec![
            ScriptStep {
                error: Some("boom".into()),
                delay_ms: Some(1),
                ..ScriptStep::default()
            },
            ScriptStep {
                delay_ms: Some(60_000),
                ..ScriptStep::default()
            },
        ]));
        let cancel = CancelToken::new();
        match complete(&t, 0, &cancel) {
            Err(ProviderError::Scripted(m)) => assert_eq!(m, "boom"),
            other => panic!("expected a scripted error, got {other:?}"),
        }
        cancel.cancel();
        assert!(matches!(
            complete(&t, 1, &cancel),
            Err(ProviderError::Cancelled)
        ));
    }
}
