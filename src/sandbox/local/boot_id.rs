//! A sandbox's boot id: what its `/proc/sys/kernel/random/boot_id` reads. The host kernel's
//! is the same for every sandbox and never changes, while on E2B a sandbox that boots again
//! (a filesystem-only resume) reads a new one and one resumed with its memory the old one.
//! So each start of a sandbox's first holder writes a fresh id into the sandbox's directory,
//! and bwrap binds that file over the kernel's for every namespace of the sandbox.

use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The file, in the sandbox's directory.
const FILE: &str = "boot_id";
/// Where the sandbox's processes read it.
pub(super) const INSIDE: &str = "/proc/sys/kernel/random/boot_id";
/// A kernel boot id: a UUID and a newline.
const LEN: usize = 37;

/// The boot id file of the sandbox at `sandbox_dir`.
pub(super) fn path(sandbox_dir: &Path) -> PathBuf {
    sandbox_dir.join(FILE)
}

/// Gives the sandbox at `sandbox_dir` a new boot id. Written aside and renamed over the old
/// one, so namespaces started before keep reading the id they booted with.
pub(super) fn renew(sandbox_dir: &Path) -> io::Result<()> {
    let id = uuid_v4()?;
    let fresh = sandbox_dir.join(format!("{FILE}.new"));
    let _ = std::fs::remove_file(&fresh);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&fresh)?;
    f.write_all(format!("{id}\n").as_bytes())?;
    drop(f);
    std::fs::rename(&fresh, path(sandbox_dir))
}

/// The boot id of the sandbox at `sandbox_dir`, without its newline.
pub(super) fn read(sandbox_dir: &Path) -> io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path(sandbox_dir))?
        .take(LEN as u64 + 1)
        .read_to_string(&mut text)?;
    match text.strip_suffix('\n') {
        Some(id) if text.len() == LEN => Ok(id.to_string()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the sandbox's boot id file is not a boot id",
        )),
    }
}

/// A random (version 4) UUID in the kernel's form.
fn uuid_v4() -> io::Result<String> {
    let hex: Vec<char> = super::sys::random_hex(16)?.chars().collect();
    let variant = ['8', '9', 'a', 'b'][hex[16].to_digit(16).unwrap_or(0) as usize % 4];
    let part = |r: std::ops::Range<usize>| hex[r].iter().collect::<String>();
    Ok(format!(
        "{}-{}-4{}-{variant}{}-{}",
        part(0..8),
        part(8..12),
        part(13..16),
        part(17..20),
        part(20..32)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_renewal_is_a_new_id_in_the_kernels_form() {
        let dir = tempfile::tempdir().unwrap();
        renew(dir.path()).unwrap();
        let first = read(dir.path()).unwrap();
        assert_eq!(first.len(), LEN - 1);
        assert_eq!(first.matches('-').count(), 4);
        assert_eq!(&first[14..15], "4");
        renew(dir.path()).unwrap();
        assert_ne!(read(dir.path()).unwrap(), first);
    }
}
