//! The certificate the emulator answers with when a client tunnels to a sandbox's port over
//! HTTPS (`CONNECT`, then TLS), as it reaches E2B's proxy at `https://<port>-<id>.<domain>`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the certificates in {path}: {why}")]
    Certificates { path: PathBuf, why: String },
    #[error("{path} holds no certificate (PEM `CERTIFICATE` blocks)")]
    NoCertificate { path: PathBuf },
    #[error("cannot read the private key in {path}: {why}")]
    Key { path: PathBuf, why: String },
    #[error("the certificate in {cert} and the key in {key} cannot serve TLS: {why}")]
    Config {
        cert: PathBuf,
        key: PathBuf,
        why: String,
    },
}

/// A certificate chain and its key, ready to serve.
#[derive(Clone)]
pub struct TlsIdentity(pub(super) Arc<ServerConfig>);

impl TlsIdentity {
    /// Reads a PEM certificate chain (the leaf first, for the names clients ask for, such
    /// as `*.e2b.app`) and its PEM private key.
    pub fn load(cert: &Path, key: &Path) -> Result<TlsIdentity, TlsError> {
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| TlsError::Certificates {
                path: cert.to_path_buf(),
                why: e.to_string(),
            })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: cert.to_path_buf(),
            });
        }
        let private = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
            path: key.to_path_buf(),
            why: e.to_string(),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, private))
            .map_err(|e| TlsError::Config {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
                why: e.to_string(),
            })?;
        Ok(TlsIdentity(Arc::new(config)))
    }
}
