//! The documents of the distribution API: image indexes (OCI and Docker manifest lists),
//! image manifests (OCI and Docker v2 schema 2), image configs, and the choice of an index's
//! manifest for this machine. Every document is a registry's word: digests are checked
//! before they name a blob, counts are bounded.

use serde::Deserialize;

use super::error::ImageError;
use super::reference::Digest;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// What a manifest GET accepts.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// A manifest, config or token body larger than this is refused.
pub const MAX_DOCUMENT: u64 = 4 << 20;
/// Layers an image may have.
pub const MAX_LAYERS: usize = 256;
/// Entries an index may have.
const MAX_INDEX_ENTRIES: usize = 1024;

/// A blob named by a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// A manifest document, as it was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Document {
    Index(Vec<(Descriptor, Option<Platform>)>),
    Manifest {
        config: Descriptor,
        layers: Vec<Descriptor>,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDocument {
    media_type: Option<String>,
    config: Option<RawDescriptor>,
    layers: Option<Vec<RawDescriptor>>,
    manifests: Option<Vec<RawDescriptor>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDescriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: u64,
    platform: Option<RawPlatform>,
}

#[derive(Deserialize)]
struct RawPlatform {
    os: String,
    architecture: String,
    variant: Option<String>,
}

/// Parses a manifest or index; `content_type` is the answer's, used when the body names no
/// media type.
pub fn parse_document(
    what: &str,
    bytes: &[u8],
    content_type: Option<&str>,
) -> Result<Document, ImageError> {
    let bad = |why: String| ImageError::BadManifest {
        what: what.to_string(),
        why,
    };
    let raw: RawDocument =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
    let content_type = content_type.map(|c| c.split(';').next().unwrap_or(c).trim());
    let media_type = raw.media_type.as_deref().or(content_type).unwrap_or("");
    let descriptor = |d: RawDescriptor| -> Result<(Descriptor, Option<Platform>), ImageError> {
        let digest = Digest::parse(&d.digest)
            .ok_or_else(|| bad(format!("{:?} is not a sha256 digest", d.digest)))?;
        let platform = d.platform.map(|p| Platform {
            os: p.os,
            architecture: p.architecture,
            variant: p.variant.filter(|v| !v.is_empty()),
        });
        Ok((
            Descriptor {
                media_type: d.media_type,
                digest,
                size: d.size,
            },
            platform,
        ))
    };
    match (media_type, raw.manifests, raw.config, raw.layers) {
        (OCI_INDEX | DOCKER_LIST | "", Some(manifests), None, None) => {
            if manifests.len() > MAX_INDEX_ENTRIES {
                return Err(bad(format!("more than {MAX_INDEX_ENTRIES} manifests")));
            }
            Ok(Document::Index(
                manifests
                    .into_iter()
                    .map(descriptor)
                    .collect::<Result<_, _>>()?,
            ))
        }
        (OCI_MANIFEST | DOCKER_MANIFEST | "", None, Some(config), Some(layers)) => {
            if layers.len() > MAX_LAYERS {
                return Err(bad(format!("more than {MAX_LAYERS} layers")));
            }
            let layers = layers
                .into_iter()
                .map(|l| descriptor(l).map(|(d, _)| d))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Document::Manifest {
                config: descriptor(config)?.0,
                layers,
            })
        }
        (other, ..) => Err(bad(format!(
            "media type {other:?} is not an OCI or Docker v2 schema 2 manifest or index"
        ))),
    }
}

/// This machine's platform in OCI's names.
pub fn host_platform() -> Platform {
    let (architecture, variant) = match std::env::consts::ARCH {
        "x86_64" => ("amd64", None),
        "x86" => ("386", None),
        "aarch64" => ("arm64", None),
        "arm" => ("arm", Some("v7")),
        "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
        "loongarch64" => ("loong64", None),
        other => (other, None),
    };
    Platform {
        os: "linux".to_string(),
        architecture: architecture.to_string(),
        variant: variant.map(str::to_string),
    }
}

/// The index entry for `want`: same OS and architecture, and the same variant where the
/// architecture has them (an arm64 entry with no variant or `v8` is the same thing).
pub fn select_platform<'a>(
    entries: &'a [(Descriptor, Option<Platform>)],
    want: &Platform,
) -> Option<&'a Descriptor> {
    let variant_fits = |got: &Option<String>| match (&want.variant, got.as_deref()) {
        (None, None) => true,
        (None, Some("v8")) => want.architecture == "arm64",
        (Some(w), Some(g)) => w == g,
        (Some(_), None) => false,
        (None, Some(_)) => false,
    };
    entries.iter().find_map(|(d, p)| {
        let p = p.as_ref()?;
        (p.os == want.os && p.architecture == want.architecture && variant_fits(&p.variant))
            .then_some(d)
    })
}

/// The platforms an index offers, for an error.
pub fn offered(entries: &[(Descriptor, Option<Platform>)]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|(_, p)| p.as_ref().map(Platform::to_string))
        .collect()
}

/// What an image's config says about how to run it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    /// The uncompressed layers' digests, in order.
    pub diff_ids: Vec<Digest>,
    pub os: Option<String>,
    pub architecture: Option<String>,
}

impl ImageConfig {
    /// `Env` as names and values (an entry without `=` is no variable).
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        self.env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

#[derive(Deserialize)]
struct RawConfig {
    os: Option<String>,
    architecture: Option<String>,
    config: Option<RawRunConfig>,
    rootfs: Option<RawRootfs>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RawRunConfig {
    env: Option<Vec<String>>,
    working_dir: Option<String>,
    user: Option<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct RawRootfs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// Parses an image config; its `diff_ids` must match the manifest's `layers` one for one.
pub fn parse_config(what: &str, bytes: &[u8], layers: usize) -> Result<ImageConfig, ImageError> {
    let bad = |why: String| ImageError::BadManifest {
        what: what.to_string(),
        why,
    };
    let raw: RawConfig =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not an image config: {e}")))?;
    let run = raw.config.unwrap_or_default();
    let diff_ids = raw
        .rootfs
        .map(|r| r.diff_ids)
        .unwrap_or_default()
        .iter()
        .map(|d| {
            Digest::parse(d).ok_or_else(|| bad(format!("diff_id {d:?} is not a sha256 digest")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if diff_ids.len() != layers {
        return Err(bad(format!(
            "{} diff_ids for {layers} layers",
            diff_ids.len()
        )));
    }
    let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
    Ok(ImageConfig {
        env: run.env.unwrap_or_default(),
        working_dir: nonempty(run.working_dir),
        user: nonempty(run.user),
        entrypoint: run.entrypoint,
        cmd: run.cmd,
        diff_ids,
        os: raw.os,
        architecture: raw.architecture,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn entry(arch: &str, variant: Option<&str>, digest: &str) -> (Descriptor, Option<Platform>) {
        (
            Descriptor {
                media_type: OCI_MANIFEST.into(),
                digest: Digest::parse(digest).unwrap(),
                size: 1,
            },
            Some(Platform {
                os: "linux".into(),
                architecture: arch.into(),
                variant: variant.map(Into::into),
            }),
        )
    }

    #[test]
    fn platforms_match_on_os_architecture_and_variant() {
        let arm64 = Platform {
            os: "linux".into(),
            architecture: "arm64".into(),
            variant: None,
        };
        let entries = [entry("amd64", None, A), entry("arm64", Some("v8"), B)];
        assert_eq!(
            select_platform(&entries, &arm64).unwrap().digest.as_str(),
            B
        );
        let armv6 = Platform {
            os: "linux".into(),
            architecture: "arm".into(),
            variant: Some("v6".into()),
        };
        let arm = [entry("arm", Some("v7"), A)];
        assert!(select_platform(&arm, &armv6).is_none());
        assert_eq!(offered(&arm), ["linux/arm/v7"]);
        assert_eq!(host_platform().os, "linux");
    }

    #[test]
    fn documents_with_bad_digests_or_too_many_layers_are_refused() {
        let layer = format!(r#"{{"mediaType":"x","digest":"{A}","size":1}}"#);
        let manifest = |layers: &str| {
            format!(
                r#"{{"mediaType":"{OCI_MANIFEST}","config":{{"digest":"{B}","size":2}},"layers":[{layers}]}}"#
            )
        };
        let ok = parse_document("m", manifest(&layer).as_bytes(), None).unwrap();
        assert!(matches!(ok, Document::Manifest { ref layers, .. } if layers.len() == 1));
        let many = vec![layer; MAX_LAYERS + 1].join(",");
        assert!(parse_document("m", manifest(&many).as_bytes(), None).is_err());
        let climbing = manifest(r#"{"digest":"sha256:../../etc/passwd","size":1}"#);
        let e = parse_document("m", climbing.as_bytes(), None).unwrap_err();
        assert!(e.to_string().contains("not a sha256 digest"), "{e}");
        let v1 = r#"{"schemaVersion":1,"fsLayers":[]}"#;
        assert!(parse_document(
            "m",
            v1.as_bytes(),
            Some("application/vnd.docker.distribution.manifest.v1+prettyjws")
        )
        .is_err());
    }

    #[test]
    fn config_fields_and_diff_ids_read_back() {
        let json = format!(
            r#"{{"architecture":"amd64","os":"linux","config":{{"Env":["A=1"],"WorkingDir":"/w",
               "User":"1000:1000","Entrypoint":["/bin/sh"],"Cmd":null}},
               "rootfs":{{"type":"layers","diff_ids":["{A}"]}}}}"#
        );
        let c = parse_config("c", json.as_bytes(), 1).unwrap();
        assert_eq!(c.env, ["A=1"]);
        assert_eq!(
            (c.working_dir.as_deref(), c.user.as_deref()),
            (Some("/w"), Some("1000:1000"))
        );
        assert_eq!(c.entrypoint, Some(vec!["/bin/sh".to_string()]));
        assert_eq!(c.cmd, None);
        assert!(parse_config("c", json.as_bytes(), 2).is_err());
    }
}
