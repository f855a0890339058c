//! Images that come from somewhere other than a registry, made the same [`PulledImage`] a
//! pull makes: an OCI image layout (what a builder's `push oci:DIR` writes) imported into
//! the store, each blob copied with its digest and size checked and then recorded; and an
//! image the store already holds, read back from its manifest alone.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::error::ImageError;
use super::manifest::{
    host_platform, offered, parse_config, parse_document, select_platform, Descriptor, Document,
    MAX_DOCUMENT, OCI_INDEX,
};
use super::pull::{Layer, PulledImage, MAX_LAYER};
use super::reference::{Digest, Reference};
use super::store::{unix_now, Record, Store, StoreError};

/// Imports the image of the OCI layout at `dir` into `store` and records it as
/// `reference`. The layout's index must name one manifest, or one for this machine.
pub fn import_layout(
    dir: &Path,
    reference: &Reference,
    store: &Store,
) -> Result<PulledImage, ImageError> {
    let _importing = store.pull_lock()?;
    let layout = Layout { dir, reference };
    let index_path = dir.join("index.json");
    let index = read_bounded(&index_path, MAX_DOCUMENT)?;
    let what = index_path.display().to_string();
    let Document::Index(entries) = parse_document(&what, &index, Some(OCI_INDEX))? else {
        return Err(layout.bad("index.json is not an image index"));
    };
    let mut chosen = layout.choose(&entries)?.clone();
    let mut manifest = layout.document(&chosen, store)?;
    if let Document::Index(inner) = &manifest {
        chosen = layout.choose(inner)?.clone();
        manifest = layout.document(&chosen, store)?;
    }
    let Document::Manifest { config, layers } = manifest else {
        return Err(layout.bad("an index's entry for this platform is itself an index"));
    };
    if config.size > MAX_DOCUMENT {
        return Err(ImageError::TooLarge {
            what: format!("{reference} config {}", config.digest),
            max: MAX_DOCUMENT,
        });
    }
    layout.copy(&config, store)?;
    let mut pulled_layers = Vec::with_capacity(layers.len());
    for layer in &layers {
        if layer.size > MAX_LAYER {
            return Err(ImageError::TooLarge {
                what: format!("{reference} layer {}", layer.digest),
                max: MAX_LAYER,
            });
        }
        pulled_layers.push(Layer {
            path: layout.copy(layer, store)?,
            digest: layer.digest.clone(),
            media_type: layer.media_type.clone(),
            size: layer.size,
        });
    }
    let image = assemble(reference, chosen.digest, &config, pulled_layers, store)?;
    let mut blobs = vec![image.manifest_digest.to_string(), config.digest.to_string()];
    blobs.extend(layers.iter().map(|l| l.digest.to_string()));
    store.record(&Record {
        reference: reference.to_string(),
        digest: image.digest.to_string(),
        manifest_digest: image.manifest_digest.to_string(),
        blobs,
        pulled_at: unix_now(),
    })?;
    Ok(image)
}

/// The image whose manifest `manifest_digest` the store holds, when it holds that manifest,
/// its config and every layer; `None` when any is missing (a prune took it).
pub fn stored_image(
    reference: &Reference,
    manifest_digest: &Digest,
    store: &Store,
) -> Result<Option<PulledImage>, ImageError> {
    let Some(bytes) = store.read_blob(manifest_digest, MAX_DOCUMENT)? else {
        return Ok(None);
    };
    let what = format!("{reference} manifest {manifest_digest}");
    let Document::Manifest { config, layers } = parse_document(&what, &bytes, None)? else {
        return Err(ImageError::BadManifest {
            what,
            why: "an index where a manifest was recorded".into(),
        });
    };
    if !store.has_blob(&config.digest) || layers.iter().any(|l| !store.has_blob(&l.digest)) {
        return Ok(None);
    }
    let layers = layers
        .iter()
        .map(|l| Layer {
            path: store.blob_path(&l.digest),
            digest: l.digest.clone(),
            media_type: l.media_type.clone(),
            size: l.size,
        })
        .collect();
    assemble(reference, manifest_digest.clone(), &config, layers, store).map(Some)
}

/// The image of a manifest whose blobs are in the store: its config read and checked
/// against the layers.
fn assemble(
    reference: &Reference,
    manifest_digest: Digest,
    config: &Descriptor,
    layers: Vec<Layer>,
    store: &Store,
) -> Result<PulledImage, ImageError> {
    let what = format!("{reference} config {}", config.digest);
    let bytes = store
        .read_blob(&config.digest, MAX_DOCUMENT)?
        .ok_or_else(|| ImageError::BadManifest {
            what: what.clone(),
            why: "the config is not in the store".into(),
        })?;
    let image_config = parse_config(&what, &bytes, layers.len())?;
    Ok(PulledImage {
        reference: reference.clone(),
        digest: manifest_digest.clone(),
        manifest_digest,
        config_digest: config.digest.clone(),
        config: image_config,
        layers,
    })
}

/// One OCI layout being read.
struct Layout<'a> {
    dir: &'a Path,
    reference: &'a Reference,
}

impl Layout<'_> {
    fn bad(&self, why: &str) -> ImageError {
        ImageError::BadManifest {
            what: format!("{} (OCI layout of {})", self.dir.display(), self.reference),
            why: why.to_string(),
        }
    }

    /// The one entry of an index, or its entry for this machine.
    fn choose<'e>(
        &self,
        entries: &'e [(Descriptor, Option<super::manifest::Platform>)],
    ) -> Result<&'e Descriptor, ImageError> {
        if let [(only, _)] = entries {
            return Ok(only);
        }
        let want = host_platform();
        select_platform(entries, &want).ok_or_else(|| ImageError::NoPlatform {
            reference: self.reference.to_string(),
            wanted: want.to_string(),
            offered: offered(entries),
        })
    }

    /// A manifest or index of the layout, copied into the store (checked) and parsed.
    fn document(&self, d: &Descriptor, store: &Store) -> Result<Document, ImageError> {
        if d.size > MAX_DOCUMENT {
            return Err(ImageError::TooLarge {
                what: format!("{} manifest {}", self.reference, d.digest),
                max: MAX_DOCUMENT,
            });
        }
        self.copy(d, store)?;
        let bytes = store
            .read_blob(&d.digest, MAX_DOCUMENT)?
            .ok_or_else(|| self.bad("a manifest vanished from the store"))?;
        let what = format!("{} manifest {}", self.reference, d.digest);
        parse_document(&what, &bytes, Some(&d.media_type))
    }

    /// Copies a blob of the layout into the store, its digest and size checked.
    fn copy(&self, d: &Descriptor, store: &Store) -> Result<PathBuf, ImageError> {
        let path = self.dir.join("blobs/sha256").join(d.digest.hex());
        Ok(store.fetch_blob(&d.digest, Some(d.size), || open_plain(&path))?)
    }
}

/// A regular file of the layout, through no symlink at its last component.
fn open_plain(path: &Path) -> Result<File, StoreError> {
    let io = |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    if !file.metadata().map_err(io)?.is_file() {
        return Err(io(std::io::Error::other("not a regular file")));
    }
    Ok(file)
}

fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, ImageError> {
    let io = |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    open_plain(path)?
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(ImageError::TooLarge {
            what: path.display().to_string(),
            max,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layout of one manifest with a config and one (empty, uncompressed) layer.
    fn layout(dir: &Path, config_json: &str) -> Digest {
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let put = |bytes: &[u8]| {
            let d = Digest::of(bytes);
            std::fs::write(blobs.join(d.hex()), bytes).unwrap();
            (d, bytes.len())
        };
        let layer = vec![0u8; 1024];
        let (layer_d, layer_n) = put(&layer);
        let config = config_json.replace("DIFF", layer_d.as_str());
        let (config_d, config_n) = put(config.as_bytes());
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_d}","size":{config_n}}},
            "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer_d}","size":{layer_n}}}]}}"#
        );
        let (manifest_d, manifest_n) = put(manifest.as_bytes());
        std::fs::write(
            dir.join("index.json"),
            format!(
                r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest_d}","size":{manifest_n}}}]}}"#
            ),
        )
        .unwrap();
        manifest_d
    }

    const CONFIG: &str = r#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"User":"app"},"rootfs":{"type":"layers","diff_ids":["DIFF"]}}"#;

    #[test]
    fn a_layout_is_imported_recorded_and_read_back_from_the_store() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("store")).unwrap();
        let dir = tmp.path().join("layout");
        let manifest = layout(&dir, CONFIG);
        let reference = Reference::parse("localhost/wmo-e2b/build:x").unwrap();
        let image = import_layout(&dir, &reference, &store).unwrap();
        assert_eq!(image.manifest_digest, manifest);
        assert_eq!(image.config.env, ["A=1"]);
        assert_eq!(image.layers.len(), 1);
        assert!(image.layers[0].path.starts_with(store.root()));
        let record = store.lookup(&reference.to_string()).unwrap();
        assert_eq!(record.manifest_digest, manifest.as_str());
        assert_eq!(record.blobs.len(), 3);
        let again = stored_image(&reference, &manifest, &store)
            .unwrap()
            .unwrap();
        assert_eq!(again, image);
        std::fs::remove_file(&image.layers[0].path).unwrap();
        assert_eq!(stored_image(&reference, &manifest, &store).unwrap(), None);
    }

    #[test]
    fn a_blob_that_does_not_hash_to_its_digest_is_refused_and_not_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("store")).unwrap();
        let dir = tmp.path().join("layout");
        layout(&dir, CONFIG);
        let reference = Reference::parse("localhost/wmo-e2b/build:x").unwrap();
        // The layer's content changed under its name.
        for entry in std::fs::read_dir(dir.join("blobs/sha256")).unwrap() {
            let path = entry.unwrap().path();
            if std::fs::metadata(&path).unwrap().len() == 1024 {
                std::fs::write(&path, vec![1u8; 1024]).unwrap();
            }
        }
        let e = import_layout(&dir, &reference, &store).unwrap_err();
        assert!(
            matches!(e, ImageError::Store(StoreError::DigestMismatch { .. })),
            "{e}"
        );
        assert!(store.lookup(&reference.to_string()).is_none());
    }
}
