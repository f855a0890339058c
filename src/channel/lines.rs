//! Line splitting for frame streams: partial lines are reassembled, and a line over the
//! bound is skipped (reported by its size) instead of buffered.

/// Splits a byte stream into lines, bounded by a maximum line length.
#[derive(Default)]
pub(crate) struct LineBuffer {
    pending: Vec<u8>,
    /// Bytes of an over-long line skipped so far; the rest of it is dropped up to `\n`.
    skipping: Option<usize>,
}

pub(crate) enum Piece<'a> {
    Line(&'a [u8]),
    Oversized(usize),
}

impl LineBuffer {
    /// Feeds a chunk, calling `sink` for every complete line (without `\n`).
    pub(crate) fn feed(&mut self, mut chunk: &[u8], max: usize, mut sink: impl FnMut(Piece<'_>)) {
        while !chunk.is_empty() {
            let nl = memchr::memchr(b'\n', chunk);
            let (part, rest, complete) = match nl {
                Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                None => (chunk, &chunk[..0], false),
            };
            chunk = rest;
            if let Some(skipped) = self.skipping.as_mut() {
                *skipped += part.len();
                if complete {
                    let n = *skipped;
                    self.skipping = None;
                    sink(Piece::Oversized(n));
                }
                continue;
            }
            if self.pending.len() + part.len() > max {
                self.skipping = Some(self.pending.len() + part.len());
                self.pending = Vec::new();
                if complete {
                    let n = self.skipping.take().unwrap_or(0);
                    sink(Piece::Oversized(n));
                }
                continue;
            }
            if complete {
                if self.pending.is_empty() {
                    sink(Piece::Line(part));
                } else {
                    self.pending.extend_from_slice(part);
                    let line = std::mem::take(&mut self.pending);
                    sink(Piece::Line(&line));
                }
            } else {
                self.pending.extend_from_slice(part);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(chunks: &[&[u8]], max: usize) -> Vec<String> {
        let mut buf = LineBuffer::default();
        let mut out = Vec::new();
        for c in chunks {
            buf.feed(c, max, |p| {
                out.push(match p {
                    Piece::Line(l) => String::from_utf8_lossy(l).into_owned(),
                    Piece::Oversized(n) => format!("<{n}>"),
                })
            });
        }
        out
    }

    #[test]
    fn reassembles_partial_lines_and_splits_joined_ones() {
        assert_eq!(
            lines(&[b"ab", b"c\nde", b"f\ng\n"], 100),
            vec!["abc", "def", "g"]
        );
    }

    #[test]
    fn oversized_lines_are_dropped_not_buffered() {
        let out = lines(&[b"0123", b"456789", b"xx\nok\n"], 5);
        assert_eq!(out, vec!["<12>", "ok"]);
        let out = lines(&[b"0123456789\nok\n"], 5);
        assert_eq!(out, vec!["<10>", "ok"]);
    }
}
