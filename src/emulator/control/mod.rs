//! The control plane: create, connect, get, list, kill, timeout, network, pause, resume, and
//! the stats endpoint. Shapes and statuses follow `shared/docs/e2b-wire.md` §1–§2; every error body is
//! `{"code": <status>, "message": "..."}` (`Response::error`) because the SDK's parsers
//! require both keys.
//!
//! Layout: `routes` (admission and routing), `create`, `lifecycle` (one sandbox: get,
//! connect, kill, timeouts, pause, resume, network), `list` (filters and paging), `body`
//! (reading request bodies), `reply` (errors and the sandbox objects answered with). Whether
//! a sandbox runs or is paused is the local backend's to say (it pauses one at its timeout
//! by itself); the table keeps only what E2B reports and the backend does not know.

mod body;
mod create;
mod lifecycle;
mod list;
mod reply;
mod routes;

pub(super) use routes::{admit, handle};
