//! An E2B-compatible server backed by local sandboxes: the control plane (create, connect,
//! list, kill, timeout, network) and envd (processes over Connect JSON, files) on one port,
//! envd requests routed by their `E2b-Sandbox-Id` header, with seeded fault injection.
//!
//! Layout: `server` (start, stop, routing, the sandbox table), `http` (the HTTP/1.1 server),
//! `control` (control-plane endpoints), `envd` (envd routing and auth), `process` (process
//! RPCs and streams), `files` (`/files` and filesystem RPCs), `connect` (the Connect
//! protocol), `paths` (E2B paths onto local ones), `faults` (fault injection).

mod connect;
mod control;
mod envd;
mod faults;
mod files;
mod http;
mod paths;
mod process;
mod server;

pub use faults::{FaultCounts, FaultSpec, FaultSpecError, DEFAULT_SEED};
pub use server::{
    AccessLog, Emulator, EmulatorConfig, EmulatorError, EmulatorHandle, Stats, StopReport,
    CLIENT_ID, ENVD_VERSION,
};
