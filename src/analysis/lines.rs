//! JSON Lines read back bounded: a line over the limit is skipped (by its size), never held
//! whole, and a last line without its newline is told apart, since that is what a crash
//! mid-write leaves.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use super::AnalysisError;

/// One line of a file (numbered from 1).
pub enum Line<'a> {
    /// A line's bytes, without `\n`; `last_unterminated` when it ends the file without one.
    Text {
        number: usize,
        bytes: &'a [u8],
        last_unterminated: bool,
    },
    /// A line longer than the limit, skipped.
    Oversized { number: usize, bytes: usize },
}

/// Calls `each` for every non-blank line of `path`; the file must be at most `max_file`
/// bytes. A missing file is `Ok(false)`.
pub fn each_line(
    path: &Path,
    max_file: u64,
    what: &'static str,
    mut each: impl FnMut(Line<'_>),
) -> Result<bool, AnalysisError> {
    let read_err = |source| AnalysisError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(read_err(e)),
    };
    let size = file.metadata().map_err(read_err)?.len();
    if size > max_file {
        return Err(AnalysisError::TooLarge {
            path: path.to_path_buf(),
            what,
            size,
            limit: max_file,
        });
    }
    // Bounded by the size checked, even if the file grows while it is read.
    let mut reader = BufReader::new(file.take(max_file));
    let mut buf = Vec::new();
    let mut number = 0;
    let limit = super::MAX_LINE_BYTES as u64;
    loop {
        buf.clear();
        number += 1;
        let n = (&mut reader)
            .take(limit + 1)
            .read_until(b'\n', &mut buf)
            .map_err(read_err)?;
        if n == 0 {
            return Ok(true);
        }
        let terminated = buf.last() == Some(&b'\n');
        if !terminated && buf.len() as u64 > limit {
            // Over-long: drop the rest of it up to its newline.
            let mut skipped = buf.len();
            loop {
                buf.clear();
                let m = (&mut reader)
                    .take(limit)
                    .read_until(b'\n', &mut buf)
                    .map_err(read_err)?;
                skipped += m;
                if m == 0 || buf.last() == Some(&b'\n') {
                    break;
                }
            }
            each(Line::Oversized {
                number,
                bytes: skipped,
            });
            continue;
        }
        let bytes = if terminated {
            &buf[..buf.len() - 1]
        } else {
            &buf[..]
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        each(Line::Text {
            number,
            bytes,
            last_unterminated: !terminated,
        });
    }
}

/// Reads a whole small JSON file (at most `max` bytes); a missing file is `Ok(None)`.
pub fn read_small(
    path: &Path,
    max: u64,
    what: &'static str,
) -> Result<Option<Vec<u8>>, AnalysisError> {
    let read_err = |source| AnalysisError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let size = file.metadata().map_err(read_err)?.len();
    if size > max {
        return Err(AnalysisError::TooLarge {
            path: path.to_path_buf(),
            what,
            size,
            limit: max,
        });
    }
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes).map_err(read_err)?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[u8]) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.jsonl");
        std::fs::write(&p, text).unwrap();
        let mut out = Vec::new();
        each_line(&p, 1 << 30, "file", |l| {
            out.push(match l {
                Line::Text {
                    number,
                    bytes,
                    last_unterminated,
                } => format!(
                    "{number}:{}{}",
                    String::from_utf8_lossy(bytes),
                    if last_unterminated { "!" } else { "" }
                ),
                Line::Oversized { number, bytes } => format!("{number}:<{bytes}>"),
            })
        })
        .unwrap();
        out
    }

    #[test]
    fn blank_lines_are_skipped_and_a_torn_end_is_marked() {
        assert_eq!(lines(b"a\n\n b\nc"), ["1:a", "3: b", "4:c!"]);
        assert_eq!(lines(b"a\n"), ["1:a"]);
    }

    #[test]
    fn an_oversized_line_is_skipped_by_size() {
        let mut text = vec![b'x'; super::super::MAX_LINE_BYTES + 10];
        text.extend_from_slice(b"\nok\n");
        assert_eq!(
            lines(&text),
            [
                format!("1:<{}>", super::super::MAX_LINE_BYTES + 11),
                "2:ok".into()
            ]
        );
    }

    #[test]
    fn a_file_over_its_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.jsonl");
        std::fs::write(&p, b"0123456789").unwrap();
        let err = each_line(&p, 5, "results file", |_| {}).unwrap_err();
        assert!(
            matches!(err, AnalysisError::TooLarge { size: 10, .. }),
            "{err}"
        );
        assert!(!each_line(&dir.path().join("none"), 5, "f", |_| {}).unwrap());
    }
}
