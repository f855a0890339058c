//! Text from outside this process (a task, a harness, a model, a sandbox) made safe to show
//! on a terminal: the one escaper every human-readable printer uses.
//!
//! A control character (C0, DEL, C1, ESC among them) could clear the screen, move the
//! cursor over a line already drawn or retitle the window; a bidi override, isolate or mark
//! could make an id read as another. Each one is shown as a visible escape instead (`\x1b`,
//! `\u{202e}`), so what a run printed is what the data said. JSON and HTML output have
//! their own escaping and do not come here.

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` is a Unicode bidi control: the embeddings and overrides (U+202A–U+202E), the
/// isolates (U+2066–U+2069) and the marks (U+200E, U+200F, U+061C).
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}'
    )
}

/// Whether a terminal could act on `c` instead of showing it: a control character (C0,
/// DEL, C1) or a bidi control.
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || is_bidi_control(c)
}

/// `s` for one line of a terminal: every unsafe character, newlines and tabs included, as a
/// visible escape. Borrows when there is nothing to escape (the common case).
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_keeping(s, |_| false)
}

/// `s` as multi-line terminal text: as [`escape`], but newlines and tabs stay (a
/// carriage return does not: it could draw over the line before it).
pub fn escape_lines(s: &str) -> Cow<'_, str> {
    escape_keeping(s, |c| c == '\n' || c == '\t')
}

fn escape_keeping(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| is_unsafe(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !is_unsafe(c) || keep(c) {
            o.push(c);
        } else if (c as u32) < 0x80 {
            let _ = write!(o, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(o, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(o)
}

/// `1 task`, `2 tasks`, `2 sandboxes`: a count with its noun, as a reader says it.
pub fn plural(n: u64, noun: &str) -> String {
    let es = ["s", "x", "ch", "sh"].iter().any(|end| noun.ends_with(end));
    match (n, es) {
        (1, _) => format!("1 {noun}"),
        (_, true) => format!("{n} {noun}es"),
        (_, false) => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_as_said() {
        assert_eq!(plural(1, "task"), "1 task");
        assert_eq!(plural(0, "task"), "0 tasks");
        assert_eq!(plural(2, "sandbox"), "2 sandboxes");
        assert_eq!(plural(1, "sandbox"), "1 sandbox");
    }

    #[test]
    fn controls_and_bidi_become_visible_escapes() {
        let attack = "\x1b[2J\x1b]0;pwned\x07100 tasks: 100 passed\r\u{9b}31m\x7f";
        let shown = escape(attack);
        assert!(!shown.chars().any(is_unsafe), "{shown}");
        assert_eq!(
            shown,
            "\\x1b[2J\\x1b]0;pwned\\x07100 tasks: 100 passed\\x0d\\u{9b}31m\\x7f"
        );
        assert_eq!(
            escape("txt.\u{202e}exe\u{2066}\u{200f}\u{61c}"),
            "txt.\\u{202e}exe\\u{2066}\\u{200f}\\u{61c}"
        );
        assert_eq!(
            escape("a\nb\tc"),
            "a\\x0ab\\x09c",
            "one line stays one line"
        );
        assert_eq!(escape_lines("a\nb\tc\rd\x1b"), "a\nb\tc\\x0dd\\x1b");
    }

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        let s = "task-1 \\x1b café 日本 ✓";
        assert!(matches!(escape(s), Cow::Borrowed(t) if t == s));
    }
}
