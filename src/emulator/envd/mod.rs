//! envd: requests carrying `E2b-Sandbox-Id`, routed to the sandbox they name, checked for
//! its access token, and dispatched to health, files, and the Connect services.
//!
//! Layout: `routes` (the sandbox, its token, and the endpoint), `signing` (signed `/files`
//! URLs), `call` (the users and the unary Connect calls both services share), `process`
//! (process.Process), `files` (`/files` and filesystem.Filesystem).

mod call;
mod files;
mod process;
mod routes;
mod signing;

pub(super) use routes::{handle, handle_signed};
pub(super) use signing::is_signed;
