//! The image subsystem's errors, classified where they are born: bad input (a reference, a
//! settings file) or a registry or store that failed us.

use std::path::PathBuf;

use super::reference::{Digest, ReferenceError};
use super::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `registries.toml` or the Docker config file; never quotes the file's content (the
    /// Docker config holds credentials).
    #[error("{}: {why}", path.display())]
    Settings { path: PathBuf, why: String },
    #[error("{url}: {source}")]
    Transport {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    #[error("{url}: the registry answered {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: not found (404)")]
    NotFound { url: String },
    #[error("{registry}: access denied: {why}")]
    Unauthorized { registry: String, why: String },
    #[error("{url}: gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        url: String,
        attempts: u32,
        #[source]
        last: Box<ImageError>,
    },
    #[error(
        "{url}: plain HTTP is only used for loopback registries and those named insecure in \
         registries.toml"
    )]
    PlainHttpRefused { url: String },
    #[error("{what}: more than {max} bytes")]
    TooLarge { what: String, max: u64 },
    #[error("{what}: {why}")]
    BadManifest { what: String, why: String },
    #[error("{reference}: the manifest answered hashes to {actual}, not the digest asked for")]
    ManifestDigest { reference: String, actual: Digest },
    #[error(
        "{reference}: no image for this machine's platform ({wanted}); the index offers: {}",
        if offered.is_empty() { "nothing".to_string() } else { offered.join(", ") }
    )]
    NoPlatform {
        reference: String,
        wanted: String,
        offered: Vec<String>,
    },
    #[error("cancelled")]
    Cancelled,
}

impl ImageError {
    /// Whether the user's input is at fault (a reference that does not parse, a settings file
    /// that does not read), rather than a registry, the network or the store.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, ImageError::Reference(_) | ImageError::Settings { .. })
    }
}
