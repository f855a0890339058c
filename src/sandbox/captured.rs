//! Output captured with a bound: a head and a tail kept, the middle counted.

/// A stream captured with a bound: the first and last `max/2` bytes, and how much was dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    pub head: Vec<u8>,
    pub tail: Vec<u8>,
    pub dropped: u64,
}

impl Captured {
    /// Keeps at most `max` bytes of everything pushed through it.
    pub fn push(&mut self, data: &[u8], max: usize) {
        let half = max / 2;
        let mut data = data;
        if self.head.len() < half {
            let take = (half - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        if data.is_empty() {
            return;
        }
        self.tail.extend_from_slice(data);
        let keep = max - half;
        if self.tail.len() > keep {
            let excess = self.tail.len() - keep;
            self.tail.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    /// The captured text with a marker where bytes were dropped.
    pub fn to_text(&self) -> String {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if self.dropped > 0 {
            out.push_str(&format!("\n... [{} bytes truncated] ...\n", self.dropped));
        }
        out.push_str(&String::from_utf8_lossy(&self.tail));
        out
    }

    /// Several captured streams as one, in order, bounded by `max` as head + tail. Its
    /// one note counts every byte left out, by the parts' own bounds and by this one (a note
    /// per part, pushed through the bound, could itself be cut and then undercount).
    pub fn merged(parts: &[&Captured], max: usize) -> Captured {
        let mut out = Captured::default();
        for part in parts {
            out.push(&part.head, max);
            out.dropped += part.dropped;
            out.push(&part.tail, max);
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.tail.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_keeps_head_and_tail() {
        let mut c = Captured::default();
        c.push(b"0123456789", 6);
        c.push(b"abcdef", 6);
        assert_eq!(c.head, b"012");
        assert_eq!(c.tail, b"def");
        assert_eq!(c.dropped, 10);
        assert!(c.to_text().contains("[10 bytes truncated]"));
    }

    #[test]
    fn captured_small_output_is_whole() {
        let mut c = Captured::default();
        c.push(b"hi\n", 100);
        assert_eq!(c.to_text(), "hi\n");
    }

    #[test]
    fn a_merge_counts_every_byte_left_out() {
        let bound = 32 << 10;
        let (mut out, mut err) = (Captured::default(), Captured::default());
        let big = vec![b'x'; 600_000];
        out.push(&big, bound);
        err.push(b"an error\n", bound);
        let merged = Captured::merged(&[&out, &err], bound);
        let kept = merged.head.len() + merged.tail.len();
        assert_eq!(kept, bound);
        assert_eq!(merged.dropped as usize, 600_000 + 9 - bound);
        let note = format!("[{} bytes truncated]", 600_000 + 9 - bound);
        assert!(merged.to_text().contains(&note));
        assert!(merged.to_text().ends_with("an error\n"));
    }
}
