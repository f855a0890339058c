//! Container images: references, a daemonless registry client, a content-addressed store
//! shared by every run on the machine, images built from Dockerfiles into it, and layers
//! unpacked into root filesystems.

pub mod auth;
pub mod build;
pub mod build_key;
mod build_run;
pub mod builder;
pub mod context_archive;
pub mod dockerfile;
pub mod error;
mod layer;
pub mod manifest;
pub mod oci_layout;
pub mod pull;
pub mod reference;
pub mod registry;
mod rootfs;
pub mod settings;
pub mod store;
pub mod tar_reader;
pub mod task_root;
pub mod unpack;
pub mod unpacked;
mod zstd;

pub use build::{build, BuildError, BuildRequest, Built};
pub use builder::Builder;
pub use error::ImageError;
pub use pull::{pull, pull_with, Layer, PulledImage};
pub use reference::{Digest, Reference};
pub use settings::RegistryConfig;
pub use store::Store;
pub use task_root::task_root;
pub use unpacked::unpacked_root;
