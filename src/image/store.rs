//! The content-addressed image store under `$WMO_E2B_HOME/images/`, shared by every run on
//! the machine:
//!
//! - `blobs/sha256/<hex>`: manifests, configs and layers, each written to `tmp/`, its digest
//!   checked while it streams, then renamed into place, so an entry is never half-written;
//! - `locks/<hex>`: one `flock` per blob, so one download serves every thread and process
//!   that asks at once (the next holder finds the blob there);
//! - `refs/<sha256 of the reference>.json`: what each pulled reference resolved to, for
//!   `image list`, and which blobs it uses, for `prune`;
//! - `store.lock`: pulls hold it shared, `prune` exclusive, so nothing is pruned mid-pull.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::reference::Digest;

/// How long a pull waits for another download of the same blob (a large layer on a slow
/// link) before giving up.
const BLOB_LOCK_WAIT: Duration = Duration::from_secs(30 * 60);
/// How long a pull waits for a prune to finish, or a prune for pulls to finish.
const STORE_LOCK_WAIT: Duration = Duration::from_secs(10 * 60);

/// A record is a few hundred bytes; a bigger file there is not ours.
const MAX_RECORD: u64 = 1 << 20;
/// The most records `list` and `prune` read.
const MAX_RECORDS: usize = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("image store: {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("blob {expected}: the bytes received hash to {actual}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("blob {digest}: the download broke off after {received} bytes{}", expected.map(|n| format!(" of {n}")).unwrap_or_default())]
    Truncated {
        digest: Digest,
        expected: Option<u64>,
        received: u64,
        #[source]
        source: Option<io::Error>,
    },
    #[error("blob {digest}: more than the {expected} bytes its descriptor gives")]
    Oversized { digest: Digest, expected: u64 },
    #[error("image store: waited {} s for {what}", wait.as_secs())]
    LockTimeout { what: String, wait: Duration },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a pulled reference resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Canonical, as [`super::reference::Reference`] displays it.
    pub reference: String,
    /// The content the reference names (an index or a manifest): what provenance carries.
    pub digest: String,
    /// The manifest for this machine's platform (the same as `digest` without an index).
    pub manifest_digest: String,
    /// Every blob the image uses here: index, manifest, config, layers.
    pub blobs: Vec<String>,
    /// Seconds since the Unix epoch.
    pub pulled_at: u64,
}

/// What a prune removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    pub records: usize,
    pub blobs: usize,
    /// Unpacked roots removed.
    pub roots: usize,
    pub bytes: u64,
}

/// A held `flock`, released on drop.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The store under `$WMO_E2B_HOME/images`.
    pub fn open_default() -> Result<Store, StoreError> {
        Store::open(&crate::state::state_dir().join("images"))
    }

    /// The store at `root`, its directories made if missing.
    pub fn open(root: &Path) -> Result<Store, StoreError> {
        for dir in ["blobs/sha256", "locks", "refs", "tmp"] {
            let path = root.join(dir);
            fs::create_dir_all(&path).map_err(io_at(&path))?;
        }
        Ok(Store {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    /// Whether the blob is there; an entry only appears whole and checked.
    pub fn has_blob(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    /// The blob's bytes when it is there and at most `max` long.
    pub fn read_blob(&self, digest: &Digest, max: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.blob_path(digest);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_at(&path)(e)),
        };
        let mut bytes = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(io_at(&path))?;
        if bytes.len() as u64 > max {
            return Err(StoreError::Oversized {
                digest: digest.clone(),
                expected: max,
            });
        }
        Ok(Some(bytes))
    }

    /// The store's shared lock, held for a whole pull so that no prune removes what the pull
    /// has fetched but not yet recorded.
    pub fn pull_lock(&self) -> Result<StoreLock, StoreError> {
        take_lock(
            &self.root.join("store.lock"),
            libc::LOCK_SH,
            STORE_LOCK_WAIT,
            "a prune",
        )
    }

    /// The blob's path, fetching it with `open` first when it is absent. One caller at a time
    /// fetches a given blob; the others wait and find it there. The bytes are checked against
    /// `digest` (and `size`, when known) as they stream; on any failure nothing is left.
    /// The caller holds [`Store::pull_lock`] until what it fetched is recorded.
    pub fn fetch_blob<R: Read, E: From<StoreError>>(
        &self,
        digest: &Digest,
        size: Option<u64>,
        open: impl FnOnce() -> Result<R, E>,
    ) -> Result<PathBuf, E> {
        let path = self.blob_path(digest);
        if path.is_file() {
            return Ok(path);
        }
        let lock_path = self.root.join("locks").join(digest.hex());
        let _lock = take_lock(
            &lock_path,
            libc::LOCK_EX,
            BLOB_LOCK_WAIT,
            "another download",
        )?;
        if path.is_file() {
            return Ok(path);
        }
        let source = open()?;
        let temp = self.ingest(digest, size, source)?;
        temp.persist(&path)?;
        Ok(path)
    }

    /// Writes `bytes` as the blob `digest` (checked) unless it is there.
    pub fn put_blob(&self, digest: &Digest, bytes: &[u8]) -> Result<PathBuf, StoreError> {
        self.fetch_blob(digest, Some(bytes.len() as u64), || {
            Ok::<_, StoreError>(bytes)
        })
    }

    fn ingest(
        &self,
        digest: &Digest,
        size: Option<u64>,
        mut source: impl Read,
    ) -> Result<TempBlob, StoreError> {
        let temp = TempBlob::create(&self.root.join("tmp"), digest)?;
        let mut file = &temp.file;
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        let mut block = vec![0u8; 1 << 16];
        loop {
            let n = match source.read(&mut block) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(StoreError::Truncated {
                        digest: digest.clone(),
                        expected: size,
                        received,
                        source: Some(e),
                    })
                }
            };
            received += n as u64;
            if size.is_some_and(|s| received > s) {
                return Err(StoreError::Oversized {
                    digest: digest.clone(),
                    expected: size.unwrap_or_default(),
                });
            }
            hasher.update(&block[..n]);
            file.write_all(&block[..n]).map_err(io_at(&temp.path))?;
        }
        if let Some(expected) = size.filter(|&s| received < s) {
            return Err(StoreError::Truncated {
                digest: digest.clone(),
                expected: Some(expected),
                received,
                source: None,
            });
        }
        let actual = format!("sha256:{}", crate::digest::hex(&hasher.finalize()));
        if actual != digest.as_str() {
            return Err(StoreError::DigestMismatch {
                expected: digest.clone(),
                actual: Digest::parse(&actual).unwrap_or_else(|| digest.clone()),
            });
        }
        file.sync_all().map_err(io_at(&temp.path))?;
        Ok(temp)
    }

    /// Records what `record.reference` resolved to, replacing an earlier record of it.
    pub fn record(&self, record: &Record) -> Result<(), StoreError> {
        let name = format!(
            "{}.json",
            crate::digest::sha256_hex(record.reference.as_bytes())
        );
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| io_at(&self.root)(e.into()))?;
        let temp = TempBlob::create(&self.root.join("tmp"), &Digest::of(&bytes))?;
        (&temp.file).write_all(&bytes).map_err(io_at(&temp.path))?;
        temp.persist(&self.root.join("refs").join(name))
    }

    /// The record of a canonical reference, when one was pulled.
    pub fn lookup(&self, reference: &str) -> Option<Record> {
        let name = format!("{}.json", crate::digest::sha256_hex(reference.as_bytes()));
        read_record(&self.root.join("refs").join(name)).filter(|r| r.reference == reference)
    }

    /// Every readable record, by reference.
    pub fn records(&self) -> Result<Vec<Record>, StoreError> {
        let mut records: Vec<Record> = self
            .record_files()?
            .iter()
            .filter_map(|p| read_record(p))
            .collect();
        records.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(records)
    }

    fn record_files(&self) -> Result<Vec<PathBuf>, StoreError> {
        let dir = self.root.join("refs");
        let mut files = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_at(&dir))?.take(MAX_RECORDS) {
            files.push(entry.map_err(io_at(&dir))?.path());
        }
        Ok(files)
    }

    /// Removes every record whose image is not in `keep` (index or manifest digests: what
    /// live sandboxes use), every blob no kept record uses and not itself in `keep`, and what
    /// interrupted downloads left. Waits for running pulls to finish first.
    pub fn prune(&self, keep: &HashSet<String>) -> Result<Pruned, StoreError> {
        let _lock = take_lock(
            &self.root.join("store.lock"),
            libc::LOCK_EX,
            STORE_LOCK_WAIT,
            "running pulls and evals on images",
        )?;
        let mut pruned = Pruned::default();
        let mut kept_blobs: HashSet<String> = keep.clone();
        for path in self.record_files()? {
            match read_record(&path) {
                Some(r) if keep.contains(&r.digest) || keep.contains(&r.manifest_digest) => {
                    kept_blobs.extend(r.blobs);
                }
                _ => {
                    remove_file(&path)?;
                    pruned.records += 1;
                }
            }
        }
        let blobs = self.root.join("blobs/sha256");
        for entry in fs::read_dir(&blobs).map_err(io_at(&blobs))? {
            let entry = entry.map_err(io_at(&blobs))?;
            let name = entry.file_name();
            let kept = name
                .to_str()
                .is_some_and(|hex| kept_blobs.contains(&format!("sha256:{hex}")));
            if !kept {
                pruned.bytes += entry.metadata().map_or(0, |m| m.len());
                remove_file(&entry.path())?;
                pruned.blobs += 1;
            }
        }
        // Unpacked roots are named by their manifest digest (see `unpacked`); a temporary
        // one (dot-named) is a dead unpack's, since unpacks run under the shared lock.
        let roots = self.root.join(super::unpacked::ROOTFS_DIR);
        if let Ok(entries) = fs::read_dir(&roots) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let kept = name.to_str().is_some_and(|n| keep.contains(n));
                let is_lock = name.to_str().is_some_and(|n| n.ends_with(".lock"));
                if !kept && !is_lock {
                    crate::deep_remove::remove_tree(&entry.path()).map_err(io_at(&entry.path()))?;
                    pruned.roots += 1;
                }
            }
        }
        // No pull runs while the exclusive lock is held: what is in tmp/ was left by one that
        // died, and no one waits on a blob's lock file.
        for dir in ["tmp", "locks"] {
            let dir = self.root.join(dir);
            for entry in fs::read_dir(&dir).map_err(io_at(&dir))? {
                remove_file(&entry.map_err(io_at(&dir))?.path())?;
            }
        }
        Ok(pruned)
    }
}

fn remove_file(path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_at(path)(e)),
        _ => Ok(()),
    }
}

fn read_record(path: &Path) -> Option<Record> {
    let file = File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_RECORD).read_to_end(&mut bytes).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An `flock` of `path` (`LOCK_SH` or `LOCK_EX`), waited for up to `wait`; `what` names the
/// holder waited on, in the error.
pub(super) fn take_lock(
    path: &Path,
    how: i32,
    wait: Duration,
    what: &str,
) -> Result<StoreLock, StoreError> {
    match crate::sync::flock_within(path, how, wait).map_err(io_at(path))? {
        Some(file) => Ok(StoreLock { _file: file }),
        None => Err(StoreError::LockTimeout {
            what: what.to_string(),
            wait,
        }),
    }
}

/// A file in the store's `tmp/`, removed on drop unless persisted.
struct TempBlob {
    file: File,
    path: PathBuf,
    persisted: bool,
}

impl TempBlob {
    fn create(dir: &Path, digest: &Digest) -> Result<TempBlob, StoreError> {
        let mut attempt = 0u32;
        loop {
            let path = dir.join(format!(
                "{}.{}.{}",
                digest.hex(),
                std::process::id(),
                crate::id::unique_hex(8)
            ));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    return Ok(TempBlob {
                        file,
                        path,
                        persisted: false,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
                Err(e) => return Err(io_at(&path)(e)),
            }
        }
    }

    fn persist(mut self, to: &Path) -> Result<(), StoreError> {
        fs::rename(&self.path, to).map_err(io_at(to))?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for TempBlob {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
