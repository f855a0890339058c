//! `multipart/form-data` bodies, and the parameters of header values like it, parsed as Go's
//! mime packages (which envd uses) read them.

/// A parameter of a header value like `multipart/form-data; boundary=xyz` or
/// `form-data; name="file"; filename="/home/user/a.txt"` (quoted strings unescaped as Go's
/// mime package does).
pub(super) fn media_param(value: &str, name: &str) -> Option<String> {
    let mut rest = value.split_once(';')?.1;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        if rest.is_empty() {
            return None;
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_ascii_lowercase();
        let after = &rest[eq + 1..];
        let (val, next) = if let Some(quoted) = after.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            out.push(n);
                        }
                    }
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => out.push(c),
                }
            }
            (out, &quoted[end?..])
        } else {
            let stop = after.find(';').unwrap_or(after.len());
            (after[..stop].trim().to_string(), &after[stop..])
        };
        if key == name {
            return Some(val);
        }
        rest = next;
    }
}

/// One part of a multipart body, with the names its `Content-Disposition` gives it.
pub(super) struct Part {
    pub name: Option<String>,
    pub filename: Option<String>,
    pub data: Vec<u8>,
}

/// The parts of a multipart body, in order; the error says what is malformed.
pub(super) fn multipart(body: &[u8], boundary: &str) -> Result<Vec<Part>, &'static str> {
    let find = |from: usize, needle: &[u8]| {
        body.get(from..)
            .and_then(|hay| memchr::memmem::find(hay, needle))
            .map(|i| from + i)
    };
    let delimiter = format!("--{boundary}");
    // Every delimiter after the first is preceded by the CRLF that ends the part before it.
    let next_delimiter = format!("\r\n--{boundary}");
    let mut pos = find(0, delimiter.as_bytes()).ok_or("no boundary")? + delimiter.len();
    let mut parts = Vec::new();
    loop {
        let rest = body.get(pos..).ok_or("truncated body")?;
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        if !rest.starts_with(b"\r\n") {
            return Err("a boundary is not followed by CRLF");
        }
        let head_start = pos + 2;
        let head_end = find(head_start, b"\r\n\r\n").ok_or("a part has no header end")?;
        let data_start = head_end + 4;
        let data_end =
            find(data_start, next_delimiter.as_bytes()).ok_or("a part is not terminated")?;
        let head = String::from_utf8_lossy(&body[head_start..head_end]);
        let mut name = None;
        let mut filename = None;
        for line in head.split("\r\n") {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            if k.trim().eq_ignore_ascii_case("content-disposition") {
                name = media_param(v, "name");
                filename = media_param(v, "filename");
            }
        }
        parts.push(Part {
            name,
            filename,
            data: body[data_start..data_end].to_vec(),
        });
        pos = data_end + next_delimiter.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multipart_like_httpx_sends_it() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a \\\"b\\\".txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\nworld\r\n--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n--XyZ--\r\n";
        let parts = multipart(body, "XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name.as_deref(), Some("file"));
        assert_eq!(parts[0].filename.as_deref(), Some("/home/user/a \"b\".txt"));
        assert_eq!(parts[0].data, b"hello\r\nworld");
        assert_eq!(parts[1].name.as_deref(), Some("other"));
        assert_eq!(parts[1].data, b"x");
        assert!(multipart(b"--XyZ\r\nno end", "XyZ").is_err());
    }

    #[test]
    fn media_params() {
        assert_eq!(
            media_param("multipart/form-data; boundary=abc123", "boundary").as_deref(),
            Some("abc123")
        );
        assert_eq!(
            media_param("multipart/form-data; boundary=\"a b\"; x=y", "boundary").as_deref(),
            Some("a b")
        );
        assert_eq!(media_param("text/plain", "boundary"), None);
    }
}
