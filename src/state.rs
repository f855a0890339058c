//! Where wmo-e2b keeps its state: `$WMO_E2B_HOME`, default `~/.local/state/wmo-e2b`.

use std::path::PathBuf;

pub fn state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WMO_E2B_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".local/state/wmo-e2b")
}
