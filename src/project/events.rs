//! A project turn's event log: what happened, for people, one JSON object per line
//! (`{"t", "kind", "payload"}`), told from the frames the broker sees.

use std::collections::HashMap;
use std::io::Write;

use serde_json::{json, Map, Value};

use crate::episode::{Observer, Peer};

pub struct EventLog<'a> {
    out: &'a mut dyn Write,
    /// The tool each open request named, so its result can say which tool answered.
    tools: HashMap<u64, String>,
}

impl<'a> EventLog<'a> {
    pub fn new(out: &'a mut dyn Write) -> Self {
        EventLog {
            out,
            tools: HashMap::new(),
        }
    }

    pub fn log(&mut self, kind: &str, payload: Value) {
        log(self.out, kind, payload);
    }
}

/// One event line. The log is for people; a full disk must not fail the turn.
pub fn log(out: &mut dyn Write, kind: &str, payload: Value) {
    let line = json!({"t": crate::sandbox::ledger::unix_now(), "kind": kind, "payload": payload});
    let _ = writeln!(out, "{line}");
}

impl Observer for EventLog<'_> {
    fn frame(&mut self, from: Peer, frame: &Map<String, Value>) {
        let kind = frame.get("type").and_then(Value::as_str).unwrap_or("");
        let req_id = frame.get("req_id").and_then(Value::as_u64);
        match (from, kind) {
            (Peer::Host, "user_message") => self.log(
                "user_message",
                json!({"msg_id": frame.get("msg_id"), "text": frame.get("text")}),
            ),
            (Peer::Runner, "state") => self.log("state", Value::Object(frame.clone())),
            (Peer::Runner, "episode_error") => {
                let note = frame
                    .get("note")
                    .and_then(Value::as_str)
                    .unwrap_or("runner error");
                self.log("error", json!({"message": note}));
            }
            (Peer::Host, "llm_response") => {
                let text = frame
                    .get("completion")
                    .and_then(|c| c["choices"][0]["message"]["content"].as_str());
                if let Some(text) = text.filter(|t| !t.trim().is_empty()) {
                    self.log("assistant_message", json!({"text": text}));
                }
            }
            (Peer::Runner, "tool_request") => {
                let name = frame.get("name").and_then(Value::as_str).unwrap_or("");
                let args = frame.get("arguments").cloned().unwrap_or(json!({}));
                if name == "submit" {
                    self.log("submit", json!({"answer": args.get("answer")}));
                } else {
                    self.log("tool_call", json!({"name": name, "arguments": args}));
                }
                if let Some(id) = req_id {
                    self.tools.insert(id, name.to_string());
                }
            }
            (Peer::Host, "tool_response") => {
                let name = req_id.and_then(|id| self.tools.remove(&id));
                // `submit`'s acknowledgement is no tool result.
                if name.as_deref().is_some_and(|n| n != "submit") {
                    self.log(
                        "tool_result",
                        json!({"name": name, "content": frame.get("content"),
                               "is_error": frame.get("is_error")}),
                    );
                }
            }
            _ => {}
        }
    }

    fn note(&mut self, message: &str) {
        self.log("error", json!({"message": message}));
    }
}
