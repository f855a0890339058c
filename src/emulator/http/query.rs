//! Percent-decoding of paths and query strings.

/// Decodes `%XX` escapes (and `+` as a space when `plus` is set); invalid escapes stay as
/// they are, and invalid UTF-8 becomes U+FFFD.
pub(super) fn percent_decode(s: &str, plus: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Like `percent_decode`, but an invalid escape is an error (Go's `url.QueryUnescape`).
pub(in crate::emulator) fn query_unescape_strict(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let h = hex(*bytes.get(i + 1)?)?;
                let l = hex(*bytes.get(i + 2)?)?;
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Query pairs in order, each side decoded (`+` is a space); a pair without `=` has an empty
/// value.
pub(super) fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (percent_decode(k, true), percent_decode(v, true)),
            None => (percent_decode(pair, true), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b+c", true), "a b c");
        assert_eq!(percent_decode("a%20b+c", false), "a b+c");
        assert_eq!(percent_decode("100%", true), "100%");
        assert_eq!(percent_decode("%4", true), "%4");
        assert_eq!(percent_decode("%zz", true), "%zz");
        assert_eq!(query_unescape_strict("a%3Db"), Some("a=b".into()));
        assert_eq!(query_unescape_strict("a%3"), None);
    }

    #[test]
    fn query_pairs() {
        let q = parse_query("path=%2Fhome%2Fuser%2Fa+b&x&y=");
        assert_eq!(
            q,
            vec![
                ("path".into(), "/home/user/a b".into()),
                ("x".into(), String::new()),
                ("y".into(), String::new()),
            ]
        );
    }
}
