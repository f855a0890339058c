//! Pulling an image into the store: the reference resolved to a manifest (an index to this
//! machine's platform), then the config and the layers, each blob fetched once and checked.
//! Documents named by digest are read from the store when they are there, so a reference by
//! digest that was pulled before makes no network call.

use std::path::PathBuf;

use super::error::ImageError;
use super::manifest::{
    host_platform, offered, parse_config, parse_document, select_platform, Descriptor, Document,
    ImageConfig, MANIFEST_ACCEPT, MAX_DOCUMENT,
};
use super::reference::{Digest, Reference};
use super::registry::RegistryClient;
use super::settings::RegistryConfig;
use super::store::{unix_now, Record, Store};
use crate::cancel::CancelToken;

/// The largest layer taken: a manifest's sizes are a registry's word, and a layer is
/// downloaded up to its stated size.
pub(super) const MAX_LAYER: u64 = 64 << 30;

/// An image whose blobs are all in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledImage {
    pub reference: Reference,
    /// The content the reference names (an index or a manifest): what provenance carries.
    pub digest: Digest,
    /// The manifest for this machine's platform (`digest` itself when there is no index).
    pub manifest_digest: Digest,
    pub config_digest: Digest,
    pub config: ImageConfig,
    /// Bottom layer first.
    pub layers: Vec<Layer>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub digest: Digest,
    pub media_type: String,
    pub size: u64,
    /// The blob in the store, compressed as `media_type` says.
    pub path: PathBuf,
}

/// Pulls `reference` into `store` with the Docker config's credentials.
pub fn pull(
    reference: &Reference,
    store: &Store,
    config: &RegistryConfig,
) -> Result<PulledImage, ImageError> {
    let client = RegistryClient::new(config.clone(), CancelToken::new())?;
    pull_with(reference, store, &client)
}

/// Pulls with a client that the caller shares between pulls (its tokens serve them all).
pub fn pull_with(
    reference: &Reference,
    store: &Store,
    client: &RegistryClient,
) -> Result<PulledImage, ImageError> {
    let _pulling = store.pull_lock()?;
    let source = Source {
        reference,
        store,
        client,
    };
    let Named {
        digest,
        manifest_digest,
        config,
        layers,
        image_config,
    } = source.named()?;
    let mut pulled_layers = Vec::with_capacity(layers.len());
    for layer in &layers {
        if layer.size > MAX_LAYER {
            return Err(ImageError::TooLarge {
                what: format!("{reference} layer {}", layer.digest),
                max: MAX_LAYER,
            });
        }
        pulled_layers.push(Layer {
            path: source.blob(layer)?,
            digest: layer.digest.clone(),
            media_type: layer.media_type.clone(),
            size: layer.size,
        });
    }
    let mut blobs = vec![digest.to_string()];
    if manifest_digest != digest {
        blobs.push(manifest_digest.to_string());
    }
    blobs.push(config.digest.to_string());
    blobs.extend(layers.iter().map(|l| l.digest.to_string()));
    store.record(&Record {
        reference: reference.to_string(),
        digest: digest.to_string(),
        manifest_digest: manifest_digest.to_string(),
        blobs,
        pulled_at: unix_now(),
    })?;
    Ok(PulledImage {
        reference: reference.clone(),
        digest,
        manifest_digest,
        config_digest: config.digest,
        config: image_config,
        layers: pulled_layers,
    })
}

/// What a reference names, without its layers' content.
struct Named {
    digest: Digest,
    manifest_digest: Digest,
    config: Descriptor,
    layers: Vec<Descriptor>,
    image_config: ImageConfig,
}

/// What a reference names, resolved without fetching its layers: enough to pin it and to
/// read its config (where E2B, not this machine, pulls the image).
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The content the reference names (an index or a manifest).
    pub digest: Digest,
    pub manifest_digest: Digest,
    pub config: ImageConfig,
}

/// Resolves `reference` to its digest and config (the documents kept in `store`).
pub fn resolve(
    reference: &Reference,
    store: &Store,
    config: &RegistryConfig,
) -> Result<Resolved, ImageError> {
    let client = RegistryClient::new(config.clone(), CancelToken::new())?;
    let _pulling = store.pull_lock()?;
    let named = Source {
        reference,
        store,
        client: &client,
    }
    .named()?;
    Ok(Resolved {
        digest: named.digest,
        manifest_digest: named.manifest_digest,
        config: named.image_config,
    })
}

/// Where one pull reads from: the store first for what a digest names, else the registry.
struct Source<'a> {
    reference: &'a Reference,
    store: &'a Store,
    client: &'a RegistryClient,
}

impl Source<'_> {
    /// The documents a reference names and its config: all but the layers.
    fn named(&self) -> Result<Named, ImageError> {
        let (digest, top) = match &self.reference.digest {
            Some(d) => (d.clone(), self.document_by_digest(d, None)?),
            None => self.document_by_tag()?,
        };
        let (manifest_digest, manifest) = match top {
            Document::Manifest { .. } => (digest.clone(), top),
            Document::Index(entries) => {
                let want = host_platform();
                let chosen =
                    select_platform(&entries, &want).ok_or_else(|| ImageError::NoPlatform {
                        reference: self.reference.to_string(),
                        wanted: want.to_string(),
                        offered: offered(&entries),
                    })?;
                let manifest = self.document_by_digest(&chosen.digest, Some(chosen.size))?;
                if matches!(manifest, Document::Index(_)) {
                    return Err(self.bad("an index entry for this platform is itself an index"));
                }
                (chosen.digest.clone(), manifest)
            }
        };
        let Document::Manifest { config, layers } = manifest else {
            return Err(self.bad("no manifest"));
        };
        if config.size > MAX_DOCUMENT {
            return Err(ImageError::TooLarge {
                what: format!("{} config {}", self.reference, config.digest),
                max: MAX_DOCUMENT,
            });
        }
        self.blob(&config)?;
        let config_bytes = self
            .store
            .read_blob(&config.digest, MAX_DOCUMENT)?
            .ok_or_else(|| self.bad("the config vanished from the store"))?;
        let what = format!("{} config {}", self.reference, config.digest);
        let image_config = parse_config(&what, &config_bytes, layers.len())?;
        Ok(Named {
            digest,
            manifest_digest,
            config,
            layers,
            image_config,
        })
    }

    fn bad(&self, why: &str) -> ImageError {
        ImageError::BadManifest {
            what: self.reference.to_string(),
            why: why.to_string(),
        }
    }

    fn fetch_manifest(&self, key: &str) -> Result<(Vec<u8>, Option<String>), ImageError> {
        let r = self.reference;
        self.client.manifest(
            &r.registry,
            r.api_host(),
            &r.repository,
            key,
            MANIFEST_ACCEPT,
        )
    }

    /// A tag's manifest, always from the registry (tags move); stored under its digest.
    fn document_by_tag(&self) -> Result<(Digest, Document), ImageError> {
        let key = self.reference.manifest_key();
        let (bytes, content_type) = self.fetch_manifest(key)?;
        let digest = Digest::of(&bytes);
        let document = parse_document(&self.what(key), &bytes, content_type.as_deref())?;
        self.store.put_blob(&digest, &bytes)?;
        Ok((digest, document))
    }

    /// The document a digest names, from the store when it is there; what the registry
    /// answers must hash to the digest.
    fn document_by_digest(
        &self,
        digest: &Digest,
        size: Option<u64>,
    ) -> Result<Document, ImageError> {
        let what = self.what(digest.as_str());
        if let Some(bytes) = self.store.read_blob(digest, MAX_DOCUMENT)? {
            return parse_document(&what, &bytes, None);
        }
        let (bytes, content_type) = self.fetch_manifest(digest.as_str())?;
        let actual = Digest::of(&bytes);
        if &actual != digest || size.is_some_and(|s| s != bytes.len() as u64) {
            return Err(ImageError::ManifestDigest {
                reference: what,
                actual,
            });
        }
        let document = parse_document(&what, &bytes, content_type.as_deref())?;
        self.store.put_blob(digest, &bytes)?;
        Ok(document)
    }

    fn blob(&self, d: &Descriptor) -> Result<PathBuf, ImageError> {
        let r = self.reference;
        self.store.fetch_blob(&d.digest, Some(d.size), || {
            self.client
                .blob(&r.registry, r.api_host(), &r.repository, d.digest.as_str())
        })
    }

    fn what(&self, key: &str) -> String {
        format!(
            "{}/{} manifest {key}",
            self.reference.registry, self.reference.repository
        )
    }
}
