//! The transcript of an episode: every frame in both directions, one JSON object per line,
//! bounded: a harness that logs without end cannot fill the host's disk.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{Observer, Peer};
use crate::channel::Frame;

/// Bytes a transcript may hold (for one task's handling, all its attempts), not counting the
/// final note that says what was cut.
pub const MAX_TRANSCRIPT_BYTES: u64 = 16 << 20;
/// The last part of [`MAX_TRANSCRIPT_BYTES`], kept from `log` frames (the usual flood) so
/// that the frames which end an episode still fit once the logs have spent the rest.
const ENDING_RESERVE: u64 = 1 << 20;

/// Writes frames as `{"t": seconds, "from": "host"|"runner"|"note", "frame": {...}}` lines.
/// A transcript that cannot be written must not fail the episode: the first write error is
/// kept and reported by [`Transcript::finish`]. Lines past [`MAX_TRANSCRIPT_BYTES`] are
/// dropped and counted; `finish` ends the file with a note saying how many.
pub struct Transcript {
    out: Option<BufWriter<File>>,
    start: Instant,
    error: Option<std::io::Error>,
    limit: u64,
    written: u64,
    dropped_lines: u64,
    dropped_bytes: u64,
}

impl Transcript {
    /// Appends to `path` (a retried task keeps every attempt, separated by `attempt` notes).
    pub fn append(path: &Path) -> std::io::Result<Transcript> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let mut t = Transcript::disabled();
        t.out = Some(BufWriter::with_capacity(64 * 1024, file));
        Ok(t)
    }

    /// A transcript that records nothing.
    pub fn disabled() -> Transcript {
        Transcript {
            out: None,
            start: Instant::now(),
            error: None,
            limit: MAX_TRANSCRIPT_BYTES,
            written: 0,
            dropped_lines: 0,
            dropped_bytes: 0,
        }
    }

    /// The same, bounded at `limit` bytes instead of [`MAX_TRANSCRIPT_BYTES`].
    pub fn with_limit(mut self, limit: u64) -> Transcript {
        self.limit = limit;
        self
    }

    /// Whether a line of `len` bytes fits, counting it as written or as dropped. A `log`
    /// line may not use the ending reserve.
    fn admit(&mut self, len: usize, is_log: bool) -> bool {
        let len = len as u64;
        let room = if is_log {
            self.limit
                .saturating_sub(ENDING_RESERVE.min(self.limit / 2))
        } else {
            self.limit
        };
        if self.written + len <= room {
            self.written += len;
            true
        } else {
            self.dropped_lines += 1;
            self.dropped_bytes += len;
            false
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
        let is_log = frame.get("type").and_then(Value::as_str) == Some("log");
        self.write(&Line { t, from, frame }, is_log);
    }

    /// Records a runner's frame from its own JSON text: nothing is parsed or encoded again.
    pub fn record_json(&mut self, from: &str, frame_json: &[u8], is_log: bool) {
        if self.out.is_none() {
            return;
        }
        let head = json!({"t": self.elapsed(), "from": from}).to_string();
        // The line written below: head less its `}`, `,"frame":`, the frame, `}\n`.
        let len = head.len() - 1 + b",\"frame\":".len() + frame_json.len() + 2;
        if !self.admit(len, is_log) {
            return;
        }
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
        self.write(
            &json!({"t": self.elapsed(), "from": "note", "message": message}),
            false,
        );
    }

    fn elapsed(&self) -> f64 {
        (self.start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
    }

    fn write(&mut self, line: &impl Serialize, is_log: bool) {
        if self.out.is_none() {
            return;
        }
        // Encoded first: whether it fits depends on its length.
        let mut bytes = match serde_json::to_vec(line) {
            Ok(b) => b,
            Err(e) => {
                self.error.get_or_insert(e.into());
                self.out = None;
                return;
            }
        };
        bytes.push(b'\n');
        if self.admit(bytes.len(), is_log) {
            self.write_raw(&bytes);
        }
    }

    fn write_raw(&mut self, bytes: &[u8]) {
        let Some(out) = self.out.as_mut() else { return };
        if let Err(e) = out.write_all(bytes) {
            self.error.get_or_insert(e);
            self.out = None;
        }
    }

    /// Flushes to disk, after a last note saying what the bound cut, if anything; the first
    /// error seen, if any.
    pub fn finish(&mut self) -> std::io::Result<()> {
        if self.dropped_lines > 0 {
            let message = format!(
                "transcript cut at its {}-byte bound: {} line(s), {} byte(s) dropped",
                self.limit, self.dropped_lines, self.dropped_bytes
            );
            let note = json!({"t": self.elapsed(), "from": "note", "message": message,
                              "dropped_lines": self.dropped_lines,
                              "dropped_bytes": self.dropped_bytes});
            self.dropped_lines = 0;
            let mut bytes = note.to_string().into_bytes();
            bytes.push(b'\n');
            self.write_raw(&bytes);
        }
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
        self.record_json("runner", frame.json(), frame.kind() == "log");
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

    fn runner(frame: Value) -> Frame {
        match frame {
            Value::Object(map) => Frame::from_map(map),
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn a_flood_of_logs_is_cut_at_the_bound_the_ending_kept_and_the_cut_noted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let limit = 64 * 1024;
        let mut t = Transcript::append(&path).unwrap().with_limit(limit);
        let log = runner(json!({"type": "log", "message": "x".repeat(1000)}));
        for _ in 0..1000 {
            t.runner_frame(&log);
        }
        // Larger than a log line: only the reserve has room for it.
        let answer = "a".repeat(4000);
        t.runner_frame(&runner(json!({"type": "done", "answer": answer})));
        t.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let (note, kept) = lines.split_last().unwrap();
        let kept_bytes: usize = text.lines().take(kept.len()).map(|l| l.len() + 1).sum();
        assert!(kept_bytes as u64 <= limit, "{kept_bytes} bytes kept");
        assert!(
            kept_bytes as u64 > limit / 4,
            "the bound is used, not wasted"
        );
        // The ending reserve keeps the frame that ends the episode.
        assert_eq!(kept.last().unwrap()["frame"]["type"], "done");
        let logs = kept.iter().filter(|l| l["frame"]["type"] == "log").count() as u64;
        assert_eq!(note["from"], "note");
        assert_eq!(note["dropped_lines"], 1000 - logs, "{note}");
        assert!(note["dropped_bytes"].as_u64().unwrap() > 900 * (1000 - logs));
        assert!(note["message"].as_str().unwrap().contains("cut"), "{note}");
    }

    #[test]
    fn a_transcript_within_its_bound_has_no_cut_note() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let mut t = Transcript::append(&path).unwrap();
        t.runner_frame(&runner(json!({"type": "log", "message": "hi"})));
        t.note("end");
        t.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(!text.contains("dropped"), "{text}");
    }
}
