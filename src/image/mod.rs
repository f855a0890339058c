//! Container images: references, a daemonless registry client, a content-addressed store
//! shared by every run on the machine, and layers unpacked into root filesystems.

mod layer;
pub mod reference;
pub mod registry;
mod rootfs;
pub mod store;
pub mod tar_reader;
pub mod unpack;
mod zstd;
