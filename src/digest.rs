//! Content digests: lowercase hex, and `sha256:<hex>` names of contents.

use sha2::{Digest, Sha256};

/// `bytes` as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of `bytes` as bare lowercase hex (what `sha256sum` prints).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

/// `sha256:<hex>` of a file's content, read a block at a time (a tasks file may be large).
pub fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut block = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut block) {
            Ok(0) => break,
            Ok(n) => h.update(&block[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(format!("sha256:{}", hex(&h.finalize())))
}

/// `sha256:<hex>` of named parts, each name and content length-prefixed so that no two
/// different sets of parts hash alike.
pub fn sha256_parts<'a>(parts: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut h = Sha256::new();
    for (name, content) in parts {
        h.update((name.len() as u64).to_be_bytes());
        h.update(name.as_bytes());
        h.update((content.len() as u64).to_be_bytes());
        h.update(content);
    }
    format!("sha256:{}", hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_digests_tell_a_moved_boundary_apart() {
        let a = sha256_parts([("a", &b"bc"[..]), ("d", b"")]);
        let b = sha256_parts([("a", &b"b"[..]), ("cd", b"")]);
        assert_ne!(a, b);
        assert_eq!(a.len(), "sha256:".len() + 64);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        let big = vec![7u8; 200_000];
        std::fs::write(&file, &big).unwrap();
        assert_eq!(sha256_file(&file).unwrap(), sha256(&big));
        assert_eq!(
            sha256(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
