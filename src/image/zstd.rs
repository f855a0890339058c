//! A zstd stream of any number of frames (and skippable frames, as zstd:chunked layers carry)
//! read as one; each frame's window is bounded by the decoder (100 MiB).

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};
use std::io::{self, BufRead, Read};

pub struct Frames<R> {
    source: R,
    decoder: FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> Frames<R> {
    pub fn new(source: R) -> Frames<R> {
        Frames {
            source,
            decoder: FrameDecoder::new(),
            in_frame: false,
        }
    }

    /// Starts the next frame; false at the end of the stream.
    fn next_frame(&mut self) -> io::Result<bool> {
        loop {
            if self.source.fill_buf()?.is_empty() {
                return Ok(false);
            }
            match self.decoder.init(&mut self.source) {
                Ok(()) => return Ok(true),
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                    length,
                    ..
                })) => {
                    let skipped = io::copy(
                        &mut (&mut self.source).take(u64::from(length)),
                        &mut io::sink(),
                    )?;
                    if skipped < u64::from(length) {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the stream ends inside a skippable frame",
                        ));
                    }
                }
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
        }
    }
}

impl<R: BufRead> Read for Frames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if !self.next_frame()? {
                    return Ok(0);
                }
                self.in_frame = true;
            }
            while self.decoder.can_collect() < buf.len() && !self.decoder.is_finished() {
                let wanted = buf.len() - self.decoder.can_collect();
                self.decoder
                    .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBytes(wanted))
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            }
            let n = self.decoder.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.decoder.is_finished() {
                self.in_frame = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_skippable_frames_read_as_one_stream() {
        use ruzstd::encoding::{compress_to_vec, CompressionLevel};
        let mut stream = compress_to_vec(&b"first "[..], CompressionLevel::Fastest);
        // A skippable frame: magic 0x184D2A50, a length, that many bytes.
        stream.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
        stream.extend_from_slice(&3u32.to_le_bytes());
        stream.extend_from_slice(b"xyz");
        stream.extend(compress_to_vec(&b"second"[..], CompressionLevel::Fastest));
        let mut out = String::new();
        Frames::new(&stream[..]).read_to_string(&mut out).unwrap();
        assert_eq!(out, "first second");
    }
}
