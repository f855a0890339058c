//! The transcript of an episode: every frame in both directions, one JSON object per line.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use serde_json::{json, Map, Value};

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
        self.write(&json!({"t": self.elapsed(), "from": from, "frame": frame}));
    }

    pub fn note(&mut self, message: &str) {
        self.write(&json!({"t": self.elapsed(), "from": "note", "message": message}));
    }

    fn elapsed(&self) -> f64 {
        (self.start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
    }

    fn write(&mut self, line: &Value) {
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

impl Drop for Transcript {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
