//! Container images: references, a daemonless registry client, a content-addressed store
//! shared by every run on the machine, and layers unpacked into root filesystems.

pub mod auth;
pub mod error;
pub mod manifest;
pub mod pull;
pub mod reference;
pub mod registry;
pub mod settings;
pub mod store;
pub mod unpack;

pub use error::ImageError;
pub use pull::{pull, pull_with, Layer, PulledImage};
pub use reference::{Digest, Reference};
pub use settings::RegistryConfig;
pub use store::Store;
