//! Where the E2B backend sends its requests and with which credentials. The environment rules
//! are the official SDK's, so a shell that drives the Python SDK drives this backend too.

use std::fmt;

use crate::sandbox::{ErrorClass, SandboxError};

/// The API key, sent as `X-API-Key` on every control-plane call.
pub const API_KEY_VAR: &str = "E2B_API_KEY";
/// The base domain of the API and of sandbox hosts.
pub const DOMAIN_VAR: &str = "E2B_DOMAIN";
/// Overrides the control-plane base URL (the emulator sets it).
pub const API_URL_VAR: &str = "E2B_API_URL";
/// Overrides the envd base URL of every sandbox (the emulator sets it).
pub const SANDBOX_URL_VAR: &str = "E2B_SANDBOX_URL";

pub const DEFAULT_DOMAIN: &str = "e2b.app";
/// The port envd listens on inside every sandbox.
pub const ENVD_PORT: u16 = 49983;
/// Ours, never `connect-python`: envd rewrites filesystem replies for that one.
pub const USER_AGENT: &str = concat!("wmo-e2b/", env!("CARGO_PKG_VERSION"));

/// A setting the E2B backend cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var} is not set; the e2b backend needs an E2B API key")]
    MissingKey { var: &'static str },
    #[error("{var}={value:?} is not an http:// or https:// URL")]
    BadUrl { var: &'static str, value: String },
    #[error("e2b option {name} {reason}")]
    BadOption { name: &'static str, reason: String },
}

impl From<ConfigError> for SandboxError {
    fn from(e: ConfigError) -> SandboxError {
        let class = match e {
            ConfigError::MissingKey { .. } => ErrorClass::Auth,
            ConfigError::BadUrl { .. } | ConfigError::BadOption { .. } => ErrorClass::BadRequest,
        };
        SandboxError::Remote {
            class,
            message: "the e2b backend is not configured".to_string(),
            source: Some(Box::new(e)),
        }
    }
}

/// Endpoints and credentials, resolved once.
#[derive(Clone, PartialEq, Eq)]
pub struct E2bConfig {
    pub api_key: String,
    /// Used for sandbox hosts when a create/connect response names no domain.
    pub domain: String,
    /// Control-plane base, without a trailing slash.
    pub api_base: String,
    /// envd base for every sandbox, without a trailing slash; routing is then by header.
    pub sandbox_url: Option<String>,
}

impl fmt::Debug for E2bConfig {
    // The key stays out of logs and panic messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("E2bConfig")
            .field("api_key", &"<redacted>")
            .field("domain", &self.domain)
            .field("api_base", &self.api_base)
            .field("sandbox_url", &self.sandbox_url)
            .finish()
    }
}

impl E2bConfig {
    /// Reads `E2B_API_KEY`, `E2B_DOMAIN`, `E2B_API_URL` and `E2B_SANDBOX_URL`.
    pub fn from_env() -> Result<E2bConfig, ConfigError> {
        E2bConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// The same rules over any variable source (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<E2bConfig, ConfigError> {
        // An empty variable counts as unset, as in the SDK.
        let var = |name: &str| {
            get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let api_key = var(API_KEY_VAR).ok_or(ConfigError::MissingKey { var: API_KEY_VAR })?;
        let domain = var(DOMAIN_VAR).unwrap_or_else(|| DEFAULT_DOMAIN.to_string());
        let api_base = match var(API_URL_VAR) {
            Some(url) => checked_url(API_URL_VAR, url)?,
            None => format!("https://api.{domain}"),
        };
        let sandbox_url = var(SANDBOX_URL_VAR)
            .map(|url| checked_url(SANDBOX_URL_VAR, url))
            .transpose()?;
        Ok(E2bConfig {
            api_key,
            domain,
            api_base,
            sandbox_url,
        })
    }

    /// The envd base URL of one sandbox: the override if set, else its own host under the
    /// domain the create/connect response named (or ours).
    pub fn envd_base(&self, sandbox_id: &str, response_domain: Option<&str>) -> String {
        if let Some(url) = &self.sandbox_url {
            return url.clone();
        }
        let domain = response_domain
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .unwrap_or(&self.domain);
        format!("https://{ENVD_PORT}-{sandbox_id}.{domain}")
    }
}

fn checked_url(var: &'static str, url: String) -> Result<String, ConfigError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(host) if !host.is_empty() && !host.starts_with('/') => {
            Ok(url.trim_end_matches('/').to_string())
        }
        _ => Err(ConfigError::BadUrl { var, value: url }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<E2bConfig, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        E2bConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn a_missing_or_blank_key_names_the_variable() {
        for vars in [&[][..], &[(API_KEY_VAR, "  ")][..]] {
            let err = config(vars).unwrap_err();
            assert!(matches!(
                err,
                ConfigError::MissingKey { var: "E2B_API_KEY" }
            ));
            assert!(err.to_string().contains("E2B_API_KEY"));
        }
    }

    #[test]
    fn defaults_follow_the_domain() {
        let c = config(&[(API_KEY_VAR, "e2b_1")]).unwrap();
        assert_eq!(c.api_base, "https://api.e2b.app");
        assert_eq!(c.envd_base("isb1", None), "https://49983-isb1.e2b.app");
        assert_eq!(
            c.envd_base("isb1", Some("eu.e2b.dev")),
            "https://49983-isb1.eu.e2b.dev"
        );
        assert_eq!(c.envd_base("isb1", Some("")), "https://49983-isb1.e2b.app");

        let c = config(&[(API_KEY_VAR, "k"), (DOMAIN_VAR, "example.org")]).unwrap();
        assert_eq!(c.api_base, "https://api.example.org");
        assert_eq!(c.envd_base("x", None), "https://49983-x.example.org");
    }

    #[test]
    fn overrides_win_and_lose_their_trailing_slash() {
        let c = config(&[
            (API_KEY_VAR, "k"),
            (DOMAIN_VAR, "example.org"),
            (API_URL_VAR, "http://127.0.0.1:3000/"),
            (SANDBOX_URL_VAR, "http://127.0.0.1:49983"),
        ])
        .unwrap();
        assert_eq!(c.api_base, "http://127.0.0.1:3000");
        assert_eq!(c.envd_base("x", Some("other")), "http://127.0.0.1:49983");
    }

    #[test]
    fn bad_urls_are_refused() {
        for bad in ["127.0.0.1:3000", "ftp://x", "http://", "https:///x"] {
            let err = config(&[(API_KEY_VAR, "k"), (API_URL_VAR, bad)]).unwrap_err();
            assert!(
                matches!(
                    err,
                    ConfigError::BadUrl {
                        var: "E2B_API_URL",
                        ..
                    }
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn debug_hides_the_key() {
        let c = config(&[(API_KEY_VAR, "e2b_secret")]).unwrap();
        assert!(!format!("{c:?}").contains("secret"));
    }
}
