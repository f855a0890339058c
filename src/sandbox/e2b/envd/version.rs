//! envd versions: the oldest this client drives, and what newer ones change (as the SDK's
//! `envd/versions.py` gates them; `../shared/docs/e2b-wire.md` §7.3).

use std::fmt;

/// An envd version as `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EnvdVersion(pub u32, pub u32, pub u32);

impl fmt::Display for EnvdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The oldest envd this client drives: every command it starts sends `stdin: false`, which
/// envd before 0.3.0 refuses (the SDK refuses only envd before 0.1.0).
pub const MIN_ENVD: EnvdVersion = EnvdVersion(0, 3, 0);
/// The first envd that accepts raw `application/octet-stream` uploads (older: multipart).
pub const OCTET_STREAM_UPLOADS: EnvdVersion = EnvdVersion(0, 5, 7);
/// The first envd with `CloseStdin`.
pub const CLOSE_STDIN: EnvdVersion = EnvdVersion(0, 5, 2);

/// `major.minor.patch` of an envd version string (`v` prefix and suffixes allowed).
pub fn parse_version(v: &str) -> Option<EnvdVersion> {
    let mut parts = v.trim().trim_start_matches('v').splitn(3, '.');
    let mut next = || -> Option<u32> {
        let part = parts.next()?;
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    Some(EnvdVersion(next()?, next()?, next().unwrap_or(0)))
}

/// A sandbox whose envd this client cannot drive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvdRefused {
    #[error(
        "template {template} runs envd {version}, older than the {MIN_ENVD} this client needs; \
         rebuild the template on a current E2B base image"
    )]
    TooOld {
        template: String,
        version: EnvdVersion,
    },
    #[error("template {template} reports envd version {reported:?}, which is not a version")]
    Unreadable { template: String, reported: String },
}

/// Checks the `envdVersion` a create or connect answered for `template`. An answer without
/// one is taken as current: only a version that says so is refused.
pub fn check(template: &str, reported: Option<&str>) -> Result<Option<EnvdVersion>, EnvdRefused> {
    let Some(reported) = reported.map(str::trim).filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    match parse_version(reported) {
        Some(version) if version >= MIN_ENVD => Ok(Some(version)),
        Some(version) => Err(EnvdRefused::TooOld {
            template: template.to_string(),
            version,
        }),
        None => Err(EnvdRefused::Unreadable {
            template: template.to_string(),
            reported: reported.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("0.6.13"), Some(EnvdVersion(0, 6, 13)));
        assert_eq!(parse_version("v0.5.7-rc1"), Some(EnvdVersion(0, 5, 7)));
        assert_eq!(parse_version("1.2"), Some(EnvdVersion(1, 2, 0)));
        assert_eq!(parse_version("x"), None);
        assert!(parse_version("0.5.6").unwrap() < OCTET_STREAM_UPLOADS);
        assert_eq!(EnvdVersion(0, 3, 0).to_string(), "0.3.0");
    }

    #[test]
    fn only_envd_older_than_the_minimum_or_unreadable_is_refused() {
        assert_eq!(
            check("base", Some("0.6.13")),
            Ok(Some(EnvdVersion(0, 6, 13)))
        );
        assert_eq!(check("base", Some("0.3.0")), Ok(Some(MIN_ENVD)));
        assert_eq!(check("base", None), Ok(None));
        assert_eq!(check("base", Some(" ")), Ok(None));
        let old = check("old-tpl", Some("0.2.9")).unwrap_err();
        assert!(matches!(old, EnvdRefused::TooOld { .. }));
        let text = old.to_string();
        assert!(text.contains("old-tpl") && text.contains("0.2.9"), "{text}");
        assert!(matches!(
            check("t", Some("latest")),
            Err(EnvdRefused::Unreadable { .. })
        ));
    }
}
