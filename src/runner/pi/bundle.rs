//! The pi bundle as the host holds it: one file, its sha256, and its bytes (what an upload
//! sends), read under a size cap and refused when its digest is not the one it was built
//! with.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{io_err, PiError};
use crate::digest::sha256_hex;

/// The most a bundle may weigh: it is read whole, and sent whole into every sandbox that
/// does not have it. (It is under 1 MB.)
pub const MAX_BUNDLE_BYTES: u64 = 8 << 20;

/// A bundle read from disk, whose digest was checked.
#[derive(Clone, PartialEq, Eq)]
pub struct PiBundle {
    pub file: PathBuf,
    /// sha256 of its bytes, lowercase hex.
    pub sha256: String,
    bytes: Arc<[u8]>,
}

impl fmt::Debug for PiBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PiBundle")
            .field("file", &self.file)
            .field("sha256", &self.sha256)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl PiBundle {
    /// Reads `file` (at most [`MAX_BUNDLE_BYTES`]); with `expected` (hex), refuses it unless
    /// its sha256 is that.
    pub fn read(file: &Path, expected: Option<&str>) -> Result<PiBundle, PiError> {
        let f = File::open(file).map_err(io_err("read the pi bundle", file))?;
        let mut bytes = Vec::new();
        f.take(MAX_BUNDLE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err("read the pi bundle", file))?;
        if bytes.len() as u64 > MAX_BUNDLE_BYTES {
            let bytes = std::fs::metadata(file).map_or(bytes.len() as u64, |m| m.len());
            return Err(PiError::TooLarge {
                file: file.to_path_buf(),
                bytes,
                max: MAX_BUNDLE_BYTES,
            });
        }
        let sha256 = sha256_hex(&bytes);
        if let Some(expected) = expected {
            if expected != sha256 {
                return Err(PiError::Digest {
                    file: file.to_path_buf(),
                    expected: expected.to_string(),
                    found: sha256,
                });
            }
        }
        Ok(PiBundle {
            file: file.to_path_buf(),
            sha256,
            bytes: bytes.into(),
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// `sha256:<hex>`: how provenance names the harness.
    pub fn digest(&self) -> String {
        format!("sha256:{}", self.sha256)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_is_read_with_its_digest_and_refused_when_it_differs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pi.mjs");
        std::fs::write(&file, "export const x = 1;\n").unwrap();
        let good = PiBundle::read(&file, None).unwrap();
        assert_eq!(good.bytes(), b"export const x = 1;\n");
        assert_eq!(good.digest(), crate::digest::sha256(good.bytes()));
        assert_eq!(PiBundle::read(&file, Some(&good.sha256)).unwrap(), good);

        // truncated: refused by its digest, naming the file
        std::fs::write(&file, "export const x").unwrap();
        let e = PiBundle::read(&file, Some(&good.sha256)).unwrap_err();
        let PiError::Digest {
            file: named,
            expected,
            found,
        } = &e
        else {
            panic!("{e:?}");
        };
        assert_eq!(named, &file);
        assert_eq!(expected, &good.sha256);
        assert_eq!(found, &sha256_hex(b"export const x"));
        assert!(e.to_string().contains(&file.display().to_string()), "{e}");
    }

    #[test]
    fn a_bundle_over_the_cap_is_refused_without_reading_it_all() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pi.mjs");
        let f = File::create(&file).unwrap();
        f.set_len(MAX_BUNDLE_BYTES + 10).unwrap();
        let e = PiBundle::read(&file, None).unwrap_err();
        assert!(
            matches!(e, PiError::TooLarge { bytes, .. } if bytes == MAX_BUNDLE_BYTES + 10),
            "{e:?}"
        );
        let e = PiBundle::read(&dir.path().join("gone.mjs"), None).unwrap_err();
        assert!(matches!(e, PiError::Io { .. }), "{e:?}");
    }
}
