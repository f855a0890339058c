//! Per-registry settings from `$WMO_E2B_HOME/registries.toml`: pull-through mirrors, tried
//! before the registry itself, and registries reached over plain HTTP:
//!
//! ```toml
//! [registries."docker.io"]
//! mirrors = ["mirror.internal:5000"]
//!
//! [registries."mirror.internal:5000"]
//! insecure = true
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::ImageError;

/// A settings file larger than this is not one.
const MAX_SETTINGS: u64 = 1 << 20;
/// Mirrors per registry.
const MAX_MIRRORS: usize = 8;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryConfig {
    registries: BTreeMap<String, RegistrySettings>,
    /// Where the Docker config file is looked for; `None`: `$DOCKER_CONFIG/config.json`, else
    /// `~/.docker/config.json`.
    pub docker_config: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// `host[:port]` of pull-through caches, in the order tried.
    #[serde(default)]
    pub mirrors: Vec<String>,
    /// Reached over plain HTTP.
    #[serde(default)]
    pub insecure: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    registries: BTreeMap<String, RegistrySettings>,
}

impl RegistryConfig {
    /// `$WMO_E2B_HOME/registries.toml`, or no settings when it does not exist.
    pub fn load_default() -> Result<RegistryConfig, ImageError> {
        RegistryConfig::load(&crate::state::state_dir().join("registries.toml"))
    }

    pub fn load(path: &Path) -> Result<RegistryConfig, ImageError> {
        let bad = |why: String| ImageError::Settings {
            path: path.to_path_buf(),
            why,
        };
        let text = match read_bounded(path, MAX_SETTINGS) {
            Ok(Some(bytes)) => String::from_utf8(bytes).map_err(|_| bad("not UTF-8".into()))?,
            Ok(None) => return Ok(RegistryConfig::default()),
            Err(why) => return Err(bad(why)),
        };
        let file: File = toml::from_str(&text).map_err(|e| bad(e.message().to_string()))?;
        for (registry, settings) in &file.registries {
            let hosts = std::iter::once(registry).chain(&settings.mirrors);
            if let Some(host) = hosts.into_iter().find(|h| !is_host(h)) {
                return Err(bad(format!("{host:?} is not a registry host[:port]")));
            }
            if settings.mirrors.len() > MAX_MIRRORS {
                return Err(bad(format!("{registry}: more than {MAX_MIRRORS} mirrors")));
            }
        }
        Ok(RegistryConfig {
            registries: file.registries,
            docker_config: None,
        })
    }

    /// Settings for one registry, made in code (tests, callers with their own source).
    pub fn with(mut self, registry: &str, settings: RegistrySettings) -> RegistryConfig {
        self.registries.insert(registry.to_string(), settings);
        self
    }

    /// Every registry with settings, by name.
    pub fn registries(&self) -> impl Iterator<Item = (&str, &RegistrySettings)> {
        self.registries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn mirrors(&self, registry: &str) -> &[String] {
        self.registries
            .get(registry)
            .map_or(&[][..], |s| s.mirrors.as_slice())
    }

    /// `http` for loopback hosts and those named insecure (as Docker does), else `https`.
    pub fn scheme(&self, host: &str) -> &'static str {
        if self.plain_http_allowed(host) {
            "http"
        } else {
            "https"
        }
    }

    pub fn plain_http_allowed(&self, host: &str) -> bool {
        is_loopback(host) || self.registries.get(host).is_some_and(|s| s.insecure)
    }
}

/// A file's bytes, `None` when it does not exist; at most `max` of them.
pub(super) fn read_bounded(path: &Path, max: u64) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    Ok(Some(bytes))
}

fn is_host(host: &str) -> bool {
    super::reference::Reference::parse(&format!("{host}/x")).is_ok_and(|r| r.registry == host)
}

/// `localhost`, 127.0.0.0/8 or ::1, with or without a port.
pub fn is_loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    name == "localhost" || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_for_loopback_and_insecure_registries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registries.toml");
        std::fs::write(
            &path,
            "[registries.\"docker.io\"]\nmirrors = [\"m.internal:5000\"]\n\
             [registries.\"m.internal:5000\"]\ninsecure = true\n",
        )
        .unwrap();
        let c = RegistryConfig::load(&path).unwrap();
        assert_eq!(c.mirrors("docker.io"), ["m.internal:5000"]);
        assert_eq!(c.scheme("m.internal:5000"), "http");
        assert_eq!(c.scheme("m.internal"), "https");
        assert_eq!(c.scheme("registry-1.docker.io"), "https");
        for local in ["localhost:5000", "127.0.0.1:1", "127.9.9.9", "[::1]:5000"] {
            assert_eq!(c.scheme(local), "http", "{local}");
        }
        for remote in [
            "localhost.evil.io",
            "128.0.0.1:5000",
            "[::2]:5000",
            "10.0.0.1",
        ] {
            assert_eq!(c.scheme(remote), "https", "{remote}");
        }
        assert_eq!(
            RegistryConfig::load(&dir.path().join("none")).unwrap(),
            RegistryConfig::default()
        );
        std::fs::write(&path, "[registries.\"x.io\"]\nmirors = []\n").unwrap();
        assert!(RegistryConfig::load(&path).unwrap_err().is_bad_input());
        std::fs::write(&path, "[registries.\"x.io\"]\nmirrors = [\"a b\"]\n").unwrap();
        assert!(RegistryConfig::load(&path)
            .unwrap_err()
            .to_string()
            .contains("\"a b\""));
    }
}
