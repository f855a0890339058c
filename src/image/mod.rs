//! Container images: references, a daemonless registry client, a content-addressed store
//! shared by every run on the machine, and layers unpacked into root filesystems.

pub mod auth;
pub mod error;
mod layer;
pub mod manifest;
pub mod pull;
pub mod reference;
pub mod registry;
mod rootfs;
pub mod settings;
pub mod store;
pub mod tar_reader;
pub mod unpack;
pub mod unpacked;
mod zstd;

pub use error::ImageError;
pub use pull::{pull, pull_with, Layer, PulledImage};
pub use reference::{Digest, Reference};
pub use settings::RegistryConfig;
pub use store::Store;
pub use unpacked::unpacked_root;
