//! The control plane's JSON: what a create asks for, what create, connect, info and list
//! answer, and the forms of ids, list filters and times on the wire.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::sandbox::{Metadata, OnTimeout, RunState, SandboxSummary};

/// What a create asks for.
#[derive(Debug, Clone)]
pub struct NewSandbox {
    pub template: String,
    pub timeout_secs: u64,
    pub metadata: Metadata,
    pub env_vars: BTreeMap<String, String>,
    pub internet: bool,
    /// Sent as `Idempotency-Key`, so that a create repeated after a lost or failed answer
    /// gets the sandbox the first one made instead of a second. Only a key of the documented
    /// form (1-255 of `[a-z0-9-]`) is sent.
    pub idempotency_key: Option<String>,
    pub on_timeout: OnTimeout,
}

/// The parts of a create/connect answer a sandbox handle needs.
#[derive(Debug, Clone, Deserialize)]
pub struct SandboxAccess {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: Option<String>,
    /// The base domain of the sandbox's host, when it differs from ours.
    pub domain: Option<String>,
    #[serde(rename = "envdVersion")]
    pub envd_version: Option<String>,
}

/// A sandbox as `GET /sandboxes/{id}` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxDetail {
    pub id: String,
    pub template_id: Option<String>,
    pub alias: Option<String>,
    pub metadata: Metadata,
    /// Unix seconds; 0 when the answer had no parsable time.
    pub started: u64,
    /// Unix seconds; 0 when the answer had no parsable time.
    pub end: u64,
    /// `running` or `paused`.
    pub state: String,
    pub envd_version: Option<String>,
}

/// One entry of a list or info answer; every field but the id is optional to us.
#[derive(Debug, Deserialize)]
pub(super) struct Listed {
    #[serde(rename = "sandboxID")]
    pub(super) sandbox_id: String,
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    alias: Option<String>,
    metadata: Option<Metadata>,
    #[serde(rename = "startedAt")]
    started_at: Option<String>,
    #[serde(rename = "endAt")]
    end_at: Option<String>,
    state: Option<String>,
    #[serde(rename = "envdVersion")]
    envd_version: Option<String>,
}

impl Listed {
    pub(super) fn into_summary(self) -> SandboxSummary {
        SandboxSummary {
            id: self.sandbox_id,
            // The alias is the name a create asked for ("base"); the id is internal.
            template: self.alias.or(self.template_id),
            metadata: self.metadata.unwrap_or_default(),
            created: self.started_at.as_deref().and_then(unix_secs).unwrap_or(0),
            deadline: self.end_at.as_deref().and_then(unix_secs).unwrap_or(0),
            state: match self.state.as_deref() {
                Some("paused") => RunState::Paused,
                _ => RunState::Running,
            },
        }
    }

    pub(super) fn into_detail(self) -> SandboxDetail {
        SandboxDetail {
            id: self.sandbox_id,
            template_id: self.template_id,
            alias: self.alias,
            metadata: self.metadata.unwrap_or_default(),
            started: self.started_at.as_deref().and_then(unix_secs).unwrap_or(0),
            end: self.end_at.as_deref().and_then(unix_secs).unwrap_or(0),
            state: self.state.unwrap_or_default(),
            envd_version: self.envd_version,
        }
    }
}

/// Sandbox ids go into URL paths and host names, so only id characters are let through.
pub fn is_sandbox_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The `metadata` list filter: `k1=v1&k2=v2` with each key and value percent-encoded twice,
/// because the API unescapes the whole value once more before splitting it and then unescapes
/// each part (the query layer's own encoding is added by ureq).
pub fn metadata_query(filter: &Metadata) -> String {
    filter
        .iter()
        .map(|(k, v)| format!("{}={}", pct(&pct(k)), pct(&pct(v))))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses an RFC 3339 time (`2026-08-21T20:00:22.123Z`, `...+02:00`) to Unix seconds.
pub fn unix_secs(s: &str) -> Option<u64> {
    crate::civil::parse_rfc3339(s)?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_become_unix_seconds() {
        assert_eq!(unix_secs("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_secs("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(unix_secs("2024-02-29T12:34:56Z"), Some(1_709_210_096));
        assert_eq!(
            unix_secs("2026-08-21T20:00:22.123456789Z"),
            Some(1_787_342_422)
        );
        assert_eq!(unix_secs("2026-08-21T22:00:22+02:00"), Some(1_787_342_422));
        assert_eq!(
            unix_secs("2026-08-21T19:30:22.5-00:30"),
            Some(1_787_342_422)
        );
        for bad in [
            "",
            "2026-08-21",
            "2026-08-21T20:00:22",
            "2026-13-01T00:00:00Z",
            "2026-08-21T20:00:22+0200",
            "1969-12-31T23:59:59Z",
            "20x6-08-21T20:00:22Z",
        ] {
            assert_eq!(unix_secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn metadata_filters_encode_each_part_twice() {
        let mut m = Metadata::new();
        m.insert("wmo-e2b.run".into(), "r1".into());
        m.insert("pool".into(), "eval".into());
        assert_eq!(metadata_query(&m), "pool=eval&wmo-e2b.run=r1");
        let mut m = Metadata::new();
        m.insert("a b".into(), "x=y&z".into());
        assert_eq!(metadata_query(&m), "a%2520b=x%253Dy%2526z");
        assert_eq!(metadata_query(&Metadata::new()), "");
    }

    #[test]
    fn listed_entries_prefer_the_alias_and_default_the_rest() {
        let listed: Listed = serde_json::from_str(
            r#"{"sandboxID":"isb","templateID":"tpl123","alias":"base","metadata":null,
                "startedAt":"1970-01-01T00:01:00Z","endAt":"bogus","state":"running",
                "clientID":"6532622b","cpuCount":2}"#,
        )
        .unwrap();
        let s = listed.into_summary();
        assert_eq!(s.id, "isb");
        assert_eq!(s.template.as_deref(), Some("base"));
        assert!(s.metadata.is_empty());
        assert_eq!((s.created, s.deadline), (60, 0));
    }
}
