//! Where wmo-e2b keeps its state (`$WMO_E2B_HOME`, default `~/.local/state/wmo-e2b`), and how a
//! file of it is written so that a reader finds it whole or absent.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

pub fn state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WMO_E2B_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".local/state/wmo-e2b")
}

/// Writes `bytes` to `path` whole or not at all: beside it first (a name of this call's
/// own), synced, then renamed into place; on failure nothing of this call is left.
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(".{}.tmp", crate::id::unique_hex(8)));
    let temp = PathBuf::from(temp);
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_written_whole_and_nothing_is_left_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        write_whole(&path, b"one").unwrap();
        write_whole(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        let missing = dir.path().join("no-such-dir/record.json");
        assert!(write_whole(&missing, b"x").is_err());
    }
}
