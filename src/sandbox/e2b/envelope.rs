//! The Connect streaming envelope: one flags byte, a big-endian `u32` length, then that many
//! bytes of JSON. Requests to streaming RPCs carry one envelope; responses are a sequence of
//! them ending with an end-of-stream envelope.

use std::io::{self, Read};

/// The payload is compressed. We never negotiate compression, so seeing it is an error.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// The last envelope of a response: `{}` or `{"error": {...}}`, not a message.
pub const FLAG_END_STREAM: u8 = 0x02;
pub const HEADER_LEN: usize = 5;
/// Largest message we accept. envd sends at most 32 KiB of output per event, base64 and JSON
/// grow that by about half, so this only stops a corrupt length from allocating gigabytes.
pub const MAX_MESSAGE: u32 = 16 << 20;

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub payload: Vec<u8>,
}

impl Envelope {
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    #[error("the stream ended inside an envelope header ({got} of 5 bytes)")]
    TruncatedHeader { got: usize },
    #[error("the stream ended {got} bytes into a {len}-byte message")]
    TruncatedMessage { len: u32, got: usize },
    #[error("a {len}-byte message exceeds the {max}-byte limit")]
    TooLarge { len: u32, max: u32 },
    #[error("the server sent a compressed message although none was negotiated")]
    Compressed,
    #[error("reading the stream failed")]
    Io(#[source] io::Error),
}

/// Frames `payload` as one envelope.
pub fn encode(flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("an envelope payload fits in u32");
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(flags);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads the next envelope. `Ok(None)` means the stream ended cleanly between envelopes;
/// an end inside one is an error. Short reads are fine: the parts are read until complete.
pub fn read_envelope(r: &mut impl Read, max: u32) -> Result<Option<Envelope>, EnvelopeError> {
    let mut header = [0u8; HEADER_LEN];
    let got = fill(r, &mut header)?;
    if got == 0 {
        return Ok(None);
    }
    if got < HEADER_LEN {
        return Err(EnvelopeError::TruncatedHeader { got });
    }
    let flags = header[0];
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    if len > max {
        return Err(EnvelopeError::TooLarge { len, max });
    }
    if flags & FLAG_COMPRESSED != 0 {
        return Err(EnvelopeError::Compressed);
    }
    let mut payload = vec![0u8; len as usize];
    let got = fill(r, &mut payload)?;
    if got < payload.len() {
        return Err(EnvelopeError::TruncatedMessage { len, got });
    }
    Ok(Some(Envelope { flags, payload }))
}

/// Reads until `buf` is full or the stream ends; returns how much was read.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, EnvelopeError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(EnvelopeError::Io(e)),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out its bytes in pieces of at most `step`, as a network stream may.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn trickle(data: Vec<u8>, step: usize) -> Trickle {
        Trickle { data, at: 0, step }
    }

    #[test]
    fn encode_writes_flags_and_big_endian_length() {
        assert_eq!(encode(0, b"{}"), [0, 0, 0, 0, 2, b'{', b'}']);
        let big = vec![b'x'; 0x0102];
        assert_eq!(&encode(FLAG_END_STREAM, &big)[..5], &[2, 0, 0, 1, 2]);
    }

    #[test]
    fn round_trips_a_sequence_through_any_read_size() {
        let mut wire = encode(0, br#"{"event":{"start":{"pid":7}}}"#);
        wire.extend(encode(0, b""));
        wire.extend(encode(FLAG_END_STREAM, b"{}"));
        for step in [1, 2, 3, 5, 7, 64] {
            let mut r = trickle(wire.clone(), step);
            let first = read_envelope(&mut r, MAX_MESSAGE).unwrap().unwrap();
            assert_eq!(first.payload, br#"{"event":{"start":{"pid":7}}}"#);
            assert!(!first.is_end_stream());
            let empty = read_envelope(&mut r, MAX_MESSAGE).unwrap().unwrap();
            assert!(empty.payload.is_empty());
            let end = read_envelope(&mut r, MAX_MESSAGE).unwrap().unwrap();
            assert!(end.is_end_stream());
            assert_eq!(end.payload, b"{}");
            assert!(read_envelope(&mut r, MAX_MESSAGE).unwrap().is_none());
        }
    }

    #[test]
    fn a_cut_header_or_message_is_an_error() {
        let wire = encode(0, b"hello");
        let err = read_envelope(&mut trickle(wire[..3].to_vec(), 1), MAX_MESSAGE).unwrap_err();
        assert!(matches!(err, EnvelopeError::TruncatedHeader { got: 3 }));
        let err = read_envelope(&mut trickle(wire[..8].to_vec(), 2), MAX_MESSAGE).unwrap_err();
        assert!(matches!(
            err,
            EnvelopeError::TruncatedMessage { len: 5, got: 3 }
        ));
    }

    #[test]
    fn an_oversized_length_is_refused_before_allocating() {
        let wire = vec![0, 0xff, 0xff, 0xff, 0xff];
        let err = read_envelope(&mut trickle(wire, 5), MAX_MESSAGE).unwrap_err();
        assert!(matches!(err, EnvelopeError::TooLarge { len: u32::MAX, .. }));
        let err = read_envelope(&mut trickle(encode(0, b"12345"), 9), 4).unwrap_err();
        assert!(matches!(err, EnvelopeError::TooLarge { len: 5, max: 4 }));
    }

    #[test]
    fn compressed_messages_are_refused() {
        let err =
            read_envelope(&mut trickle(encode(FLAG_COMPRESSED, b"x"), 9), MAX_MESSAGE).unwrap_err();
        assert!(matches!(err, EnvelopeError::Compressed));
    }

    #[test]
    fn read_errors_are_passed_on() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::TimedOut, "slow"))
            }
        }
        let err = read_envelope(&mut Broken, MAX_MESSAGE).unwrap_err();
        assert!(matches!(err, EnvelopeError::Io(e) if e.kind() == io::ErrorKind::TimedOut));
    }
}
