//! Files: `GET /files` and `POST /files` (multipart or octet-stream, optionally gzipped), and
//! the filesystem.Filesystem RPCs (Stat, MakeDir, ListDir, Remove, Move) with `EntryInfo`
//! shaped as envd sends it.
//!
//! Layout: `locate` (E2B paths onto the sandbox's confined directories, symlinks resolved as
//! the sandbox would), `transfer` (`/files`), `multipart` (upload bodies), `filesystem` (the
//! RPCs).

mod filesystem;
mod locate;
mod multipart;
mod transfer;

pub(super) use filesystem::rpc;
pub(super) use locate::{resolve, Follow};
pub(super) use transfer::{download, upload};
