//! `wmo-e2b image pull|build|list|prune`: prefetch or build images into the store, show what
//! it holds, and reclaim the space of what no sandbox uses.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Subcommand;
use wmo_e2b::image::build::{default_dockerfile, BuildRequest};
use wmo_e2b::image::build_key::parse_build_args;
use wmo_e2b::image::{pull, unpacked_root, Reference, RegistryConfig, Store};
use wmo_e2b::sandbox::local::images_in_use;
use wmo_e2b::terminal::escape;

use super::Exit;

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Pull an image (`[host[:port]/]path[:tag][@sha256:...]`) into the store under
    /// $WMO_E2B_HOME/images, shared by every run on this machine, and unpack it there.
    Pull {
        #[arg(value_name = "REFERENCE")]
        reference: String,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Build CONTEXT's Dockerfile with buildah (or podman) into the store, unless the same
    /// Dockerfile, context and build arguments were built before on this machine.
    Build {
        #[arg(value_name = "CONTEXT")]
        context: PathBuf,
        /// The Dockerfile [default: CONTEXT/Dockerfile, else CONTEXT/Containerfile].
        #[arg(short = 'f', long = "file", value_name = "DOCKERFILE")]
        file: Option<PathBuf>,
        /// A build argument (`NAME=VALUE`), part of the build's key; repeatable.
        #[arg(long = "build-arg", value_name = "NAME=VALUE")]
        build_args: Vec<String>,
        /// The build's bound; past it the builder is killed.
        #[arg(long, default_value = "30m", value_parser = super::bounds::duration)]
        timeout: Duration,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// The images pulled or built into the store: reference, content digest, when.
    List {
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Remove from the store every image no local sandbox runs on, and what interrupted
    /// pulls left; waits for running pulls and evals on images to finish first.
    Prune {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: ImageCommand) -> Result<Exit> {
    let store = Store::open_default().context("cannot open the image store")?;
    match cmd {
        ImageCommand::Pull { reference, json } => {
            let reference = Reference::parse(&reference)?;
            let config = RegistryConfig::load_default()?;
            let image = pull(&reference, &store, &config)
                .with_context(|| format!("cannot pull {reference}"))?;
            // Unpacked too, so that a run on this machine starts on it at once.
            let rootfs = unpacked_root(&image, &store)
                .with_context(|| format!("cannot unpack {reference}"))?;
            let bytes: u64 = image.layers.iter().map(|l| l.size).sum();
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "reference": image.reference.to_string(),
                        "digest": image.digest.as_str(),
                        "manifest_digest": image.manifest_digest.as_str(),
                        "config_digest": image.config_digest.as_str(),
                        "layers": image.layers.len(),
                        "layer_bytes": bytes,
                        "rootfs": rootfs,
                    })
                );
            } else {
                println!("{}", escape(&image.reference.to_string()));
                println!("  digest    {}", image.digest);
                if image.manifest_digest != image.digest {
                    println!("  manifest  {} (this platform's)", image.manifest_digest);
                }
                println!("  layers    {} ({bytes} bytes)", image.layers.len());
                println!("  unpacked  {}", escape(&rootfs.display().to_string()));
            }
        }
        ImageCommand::Prune { json } => {
            let keep = images_in_use(&wmo_e2b::state::state_dir());
            let pruned = store.prune(&keep).context("cannot prune the image store")?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "records": pruned.records,
                        "blobs": pruned.blobs,
                        "roots": pruned.roots,
                        "bytes": pruned.bytes,
                        "kept_in_use": keep.len(),
                    })
                );
            } else {
                println!(
                    "removed {} image(s), {} blob(s) ({} bytes), {} unpacked root(s); kept {} in use",
                    pruned.records,
                    pruned.blobs,
                    pruned.bytes,
                    pruned.roots,
                    keep.len()
                );
            }
        }
        ImageCommand::Build {
            context,
            file,
            build_args,
            timeout,
            json,
        } => {
            let args = parse_build_args(&build_args)?;
            let dockerfile = file.unwrap_or_else(|| default_dockerfile(&context));
            let log_dir = store.root().join("builds");
            let request = BuildRequest {
                dockerfile: &dockerfile,
                context: &context,
                args: &args,
                timeout,
                log_dir: &log_dir,
            };
            let config = RegistryConfig::load_default()?;
            let built = wmo_e2b::image::build(&request, None, &store, &config)?;
            let r = &built.record;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "key": built.key.as_str(),
                        "fresh": built.fresh,
                        "reference": r.reference,
                        "manifest_digest": r.manifest_digest,
                        "config_digest": built.image.config_digest.as_str(),
                        "layers": built.image.layers.len(),
                        "builder": r.builder,
                        "builder_version": r.builder_version,
                        "built_at": r.built_at,
                        "log": built.fresh.then_some(&built.log),
                    })
                );
            } else {
                let what = if built.fresh {
                    "built"
                } else {
                    "found (built before)"
                };
                println!("{} {what}", escape(&dockerfile.display().to_string()));
                println!("  key      {}", built.key);
                println!("  image    {}", escape(&r.reference));
                println!("  digest   {}", r.manifest_digest);
                println!("  builder  {}", escape(&r.builder_version));
                if built.fresh {
                    println!("  log      {}", escape(&built.log.display().to_string()));
                }
            }
        }
        ImageCommand::List { json } => {
            let records = store.records()?;
            if json {
                println!("{}", serde_json::to_string(&records)?);
            } else if records.is_empty() {
                println!("no images pulled or built");
            } else {
                println!("{:<20}  {:<71}  reference", "pulled (UTC)", "digest");
                for r in records {
                    let when = UNIX_EPOCH + Duration::from_secs(r.pulled_at);
                    println!(
                        "{:<20}  {:<71}  {}",
                        humantime::format_rfc3339_seconds(when).to_string(),
                        escape(&r.digest),
                        escape(&r.reference)
                    );
                }
            }
        }
    }
    Ok(Exit::Success)
}
