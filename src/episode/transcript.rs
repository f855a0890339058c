//! The transcript of an episode: every frame in both directions, one JSON object per line.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{Observer, Peer};
use crate::channel::Frame;

/// Writes frames as `{"t": seconds, "from": "host"|"runner"|"note", "frame": {...}}` lines.
/// A transcript that cannot be written must not fail the episode: the first write error is
/// kept and reported by [`Transcript::finish`].
pub struct Transcript {
    out: Option<BufWriter<File>>,
    start: Instant,
    error: Option<std::io::Error>,
}

impl Transcript {
    /// Appends to `path` (a retried task keeps every attempt, separated by `attempt` notes).
    pub fn append(path: &Path) -> std::io::Result<Transcript> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Transcript {
            out: Some(BufWriter::with_capacity(64 * 1024, file)),
            start: Instant::now(),
            error: None,
        })
    }

    /// A transcript that records nothing.
    pub fn disabled() -> Transcript {
        Transcript {
            out: None,
            start: Instant::now(),
            error: None,
        }
    }

    pub fn record(&mut self, from: &str, frame: &Map<String, Value>) {
        #[derive(Serialize)]
        struct Line<'a> {
            t: f64,
            from: &'a str,
            frame: &'a Map<String, Value>,
        }
        let t = self.elapsed();
        self.write(&Line { t, from, frame });
    }

    /// Records a runner's frame from its own JSON text: nothing is parsed or encoded again.
    pub fn record_json(&mut self, from: &str, frame_json: &[u8]) {
        let head = json!({"t": self.elapsed(), "from": from}).to_string();
        let Some(out) = self.out.as_mut() else { return };
        // `{"t":..,"from":..}` opened up to take the frame as its last field.
        let res = out
            .write_all(&head.as_bytes()[..head.len() - 1])
            .and_then(|()| out.write_all(b",\"frame\":"))
            .and_then(|()| out.write_all(frame_json))
            .and_then(|()| out.write_all(b"}\n"));
        if let Err(e) = res {
            self.error.get_or_insert(e);
            self.out = None;
        }
    }

    pub fn note(&mut self, message: &str) {
        self.write(&json!({"t": self.elapsed(), "from": "note", "message": message}));
    }

    fn elapsed(&self) -> f64 {
        (self.start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
    }

    fn write(&mut self, line: &impl Serialize) {
        let Some(out) = self.out.as_mut() else { return };
        let res = serde_json::to_writer(&mut *out, line)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
        if let Err(e) = res {
            self.error.get_or_insert(e);
            self.out = None;
        }
    }

    /// Flushes to disk; the first error seen, if any.
    pub fn finish(&mut self) -> std::io::Result<()> {
        if let Some(out) = self.out.as_mut() {
            if let Err(e) = out.flush() {
                self.error.get_or_insert(e);
            }
        }
        self.out = None;
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Observer for Transcript {
    fn frame(&mut self, from: Peer, frame: &Map<String, Value>) {
        if self.out.is_none() {
            // Nothing is written: the brief below need not be built either.
            return;
        }
        let from = match from {
            Peer::Host => "host",
            Peer::Runner => "runner",
        };
        match frame.get("files").and_then(Value::as_object) {
            // Harness files are the same every episode: the transcript notes their size
            // rather than copying them again (hundreds of KB per episode otherwise).
            Some(files) if !files.is_empty() => {
                let mut brief: Map<String, Value> = frame
                    .iter()
                    .filter(|(k, _)| k.as_str() != "files")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let bytes: usize = files.values().filter_map(Value::as_str).map(str::len).sum();
                brief.insert(
                    "files".into(),
                    json!({"count": files.len(), "bytes": bytes, "paths": files.keys().collect::<Vec<_>>()}),
                );
                self.record(from, &brief);
            }
            _ => self.record(from, frame),
        }
    }

    fn runner_frame(&mut self, frame: &Frame) {
        // Runners send no harness files; the frame goes as it came.
        self.record_json("runner", frame.json());
    }

    fn note(&mut self, message: &str) {
        Transcript::note(self, message);
    }
}

impl Drop for Transcript {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    #[test]
    fn a_runner_frame_is_copied_as_it_came_and_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let mut t = Transcript::append(&path).unwrap();
        let sent = br#"{"type":"tool_request","req_id":3,"name":"bash","arguments":{"command":"ls \"a b\"\n"},"note":"caf\u00e9 \u2028"}"#;
        let line = base64::engine::general_purpose::STANDARD.encode(sent);
        let frame = crate::channel::frame::decode(line.as_bytes()).unwrap();
        t.runner_frame(&frame);
        t.note("after");
        t.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["from"], "runner");
        assert!(lines[0]["t"].is_number());
        let want: Value = serde_json::from_slice(sent).unwrap();
        assert_eq!(lines[0]["frame"], want);
        assert_eq!(lines[1]["message"], "after");
    }
}
