//! Files: `GET /files` and `POST /files` (multipart or octet-stream, optionally gzipped, with
//! file metadata), and the filesystem.Filesystem RPCs (Stat, MakeDir, ListDir, Remove, Move)
//! with `EntryInfo` shaped as envd sends it.
//!
//! Layout: `locate` (E2B paths onto the sandbox's confined directories, symlinks resolved as
//! the sandbox would), `transfer` (`/files`), `multipart` (upload bodies), `metadata` (what
//! uploads store on files as extended attributes), `filesystem` (the RPCs).

mod filesystem;
mod locate;
mod metadata;
mod multipart;
mod transfer;

pub(super) use filesystem::rpc;
pub(super) use locate::{resolve, Follow};
pub(super) use transfer::{download, upload};
