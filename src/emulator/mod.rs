//! An E2B-compatible server backed by local sandboxes: the control plane (create, connect,
//! list, kill, timeout, network) and envd (processes over Connect JSON, files) on one port,
//! envd requests routed by their `E2b-Sandbox-Id` header, with seeded fault injection.
//!
//! Layers, each importing only the ones below it:
//! - `server`: start, stop, and routing each request to the control plane or to envd.
//! - `control` (the control-plane endpoints) and `envd` (envd's routing and auth, its
//!   `process` and `files` services).
//! - `edge` (E2B's edge proxy: which sandbox and port a request is for, a sandbox's own
//!   ports) and `tunnel` (HTTPS to a sandbox's port through `CONNECT`, with `tls`'s
//!   certificate).
//! - `templates`: template builds on the host's image builder, and the images sandboxes of
//!   a built template run on.
//! - `state`: the sandbox table and everything the request threads share.
//! - `hub` (the thread that follows one envd process), `config` (what an emulator is
//!   started with), `http` (the HTTP/1.1 server), `connect` (the Connect protocol), `paths`
//!   (E2B paths onto local ones), `faults` (fault injection), `keys` (one sandbox per
//!   `Idempotency-Key`).

mod config;
mod connect;
mod control;
mod edge;
mod envd;
mod faults;
mod http;
mod hub;
mod keys;
mod paths;
mod server;
mod state;
mod templates;
mod tls;
mod tunnel;

pub use config::{AccessLog, EmulatorConfig, Plan, BASE_TEMPLATE, CLIENT_ID, ENVD_VERSION};
pub use faults::{FaultCounts, FaultSpec, FaultSpecError, DEFAULT_SEED};
pub use server::{Emulator, EmulatorError, EmulatorHandle, StopReport};
pub use state::Stats;
pub use tls::{TlsError, TlsIdentity};
