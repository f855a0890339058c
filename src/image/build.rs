//! Images built from Dockerfiles, by a real builder (see [`super::builder`]), into the
//! store, each [build key](super::build_key) once on the machine:
//!
//! - `builds/<hex>.json`: the record of a key's build (the builder and its version, the
//!   image's manifest digest, when); the image itself is recorded under `refs/` as
//!   `localhost/wmo-e2b/build:<hex>`, so it is listed, kept and pruned like a pulled one;
//! - `builds/<hex>.lock`: an `flock` held for a key's whole build, so two runs (or threads)
//!   asking at once build once, the second finding the first's record;
//! - `build/`: the builder's own storage; base images it pulled stay for later builds.
//!
//! A record whose image is no longer whole in the store (a prune took a blob) is built
//! again. The builder's output goes to a log the caller places, never to the terminal.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::build_key::{self, KeyError};
use super::build_run::{self, Ended, Log};
use super::builder::{self, Builder};
use super::error::ImageError;
use super::oci_layout;
use super::pull::PulledImage;
use super::reference::{Digest, Reference};
use super::settings::RegistryConfig;
use super::store::{self, unix_now, Store, StoreError};

/// A build's bound when its task names none (Harbor's `build_timeout_sec`).
pub const DEFAULT_BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long a second asker waits for a running build of its key, past the build's own bound.
const LOCK_MARGIN: Duration = Duration::from_secs(10 * 60);
/// Bounds on the steps around the build: the builder's version, and removing the built
/// image from the builder's storage once it is in the store.
const VERSION_TIMEOUT: Duration = Duration::from_secs(60);
const RMI_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// A build record is a few hundred bytes.
const MAX_RECORD: u64 = 1 << 20;
/// The repository built images are recorded under, tagged with their key's hex.
pub const BUILT_REPOSITORY: &str = "localhost/wmo-e2b/build";

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildRequest<'a> {
    pub dockerfile: &'a Path,
    pub context: &'a Path,
    /// `--build-arg`s, as [`build_key::parse_build_args`] gives them.
    pub args: &'a [(String, String)],
    /// The build's bound, its image pushed to a layout included.
    pub timeout: Duration,
    /// Where the log goes: `<log_dir>/<key hex>.log`.
    pub log_dir: &'a Path,
}

/// A build's result, made now or found.
#[derive(Debug, Clone)]
pub struct Built {
    pub key: Digest,
    pub image: PulledImage,
    pub record: BuildRecord,
    /// False when a record of the key was found: nothing was built.
    pub fresh: bool,
    /// This build's log (when found, where this request would have written it).
    pub log: PathBuf,
}

/// What `builds/<hex>.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildRecord {
    /// `sha256:<hex>`: see [`super::build_key`].
    pub key: String,
    /// `buildah` or `podman`.
    pub builder: String,
    /// The first line of `<builder> --version`.
    pub builder_version: String,
    /// The reference the image is recorded under in the store.
    pub reference: String,
    pub manifest_digest: String,
    /// The Dockerfile as the first request named it, for a person reading the record.
    pub dockerfile: String,
    /// Seconds since the Unix epoch.
    pub built_at: u64,
}

/// Why an image could not be built, classified where it happens.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(
        "no image builder found on PATH (looked for buildah, podman, docker): install buildah \
         (`apt-get install buildah`)"
    )]
    NoBuilder,
    #[error(
        "{}: docker is found, and wmo-e2b does not build with docker yet: install buildah \
         (`apt-get install buildah`)",
        program.display()
    )]
    DockerUnsupported { program: PathBuf },
    #[error(transparent)]
    Input(#[from] KeyError),
    #[error("image store: {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot run {}: {source}", program.display())]
    Spawn { program: PathBuf, source: io::Error },
    #[error(
        "Dockerfile {}: `{step}` {} (log: {}){}",
        dockerfile.display(),
        describe(status),
        log.display(),
        quote_tail(tail)
    )]
    Failed {
        dockerfile: PathBuf,
        step: String,
        status: Option<ExitStatus>,
        log: PathBuf,
        /// The log's last lines, unescaped: escaped where printed.
        tail: Vec<String>,
    },
    #[error(
        "Dockerfile {}: the build ran past its {} s and was killed (log: {})",
        dockerfile.display(),
        timeout.as_secs(),
        log.display()
    )]
    TimedOut {
        dockerfile: PathBuf,
        timeout: Duration,
        log: PathBuf,
    },
    #[error("Dockerfile {}: the built image: {source}", dockerfile.display())]
    Import {
        dockerfile: PathBuf,
        #[source]
        source: ImageError,
    },
}

impl BuildError {
    /// Whether the user's input is at fault (a Dockerfile or context that cannot be read or
    /// is too large, a malformed build argument), rather than the builder or the machine.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, BuildError::Input(_))
    }
}

fn describe(status: &Option<ExitStatus>) -> String {
    match status {
        Some(s) => format!("failed ({s})"),
        None => "failed".into(),
    }
}

fn quote_tail(tail: &[String]) -> String {
    if tail.is_empty() {
        return String::new();
    }
    format!("; its last lines:\n    {}", tail.join("\n    "))
}

/// The Dockerfile of a context when none is named: its `Dockerfile`, else its
/// `Containerfile` (as buildah looks), else `Dockerfile` (to be reported missing).
pub fn default_dockerfile(context: &Path) -> PathBuf {
    let docker = context.join("Dockerfile");
    let container = context.join("Containerfile");
    if !docker.exists() && container.exists() {
        container
    } else {
        docker
    }
}

/// The reference a key's image is recorded under.
pub fn built_reference(key: &Digest) -> Reference {
    let name = format!("{BUILT_REPOSITORY}:{}", key.hex());
    Reference::parse(&name).unwrap_or_else(|_| Reference {
        registry: "localhost".into(),
        repository: "wmo-e2b/build".into(),
        tag: Some(key.hex().to_string()),
        digest: None,
    })
}

/// Builds `req` into `store` unless its key was built before; `builder` when given, else
/// the first on `PATH` (looked for only when there is something to build).
pub fn build(
    req: &BuildRequest,
    builder: Option<&Builder>,
    store: &Store,
    config: &RegistryConfig,
) -> Result<Built, BuildError> {
    let read = |path: &Path| {
        let path = path.to_path_buf();
        move |source| KeyError::Read { path, source }
    };
    // Absolute: the builders take a relative name that looks like a URL as one.
    let dockerfile = fs::canonicalize(req.dockerfile).map_err(read(req.dockerfile))?;
    let context = fs::canonicalize(req.context).map_err(read(req.context))?;
    let dockerfile_bytes = build_key::read_dockerfile(&dockerfile)?;
    let key = build_key::build_key(&dockerfile_bytes, &context, req.args)?;
    let records = store.root().join("builds");
    fs::create_dir_all(&records).map_err(io_at(&records))?;
    let log_path = req.log_dir.join(format!("{}.log", key.hex()));
    let _building = store::take_lock(
        &records.join(format!("{}.lock", key.hex())),
        libc::LOCK_EX,
        req.timeout + LOCK_MARGIN,
        &format!("another build of {key}"),
    )?;
    let record_path = records.join(format!("{}.json", key.hex()));
    if let Some((record, image)) = find_built(&record_path, &key, store)? {
        return Ok(Built {
            key,
            image,
            record,
            fresh: false,
            log: log_path,
        });
    }
    let builder = match builder {
        Some(b) => b.clone(),
        None => Builder::find()?,
    };
    let run = Run {
        builder: &builder,
        named: req.dockerfile,
        dockerfile: &dockerfile,
        context: &context,
        dockerfile_bytes: &dockerfile_bytes,
        key: &key,
        log_path: &log_path,
        storage: store.root().join("build"),
        store,
    };
    let work = run.work_dir()?;
    let result = run.build(req, &work, config);
    // What is left in the work directory is this build's alone; the error says what failed.
    let _ = crate::deep_remove::remove_tree(&work);
    let (image, version) = result?;
    let record = BuildRecord {
        key: key.to_string(),
        builder: builder.name().to_string(),
        builder_version: version,
        reference: image.reference.to_string(),
        manifest_digest: image.manifest_digest.to_string(),
        dockerfile: req.dockerfile.display().to_string(),
        built_at: unix_now(),
    };
    write_record(&record_path, &record)?;
    Ok(Built {
        key,
        image,
        record,
        fresh: true,
        log: log_path,
    })
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The record at `path` and its image, when both are whole; anything less is built again.
fn find_built(
    path: &Path,
    key: &Digest,
    store: &Store,
) -> Result<Option<(BuildRecord, PulledImage)>, BuildError> {
    let Some(record) = read_record(path).filter(|r| r.key == key.as_str()) else {
        return Ok(None);
    };
    let Some(manifest) = Digest::parse(&record.manifest_digest) else {
        return Ok(None);
    };
    let reference = built_reference(key);
    match oci_layout::stored_image(&reference, &manifest, store) {
        Ok(Some(image)) => Ok(Some((record, image))),
        // A manifest or config the store holds but cannot read as one: built again.
        Ok(None) | Err(ImageError::BadManifest { .. }) => Ok(None),
        Err(source) => Err(BuildError::Import {
            dockerfile: PathBuf::from(&record.dockerfile),
            source,
        }),
    }
}

fn read_record(path: &Path) -> Option<BuildRecord> {
    let file = File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_RECORD).read_to_end(&mut bytes).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Whole or absent (see [`crate::state::write_whole`]).
fn write_record(path: &Path, record: &BuildRecord) -> Result<(), BuildError> {
    let bytes = serde_json::to_vec_pretty(record).map_err(|e| io_at(path)(e.into()))?;
    crate::state::write_whole(path, &bytes).map_err(io_at(path))
}

/// One build being made.
struct Run<'a> {
    builder: &'a Builder,
    /// The Dockerfile as the request named it, for errors.
    named: &'a Path,
    /// Absolute, as the builder is given them.
    dockerfile: &'a Path,
    context: &'a Path,
    dockerfile_bytes: &'a [u8],
    key: &'a Digest,
    log_path: &'a Path,
    /// The builder's storage.
    storage: PathBuf,
    store: &'a Store,
}

impl Run<'_> {
    /// A directory of this build's own under the builder's storage.
    fn work_dir(&self) -> Result<PathBuf, BuildError> {
        let tmp = self.storage.join("tmp");
        fs::create_dir_all(&tmp).map_err(io_at(&tmp))?;
        let work = tmp.join(format!(
            "{}.{}.{}",
            self.key.hex(),
            std::process::id(),
            crate::id::unique_hex(8)
        ));
        fs::create_dir(&work).map_err(io_at(&work))?;
        Ok(work)
    }

    /// The builder's version, the build, the image pushed to a layout and imported.
    fn build(
        &self,
        req: &BuildRequest,
        work: &Path,
        config: &RegistryConfig,
    ) -> Result<(PulledImage, String), BuildError> {
        if let Some(dir) = self.log_path.parent() {
            fs::create_dir_all(dir).map_err(io_at(dir))?;
        }
        let file = File::create(self.log_path).map_err(io_at(self.log_path))?;
        let mut log = Log::new(file);
        let text = String::from_utf8_lossy(self.dockerfile_bytes);
        let from = builder::from_registries(&text, req.args);
        let conf = work.join("registries.conf");
        fs::write(&conf, builder::registries_conf(config, &from)).map_err(io_at(&conf))?;
        let command = |args: &[std::ffi::OsString]| {
            let mut c = self.builder.command(&self.storage, &conf);
            c.args(args);
            c
        };

        let version_args = ["--version".into()];
        let out = self.step(
            command(&version_args),
            &mut log,
            Instant::now() + VERSION_TIMEOUT,
            "--version",
        )?;
        let version = out.first().cloned().unwrap_or_default();

        let deadline = Instant::now() + req.timeout;
        let reference = built_reference(self.key);
        let name = reference.to_string();
        let args = self
            .builder
            .build_args(self.dockerfile, self.context, &name, req.args);
        self.timed(command(&args), &mut log, deadline, "build", req.timeout)?;
        let layout = "layout";
        let push = [
            "push".into(),
            name.clone().into(),
            format!("oci:{layout}").into(),
        ];
        let mut c = command(&push);
        // Relative to the work directory: an `oci:` path may not hold a `:`.
        c.current_dir(work);
        self.timed(c, &mut log, deadline, "push", req.timeout)?;
        let image = oci_layout::import_layout(&work.join(layout), &reference, self.store).map_err(
            |source| BuildError::Import {
                dockerfile: self.named.to_path_buf(),
                source,
            },
        )?;
        // The image is the store's now; the builder's copy only takes room.
        let rmi = ["rmi".into(), name.into()];
        let _ = build_run::run_step(command(&rmi), &mut log, Instant::now() + RMI_TIMEOUT);
        Ok((image, version))
    }

    fn timed(
        &self,
        cmd: std::process::Command,
        log: &mut Log,
        deadline: Instant,
        step: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, BuildError> {
        self.step(cmd, log, deadline, step).map_err(|e| match e {
            BuildError::Failed { status: None, .. } => BuildError::TimedOut {
                dockerfile: self.named.to_path_buf(),
                timeout,
                log: self.log_path.to_path_buf(),
            },
            e => e,
        })
    }

    /// Runs one step into the log; its output's last lines when it succeeds.
    fn step(
        &self,
        cmd: std::process::Command,
        log: &mut Log,
        deadline: Instant,
        step: &str,
    ) -> Result<Vec<String>, BuildError> {
        let out = build_run::run_step(cmd, log, deadline).map_err(|source| BuildError::Spawn {
            program: self.builder.program.clone(),
            source,
        })?;
        let status = match out.ended {
            Ended::Exited(s) if s.success() => return Ok(out.tail),
            Ended::Exited(s) => Some(s),
            Ended::TimedOut => None,
        };
        Err(BuildError::Failed {
            dockerfile: self.named.to_path_buf(),
            step: format!("{} {step}", self.builder.name()),
            status,
            log: self.log_path.to_path_buf(),
            tail: out.tail,
        })
    }
}
