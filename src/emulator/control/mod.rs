//! The control plane: create, connect, get, list, kill, timeout, network, and the stats
//! endpoint. Shapes and statuses follow `shared/docs/e2b-wire.md` §1–§2; every error body is
//! `{"code": <status>, "message": "..."}` (`Response::error`) because the SDK's parsers
//! require both keys.
//!
//! Layout: `routes` (admission and routing), `create`, `lifecycle` (one sandbox: get,
//! connect, kill, timeouts, network), `list` (filters and paging), `body` (reading request
//! bodies), `reply` (errors and the sandbox objects answered with).

mod body;
mod create;
mod lifecycle;
mod list;
mod reply;
mod routes;

pub(super) use routes::{admit, handle};
