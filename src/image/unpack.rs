//! An image's layers unpacked into one flattened root filesystem, `INTO/<key>`, which
//! sandboxes mount read-only.
//!
//! The result is built in a temporary directory beside it and renamed into place, so
//! whatever is at `INTO/<key>` is complete; a failure removes the temporary directory.
//! Callers asking for one key at once, in threads or in processes, queue on an `flock` of
//! `INTO/.<key>.lock`: the first unpacks, the rest find the result. Every layer is an
//! attacker's input: each entry's path is checked, nothing is written through a symlink,
//! and what a layer may cost is bounded (see [`Limits`]).

use super::layer::{self, Tally};
use super::rootfs::Rootfs;
use super::tar_reader::{TarError, TarReader};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The most uncompressed layer bytes (tar headers and content, all layers together) one
/// image may have; what is written is never more.
pub const MAX_UNPACKED_BYTES: u64 = 64 << 30;
/// The most entries all layers of one image may have together.
pub const MAX_ENTRIES: u64 = 4_000_000;
/// The most bytes of paths kept in memory while unpacking one image (each entry's path and
/// its parents, for whiteouts and directory metadata).
pub const MAX_PATH_MEMORY: u64 = 1 << 30;

/// One layer as the store holds it.
#[derive(Debug, Clone)]
pub struct LayerBlob {
    /// The blob file, compressed as `media_type` says.
    pub path: PathBuf,
    pub media_type: String,
    /// The blob's digest: it names the layer in errors.
    pub digest: String,
    /// The digest of the uncompressed layer (the image config's `rootfs.diff_ids`): checked
    /// while unpacking when given.
    pub diff_id: Option<String>,
}

/// What unpacking may cost; [`Limits::default`] is the documented bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_entries: u64,
    pub max_path_memory: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bytes: MAX_UNPACKED_BYTES,
            max_entries: MAX_ENTRIES,
            max_path_memory: MAX_PATH_MEMORY,
        }
    }
}

/// What [`unpack_image_with`] did.
#[derive(Debug, Clone)]
pub struct Unpacked {
    pub root: PathBuf,
    /// False when the result was there already (another caller unpacked it).
    pub fresh: bool,
    pub entries: u64,
    /// Character and block devices in the layers, never created.
    pub devices_skipped: u64,
}

/// Why an entry was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsafe {
    /// A `..` component.
    ParentDir,
    Absolute,
    /// A parent component is a symlink (placed by an earlier entry or layer).
    ThroughSymlink,
    /// A parent component is a file.
    NotADirectory,
    /// A hard link whose source climbs out or is absolute.
    LinkOutside,
    /// A hard link whose source is not (yet) a non-directory in the tree.
    LinkTargetMissing,
    /// Something other than a directory at the archive's root.
    ReplacesRoot,
    /// A `.wh.` name that names nothing (`.wh.`, `.wh..`).
    BadWhiteout,
    /// More components than [`super::layer::MAX_DEPTH`].
    TooDeep,
}

/// Which bound a layer went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// [`Limits::max_bytes`].
    Bytes,
    /// [`Limits::max_entries`].
    Entries,
    /// [`Limits::max_path_memory`].
    PathBytes,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("the unpacked image key {key:?} is not a content digest (ALGORITHM:HEX)")]
    BadKey { key: String },
    #[error("cannot use the image store: {0}")]
    Locked(#[source] super::store::StoreError),
    #[error("layer {digest}: unknown media type {media_type:?}")]
    UnknownMediaType { digest: String, media_type: String },
    #[error("layer {digest}: entry {entry:?} refused: {why:?}")]
    Unsafe {
        digest: String,
        entry: String,
        why: Unsafe,
    },
    #[error("layer {digest}: past the bound on {bound:?}")]
    Bound { digest: String, bound: Bound },
    #[error("layer {digest}: {source}")]
    Tar { digest: String, source: TarError },
    #[error("layer {digest}: its uncompressed content is {actual}, not its diff_id {expected}")]
    DiffIdMismatch {
        digest: String,
        expected: String,
        actual: String,
    },
    #[error("layer {digest}: diff_id {diff_id:?} is not a sha256 digest")]
    BadDiffId { digest: String, diff_id: String },
    #[error("layer {digest}: entry {entry:?}: {op}: {source}")]
    Io {
        digest: String,
        entry: String,
        op: &'static str,
        source: io::Error,
    },
    #[error("{op} {}: {source}", path.display())]
    Store {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// Unpacks `layers` (lowest first) into `into/<key>` under the default [`Limits`] and
/// returns that directory; an existing result is returned as it is.
pub fn unpack_image(layers: &[LayerBlob], into: &Path, key: &str) -> Result<PathBuf, UnpackError> {
    unpack_image_with(layers, into, key, Limits::default()).map(|u| u.root)
}

/// [`unpack_image`] under given limits, saying what it did.
pub fn unpack_image_with(
    layers: &[LayerBlob],
    into: &Path,
    key: &str,
    limits: Limits,
) -> Result<Unpacked, UnpackError> {
    check_key(key)?;
    let store = |op| {
        move |source| UnpackError::Store {
            op,
            path: into.to_path_buf(),
            source,
        }
    };
    std::fs::create_dir_all(into).map_err(store("create"))?;
    let root = into.join(key);
    let done = |root: PathBuf| Unpacked {
        root,
        fresh: false,
        entries: 0,
        devices_skipped: 0,
    };
    if is_dir(&root) {
        return Ok(done(root));
    }
    let _lock = lock(&into.join(format!(".{key}.lock"))).map_err(store("lock"))?;
    if is_dir(&root) {
        return Ok(done(root));
    }
    // Under the lock, any temporary directory for this key is a dead caller's.
    remove_temporaries(into, key).map_err(store("remove a stale temporary directory in"))?;
    let temp = into.join(format!(".{key}.tmp-{}", std::process::id()));
    std::fs::create_dir(&temp).map_err(store("create a temporary directory in"))?;
    let result = unpack_layers(layers, &temp, limits).and_then(|tally| {
        publish(&temp, &root).map_err(store("publish the unpacked image in"))?;
        Ok(Unpacked {
            root: root.clone(),
            fresh: true,
            entries: tally.entries,
            devices_skipped: tally.devices_skipped,
        })
    });
    if result.is_err() {
        // The error being returned says what went wrong; a temporary directory that will
        // not go is removed by the next caller for this key.
        let _ = crate::deep_remove::remove_tree(&temp);
    }
    result
}

fn unpack_layers(layers: &[LayerBlob], temp: &Path, limits: Limits) -> Result<Tally, UnpackError> {
    let mut fs = Rootfs::open(temp).map_err(|source| UnpackError::Store {
        op: "open",
        path: temp.to_path_buf(),
        source,
    })?;
    let mut tally = Tally {
        entries_left: limits.max_entries,
        path_bytes_left: limits.max_path_memory,
        entries: 0,
        devices_skipped: 0,
        dirs: Vec::new(),
    };
    let mut bytes_left = limits.max_bytes;
    for blob in layers {
        bytes_left = unpack_layer(blob, &mut fs, &mut tally, bytes_left)?;
    }
    layer::finish_dirs(&mut fs, &tally.dirs).map_err(|source| UnpackError::Store {
        op: "set directory metadata in",
        path: temp.to_path_buf(),
        source,
    })?;
    Ok(tally)
}

/// Applies one layer; returns the byte budget left.
fn unpack_layer(
    blob: &LayerBlob,
    fs: &mut Rootfs,
    tally: &mut Tally,
    bytes_left: u64,
) -> Result<u64, UnpackError> {
    let digest = blob.digest.as_str();
    let compression =
        compression(&blob.media_type).ok_or_else(|| UnpackError::UnknownMediaType {
            digest: digest.to_string(),
            media_type: blob.media_type.clone(),
        })?;
    let expected = match &blob.diff_id {
        Some(id) => match id.strip_prefix("sha256:") {
            Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => Some(id),
            _ => {
                return Err(UnpackError::BadDiffId {
                    digest: digest.to_string(),
                    diff_id: id.clone(),
                })
            }
        },
        None => None,
    };
    let file = File::open(&blob.path).map_err(|source| UnpackError::Store {
        op: "open the layer blob",
        path: blob.path.clone(),
        source,
    })?;
    let metered = Metered {
        inner: decompressor(compression, BufReader::with_capacity(1 << 16, file)),
        hash: expected.map(|_| Sha256::new()),
        left: bytes_left,
        exceeded: false,
    };
    let mut tar = TarReader::new(metered);
    let on_tar_error = |tar: &mut TarReader<Metered>, source: TarError| {
        if tar.get_mut().exceeded {
            UnpackError::Bound {
                digest: digest.to_string(),
                bound: Bound::Bytes,
            }
        } else {
            UnpackError::Tar {
                digest: digest.to_string(),
                source,
            }
        }
    };
    layer::apply_layer(&mut tar, fs, digest, tally, &on_tar_error)?;
    tar.drain().map_err(|e| on_tar_error(&mut tar, e))?;
    let metered = tar.get_mut();
    if let (Some(expected), Some(hash)) = (expected, metered.hash.take()) {
        let actual = format!("sha256:{}", crate::digest::hex(&hash.finalize()));
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(UnpackError::DiffIdMismatch {
                digest: digest.to_string(),
                expected: expected.clone(),
                actual,
            });
        }
    }
    Ok(metered.left)
}

#[derive(Debug, Clone, Copy)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The compression of a layer media type, OCI's or Docker's; `None` for one not a layer.
fn compression(media_type: &str) -> Option<Compression> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Some(Compression::Zstd),
        _ => None,
    }
}

fn decompressor(compression: Compression, blob: BufReader<File>) -> Box<dyn Read> {
    match compression {
        Compression::None => Box::new(blob),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(blob)),
        Compression::Zstd => Box::new(super::zstd::Frames::new(blob)),
    }
}

/// The uncompressed stream of one layer, counted against the image's byte budget and hashed
/// when a diff_id is to be checked.
struct Metered {
    inner: Box<dyn Read>,
    hash: Option<Sha256>,
    left: u64,
    /// Set when the budget ran out, so that the error is classified as the bound.
    exceeded: bool,
}

impl Read for Metered {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.exceeded = true;
            return Err(io::Error::other("the layer exceeds the byte bound"));
        }
        self.left -= n as u64;
        if let Some(hash) = &mut self.hash {
            hash.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// A key names a directory: it must be `ALGORITHM:HEX`, nothing a path could be made of.
fn check_key(key: &str) -> Result<(), UnpackError> {
    let ok = key.split_once(':').is_some_and(|(algorithm, hex)| {
        !algorithm.is_empty()
            && algorithm.len() <= 32
            && algorithm
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && (32..=128).contains(&hex.len())
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(UnpackError::BadKey {
            key: key.to_string(),
        })
    }
}

fn is_dir(path: &Path) -> bool {
    path.symlink_metadata().is_ok_and(|m| m.is_dir())
}

fn remove_temporaries(into: &Path, key: &str) -> io::Result<()> {
    let prefix = format!(".{key}.tmp-");
    for entry in std::fs::read_dir(into)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            crate::deep_remove::remove_tree(&entry.path())?;
        }
    }
    Ok(())
}

/// Makes the finished tree durable, then moves it into place (never over anything).
fn publish(temp: &Path, root: &Path) -> io::Result<()> {
    let dir = File::open(temp)?;
    // SAFETY: syncfs on a descriptor we own.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let from = crate::image::rootfs::c_name(temp.as_os_str().as_encoded_bytes())?;
    let to = crate::image::rootfs::c_name(root.as_os_str().as_encoded_bytes())?;
    // SAFETY: valid C strings.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    // A filesystem without RENAME_NOREPLACE: under the lock, nothing else makes the result,
    // so checking first is as good.
    if err.raw_os_error() == Some(libc::EINVAL) && !is_dir(root) {
        return std::fs::rename(temp, root);
    }
    Err(err)
}

/// An exclusive `flock`, held until the file is dropped (or the process dies). The wait is
/// bounded by the holder's unpacking, itself bounded by [`Limits`].
fn lock(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(file);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
