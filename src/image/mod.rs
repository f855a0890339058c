//! Container images: references, a daemonless registry client, a content-addressed store
//! shared by every run on the machine, and layers unpacked into root filesystems.

pub mod reference;
pub mod registry;
pub mod store;
pub mod unpack;
