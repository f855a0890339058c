//! Image references, `[host[:port]/]path[:tag][@sha256:<hex>]`, with Docker's defaults, and
//! content digests checked before they name anything (a digest from a registry becomes a file
//! name in the store).

use std::fmt;

/// Docker Hub's name in references; its API is served elsewhere ([`DOCKER_HUB_API`]).
pub const DOCKER_HUB: &str = "docker.io";
/// Where Docker Hub serves the distribution API.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// The longest repository name the distribution spec lets a registry refuse beyond.
const MAX_NAME: usize = 255;
/// Tags are `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
const MAX_TAG: usize = 128;

/// Which part of a reference is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("an image reference is empty")]
    Empty,
    #[error("image reference {reference:?}: the registry {host:?} is not a host[:port]")]
    Host { reference: String, host: String },
    #[error(
        "image reference {reference:?}: the repository {path:?} is not lowercase components \
         ([a-z0-9] joined by '.', '_', '__' or '-') separated by '/', {MAX_NAME} characters at most"
    )]
    Path { reference: String, path: String },
    #[error(
        "image reference {reference:?}: the tag {tag:?} is not [A-Za-z0-9_][A-Za-z0-9_.-]*, \
         {MAX_TAG} characters at most"
    )]
    Tag { reference: String, tag: String },
    #[error(
        "image reference {reference:?}: the digest {digest:?} is not sha256:<64 lowercase hex>"
    )]
    Digest { reference: String, digest: String },
}

/// A content digest, `sha256:<64 lowercase hex>`: the only algorithm taken, so that the hex
/// can name a file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// `None` unless `s` is exactly `sha256:` and 64 lowercase hex digits.
    pub fn parse(s: &str) -> Option<Digest> {
        let hex = s.strip_prefix("sha256:")?;
        let ok = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| Digest(s.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(crate::digest::sha256(bytes))
    }

    /// The digest whose SHA-256 is `hash` (a hasher's result).
    pub fn from_sha256(hash: [u8; 32]) -> Digest {
        Digest(format!("sha256:{}", crate::digest::hex(&hash)))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A parsed reference. `tag` is `latest` when neither a tag nor a digest was given; a
/// reference with a digest is pulled by the digest (its tag, if any, is kept for display).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// As written in references (`docker.io`, `localhost:5000`, `[::1]:5000`).
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl Reference {
    pub fn parse(s: &str) -> Result<Reference, ReferenceError> {
        if s.is_empty() {
            return Err(ReferenceError::Empty);
        }
        let reference = || s.to_string();
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => {
                let digest = Digest::parse(d).ok_or_else(|| ReferenceError::Digest {
                    reference: reference(),
                    digest: d.to_string(),
                })?;
                (rest, Some(digest))
            }
            None => (s, None),
        };
        // The tag's ':' is the one after the last '/', so a registry port is not a tag.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(tag) = tag {
            if !is_tag(tag) {
                return Err(ReferenceError::Tag {
                    reference: reference(),
                    tag: tag.to_string(),
                });
            }
        }
        // Docker's rule: the first component names a registry when it has a '.' or a ':' or
        // is `localhost`; otherwise the whole name is a path on Docker Hub.
        let (registry, path) = match name.split_once('/') {
            Some((first, path)) if first.contains(['.', ':', '[']) || first == "localhost" => {
                (first, path)
            }
            _ => (DOCKER_HUB, name),
        };
        if !is_host(registry) {
            return Err(ReferenceError::Host {
                reference: reference(),
                host: registry.to_string(),
            });
        }
        let registry = match registry {
            "index.docker.io" | DOCKER_HUB_API => DOCKER_HUB,
            other => other,
        };
        let repository = if registry == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path.to_string()
        };
        if !is_path(&repository) {
            return Err(ReferenceError::Path {
                reference: reference(),
                path: path.to_string(),
            });
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, None) => Some("latest".to_string()),
            (None, Some(_)) => None,
        };
        Ok(Reference {
            registry: registry.to_string(),
            repository,
            tag,
            digest,
        })
    }

    /// The `host[:port]` the distribution API is served at.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// What the manifest is asked for by: the digest when there is one, else the tag.
    pub fn manifest_key(&self) -> &str {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.as_str(),
            (None, Some(t)) => t,
            (None, None) => "latest",
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

fn is_tag(tag: &str) -> bool {
    let mut bytes = tag.bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    tag.len() <= MAX_TAG
        && bytes.next().is_some_and(word)
        && bytes.all(|b| word(b) || b == b'.' || b == b'-')
}

/// `host[:port]`: DNS labels or an IPv4 address, or a bracketed IPv6 address; a port of
/// 1 to 65535.
fn is_host(host: &str) -> bool {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(port) => ("v6", Some(port)),
                None => return false,
            },
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u16>().is_ok_and(|n| n > 0)
    });
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    port_ok && !name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)
}

/// Components of `[a-z0-9]+` joined by one separator (`.`, `_`, `__`, or any run of `-`),
/// separated by single slashes.
fn is_path(path: &str) -> bool {
    path.len() <= MAX_NAME && !path.is_empty() && path.split('/').all(is_component)
}

fn is_component(c: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if !alnum(first) || !alnum(last) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let dashes = sep.bytes().all(|b| b == b'-');
        if !(dashes || sep == "." || sep == "_" || sep == "__") {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn canonical(s: &str) -> String {
        Reference::parse(s).unwrap().to_string()
    }

    #[test]
    fn docker_defaults_fill_the_registry_library_and_tag() {
        assert_eq!(canonical("alpine"), "docker.io/library/alpine:latest");
        assert_eq!(canonical("alpine:3.20"), "docker.io/library/alpine:3.20");
        assert_eq!(canonical("user/app"), "docker.io/user/app:latest");
        assert_eq!(canonical("index.docker.io/x/y:1"), "docker.io/x/y:1");
        let r = Reference::parse("ubuntu").unwrap();
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(r.repository, "library/ubuntu");
        assert_eq!(r.manifest_key(), "latest");
    }

    #[test]
    fn hosts_ports_tags_and_digests_are_told_apart() {
        let r = Reference::parse("localhost:5000/a/b:v1").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("localhost:5000", "a/b")
        );
        assert_eq!(r.tag.as_deref(), Some("v1"));
        let r = Reference::parse("127.0.0.1:5000/img").unwrap();
        assert_eq!(
            (r.api_host(), r.tag.as_deref()),
            ("127.0.0.1:5000", Some("latest"))
        );
        let by_digest = format!("ghcr.io/o/r@sha256:{HEX}");
        let r = Reference::parse(&by_digest).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_key(), format!("sha256:{HEX}"));
        assert_eq!(r.to_string(), by_digest);
        let both = format!("[::1]:5000/x:t@sha256:{HEX}");
        assert_eq!(canonical(&both), both);
        // A first component without '.', ':' or `localhost` is a Docker Hub path.
        assert_eq!(canonical("registry/img"), "docker.io/registry/img:latest");
        assert_eq!(canonical("a.b-c/d__e---f.g_h"), "a.b-c/d__e---f.g_h:latest");
    }

    #[test]
    fn each_wrong_part_is_named() {
        use ReferenceError as E;
        let kind = |s: &str| Reference::parse(s).unwrap_err();
        assert_eq!(kind(""), E::Empty);
        assert!(matches!(kind("Alpine"), E::Path { .. }));
        assert!(matches!(kind("a//b"), E::Path { .. }));
        assert!(matches!(kind("x.io/a/../b"), E::Path { .. }));
        assert!(matches!(kind("x.io/-a"), E::Path { .. }));
        assert!(matches!(kind("x.io/a._b"), E::Path { .. }));
        assert!(matches!(kind("a:"), E::Tag { .. }));
        assert!(matches!(kind("a:.x"), E::Tag { .. }));
        assert!(matches!(
            kind(&format!("a:{}", "t".repeat(129))),
            E::Tag { .. }
        ));
        assert!(matches!(kind("a@sha256:abc"), E::Digest { .. }));
        assert!(matches!(kind(&format!("a@sha512:{HEX}")), E::Digest { .. }));
        assert!(matches!(
            kind(&format!("a@sha256:{}", HEX.to_uppercase())),
            E::Digest { .. }
        ));
        assert!(matches!(kind("host:99999/a"), E::Host { .. }));
        assert!(matches!(kind("host:0/a"), E::Host { .. }));
        assert!(matches!(kind("ho_st.io/a"), E::Host { .. }));
        assert!(matches!(kind("[zz]:5/a"), E::Host { .. }));
        assert!(matches!(
            kind(&format!("x.io/{}", "a".repeat(256))),
            E::Path { .. }
        ));
        let e = kind("x.io/a:b c");
        assert!(e.to_string().contains("the tag \"b c\""), "{e}");
    }

    #[test]
    fn digests_take_only_sha256_lowercase_hex() {
        let d = Digest::parse(&format!("sha256:{HEX}")).unwrap();
        assert_eq!(d.hex(), HEX);
        assert!(Digest::parse(&format!("sha256:{HEX}0")).is_none());
        assert!(Digest::parse(&format!("sha256:../{}", &HEX[3..])).is_none());
        assert!(Digest::parse(HEX).is_none());
        assert_eq!(Digest::of(b"").hex(), crate::digest::sha256_hex(b""));
    }
}
