//! The task environments of a run, made before any sandbox starts: each image a task names
//! (or `--image` gives the tasks that name none) pulled into the store, each Dockerfile a
//! task names built into it (once per build key on the machine), each unpacked once and
//! described as the root its sandboxes' task processes run on. A run whose environments
//! cannot all be had stops here, before it spends anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::templates::plan_of;
pub use super::templates::TemplatePlan;
use crate::image::store::StoreLock;
use crate::image::{self, BuildError, BuildRequest, ImageError, PulledImage, Reference};
use crate::image::{RegistryConfig, Store};
use crate::sandbox::e2b::E2B_USER_ID;
use crate::sandbox::{ImageRoot, SandboxError};
use crate::task::{EnvironmentSpec, Task};

/// Where a task's environment comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// An image reference, pulled.
    Image(String),
    /// A Dockerfile, built in `context`.
    Dockerfile {
        path: PathBuf,
        context: PathBuf,
        /// The Dockerfile's path relative to the tasks file's directory (a Harbor dataset's
        /// own): how provenance names it.
        label: String,
        /// The longest any task naming it allows.
        timeout: Duration,
    },
}

impl Source {
    /// How results name it: the reference, or `dockerfile:<label>`.
    pub fn name(&self) -> String {
        match self {
            Source::Image(r) => r.clone(),
            Source::Dockerfile { label, .. } => format!("dockerfile:{label}"),
        }
    }

    /// What it is, for a person: `image R` or `Dockerfile P`.
    pub fn describe(&self) -> String {
        match self {
            Source::Image(r) => format!("image {r}"),
            Source::Dockerfile { path, .. } => format!("Dockerfile {}", path.display()),
        }
    }

    /// Whether `self` and `other` are one environment (a Dockerfile's timeout aside).
    pub fn same_as(&self, other: &Source) -> bool {
        match (self, other) {
            (Source::Image(a), Source::Image(b)) => a == b,
            (
                Source::Dockerfile { path, context, .. },
                Source::Dockerfile {
                    path: p,
                    context: c,
                    ..
                },
            ) => path == p && context == c,
            _ => false,
        }
    }
}

/// Makes a template of a plan; its name.
pub type TemplateFor<'a> = dyn Fn(&TemplatePlan) -> Result<String, SandboxError> + 'a;

/// How the run's Dockerfiles are built.
#[derive(Debug, Clone, Copy)]
pub struct BuildOptions<'a> {
    /// `--build-arg`s, given to every build (part of each build's key).
    pub args: &'a [(String, String)],
    /// Where each build's log goes, as `<key hex>.log` (an eval's is `<out>/builds`).
    pub log_dir: &'a Path,
}

/// Why an environment could not be made.
#[derive(Debug, thiserror::Error)]
pub enum EnvironmentError {
    #[error("image {reference}: {source}")]
    Image {
        reference: String,
        #[source]
        source: ImageError,
    },
    /// Names the Dockerfile itself.
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("{name}: cannot unpack it: {source}")]
    Unpack {
        name: String,
        #[source]
        source: image::unpack::UnpackError,
    },
    #[error("cannot open the image store: {0}")]
    Store(#[source] image::store::StoreError),
    #[error("{}: {source}", path.display())]
    Dockerfile {
        path: PathBuf,
        #[source]
        source: crate::image::dockerfile::DockerfileError,
    },
    #[error("{}: {source}", context.display())]
    Context {
        context: PathBuf,
        #[source]
        source: crate::image::context_archive::ArchiveError,
    },
    #[error("{name}: no template made of it: {source}")]
    Template {
        name: String,
        #[source]
        source: SandboxError,
    },
}

impl EnvironmentError {
    /// Whether the user's input is at fault (a reference or settings file that does not
    /// parse, a Dockerfile or context that cannot be read), rather than the machine.
    pub fn is_bad_input(&self) -> bool {
        match self {
            EnvironmentError::Image { source, .. } => source.is_bad_input(),
            EnvironmentError::Build(e) => e.is_bad_input(),
            EnvironmentError::Dockerfile { .. } | EnvironmentError::Context { .. } => true,
            EnvironmentError::Unpack { .. }
            | EnvironmentError::Store(_)
            | EnvironmentError::Template { .. } => false,
        }
    }
}

/// The environments of a run's tasks, by the name of each (see [`Source::name`]).
#[derive(Debug, Default)]
pub struct Environments {
    roots: BTreeMap<String, Made>,
    /// The store's shared lock, held while the run may still start sandboxes on its roots:
    /// no prune removes them under it.
    _store: Option<StoreLock>,
    /// The name of each Dockerfile's environment, by its path as tasks name it.
    dockerfiles: BTreeMap<PathBuf, String>,
    /// The environment of tasks that name none (`--image`).
    default: Option<String>,
}

#[derive(Debug)]
struct Made {
    root: ImageRoot,
    /// The content digest the reference resolved to, or the built image's manifest digest
    /// (what provenance records).
    digest: String,
}

impl Environments {
    /// Pulls or builds, and unpacks, every environment in `sources` into `store`;
    /// `default` (an image among them) is the environment of tasks that name none.
    pub fn make(
        sources: &[Source],
        default: Option<&str>,
        store: &Store,
        config: &RegistryConfig,
        build: &BuildOptions,
    ) -> Result<Environments, EnvironmentError> {
        let mut made = Environments {
            default: default.map(str::to_string),
            ..Environments::default()
        };
        if !sources.is_empty() {
            made._store = Some(store.pull_lock().map_err(EnvironmentError::Store)?);
        }
        for source in sources {
            let name = source.name();
            if made.roots.contains_key(&name) {
                continue;
            }
            let image = match source {
                Source::Image(reference) => pull(reference, store, config)?,
                Source::Dockerfile {
                    path,
                    context,
                    timeout,
                    ..
                } => {
                    let request = BuildRequest {
                        dockerfile: path,
                        context,
                        args: build.args,
                        timeout: *timeout,
                        log_dir: build.log_dir,
                    };
                    made.dockerfiles.insert(path.clone(), name.clone());
                    image::build(&request, None, store, config)?.image
                }
            };
            made.roots
                .insert(name.clone(), make_root(&name, &image, store)?);
        }
        Ok(made)
    }

    /// A template made of every environment in `sources` by `template_for`: for a backend
    /// that holds images itself (E2B). This machine resolves each image to its digest and
    /// reads its config, and a Dockerfile's steps and build context (see `templates`).
    pub fn make_templates(
        sources: &[Source],
        default: Option<&str>,
        store: &Store,
        config: &RegistryConfig,
        build_args: &[(String, String)],
        template_for: &TemplateFor,
    ) -> Result<Environments, EnvironmentError> {
        let mut made = Environments {
            default: default.map(str::to_string),
            ..Environments::default()
        };
        for source in sources {
            let name = source.name();
            if made.roots.contains_key(&name) {
                continue;
            }
            let planned = plan_of(source, store, config, build_args)?;
            let template =
                template_for(&planned.plan).map_err(|source| EnvironmentError::Template {
                    name: name.clone(),
                    source,
                })?;
            let root = ImageRoot {
                id: planned.id,
                rootfs: PathBuf::new(),
                env: planned.env,
                workdir: planned.plan.workdir.clone(),
                user: E2B_USER_ID,
                shell: "/bin/bash".into(),
                template: Some(template),
            };
            if let Source::Dockerfile { path, .. } = source {
                made.dockerfiles.insert(path.clone(), name.clone());
            }
            let digest = planned.digest;
            made.roots.insert(name, Made { root, digest });
        }
        Ok(made)
    }

    /// The root `task`'s commands run on; `None`: the sandbox's own system.
    pub fn of(&self, task: &Task) -> Option<&ImageRoot> {
        self.roots.get(self.name_of(task)?).map(|m| &m.root)
    }

    /// The environment `task` runs on as `reference@digest` (`dockerfile:<path>@digest` for
    /// a built one), for its record's provenance.
    pub fn pinned(&self, task: &Task) -> Option<String> {
        let name = self.name_of(task)?;
        let made = self.roots.get(name)?;
        Some(format!("{name}@{}", made.digest))
    }

    fn name_of<'a>(&'a self, task: &'a Task) -> Option<&'a String> {
        match &task.environment {
            Some(EnvironmentSpec::Image(r)) => Some(r),
            Some(EnvironmentSpec::Dockerfile { path, .. }) => self.dockerfiles.get(path),
            None => self.default.as_ref(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }
}

fn pull(
    reference: &str,
    store: &Store,
    config: &RegistryConfig,
) -> Result<PulledImage, EnvironmentError> {
    let image_error = |source| EnvironmentError::Image {
        reference: reference.to_string(),
        source,
    };
    let parsed = Reference::parse(reference).map_err(|e| image_error(e.into()))?;
    image::pull(&parsed, store, config).map_err(image_error)
}

/// An image in the store unpacked (once) and described as the root tasks run on.
fn make_root(name: &str, pulled: &PulledImage, store: &Store) -> Result<Made, EnvironmentError> {
    let root = image::task_root(pulled, store).map_err(|source| EnvironmentError::Unpack {
        name: name.to_string(),
        source,
    })?;
    Ok(Made {
        root,
        digest: pulled.digest.as_str().to_string(),
    })
}
