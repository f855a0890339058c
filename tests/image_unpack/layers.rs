//! Layers built for the tests: raw headers, compressed as a media type says, and what to
//! look at in a result.

use std::path::{Path, PathBuf};

use wmo_e2b::image::unpack::{unpack_image, LayerBlob, UnpackError, Unsafe};

pub const OCI_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const OCI_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const OCI_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const DOCKER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
pub const KEY: &str = "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// A layer written entry by entry with raw headers: the names go in as they are, `..` and
/// absolute ones included, which no tar writer would produce.
pub struct Layer(pub tar::Builder<Vec<u8>>);

impl Layer {
    pub fn new() -> Layer {
        Layer(tar::Builder::new(Vec::new()))
    }

    pub fn entry(
        mut self,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        link: &str,
        data: &[u8],
    ) -> Layer {
        let mut h = tar::Header::new_ustar();
        let name = &mut h.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        let linkname = &mut h.as_old_mut().linkname;
        linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_600_000_000);
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }

    pub fn file(self, path: &str, data: &str) -> Layer {
        self.entry(path, tar::EntryType::Regular, 0o644, "", data.as_bytes())
    }

    pub fn dir(self, path: &str) -> Layer {
        self.entry(path, tar::EntryType::Directory, 0o755, "", b"")
    }

    pub fn symlink(self, path: &str, target: &str) -> Layer {
        self.entry(path, tar::EntryType::Symlink, 0o777, target, b"")
    }

    pub fn hardlink(self, path: &str, target: &str) -> Layer {
        self.entry(path, tar::EntryType::Link, 0o644, target, b"")
    }

    pub fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }

    /// The layer as a blob of `media_type` in `dir`.
    pub fn blob(self, dir: &Path, media_type: &str) -> LayerBlob {
        write_blob(dir, media_type, &self.bytes())
    }
}

pub fn write_blob(dir: &Path, media_type: &str, tar: &[u8]) -> LayerBlob {
    use std::io::Write;
    let data = if media_type.contains("gzip") {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(tar).unwrap();
        enc.finish().unwrap()
    } else if media_type.contains("zstd") {
        ruzstd::encoding::compress_to_vec(tar, ruzstd::encoding::CompressionLevel::Fastest)
    } else {
        tar.to_vec()
    };
    let digest = wmo_e2b::digest::sha256(&data);
    let path = dir.join(digest.replace(':', "-"));
    std::fs::write(&path, &data).unwrap();
    LayerBlob {
        path,
        media_type: media_type.to_string(),
        digest,
        diff_id: None,
    }
}

pub fn unpack(layers: &[LayerBlob], into: &Path) -> Result<PathBuf, UnpackError> {
    unpack_image(layers, into, KEY)
}

pub fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path).unwrap()
}

pub fn names_under(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// What is left in the store directory: no result and no temporary directory after a failure.
pub fn store_listing(into: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(into)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    names.sort();
    names
}

pub fn refused(result: Result<PathBuf, UnpackError>) -> (String, String, Unsafe) {
    match result {
        Err(UnpackError::Unsafe { digest, entry, why }) => (digest, entry, why),
        other => panic!("expected a refused entry, got {other:?}"),
    }
}

pub const ZSTD_TOOL_LAYER: &str = "28b52ffd0468ed060072491d18806d03c0c8bdc81e3744033822674ddb4b1b11e7a4c23d056bd5ddc0dc9d190fddcd9b879172ce5fe5a36ae3f24b211b15e8fc9c10af3676b75881e66ea25fafe0b93f6eee79b2cc00765d448779b8bc945921f891a4d36ab35eddcd97b3d6e5585b73ac3f7d30a58c8b10415181d198e02104012720004bc2480adb01fd19440f57038802a0a8591d60000350a600c7d484fd6f01bc01a9c2fb141cee5895ecb04c289f68000e2006643e7f954b3c055884c0d0801892a4258261f30e40a8d937132a4bc50ed6b2343f7500486761f40070705000abe815033eb80797";

pub fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}
