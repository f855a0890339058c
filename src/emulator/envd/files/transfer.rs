//! `GET /files` (a download, streamed from the file) and `POST /files` (an upload of one or
//! more files, written only once every target checked out).

use std::io::{self, Read};

use flate2::read::GzDecoder;
use serde_json::{json, Value};

use super::locate::{locate, root_only, Follow};
use super::metadata::{self, StoreError};
use super::multipart::{media_param, multipart};
use crate::emulator::envd::call::files_user;
use crate::emulator::http::{Body, Request, Response, MAX_BODY_BYTES};
use crate::emulator::paths;
use crate::emulator::state::SandboxEntry;
use crate::errors::error_chain;
use crate::sandbox::{ErrorClass, Role, SandboxError};

/// The one file outside the sandbox's own directories a download may read: the sandbox's
/// boot id, by which a client tells a memory resume from a reboot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

pub(in crate::emulator) fn download(entry: &SandboxEntry, req: &Request) -> Response {
    match read_file(entry, req) {
        Ok(resp) | Err(resp) => resp,
    }
}

pub(in crate::emulator) fn upload(entry: &SandboxEntry, req: &Request) -> Response {
    match write_files(entry, req) {
        Ok(resp) | Err(resp) => resp,
    }
}

fn read_file(entry: &SandboxEntry, req: &Request) -> Result<Response, Response> {
    let role = files_user(req)?;
    let path = req
        .query("path")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| Response::error(400, "path is required"))?;
    if paths::normalize(path, role).is_ok_and(|p| p == BOOT_ID) {
        return read_boot_id(entry);
    }
    let (files, rel, e2b) =
        locate(entry, path, role, Follow::All).map_err(|m| Response::error(400, m))?;
    if role == Role::Task && root_only(&e2b) {
        return Err(Response::error(
            403,
            format!("cannot open '{e2b}': permission denied"),
        ));
    }
    let meta = match files.metadata(&rel) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Response::error(404, format!("path '{e2b}' does not exist")))
        }
        Err(e) => return Err(Response::error(400, fs_error(entry, &e2b, "stat", e))),
    };
    if meta.is_dir() {
        return Err(Response::error(400, format!("path '{e2b}' is a directory")));
    }
    let file = files
        .open_read(&rel)
        .map_err(|e| Response::error(400, fs_error(entry, &e2b, "open", e)))?;
    let len = file.metadata().map_or(meta.len(), |m| m.len());
    let name = e2b.rsplit('/').next().unwrap_or("");
    Ok(Response {
        status: 200,
        headers: vec![
            ("Content-Type".into(), "application/octet-stream".into()),
            (
                "Content-Disposition".into(),
                format!("inline; filename={}", name.replace('"', "")),
            ),
        ],
        body: Body::File(file, len),
    })
}

fn read_boot_id(entry: &SandboxEntry) -> Result<Response, Response> {
    let id = entry
        .sandbox
        .boot_id()
        .map_err(|e| Response::error(500, error_chain(&e)))?;
    Ok(Response {
        status: 200,
        headers: vec![
            ("Content-Type".into(), "application/octet-stream".into()),
            (
                "Content-Disposition".into(),
                "inline; filename=boot_id".into(),
            ),
        ],
        body: Body::Bytes(format!("{id}\n").into_bytes()),
    })
}

/// A file operation's error as the local backend classifies it (a symlink out of the
/// sandbox is named, never followed).
fn fs_error(entry: &SandboxEntry, e2b: &str, what: &str, e: io::Error) -> String {
    error_chain(&entry.sandbox.file_error(e2b, what, e))
}

fn write_files(entry: &SandboxEntry, req: &Request) -> Result<Response, Response> {
    let role = files_user(req)?;
    let meta = metadata::from_headers(&req.headers)
        .map_err(|e| Response::error(400, format!("invalid metadata: {e}")))?;
    let body = decoded_body(req)?;
    let uploads = uploads(req, body)?;
    if uploads.is_empty() {
        return Err(Response::error(400, "no file in the request"));
    }
    let mut resolved = Vec::with_capacity(uploads.len());
    for (path, data) in uploads {
        let (files, rel, e2b) =
            locate(entry, &path, role, Follow::All).map_err(|m| Response::error(400, m))?;
        if role == Role::Task && root_only(&e2b) {
            return Err(Response::error(
                403,
                format!("cannot write '{e2b}': permission denied"),
            ));
        }
        if resolved.iter().any(|(_, _, e, _)| *e == e2b) {
            return Err(Response::error(
                400,
                format!("path '{e2b}' is written twice"),
            ));
        }
        resolved.push((files, rel, e2b, data));
    }
    let mut written = Vec::new();
    for (files, rel, e2b, data) in resolved {
        if rel.is_empty() || files.metadata(&rel).is_ok_and(|m| m.is_dir()) {
            return Err(Response::error(400, format!("path '{e2b}' is a directory")));
        }
        let file = files
            .write_open(&rel, &data)
            .map_err(|e| write_error(&e2b, &entry.sandbox.file_error(&e2b, "write", e)))?;
        // Every upload sets the whole metadata, none included: envd's overwrite replaces it.
        metadata::replace(&file, &meta).map_err(|e| match e {
            StoreError::NoSpace(_) => Response::error(507, e.to_string()),
            StoreError::Failed(_) => Response::error(500, e.to_string()),
        })?;
        let name = e2b.rsplit('/').next().unwrap_or("").to_string();
        let mut info = json!({"path": e2b, "name": name, "type": "file"});
        // What the file holds now, as envd reads it back.
        let stored = metadata::read(&file);
        if !stored.is_empty() {
            info["metadata"] = json!(stored);
        }
        written.push(info);
    }
    Ok(Response::json(200, &Value::Array(written)))
}

/// The files a request uploads, each with the path it goes to: an octet-stream body to the
/// `path` parameter; each `file` part of a multipart body to `path`, or else its filename.
fn uploads(req: &Request, body: Vec<u8>) -> Result<Vec<(String, Vec<u8>)>, Response> {
    let query_path = req.query("path").filter(|p| !p.is_empty());
    match req.media_type().as_str() {
        "application/octet-stream" => {
            let path = query_path.ok_or_else(|| {
                Response::error(400, "path is required for application/octet-stream uploads")
            })?;
            Ok(vec![(path.to_string(), body)])
        }
        "multipart/form-data" => {
            let content_type = req.header("content-type").unwrap_or("");
            let boundary = media_param(content_type, "boundary")
                .ok_or_else(|| Response::error(400, "multipart body without a boundary"))?;
            let parts = multipart(&body, &boundary)
                .map_err(|m| Response::error(400, format!("malformed multipart body: {m}")))?;
            parts
                .into_iter()
                .filter(|p| p.name.as_deref() == Some("file"))
                .map(|part| match (query_path, part.filename) {
                    (Some(p), _) => Ok((p.to_string(), part.data)),
                    (None, Some(f)) if !f.is_empty() => Ok((f, part.data)),
                    _ => Err(Response::error(
                        400,
                        "a file part has no filename and no path was given",
                    )),
                })
                .collect()
        }
        other => Err(Response::error(
            400,
            format!("unsupported content type: {other:?}"),
        )),
    }
}

fn write_error(e2b: &str, e: &SandboxError) -> Response {
    let text = error_chain(e);
    let no_space = matches!(e, SandboxError::Io { source, .. }
        if source.raw_os_error() == Some(libc::ENOSPC));
    if no_space {
        return Response::error(507, "not enough disk space available");
    }
    match e.class() {
        ErrorClass::BadRequest => Response::error(400, format!("cannot write '{e2b}': {text}")),
        ErrorClass::Gone => Response::error(502, "The sandbox was not found"),
        _ => Response::error(500, format!("cannot write '{e2b}': {text}")),
    }
}

/// The request body with its `Content-Encoding` undone (gzip or identity).
fn decoded_body(req: &Request) -> Result<Vec<u8>, Response> {
    match req
        .header("content-encoding")
        .map(|e| e.trim().to_ascii_lowercase())
    {
        None => Ok(req.body.clone()),
        Some(e) if e.is_empty() || e == "identity" => Ok(req.body.clone()),
        Some(e) if e == "gzip" => {
            let mut out = Vec::new();
            let limit = MAX_BODY_BYTES as u64;
            GzDecoder::new(req.body.as_slice())
                .take(limit + 1)
                .read_to_end(&mut out)
                .map_err(|e| Response::error(400, format!("invalid gzip body: {e}")))?;
            if out.len() as u64 > limit {
                return Err(Response::error(413, "the decompressed body is too large"));
            }
            Ok(out)
        }
        Some(e) => Err(Response::error(
            400,
            format!("unsupported content encoding {e:?}"),
        )),
    }
}
