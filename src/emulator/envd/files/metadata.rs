//! File metadata (envd >= 0.6.2): the `X-Metadata-<key>` headers of an upload, kept on each
//! file as the extended attribute `user.e2b.<key>`, and read back as `EntryInfo.metadata`.
//!
//! Every attribute call goes through a descriptor the confined opens handed out, never a
//! path, so it acts on the file those checked and nothing a symlink swapped in since.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use crate::sandbox::local::confined::Beneath;

/// What E2B's metadata is, key to value.
pub(super) type FileMetadata = BTreeMap<String, String>;

/// The namespace envd keeps metadata in; other attributes are left alone.
const XATTR_PREFIX: &str = "user.e2b.";
const HEADER_PREFIX: &str = "x-metadata-";
/// Linux caps an attribute name at 255 bytes, 9 of which the prefix takes.
pub(super) const MAX_KEY_BYTES: usize = 246;
/// Keys and values of one upload together.
pub(super) const MAX_TOTAL_BYTES: usize = 4096;
/// Linux's own caps on a file's attribute list and on one value (`XATTR_LIST_MAX`,
/// `XATTR_SIZE_MAX`): what the sandbox set itself can be no larger.
const MAX_LIST_BYTES: usize = 64 * 1024;
const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Read-backs of a file's attributes that grew between sizing and reading, before giving up.
const RESIZE_RETRIES: usize = 3;

/// Why an upload's metadata headers are refused (envd answers 400).
#[derive(Debug, thiserror::Error)]
pub(super) enum MetadataError {
    #[error("key {0:?} is not printable ASCII")]
    KeyNotPrintable(String),
    #[error("the value of key {0:?} is not printable ASCII")]
    ValueNotPrintable(String),
    #[error("key {key:?}... is {len} bytes, more than {MAX_KEY_BYTES}")]
    KeyTooLong { key: String, len: usize },
    #[error("keys and values are {0} bytes in all, more than {MAX_TOTAL_BYTES}")]
    TooLarge(usize),
}

/// Why storing metadata on a written file failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum StoreError {
    /// The disk or the quota is full (envd answers 507).
    #[error("not enough space for file metadata: {0}")]
    NoSpace(#[source] io::Error),
    #[error("error writing file metadata: {0}")]
    Failed(#[source] io::Error),
}

/// The metadata an upload's headers carry: each `X-Metadata-<key>`, its key lowercased; an
/// empty key is dropped and a repeated one keeps its first value, as envd reads them.
pub(super) fn from_headers(headers: &[(String, String)]) -> Result<FileMetadata, MetadataError> {
    let mut meta = FileMetadata::new();
    let mut total = 0usize;
    for (name, value) in headers {
        let Some(key) = name
            .to_ascii_lowercase()
            .strip_prefix(HEADER_PREFIX)
            .map(str::to_string)
        else {
            continue;
        };
        if key.is_empty() || meta.contains_key(&key) {
            continue;
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(MetadataError::KeyNotPrintable(key));
        }
        if key.len() > MAX_KEY_BYTES {
            let len = key.len();
            return Err(MetadataError::KeyTooLong {
                key: key[..32.min(len)].to_string(),
                len,
            });
        }
        if !value.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
            return Err(MetadataError::ValueNotPrintable(key));
        }
        total = total.saturating_add(key.len() + value.len());
        if total > MAX_TOTAL_BYTES {
            return Err(MetadataError::TooLarge(total));
        }
        meta.insert(key, value.clone());
    }
    Ok(meta)
}

/// Makes `meta` the file's whole metadata: keys it lacks are removed, so an overwrite leaves
/// none of the last upload's behind. A filesystem without user attributes keeps none, which
/// the read-back then shows, as envd does.
pub(super) fn replace(file: &File, meta: &FileMetadata) -> Result<(), StoreError> {
    let classify = |e: io::Error| match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => StoreError::NoSpace(e),
        _ => StoreError::Failed(e),
    };
    let names = match list(file) {
        Ok(names) => names,
        Err(e) if unsupported(&e) => return Ok(()),
        Err(e) => return Err(classify(e)),
    };
    for name in names {
        let stale = name
            .strip_prefix(XATTR_PREFIX)
            .is_some_and(|key| !meta.contains_key(key));
        if !stale {
            continue;
        }
        if let Err(e) = remove(file, &name) {
            // Removed meanwhile by the sandbox: gone is what was wanted.
            if e.raw_os_error() != Some(libc::ENODATA) {
                return Err(classify(e));
            }
        }
    }
    for (key, value) in meta {
        match set(file, &format!("{XATTR_PREFIX}{key}"), value.as_bytes()) {
            Err(e) if unsupported(&e) => return Ok(()),
            Err(e) => return Err(classify(e)),
            Ok(()) => {}
        }
    }
    Ok(())
}

/// The metadata of what `rel` leads to (a file or directory, symlinks followed beneath);
/// empty when it has none or cannot be read, as envd reports it.
pub(super) fn metadata_of(files: &Beneath, rel: &str) -> FileMetadata {
    files.open_entry(rel).map(|f| read(&f)).unwrap_or_default()
}

/// The file's metadata: its `user.e2b.*` attributes, the prefix stripped (values that are not
/// UTF-8 are read lossily). Empty when it has none or they cannot be read.
pub(super) fn read(file: &File) -> FileMetadata {
    let Ok(names) = list(file) else {
        return FileMetadata::new();
    };
    names
        .iter()
        .filter_map(|name| {
            let key = name.strip_prefix(XATTR_PREFIX)?;
            let value = get(file, name).ok()?;
            Some((
                key.to_string(),
                String::from_utf8_lossy(&value).into_owned(),
            ))
        })
        .collect()
}

fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP))
}

/// The file's attribute names (those that are not UTF-8 cannot be E2B's, and are skipped).
fn list(file: &File) -> io::Result<Vec<String>> {
    let fd = file.as_raw_fd();
    let raw = sized(MAX_LIST_BYTES, |buf| {
        let (ptr, len) = buf_parts(buf);
        // SAFETY: `ptr` points to `len` writable bytes (or is null with `len` 0).
        unsafe { libc::flistxattr(fd, ptr, len) }
    })?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .filter_map(|n| std::str::from_utf8(n).ok().map(str::to_string))
        .collect())
}

fn get(file: &File, name: &str) -> io::Result<Vec<u8>> {
    let fd = file.as_raw_fd();
    let c = cname(name)?;
    sized(MAX_VALUE_BYTES, |buf| {
        let (ptr, len) = buf_parts(buf);
        // SAFETY: a valid C string; `ptr` points to `len` writable bytes (or is null, 0).
        unsafe { libc::fgetxattr(fd, c.as_ptr(), ptr.cast(), len) }
    })
}

fn set(file: &File, name: &str, value: &[u8]) -> io::Result<()> {
    let c = cname(name)?;
    // SAFETY: a valid C string and a buffer of `value.len()` bytes.
    let rc = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            c.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn remove(file: &File, name: &str) -> io::Result<()> {
    let c = cname(name)?;
    // SAFETY: a valid C string.
    if unsafe { libc::fremovexattr(file.as_raw_fd(), c.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn cname(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

fn buf_parts(buf: &mut [u8]) -> (*mut libc::c_char, usize) {
    if buf.is_empty() {
        (std::ptr::null_mut(), 0)
    } else {
        (buf.as_mut_ptr().cast(), buf.len())
    }
}

/// Runs a Linux "size, then fill" attribute call: asks for the size with an empty buffer,
/// then fills one that large (at most `max`), again when it grew in between.
fn sized(max: usize, mut call: impl FnMut(&mut [u8]) -> libc::ssize_t) -> io::Result<Vec<u8>> {
    for _ in 0..RESIZE_RETRIES {
        let want = usize::try_from(call(&mut [])).map_err(|_| io::Error::last_os_error())?;
        if want > max {
            return Err(io::Error::from_raw_os_error(libc::E2BIG));
        }
        let mut buf = vec![0u8; want];
        match usize::try_from(call(&mut buf)) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(_) => {
                let err = io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::ERANGE) {
                    return Err(err);
                }
            }
        }
    }
    Err(io::Error::from_raw_os_error(libc::ERANGE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn headers_become_lowercase_keys_first_value_wins() {
        let meta = from_headers(&headers(&[
            ("x-metadata-Author", "mish"),
            ("content-type", "application/octet-stream"),
            ("x-metadata-author", "second"),
            ("x-metadata-", "dropped"),
            ("x-metadata-empty", ""),
        ]))
        .unwrap();
        let want: FileMetadata = [("author", "mish"), ("empty", "")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(meta, want);
    }

    #[test]
    fn bad_metadata_is_refused() {
        let long_key = format!("x-metadata-{}", "k".repeat(MAX_KEY_BYTES + 1));
        let fits = format!("x-metadata-{}", "k".repeat(MAX_KEY_BYTES));
        assert!(from_headers(&headers(&[(&fits, "v")])).is_ok());
        assert!(matches!(
            from_headers(&headers(&[(&long_key, "v")])),
            Err(MetadataError::KeyTooLong { len, .. }) if len == MAX_KEY_BYTES + 1
        ));
        assert!(matches!(
            from_headers(&headers(&[("x-metadata-a", "tab\there")])),
            Err(MetadataError::ValueNotPrintable(_))
        ));
        assert!(matches!(
            from_headers(&headers(&[("x-metadata-a", "caf\u{e9}")])),
            Err(MetadataError::ValueNotPrintable(_))
        ));
        let big = "v".repeat(2000);
        assert!(matches!(
            from_headers(&headers(&[
                ("x-metadata-a", &big),
                ("x-metadata-b", &big),
                ("x-metadata-c", &big),
            ])),
            Err(MetadataError::TooLarge(n)) if n > MAX_TOTAL_BYTES
        ));
    }
}
