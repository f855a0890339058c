//! Escaping for the HTML report: run data as HTML text or attribute values, and JSON inside a
//! `<script>` element, so nothing a run wrote can close an element or open one.

/// `s` as HTML text or a quoted attribute value.
pub fn html(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// JSON text made safe inside `<script type="application/json">`: `<`, `>` and `&` (which
/// JSON has only inside strings) become `\u` escapes, so `</script>` and `<!--` cannot
/// appear; U+2028 and U+2029 too, which older JavaScript reads as line ends.
pub fn script_json(json: &str) -> String {
    let mut o = String::with_capacity(json.len() + json.len() / 16);
    for c in json.chars() {
        match c {
            '<' => o.push_str("\\u003c"),
            '>' => o.push_str("\\u003e"),
            '&' => o.push_str("\\u0026"),
            '\u{2028}' => o.push_str("\\u2028"),
            '\u{2029}' => o.push_str("\\u2029"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_cannot_survive() {
        let evil = r#"</script><script>alert('x')</script>&"#;
        let h = html(evil);
        assert!(!h.contains('<') && !h.contains('>') && !h.contains('\''));
        assert_eq!(
            html("a&b\"c"),
            "a&amp;b&quot;c",
            "ampersands and quotes are escaped"
        );
        let v = serde_json::json!({ "answer": format!("{evil}\u{2028}\u{2029}<!--") });
        let s = script_json(&v.to_string());
        for bad in ["<", ">", "&", "\u{2028}", "\u{2029}"] {
            assert!(!s.contains(bad), "{bad:?} left in {s}");
        }
        let back: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back, v, "the escaped JSON reads back the same");
    }
}
