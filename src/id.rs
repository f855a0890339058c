//! Random identifiers, as lowercase hex.

use std::time::{SystemTime, UNIX_EPOCH};

/// `bytes` random bytes from the OS, as lowercase hex. Fails only when the OS has no
/// randomness to give.
pub fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)?;
    Ok(hex(&buf))
}

/// `bytes` (at most 16) random bytes as lowercase hex, for ids that only need to be unique on
/// this host (an episode's, a lease's): without randomness from the OS, the clock and the pid
/// stand in.
pub fn unique_hex(bytes: usize) -> String {
    random_hex(bytes).unwrap_or_else(|_| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mixed = (nanos ^ u128::from(std::process::id())).to_le_bytes();
        hex(&mixed[..bytes.min(mixed.len())])
    })
}

/// A fresh episode id: 32 hex characters.
pub fn new_episode_id() -> String {
    unique_hex(16)
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_lowercase_hex_of_the_asked_length_and_differ() {
        let a = new_episode_id();
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(a, new_episode_id());
        assert_eq!(unique_hex(12).len(), 24);
        assert_eq!(random_hex(8).unwrap().len(), 16);
    }
}
