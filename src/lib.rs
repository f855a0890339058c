//! wmo-e2b: run AI-agent episodes inside sandboxes while the host keeps the credentials.
//!
//! The binary (`src/main.rs`, `src/commands/`) only parses, wires and prints; everything a
//! test needs to reach lives in these modules.

pub mod analysis;
pub mod backoff;
pub mod cancel;
pub mod channel;
pub mod civil;
pub mod deep_remove;
pub mod digest;
pub mod emulator;
pub mod environment;
pub mod episode;
pub mod errors;
pub mod eval;
pub mod glob;
pub mod id;
pub mod image;
pub mod pool;
pub mod project;
pub mod provider;
pub mod reap;
pub mod report;
pub mod runner;
pub mod sandbox;
pub mod skills;
pub mod state;
pub mod sync;
pub mod task;
pub mod terminal;
pub mod tree;
