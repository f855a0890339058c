//! The pi harness: the real pi agent loop (`@mariozechner/pi-agent-core`'s `runAgentLoop`)
//! run by the runner in place of its builtin loop, for episodes whose `episode_start` says
//! `"harness": "pi"`.
//!
//! What a sandbox gets of pi is one file: an ES module bundling the pinned packages (and
//! what they load), built once on the host by a pinned esbuild ([`ensure_installed`], into
//! `<state_dir>/npm/pi-<version>/`). The runner is told where it is (`WMO_PI_BUNDLE`) and
//! its sha256 (`WMO_PI_BUNDLE_SHA256`), checks the digest before its hello, and imports it
//! lazily at its first pi episode, through `pi_harness.mjs`. A local sandbox sees the
//! host's bundle through a read-only mount; any other gets it placed by the bootstrap
//! ([`place_bundle`]): a template's baked copy when its digest matches, otherwise an upload,
//! once per sandbox. No sandbox runs npm.

mod build;
mod bundle;
pub(crate) mod command;
mod error;
mod install;
mod sandbox;

pub use build::{InstallOpts, DEFAULT_INSTALL_TIMEOUT, NPM_CI_ARGS};
pub use bundle::{PiBundle, MAX_BUNDLE_BYTES};
pub use error::PiError;
pub use install::{ensure_installed, ensure_installed_with, find_installed, install_dir};
pub use sandbox::{check_hello, place_bundle, uploaded_path};

/// The exact version of both pi packages.
pub const PI_VERSION: &str = "0.73.1";

/// The packages bundled, each at [`PI_VERSION`].
pub const PI_PACKAGES: [&str; 2] = ["@mariozechner/pi-agent-core", "@mariozechner/pi-ai"];

/// The exact version of the bundler (esbuild, from npm; its platform binary is one of its
/// optional dependencies, also from the npm registry).
pub const ESBUILD_VERSION: &str = "0.28.2";

/// The runner's environment variable naming the bundle file.
pub const PI_BUNDLE_ENV: &str = "WMO_PI_BUNDLE";

/// The runner's environment variable holding the bundle's sha256 (hex), which the runner
/// checks before it says hello.
pub const PI_BUNDLE_SHA256_ENV: &str = "WMO_PI_BUNDLE_SHA256";

/// The bundle's file name in an install directory and in a template.
pub const BUNDLE_FILE: &str = "pi.mjs";

/// Where pi lives in a sandbox's system directory: the template recipe
/// (`scripts/e2b-template/`) bakes the bundle there, and a local bwrap sandbox is shown the
/// host's install there (read-only, to the runner only).
pub const SANDBOX_PI_DIR: &str = "/opt/wmo-e2b/pi";

/// The bundle under [`SANDBOX_PI_DIR`].
pub const TEMPLATE_PI_BUNDLE: &str = "/opt/wmo-e2b/pi/pi.mjs";

/// What the bundle is built from, embedded in this binary and written into the build
/// directory: the pins (`package.json`), every package's exact version and integrity
/// (`package-lock.json`, so the same inputs give the same bundle), the bundle's entry point
/// and the build script.
pub const BUILD_INPUTS: [(&str, &str); 4] = [
    ("package.json", include_str!("../../runner/pi/package.json")),
    (
        "package-lock.json",
        include_str!("../../runner/pi/package-lock.json"),
    ),
    ("entry.mjs", include_str!("../../runner/pi/entry.mjs")),
    ("build.mjs", include_str!("../../runner/pi/build.mjs")),
];

/// The exact package specs the bundle is built from, e.g. `@mariozechner/pi-ai@0.73.1`.
pub fn specs() -> Vec<String> {
    PI_PACKAGES
        .iter()
        .map(|p| format!("{p}@{PI_VERSION}"))
        .chain([format!("esbuild@{ESBUILD_VERSION}")])
        .collect()
}

/// An installed pi: the bundle, in its install directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PiInstall {
    /// `<state_dir>/npm/pi-<version>`: the bundle, its build inputs and the build's report.
    pub dir: std::path::PathBuf,
    pub bundle: PiBundle,
    /// The bundled version ([`PI_VERSION`]).
    pub version: String,
}

impl PiInstall {
    /// How a local backend shows this install to confined runners: the host directory
    /// (holding the bundle), and the sandbox path it is mounted at, read-only.
    pub fn local_mount(&self) -> (std::path::PathBuf, String) {
        (self.dir.clone(), SANDBOX_PI_DIR.to_string())
    }

    /// What a local runner is given: the bundle where it sees it (the mount under bwrap,
    /// the host file when unconfined).
    pub fn local_shipment(&self, isolation: crate::sandbox::local::Isolation) -> PiShipment {
        let seen = match isolation {
            crate::sandbox::local::Isolation::Bwrap => format!("{SANDBOX_PI_DIR}/{BUNDLE_FILE}"),
            crate::sandbox::local::Isolation::None => {
                self.bundle.file.to_string_lossy().into_owned()
            }
        };
        PiShipment {
            bundle: self.bundle.clone(),
            seen_at: Some(seen),
        }
    }

    /// What a runner in a sandbox that cannot see the host is given: the bundle, placed by
    /// the bootstrap.
    pub fn placed_shipment(&self) -> PiShipment {
        PiShipment {
            bundle: self.bundle.clone(),
            seen_at: None,
        }
    }
}

/// How the bootstrap gives a runner the pi harness (`BootstrapOpts::pi`).
#[derive(Debug, Clone)]
pub struct PiShipment {
    /// The bundle: its digest, which the runner must report back, and its bytes, for an
    /// upload.
    pub bundle: PiBundle,
    /// Where the sandbox already sees the bundle; `None`: the bootstrap places it
    /// ([`place_bundle`]).
    pub seen_at: Option<String>,
}

#[cfg(test)]
mod tests;
