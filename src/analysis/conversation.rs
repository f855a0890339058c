//! A task's transcript as the HTML report shows it: a conversation (instruction, model turns,
//! tool calls with their arguments and output, notes), each item tagged with its attempt,
//! then the verdict. Built from the task's ATIF trajectory so both views read transcripts
//! the same way; every text is bounded so one noisy tool cannot bloat the page.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use super::atif::{trajectory, Step};
use super::load::Record;
use super::AnalysisError;

/// Most bytes of one tool output, message or argument list kept; the rest is cut with a note.
pub const MAX_TEXT_BYTES: usize = 64 << 10;
/// Most conversation items kept for one task.
pub const MAX_ITEMS: usize = 5_000;

/// `s` cut to `MAX_TEXT_BYTES` on a character boundary, and how many bytes were dropped.
pub fn clip(s: &str) -> (String, usize) {
    if s.len() <= MAX_TEXT_BYTES {
        return (s.to_string(), 0);
    }
    let mut end = MAX_TEXT_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (s[..end].to_string(), s.len() - end)
}

/// A clipped text as `{"text", "cut"}` (`cut` only when bytes were dropped).
fn text(s: &str) -> Value {
    let (kept, cut) = clip(s);
    if cut == 0 {
        json!({ "text": kept })
    } else {
        json!({ "text": kept, "cut": cut })
    }
}

fn attempt(step: &Step) -> u64 {
    step.extra
        .get("attempt")
        .and_then(Value::as_u64)
        .unwrap_or(1)
}

fn item(step: &Step) -> Value {
    let mut v =
        json!({ "attempt": attempt(step), "source": step.source, "message": text(&step.message) });
    if let Some(r) = &step.reasoning_content {
        v["reasoning"] = text(r);
    }
    if let Some(m) = &step.metrics {
        v["tokens"] = json!([m.prompt_tokens, m.completion_tokens]);
    }
    let results: BTreeMap<&str, (&str, bool)> = step
        .observation
        .iter()
        .flat_map(|o| &o.results)
        .map(|r| {
            let err = r.extra.get("is_error").and_then(Value::as_bool) == Some(true);
            (r.source_call_id.as_str(), (r.content.as_str(), err))
        })
        .collect();
    if let Some(calls) = &step.tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let args = serde_json::to_string_pretty(&c.arguments).unwrap_or_default();
                let mut call = json!({ "name": c.function_name, "arguments": text(&args) });
                if let Some((out, err)) = results.get(c.tool_call_id.as_str()) {
                    call["output"] = text(out);
                    call["is_error"] = json!(err);
                }
                call
            })
            .collect();
        v["calls"] = Value::Array(calls);
    }
    v
}

/// The verdict of a task's record: status, stop reason, answer, verify, attempts, error.
pub fn verdict(r: &Record) -> Value {
    json!({
        "status": r.status,
        "stop_reason": r.stop_reason,
        "answer": text(&r.answer),
        "attempts": r.attempts,
        "error": r.error.as_deref().map(text),
        "verify": r.verify.as_ref().map(|v| json!({
            "exit_code": v.exit_code,
            "timed_out": v.timed_out,
            "output_tail": text(&v.output_tail),
        })),
    })
}

/// The conversation of one task: `{"items": [...], "dropped": n, "verdict": ...}`.
pub fn conversation(
    id: &str,
    transcript: &Path,
    record: Option<&Record>,
) -> Result<Value, AnalysisError> {
    let t = trajectory(id, transcript, record)?;
    let items: Vec<Value> = t.steps.iter().take(MAX_ITEMS).map(item).collect();
    Ok(json!({
        "items": items,
        "dropped": t.steps.len().saturating_sub(MAX_ITEMS),
        "verdict": record.map(verdict),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_whole_characters_and_counts_the_rest() {
        let s = "é".repeat(MAX_TEXT_BYTES); // two bytes each
        let (kept, cut) = clip(&s);
        assert_eq!(kept.len(), MAX_TEXT_BYTES);
        assert_eq!(kept.len() + cut, s.len());
        let (odd, cut) = clip(&format!("a{s}"));
        assert_eq!(odd.len(), MAX_TEXT_BYTES - 1);
        assert_eq!(odd.len() + cut, s.len() + 1);
        assert_eq!(clip("short"), ("short".to_string(), 0));
    }
}
