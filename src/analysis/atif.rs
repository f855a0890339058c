//! Trajectories in ATIF, the Agent Trajectory Interchange Format (Harbor's RFC 0001,
//! `ATIF-v1.8`), made from transcripts: the instruction as a `user` step, each model answer
//! as an `agent` step with its tool calls and token metrics, each tool result as an
//! observation tied to its call's id, notes and failed model calls as `system` steps, and the
//! task's verdict in the root `extra`. Every step's `extra.attempt` keeps a retried task's
//! attempts apart.
//!
//! Tool requests carry no call id on the wire: a request is tied to the first call of the
//! latest model answer with its name not yet taken; one that matches none (a harness that
//! calls tools on its own) gets a call of its own, marked `synthesized`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::lines::{each_line, Line};
use super::load::Record;
use super::merge::Run;
use super::{AnalysisError, Note, MAX_TRANSCRIPT_BYTES};
use crate::eval::schedule::FIRST_ATTEMPT;

pub const SCHEMA_VERSION: &str = "ATIF-v1.8";

#[derive(Debug, Serialize)]
pub struct Trajectory {
    pub schema_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub trajectory_id: String,
    pub agent: Agent,
    pub steps: Vec<Step>,
    pub final_metrics: FinalMetrics,
    pub extra: Map<String, Value>,
}

#[derive(Debug, Serialize)]
pub struct Agent {
    pub name: &'static str,
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_definitions: Option<Vec<Value>>,
    pub extra: Map<String, Value>,
}

#[derive(Debug, Serialize)]
pub struct Step {
    pub step_id: usize,
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observation: Option<Observation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm_call_count: Option<u32>,
    pub extra: Map<String, Value>,
}

#[derive(Debug, Serialize)]
pub struct ToolCall {
    pub tool_call_id: String,
    pub function_name: String,
    pub arguments: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<Map<String, Value>>,
}

#[derive(Debug, Default, Serialize)]
pub struct Observation {
    pub results: Vec<ObservationResult>,
}

#[derive(Debug, Serialize)]
pub struct ObservationResult {
    pub source_call_id: String,
    pub content: String,
    pub extra: Map<String, Value>,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Metrics {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct FinalMetrics {
    pub total_prompt_tokens: u64,
    pub total_completion_tokens: u64,
    pub total_cached_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_cost_usd: Option<f64>,
    pub total_steps: usize,
}

/// Builds trajectories from transcript lines as they come.
struct Builder {
    attempt: u64,
    steps: Vec<Step>,
    session_id: Option<String>,
    tools: Option<Vec<Value>>,
    harness: Option<String>,
    /// The latest agent step, and which of its calls a tool request has taken.
    last_agent: Option<usize>,
    taken: BTreeSet<String>,
    /// Tool requests awaiting their response: req_id -> (step, call id).
    waiting: BTreeMap<(u64, u64), (usize, String)>,
    ends: Vec<Value>,
    unreadable: usize,
}

fn extra(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

impl Builder {
    fn new() -> Builder {
        Builder {
            attempt: 1,
            steps: Vec::new(),
            session_id: None,
            tools: None,
            harness: None,
            last_agent: None,
            taken: BTreeSet::new(),
            waiting: BTreeMap::new(),
            ends: Vec::new(),
            unreadable: 0,
        }
    }

    fn system(&mut self, message: String, t: &Value) {
        self.plain("system", message, t);
    }

    /// A step that only says something: a system message or the user's instruction.
    fn plain(&mut self, source: &'static str, message: String, t: &Value) {
        self.steps.push(Step {
            step_id: 0,
            source,
            model_name: None,
            message,
            reasoning_content: None,
            tool_calls: None,
            observation: None,
            metrics: None,
            llm_call_count: None,
            extra: extra(&[("attempt", json!(self.attempt)), ("t", t.clone())]),
        });
    }

    fn line(&mut self, line: &Value) {
        let t = line.get("t").cloned().unwrap_or(Value::Null);
        if line["from"] == "note" {
            let message = line["message"].as_str().unwrap_or("").to_string();
            if let Some(n) = message
                .strip_prefix("attempt ")
                .and_then(|rest| rest.parse::<u64>().ok())
            {
                self.attempt = n;
                self.last_agent = None;
            }
            self.system(message, &t);
            return;
        }
        let Some(frame) = line.get("frame").and_then(Value::as_object) else {
            self.unreadable += 1;
            return;
        };
        match frame.get("type").and_then(Value::as_str).unwrap_or("") {
            "episode_start" => self.episode_start(frame, &t),
            "llm_response" => self.llm_response(frame, &t),
            "tool_request" => self.tool_request(frame),
            "tool_response" => self.tool_response(frame),
            "done" => self.ends.push(json!({
                "attempt": self.attempt,
                "reason": frame.get("reason"),
                "answer": frame.get("answer"),
            })),
            "episode_error" => {
                let note = frame.get("note").and_then(Value::as_str).unwrap_or("");
                self.ends
                    .push(json!({"attempt": self.attempt, "error": note}));
                self.system(format!("episode error: {note}"), &t);
            }
            _ => {}
        }
    }

    fn episode_start(&mut self, f: &Map<String, Value>, t: &Value) {
        let text = |k: &str| f.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        self.session_id.get_or_insert_with(|| text("episode_id"));
        if self.tools.is_none() {
            self.tools = f
                .get("tools")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter(|v| v.is_object()).cloned().collect());
        }
        self.harness.get_or_insert_with(|| text("harness"));
        let system = text("system");
        if !system.is_empty() {
            self.system(system, t);
        }
        self.plain("user", text("instruction"), t);
        self.last_agent = None;
    }

    fn llm_response(&mut self, f: &Map<String, Value>, t: &Value) {
        let Some(completion) = f.get("completion").filter(|c| c.is_object()) else {
            let error = f
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no completion");
            self.system(format!("model call failed: {error}"), t);
            return;
        };
        let message = &completion["choices"][0]["message"];
        let content = match &message["content"] {
            Value::String(s) => s.clone(),
            // Content parts: their text, in order.
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        };
        let reasoning = ["reasoning_content", "reasoning"]
            .iter()
            .find_map(|k| message[*k].as_str().map(str::to_string));
        let step = self.steps.len() + 1;
        let calls: Vec<ToolCall> = message["tool_calls"]
            .as_array()
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(j, c)| tool_call(c, step, j))
            .collect();
        let usage = &completion["usage"];
        let metrics = Metrics {
            prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
            completion_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
            cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        };
        self.steps.push(Step {
            step_id: 0,
            source: "agent",
            model_name: completion["model"].as_str().map(str::to_string),
            message: content,
            reasoning_content: reasoning,
            tool_calls: (!calls.is_empty()).then_some(calls),
            observation: None,
            metrics: Some(metrics),
            llm_call_count: Some(1),
            extra: extra(&[
                ("attempt", json!(self.attempt)),
                ("t", t.clone()),
                (
                    "finish_reason",
                    completion["choices"][0]["finish_reason"].clone(),
                ),
            ]),
        });
        self.last_agent = Some(self.steps.len() - 1);
        self.taken.clear();
    }

    fn tool_request(&mut self, f: &Map<String, Value>) {
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let req = f.get("req_id").and_then(Value::as_u64).unwrap_or(0);
        let arguments = f
            .get("arguments")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let step = match self.last_agent {
            Some(s) => s,
            None => {
                // Tool calls no model answer asked for: a step of deterministic dispatch.
                self.steps.push(Step {
                    step_id: 0,
                    source: "agent",
                    model_name: None,
                    message: String::new(),
                    reasoning_content: None,
                    tool_calls: None,
                    observation: None,
                    metrics: None,
                    llm_call_count: Some(0),
                    extra: extra(&[("attempt", json!(self.attempt))]),
                });
                self.taken.clear();
                self.last_agent = Some(self.steps.len() - 1);
                self.steps.len() - 1
            }
        };
        let calls = self.steps[step].tool_calls.get_or_insert_with(Vec::new);
        let found = calls
            .iter()
            .find(|c| c.function_name == name && !self.taken.contains(&c.tool_call_id))
            .map(|c| c.tool_call_id.clone());
        let id = found.unwrap_or_else(|| {
            let id = format!("req-{}-{req}", self.attempt);
            calls.push(ToolCall {
                tool_call_id: id.clone(),
                function_name: name,
                arguments,
                extra: Some(extra(&[("synthesized", json!(true))])),
            });
            id
        });
        self.taken.insert(id.clone());
        self.waiting.insert((self.attempt, req), (step, id));
    }

    fn tool_response(&mut self, f: &Map<String, Value>) {
        let req = f.get("req_id").and_then(Value::as_u64).unwrap_or(0);
        let Some((step, id)) = self.waiting.remove(&(self.attempt, req)) else {
            return;
        };
        let content = match f.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let is_error = f.get("is_error").cloned().unwrap_or(Value::Bool(false));
        self.steps[step]
            .observation
            .get_or_insert_with(Observation::default)
            .results
            .push(ObservationResult {
                source_call_id: id,
                content,
                extra: extra(&[("is_error", is_error)]),
            });
    }
}

/// A model answer's tool call; arguments that are no JSON object are kept as text in
/// `extra.raw_arguments` (the trajectory's `arguments` must be an object).
fn tool_call(c: &Value, step: usize, j: usize) -> ToolCall {
    let id = c["id"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map_or_else(|| format!("call-{step}-{j}"), str::to_string);
    let raw = &c["function"]["arguments"];
    let parsed = match raw {
        Value::String(s) => serde_json::from_str::<Value>(s).ok(),
        other => Some(other.clone()),
    };
    let (arguments, extra_raw) = match parsed {
        Some(Value::Object(m)) => (m, None),
        _ => (Map::new(), Some(extra(&[("raw_arguments", raw.clone())]))),
    };
    ToolCall {
        tool_call_id: id,
        function_name: c["function"]["name"].as_str().unwrap_or("").to_string(),
        arguments,
        extra: extra_raw,
    }
}

/// The trajectory of one transcript; `record` is the task's result, when it has one.
pub fn trajectory(
    id: &str,
    transcript: &Path,
    record: Option<&Record>,
) -> Result<Trajectory, AnalysisError> {
    let mut b = Builder::new();
    each_line(
        transcript,
        MAX_TRANSCRIPT_BYTES,
        "transcript",
        |line| match line {
            Line::Text { bytes, .. } => match serde_json::from_slice::<Value>(bytes) {
                Ok(v) => b.line(&v),
                Err(_) => b.unreadable += 1,
            },
            Line::Oversized { .. } => b.unreadable += 1,
        },
    )?;
    for (n, step) in b.steps.iter_mut().enumerate() {
        step.step_id = n + 1;
    }
    let sum = |f: fn(&Metrics) -> u64| -> u64 {
        b.steps
            .iter()
            .filter_map(|s| s.metrics.as_ref())
            .map(f)
            .sum()
    };
    let final_metrics = FinalMetrics {
        total_prompt_tokens: sum(|m| m.prompt_tokens),
        total_completion_tokens: sum(|m| m.completion_tokens),
        total_cached_tokens: sum(|m| m.cached_tokens.unwrap_or(0)),
        total_cost_usd: record.and_then(|r| r.cost.as_ref()).map(|c| c.usd),
        total_steps: b.steps.len(),
    };
    let provenance = record.and_then(|r| r.provenance.clone());
    let verdict = record.map(|r| {
        json!({
            "status": r.status,
            "stop_reason": r.stop_reason,
            "answer": r.answer,
            "verify": r.verify,
            "attempts": r.attempts,
            "error": r.error,
            "tokens": r.tokens,
        })
    });
    let text = |field: &str| {
        provenance
            .as_ref()
            .and_then(|p| p.get(field))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(Trajectory {
        schema_version: SCHEMA_VERSION,
        session_id: b.session_id.clone(),
        trajectory_id: id.to_string(),
        agent: Agent {
            name: "wmo-e2b",
            version: text("wmo_e2b").unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string()),
            model_name: text("model"),
            tool_definitions: b.tools.take(),
            extra: extra(&[
                (
                    "harness",
                    json!(b.harness.take().or_else(|| text("harness"))),
                ),
                ("provenance", provenance.clone().unwrap_or(Value::Null)),
            ]),
        },
        final_metrics,
        extra: extra(&[
            ("task_id", json!(id)),
            ("verdict", verdict.unwrap_or(Value::Null)),
            ("episode_ends", Value::Array(std::mem::take(&mut b.ends))),
            ("unreadable_lines", json!(b.unreadable)),
        ]),
        steps: b.steps,
    })
}

/// An id that names a file in `OUTDIR` and nothing else.
fn safe_name(id: &str) -> bool {
    !id.is_empty()
        && id != "."
        && id != ".."
        && id.len() <= 200
        && !id.chars().any(|c| c.is_control() || c == '/' || c == '\\')
}

/// Writes `OUTDIR/<id>.json` for every task with a transcript (results without one, and
/// transcripts that make no step, are noted); returns how many were written.
pub fn write_all(run: &Run, out: &Path, notes: &mut Vec<Note>) -> Result<usize, AnalysisError> {
    std::fs::create_dir_all(out).map_err(|source| AnalysisError::Write {
        path: out.to_path_buf(),
        source,
    })?;
    let mut todo: Vec<(String, u32, PathBuf, Option<&Record>)> = Vec::new();
    let mut ids: BTreeSet<&str> = BTreeSet::new();
    for (r, &s) in run.records.iter().zip(&run.shard_of) {
        if r.attempt == FIRST_ATTEMPT {
            ids.insert(&r.id);
        }
        if let Some(p) = run.shards[s].transcript(&r.id, r.attempt) {
            todo.push((r.id.clone(), r.attempt, p.clone(), Some(r)));
        }
    }
    for shard in &run.shards {
        for (id, p) in &shard.transcripts {
            if ids.insert(id) {
                todo.push((id.clone(), FIRST_ATTEMPT, p.clone(), None));
            }
        }
    }
    let mut written = 0;
    for (id, attempt, transcript, record) in todo {
        if !safe_name(&id) {
            notes.push(Note::NoTrajectory {
                id,
                why: "the id cannot name a file".into(),
            });
            continue;
        }
        let t = match trajectory(&id, &transcript, record) {
            Ok(t) => t,
            Err(e) => {
                notes.push(Note::NoTrajectory {
                    id,
                    why: crate::errors::error_chain(&e),
                });
                continue;
            }
        };
        if t.steps.is_empty() {
            notes.push(Note::NoTrajectory {
                id,
                why: "its transcript holds no step".into(),
            });
            continue;
        }
        // Later attempts' beside the first's, as their transcripts are.
        let dir = if attempt == FIRST_ATTEMPT {
            out.to_path_buf()
        } else {
            out.join(format!("attempt-{attempt}"))
        };
        let path = dir.join(format!("{id}.json"));
        let write_err = |source| AnalysisError::Write {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(write_err)?;
        let file = std::fs::File::create(&path).map_err(write_err)?;
        let mut w = BufWriter::new(file);
        serde_json::to_writer(&mut w, &t)
            .map_err(std::io::Error::from)
            .and_then(|()| w.write_all(b"\n"))
            .and_then(|()| w.flush())
            .map_err(write_err)?;
        written += 1;
    }
    Ok(written)
}
