//! The E2B backend: sandboxes are E2B microVMs, driven over E2B's control-plane REST API and
//! each sandbox's envd (Connect protocol with the JSON codec, plus `/files`). Blocking, on
//! one shared `ureq` agent; process streams are read by one thread each.
//!
//! Layout:
//!
//! ```text
//! config.rs    endpoints and key from E2B_API_KEY / E2B_DOMAIN / E2B_API_URL / E2B_SANDBOX_URL
//! api/         control plane: create (v2, v1 fallback), connect, info, list, kill, timeout,
//!              network (mod.rs), and its JSON (wire.rs)
//! envd/        envd: unary and streaming Connect calls, /health (mod.rs), process streams
//!              (events.rs), /files (files.rs), versions and what they gate (version.rs)
//! envelope.rs  the Connect streaming envelope codec
//! process.rs   process streams to ProcessEvents (reader threads) and foreground collection
//! error.rs     classification of statuses, Connect codes and failed exchanges
//! gate.rs      the create-rate gate and the live-sandbox cap
//! retry.rs     how calls are repeated (policy and its one loop, counts, idempotency keys)
//! backend.rs   E2bBackend (Backend)
//! templates.rs templates made from task images, built once per content and recorded
//! sandbox.rs   E2bSandbox (Sandbox)
//! ```
//!
//! `shared/docs/e2b-wire.md` describes the wire protocol this follows.

mod api;
mod backend;
pub mod config;
mod envd;
pub mod envelope;
pub mod error;
pub mod gate;
mod process;
mod retry;
mod reuse;
mod sandbox;
mod templates;

pub use api::SandboxDetail;
pub use backend::{E2bBackend, E2bCounters, E2bOptions};
pub use config::{ConfigError, E2bConfig};
pub use envd::version::{EnvdRefused, EnvdVersion, MIN_ENVD};
pub use gate::{Clock, CreateRejected, SystemClock};
pub use retry::{is_idempotency_key, RetryPolicy};
pub use sandbox::{E2bSandbox, HOME};
pub use templates::{TemplateSource, Upload, E2B_USER_ID};
