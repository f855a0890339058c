//! `wmo-e2b image pull|list|prune`: prefetch images into the store, show what it holds, and
//! reclaim the space of what no sandbox uses.

use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Subcommand;
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
    /// The images pulled into the store: reference, content digest, when.
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
        ImageCommand::List { json } => {
            let records = store.records()?;
            if json {
                println!("{}", serde_json::to_string(&records)?);
            } else if records.is_empty() {
                println!("no images pulled");
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
