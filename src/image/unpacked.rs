//! A pulled image's unpacked root in the store, `rootfs/<manifest digest>/`: made once from
//! its layers (see `unpack`) and shared by every sandbox of the image on this machine.

use std::path::PathBuf;

use super::pull::PulledImage;
use super::store::Store;
use super::unpack::{unpack_image, LayerBlob, UnpackError};

/// Where unpacked images live in the store.
pub const ROOTFS_DIR: &str = "rootfs";

/// `image`'s root filesystem, unpacked into the store unless it already is (under the
/// store's shared lock, as a pull: no prune removes a root being made).
pub fn unpacked_root(image: &PulledImage, store: &Store) -> Result<PathBuf, UnpackError> {
    let _shared = store.pull_lock().map_err(UnpackError::Locked)?;
    let layers: Vec<LayerBlob> = image
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| LayerBlob {
            path: l.path.clone(),
            media_type: l.media_type.clone(),
            digest: l.digest.as_str().to_string(),
            diff_id: image.config.diff_ids.get(i).map(|d| d.as_str().to_string()),
        })
        .collect();
    let key = image.manifest_digest.as_str();
    unpack_image(&layers, &store.root().join(ROOTFS_DIR), key)
}
