//! Registry credentials and challenges: `user:pass` from the Docker config file
//! (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`), and the parsing of a
//! `WWW-Authenticate` challenge. Credentials are never logged and never put in an error.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use base64::Engine;
use serde::Deserialize;

use super::error::ImageError;
use super::reference::{DOCKER_HUB, DOCKER_HUB_API};

/// The Docker config file is small; a larger one is not it.
const MAX_DOCKER_CONFIG: u64 = 4 << 20;

#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

impl Credentials {
    /// The value of a `Basic` `Authorization` header.
    pub fn basic_header(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// The credentials of a Docker config file, by registry host.
#[derive(Debug, Clone, Default)]
pub struct CredentialStore {
    by_host: HashMap<String, Credentials>,
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl CredentialStore {
    /// Where Docker looks: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
    pub fn default_path() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
            return Some(PathBuf::from(dir).join("config.json"));
        }
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json"))
    }

    /// The credentials in `path`; none when the file does not exist. A file that does not
    /// parse is refused naming its line, never its content.
    pub fn load(path: &std::path::Path) -> Result<CredentialStore, ImageError> {
        let bad = |why: String| ImageError::Settings {
            path: path.to_path_buf(),
            why,
        };
        let bytes = match super::settings::read_bounded(path, MAX_DOCKER_CONFIG) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(CredentialStore::default()),
            Err(why) => return Err(bad(why)),
        };
        let config: DockerConfig = serde_json::from_slice(&bytes).map_err(|e| {
            bad(format!(
                "not a Docker config file (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        let mut by_host = HashMap::new();
        for (key, entry) in config.auths {
            let from_auth = entry.auth.as_deref().filter(|a| !a.is_empty()).map(|a| {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(a.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok());
                decoded
                    .as_deref()
                    .and_then(|pair| pair.split_once(':'))
                    .map(|(u, p)| Credentials {
                        username: u.to_string(),
                        password: p.to_string(),
                    })
                    .ok_or_else(|| bad(format!("auths.{key}.auth is not base64 of user:password")))
            });
            let creds = match (from_auth.transpose()?, entry.username, entry.password) {
                (Some(c), _, _) => c,
                (None, Some(username), Some(password)) => Credentials { username, password },
                _ => continue,
            };
            by_host.insert(host_of_key(&key), creds);
        }
        Ok(CredentialStore { by_host })
    }

    /// The credentials for a registry host (Docker Hub under any of its names).
    pub fn for_host(&self, host: &str) -> Option<&Credentials> {
        self.by_host.get(&canonical_host(host))
    }
}

/// A config key is a host or a URL (`https://index.docker.io/v1/`).
fn host_of_key(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    canonical_host(rest.split('/').next().unwrap_or(rest))
}

fn canonical_host(host: &str) -> String {
    match host {
        "index.docker.io" | DOCKER_HUB_API | DOCKER_HUB => DOCKER_HUB.to_string(),
        other => other.to_ascii_lowercase(),
    }
}

/// A `WWW-Authenticate` challenge we can answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
    Basic,
}

/// The first challenge in a `WWW-Authenticate` value that is `Bearer` (with a realm) or
/// `Basic`.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, params) = header.split_once(' ').unwrap_or((header, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let params = parse_params(params);
    let get = |k: &str| {
        params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.clone())
    };
    Some(Challenge::Bearer {
        realm: get("realm")?,
        service: get("service"),
        scope: get("scope"),
    })
}

/// `name=value` or `name="quoted, value"` pairs separated by commas.
fn parse_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ',' || c.is_whitespace()).is_some() {}
        let name: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if name.is_empty() || chars.next() != Some('=') {
            return out;
        }
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => value.extend(chars.next()),
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect();
        }
        out.push((name.trim().to_string(), value.trim().to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse_quoted_params() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/a:pull,push""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/a:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="x""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Negotiate"), None);
    }

    #[test]
    fn docker_config_credentials_by_host_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("me:s3cret:x");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths": {{"https://index.docker.io/v1/": {{"auth": "{auth}"}},
                   "127.0.0.1:5000": {{"username": "u", "password": "p"}},
                   "empty.io": {{}}}}}}"#
            ),
        )
        .unwrap();
        let store = CredentialStore::load(&path).unwrap();
        let hub = store.for_host("registry-1.docker.io").unwrap();
        assert_eq!(
            (hub.username.as_str(), hub.password.as_str()),
            ("me", "s3cret:x")
        );
        assert_eq!(store.for_host("127.0.0.1:5000").unwrap().password, "p");
        assert!(store.for_host("empty.io").is_none());
        assert!(!format!("{hub:?}").contains("s3cret"));
        std::fs::write(&path, r#"{"auths": {"x": {"auth": "s3cret-not-base64!"}}}"#).unwrap();
        let e = CredentialStore::load(&path).unwrap_err().to_string();
        assert!(!e.contains("s3cret"), "{e}");
        std::fs::write(&path, r#"{"auths": {"x": {"auth": 12345678}}}"#).unwrap();
        let e = CredentialStore::load(&path).unwrap_err().to_string();
        assert!(!e.contains("12345678") && e.contains("line 1"), "{e}");
    }
}
