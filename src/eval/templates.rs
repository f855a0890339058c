//! What a template of a task's environment is made of, for a backend that builds templates
//! (E2B): the base image pinned by digest, and for a Dockerfile its steps, each `COPY` with
//! the archive of the build context's files it names. The image's config is read here; its
//! layers are E2B's to fetch.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::environments::{EnvironmentError, Source};
use crate::image::build::DEFAULT_BUILD_TIMEOUT;
use crate::image::context_archive::context_archive;
use crate::image::dockerfile::{self, Step};
use crate::image::{self, build_key, Reference, RegistryConfig, Store};
use crate::runner::node_layer::{NodeLayer, NODE_LAYER_ARCHIVE_DIR, NODE_LAYER_DIR};
use crate::sandbox::e2b::{E2bBackend, TemplateSource, Upload};
use crate::sandbox::SandboxError;

/// A template to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplatePlan {
    /// The base image, `reference@sha256:...`.
    pub from_image: String,
    /// Where a task works: the Dockerfile's last `WORKDIR`, else the image's.
    pub workdir: Option<String>,
    /// `TemplateStep`s, in order.
    pub steps: Vec<Value>,
    /// The archives the `COPY` steps name.
    pub archives: Archives,
    /// The build's bound (a Harbor task's `build_timeout_sec`).
    pub timeout: Duration,
}

/// `(filesHash, gzipped tar)` of each archive a plan's `COPY` steps name.
pub type Archives = Vec<(String, Vec<u8>)>;

/// Makes plans into E2B templates: the runner's Node.js copied in first, then the plan's
/// steps, each build bounded and recorded (see `sandbox::e2b::templates`).
pub struct E2bTemplates<'a> {
    pub e2b: &'a E2bBackend,
    pub node: &'a NodeLayer,
    /// Build records, by template name.
    pub records: &'a Path,
    pub log_dir: &'a Path,
}

impl E2bTemplates<'_> {
    /// The template `plan` is made into; its name.
    pub fn make(&self, plan: &TemplatePlan) -> Result<String, SandboxError> {
        let node = self.node;
        let node_step = json!({
            "type": "COPY",
            "args": [format!("{NODE_LAYER_ARCHIVE_DIR}/*"), format!("{NODE_LAYER_DIR}/"), "", ""],
            "filesHash": node.hash,
            "force": false,
        });
        let steps: Vec<Value> = std::iter::once(node_step)
            .chain(plan.steps.iter().cloned())
            .collect();
        let node_archive = || node.archive().map_err(|e| e.to_string());
        let archives: Vec<_> = plan
            .archives
            .iter()
            .map(|(hash, bytes)| (hash, move || Ok(bytes.clone())))
            .collect();
        let uploads: Vec<Upload> = std::iter::once(Upload {
            hash: &node.hash,
            archive: &node_archive,
        })
        .chain(archives.iter().map(|(hash, archive)| Upload {
            hash,
            archive: archive as &dyn Fn() -> Result<Vec<u8>, String>,
        }))
        .collect();
        self.e2b.template_for(&TemplateSource {
            from_image: &plan.from_image,
            workdir: plan.workdir.as_deref(),
            timeout: plan.timeout,
            records: self.records,
            log_dir: self.log_dir,
            steps: &steps,
            uploads: &uploads,
        })
    }
}

/// A plan, with what names its environment.
pub(super) struct Planned {
    pub plan: TemplatePlan,
    /// The base's manifest digest, or for a Dockerfile the digest of the plan: what keeps
    /// sandboxes of one environment from serving another.
    pub id: String,
    /// What provenance pins.
    pub digest: String,
    /// The image's variables and the Dockerfile's `ENV`s: E2B keeps a template's only for
    /// its build, so every sandbox of it is created with them.
    pub env: Vec<(String, String)>,
}

pub(super) fn plan_of(
    source: &Source,
    store: &Store,
    config: &RegistryConfig,
    build_args: &[(String, String)],
) -> Result<Planned, EnvironmentError> {
    match source {
        Source::Image(reference) => {
            let (pinned, resolved) = resolve(reference, store, config)?;
            Ok(Planned {
                id: resolved.manifest_digest.as_str().to_string(),
                digest: resolved.digest.as_str().to_string(),
                env: resolved.config.env_pairs(),
                plan: TemplatePlan {
                    from_image: pinned,
                    workdir: resolved.config.working_dir,
                    steps: Vec::new(),
                    archives: Vec::new(),
                    timeout: DEFAULT_BUILD_TIMEOUT,
                },
            })
        }
        Source::Dockerfile {
            path,
            context,
            timeout,
            ..
        } => {
            let bytes = build_key::read_dockerfile(path)
                .map_err(|e| EnvironmentError::Build(image::BuildError::Input(e)))?;
            let text = String::from_utf8_lossy(&bytes);
            let recipe = dockerfile::read(&text, build_args).map_err(|source| {
                EnvironmentError::Dockerfile {
                    path: path.clone(),
                    source,
                }
            })?;
            let (pinned, resolved) = resolve(&recipe.from, store, config)?;
            let (steps, archives) = steps_of(&recipe.steps, context)?;
            let mut env = resolved.config.env_pairs();
            for step in &recipe.steps {
                if let Step::Env(pairs) = step {
                    for (k, v) in pairs {
                        env.retain(|(name, _)| name != k);
                        env.push((k.clone(), v.clone()));
                    }
                }
            }
            let plan = TemplatePlan {
                from_image: pinned,
                workdir: recipe.workdir.or(resolved.config.working_dir),
                steps,
                archives,
                timeout: *timeout,
            };
            let digest = format!("sha256:{}", plan_digest(&plan));
            Ok(Planned {
                id: digest.clone(),
                digest,
                plan,
                env,
            })
        }
    }
}

fn resolve(
    reference: &str,
    store: &Store,
    config: &RegistryConfig,
) -> Result<(String, image::pull::Resolved), EnvironmentError> {
    let image_error = |source| EnvironmentError::Image {
        reference: reference.to_string(),
        source,
    };
    let parsed = Reference::parse(reference).map_err(|e| image_error(e.into()))?;
    let resolved = image::pull::resolve(&parsed, store, config).map_err(image_error)?;
    let pinned = Reference {
        tag: None,
        digest: Some(resolved.digest.clone()),
        ..parsed
    }
    .to_string();
    Ok((pinned, resolved))
}

/// A Dockerfile's steps as `TemplateStep`s, one `COPY` per source, each with its archive.
fn steps_of(steps: &[Step], context: &Path) -> Result<(Vec<Value>, Archives), EnvironmentError> {
    let mut out = Vec::new();
    let mut archives: Archives = Vec::new();
    for step in steps {
        match step {
            Step::Run { command, user } => out.push(json!({
                "type": "RUN", "args": [command, user.clone().unwrap_or_default()], "force": false,
            })),
            Step::Copy {
                sources,
                dest,
                chown,
                chmod,
            } => {
                for src in sources {
                    let archive = context_archive(context, src).map_err(|source| {
                        EnvironmentError::Context {
                            context: PathBuf::from(context),
                            source,
                        }
                    })?;
                    let hash = crate::digest::sha256_hex(&archive);
                    out.push(json!({
                        "type": "COPY",
                        "args": [src, dest, chown.clone().unwrap_or_default(),
                                 chmod.clone().unwrap_or_default()],
                        "filesHash": hash,
                        "force": false,
                    }));
                    if !archives.iter().any(|(h, _)| *h == hash) {
                        archives.push((hash, archive));
                    }
                }
            }
            Step::Env(pairs) => {
                let args: Vec<&str> = pairs
                    .iter()
                    .flat_map(|(k, v)| [k.as_str(), v.as_str()])
                    .collect();
                out.push(json!({"type": "ENV", "args": args, "force": false}));
            }
            Step::Workdir(dir) => {
                out.push(json!({"type": "WORKDIR", "args": [dir], "force": false}))
            }
            Step::User(user) => out.push(json!({"type": "USER", "args": [user], "force": false})),
        }
    }
    Ok((out, archives))
}

/// What names a plan's content: its base and its steps (which hold each archive's hash).
fn plan_digest(plan: &TemplatePlan) -> String {
    let text = json!({"from": plan.from_image, "steps": plan.steps, "workdir": plan.workdir});
    crate::digest::sha256_hex(text.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dockerfiles_steps_become_template_steps_with_their_archives() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("greeting.txt"), "hi").unwrap();
        let recipe = dockerfile::read(
            "FROM base\nCOPY greeting.txt /opt/g.txt\nENV A=1 B=2\nUSER app\nRUN id\nWORKDIR /w\n",
            &[],
        )
        .unwrap();
        let (steps, archives) = steps_of(&recipe.steps, dir.path()).unwrap();
        let kinds: Vec<&str> = steps.iter().map(|s| s["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["COPY", "ENV", "USER", "RUN", "WORKDIR"]);
        assert_eq!(
            steps[0]["args"],
            json!(["greeting.txt", "/opt/g.txt", "", ""])
        );
        assert_eq!(steps[0]["filesHash"], archives[0].0.as_str());
        assert_eq!(steps[1]["args"], json!(["A", "1", "B", "2"]));
        assert_eq!(steps[3]["args"], json!(["id", "app"]));
        let missing = dockerfile::read("FROM base\nCOPY nope.txt /x\n", &[]).unwrap();
        assert!(matches!(
            steps_of(&missing.steps, dir.path()),
            Err(EnvironmentError::Context { .. })
        ));
    }
}
