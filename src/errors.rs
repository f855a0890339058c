//! How an error is told: one line, its causes after it.

/// Bytes of an error line at most, so one bad peer cannot flood a frame or a record.
const MAX_CHARS: usize = 500;

/// An error and its causes on one line (`error: cause: cause`), whitespace collapsed and
/// capped.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        cur = s.source();
    }
    let collapsed: String = msg.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() > MAX_CHARS {
        let cut: String = collapsed.chars().take(MAX_CHARS).collect();
        format!("{cut}... (truncated)")
    } else {
        collapsed
    }
}

/// What a panic said: its message when it was given one (a `&str` or a `String`, as
/// `panic!` makes), else a placeholder.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(a panic without a message)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer\n  failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_follow_on_one_line_and_long_ones_are_cut() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&e), "outer failed: inner");
        let long = Outer(std::io::Error::other("x".repeat(2000)));
        let text = error_chain(&long);
        assert!(text.ends_with("... (truncated)"));
        assert_eq!(text.chars().count(), MAX_CHARS + "... (truncated)".len());
    }
}
