//! Files: `GET /files` and `POST /files` (multipart or octet-stream, optionally gzipped), and
//! the filesystem.Filesystem RPCs (Stat, MakeDir, ListDir, Remove, Move) with `EntryInfo`
//! shaped as envd sends it.

use std::fs::Metadata as FsMetadata;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;

use flate2::read::GzDecoder;
use serde_json::{json, Map, Value};

use super::connect::{int_field, string_field, Code, RpcError, RpcResult};
use super::envd::{files_user, plain_error};
use super::http::{Body, Request, Response, MAX_BODY_BYTES};
use super::paths;
use super::server::SandboxEntry;
use crate::sandbox::local::confined::Beneath;
use crate::sandbox::{ErrorClass, Role, SandboxError};

/// Entries one ListDir returns at most.
const MAX_LIST_ENTRIES: usize = 100_000;
/// The system directory, which only `root` may write (as on E2B, where it is root's).
const SYSTEM_DIR: &str = "/opt/wmo-e2b";

/// The user E2B reports as the owner (and group) of a path.
fn owner_of(e2b: &str) -> &'static str {
    if under_system(e2b) {
        "root"
    } else {
        "user"
    }
}

fn under_system(e2b: &str) -> bool {
    e2b.strip_prefix(SYSTEM_DIR)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Symlink hops one path may take, as Linux allows.
const MAX_HOPS: usize = 40;

/// How much of a path's symlinks envd would follow for an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Follow {
    /// Every component (reads, writes, listings, working directories).
    All,
    /// All but the last, which is acted on itself (stat, remove, move).
    Parents,
}

/// Resolves the symlinks of a normalized E2B path as the sandbox itself would, so a link
/// made inside the sandbox works as on E2B. Each hop is looked up beneath the sandbox's
/// directories; what lies outside them is never looked at (a link out is left for the
/// confined operation to refuse).
pub(super) fn resolve(entry: &SandboxEntry, e2b: &str, follow: Follow) -> Result<String, String> {
    let mut todo: std::collections::VecDeque<String> = e2b
        .split('/')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    let mut done = String::new();
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        match part.as_str() {
            "." => continue,
            ".." => {
                done.truncate(done.rfind('/').unwrap_or(0));
                continue;
            }
            _ => {}
        }
        let candidate = format!("{done}/{part}");
        if todo.is_empty() && follow == Follow::Parents {
            done = candidate;
            break;
        }
        let link = entry.sandbox.files(&candidate).ok().and_then(|(b, rel)| {
            b.symlink_metadata(&rel)
                .ok()
                .filter(|m| m.file_type().is_symlink())
                .and_then(|_| b.read_link(&rel).ok())
        });
        let Some(target) = link else {
            done = candidate;
            continue;
        };
        hops += 1;
        if hops > MAX_HOPS {
            return Err(format!("too many levels of symbolic links: {e2b}"));
        }
        let target = target.to_string_lossy().into_owned();
        if target.starts_with('/') {
            done.clear();
        }
        for (i, p) in target.split('/').filter(|p| !p.is_empty()).enumerate() {
            todo.insert(i, p.to_string());
        }
    }
    Ok(if done.is_empty() { "/".into() } else { done })
}

/// The sandbox's confined view of an E2B path (its symlinks resolved as `follow` says), and
/// the path as requested, normalized.
fn locate(
    entry: &SandboxEntry,
    path: &str,
    role: Role,
    follow: Follow,
) -> Result<(Beneath, String, String), String> {
    let e2b = paths::normalize(path, role).map_err(|e| e.to_string())?;
    let resolved = resolve(entry, &e2b, follow)?;
    let (files, rel) = entry.sandbox.files(&resolved).map_err(|e| match e {
        SandboxError::BadPath { .. } => format!(
            "path '{e2b}' is outside /home/user, /tmp and {SYSTEM_DIR}: the emulator serves only these"
        ),
        other => crate::errors::error_chain(&other),
    })?;
    Ok((files, rel, e2b))
}

pub(super) fn download(entry: &SandboxEntry, req: &Request) -> Response {
    let role = match files_user(req) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let Some(path) = req.query("path").filter(|p| !p.is_empty()) else {
        return plain_error(400, "path is required");
    };
    let (files, rel, e2b) = match locate(entry, path, role, Follow::All) {
        Ok(l) => l,
        Err(m) => return plain_error(400, &m),
    };
    if role == Role::Task && under_system(&e2b) {
        return plain_error(403, &format!("cannot open '{e2b}': permission denied"));
    }
    let meta = match files.metadata(&rel) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return plain_error(404, &format!("path '{e2b}' does not exist"))
        }
        Err(e) => return plain_error(400, &fs_error(entry, &e2b, "stat", e)),
    };
    if meta.is_dir() {
        return plain_error(400, &format!("path '{e2b}' is a directory"));
    }
    let file = match files.open_read(&rel) {
        Ok(f) => f,
        Err(e) => return plain_error(400, &fs_error(entry, &e2b, "open", e)),
    };
    let len = file.metadata().map_or(meta.len(), |m| m.len());
    let name = e2b.rsplit('/').next().unwrap_or("");
    Response {
        status: 200,
        headers: vec![
            ("Content-Type".into(), "application/octet-stream".into()),
            (
                "Content-Disposition".into(),
                format!("inline; filename={}", name.replace('"', "")),
            ),
        ],
        body: Body::File(file, len),
    }
}

/// A file operation's error as the local backend classifies it (a symlink out of the
/// sandbox is named, never followed).
fn fs_error(entry: &SandboxEntry, e2b: &str, what: &str, e: io::Error) -> String {
    crate::errors::error_chain(&entry.sandbox.file_error(e2b, what, e))
}

pub(super) fn upload(entry: &SandboxEntry, req: &Request) -> Response {
    let role = match files_user(req) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let body = match decoded_body(req) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let content_type = req.header("content-type").unwrap_or("");
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let query_path = req.query("path").filter(|p| !p.is_empty());
    let files: Vec<(String, Vec<u8>)> = match mime.as_str() {
        "application/octet-stream" => {
            let Some(path) = query_path else {
                return plain_error(400, "path is required for application/octet-stream uploads");
            };
            vec![(path.to_string(), body)]
        }
        "multipart/form-data" => {
            let Some(boundary) = media_param(content_type, "boundary") else {
                return plain_error(400, "multipart body without a boundary");
            };
            let parts = match multipart(&body, &boundary) {
                Ok(p) => p,
                Err(m) => return plain_error(400, &format!("malformed multipart body: {m}")),
            };
            let mut files = Vec::new();
            for part in parts
                .into_iter()
                .filter(|p| p.name.as_deref() == Some("file"))
            {
                let target = match (query_path, part.filename) {
                    (Some(p), _) => p.to_string(),
                    (None, Some(f)) if !f.is_empty() => f,
                    _ => {
                        return plain_error(
                            400,
                            "a file part has no filename and no path was given",
                        )
                    }
                };
                files.push((target, part.data));
            }
            files
        }
        other => return plain_error(400, &format!("unsupported content type: {other:?}")),
    };
    if files.is_empty() {
        return plain_error(400, "no file in the request");
    }
    let mut resolved = Vec::with_capacity(files.len());
    for (path, data) in files {
        let (files, rel, e2b) = match locate(entry, &path, role, Follow::All) {
            Ok(l) => l,
            Err(m) => return plain_error(400, &m),
        };
        if role == Role::Task && under_system(&e2b) {
            return plain_error(403, &format!("cannot write '{e2b}': permission denied"));
        }
        if resolved.iter().any(|(_, _, e, _)| *e == e2b) {
            return plain_error(400, &format!("path '{e2b}' is written twice"));
        }
        resolved.push((files, rel, e2b, data));
    }
    let mut written = Vec::new();
    for (files, rel, e2b, data) in resolved {
        if rel.is_empty() || files.metadata(&rel).is_ok_and(|m| m.is_dir()) {
            return plain_error(400, &format!("path '{e2b}' is a directory"));
        }
        if let Err(e) = files.write(&rel, &data) {
            return write_error(&e2b, &entry.sandbox.file_error(&e2b, "write", e));
        }
        let name = e2b.rsplit('/').next().unwrap_or("").to_string();
        written.push(json!({"path": e2b, "name": name, "type": "file"}));
    }
    Response::json(200, &Value::Array(written))
}

fn write_error(e2b: &str, e: &SandboxError) -> Response {
    let text = crate::errors::error_chain(e);
    let no_space = matches!(e, SandboxError::Io { source, .. }
        if source.raw_os_error() == Some(libc::ENOSPC));
    if no_space {
        return plain_error(507, "not enough disk space available");
    }
    match e.class() {
        ErrorClass::BadRequest => plain_error(400, &format!("cannot write '{e2b}': {text}")),
        ErrorClass::Gone => plain_error(502, "The sandbox was not found"),
        _ => plain_error(500, &format!("cannot write '{e2b}': {text}")),
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
                .map_err(|e| plain_error(400, &format!("invalid gzip body: {e}")))?;
            if out.len() as u64 > limit {
                return Err(plain_error(413, "the decompressed body is too large"));
            }
            Ok(out)
        }
        Some(e) => Err(plain_error(
            400,
            &format!("unsupported content encoding {e:?}"),
        )),
    }
}

/// A parameter of a header value like `multipart/form-data; boundary=xyz` or
/// `form-data; name="file"; filename="/home/user/a.txt"` (quoted strings unescaped as Go's
/// mime package does).
fn media_param(value: &str, name: &str) -> Option<String> {
    let mut rest = value.split_once(';')?.1;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        if rest.is_empty() {
            return None;
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_ascii_lowercase();
        let after = &rest[eq + 1..];
        let (val, next) = if let Some(quoted) = after.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            out.push(n);
                        }
                    }
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => out.push(c),
                }
            }
            (out, &quoted[end?..])
        } else {
            let stop = after.find(';').unwrap_or(after.len());
            (after[..stop].trim().to_string(), &after[stop..])
        };
        if key == name {
            return Some(val);
        }
        rest = next;
    }
}

struct Part {
    name: Option<String>,
    filename: Option<String>,
    data: Vec<u8>,
}

fn multipart(body: &[u8], boundary: &str) -> Result<Vec<Part>, &'static str> {
    let find = |from: usize, needle: &[u8]| {
        body.get(from..)
            .and_then(|hay| memchr::memmem::find(hay, needle))
            .map(|i| from + i)
    };
    let delimiter = format!("--{boundary}");
    // Every delimiter after the first is preceded by the CRLF that ends the part before it.
    let next_delimiter = format!("\r\n--{boundary}");
    let mut pos = find(0, delimiter.as_bytes()).ok_or("no boundary")? + delimiter.len();
    let mut parts = Vec::new();
    loop {
        let rest = body.get(pos..).ok_or("truncated body")?;
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        if !rest.starts_with(b"\r\n") {
            return Err("a boundary is not followed by CRLF");
        }
        let head_start = pos + 2;
        let head_end = find(head_start, b"\r\n\r\n").ok_or("a part has no header end")?;
        let data_start = head_end + 4;
        let data_end =
            find(data_start, next_delimiter.as_bytes()).ok_or("a part is not terminated")?;
        let head = String::from_utf8_lossy(&body[head_start..head_end]);
        let mut name = None;
        let mut filename = None;
        for line in head.split("\r\n") {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            if k.trim().eq_ignore_ascii_case("content-disposition") {
                name = media_param(v, "name");
                filename = media_param(v, "filename");
            }
        }
        parts.push(Part {
            name,
            filename,
            data: body[data_start..data_end].to_vec(),
        });
        pos = data_end + next_delimiter.len();
    }
}

fn io_error(what: &str, e2b: &str, e: &io::Error) -> RpcError {
    match e.raw_os_error() {
        Some(libc::EXDEV | libc::ELOOP) => RpcError::new(
            Code::InvalidArgument,
            format!("{what}: {e2b} goes through a symlink that leaves the sandbox"),
        ),
        _ => match e.kind() {
            io::ErrorKind::NotFound => RpcError::new(
                Code::NotFound,
                format!("{what}: no such file or directory: {e2b}"),
            ),
            io::ErrorKind::PermissionDenied => RpcError::new(
                Code::InvalidArgument,
                format!("{what}: permission denied: {e2b}"),
            ),
            _ => RpcError::new(Code::Internal, format!("{what} {e2b}: {e}")),
        },
    }
}

pub(super) fn rpc(entry: &SandboxEntry, method: &str, msg: &Value, role: Role) -> RpcResult<Value> {
    match method {
        "Stat" => stat(entry, msg, role),
        "MakeDir" => make_dir(entry, msg, role),
        "ListDir" => list_dir(entry, msg, role),
        "Remove" => remove(entry, msg, role),
        "Move" => move_entry(entry, msg, role),
        "WatchDir" | "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => Err(RpcError::new(
            Code::Unimplemented,
            "watching directories is not supported by the wmo-e2b emulator",
        )),
        other => Err(RpcError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{other} is not implemented"),
        )),
    }
}

/// A path argument, located; writes under the system directory need `root`.
fn path_arg(
    entry: &SandboxEntry,
    msg: &Value,
    name: &str,
    role: Role,
    write: bool,
    follow: Follow,
) -> RpcResult<(Beneath, String, String)> {
    let path = string_field(msg, name, name)?.unwrap_or_default();
    let (files, rel, e2b) =
        locate(entry, &path, role, follow).map_err(|m| RpcError::new(Code::InvalidArgument, m))?;
    if write && role == Role::Task && under_system(&e2b) {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!("permission denied: {e2b}"),
        ));
    }
    Ok((files, rel, e2b))
}

fn stat(entry: &SandboxEntry, msg: &Value, role: Role) -> RpcResult<Value> {
    let (files, rel, e2b) = path_arg(entry, msg, "path", role, false, Follow::Parents)?;
    match files.symlink_metadata(&rel) {
        Ok(_) => Ok(json!({"entry": entry_info(entry, &files, &rel, &e2b)?})),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(RpcError::new(
            Code::NotFound,
            format!("file not found: {e2b}"),
        )),
        Err(e) => Err(io_error("cannot stat", &e2b, &e)),
    }
}

fn make_dir(entry: &SandboxEntry, msg: &Value, role: Role) -> RpcResult<Value> {
    let (files, rel, e2b) = path_arg(entry, msg, "path", role, true, Follow::All)?;
    match files.metadata(&rel) {
        Ok(m) if m.is_dir() => {
            return Err(RpcError::new(
                Code::AlreadyExists,
                format!("directory already exists: {e2b}"),
            ))
        }
        Ok(_) => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                format!("path already exists but it is not a directory: {e2b}"),
            ))
        }
        Err(_) => {}
    }
    files
        .make_dirs(&rel)
        .map_err(|e| io_error("cannot create directory", &e2b, &e))?;
    Ok(json!({"entry": entry_info(entry, &files, &rel, &e2b)?}))
}

fn list_dir(entry: &SandboxEntry, msg: &Value, role: Role) -> RpcResult<Value> {
    let (files, rel, e2b) = path_arg(entry, msg, "path", role, false, Follow::All)?;
    let depth = int_field(msg, "depth", "depth")?.unwrap_or(0).max(1);
    let meta = files.metadata(&rel).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => {
            RpcError::new(Code::NotFound, format!("directory not found: {e2b}"))
        }
        _ => io_error("cannot stat", &e2b, &e),
    })?;
    if !meta.is_dir() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!("path is not a directory: {e2b}"),
        ));
    }
    let mut entries = Vec::new();
    walk(entry, &files, &rel, &e2b, depth, &mut entries)?;
    if entries.is_empty() {
        return Ok(json!({}));
    }
    Ok(json!({"entries": entries}))
}

fn walk(
    entry: &SandboxEntry,
    files: &Beneath,
    rel: &str,
    e2b_dir: &str,
    depth: i64,
    out: &mut Vec<Value>,
) -> RpcResult<()> {
    let left = MAX_LIST_ENTRIES.saturating_sub(out.len());
    let children = files.list(rel, left).map_err(|e| {
        if e.kind() == io::ErrorKind::OutOfMemory {
            RpcError::new(
                Code::ResourceExhausted,
                format!("more than {MAX_LIST_ENTRIES} entries; list a smaller depth"),
            )
        } else {
            io_error("cannot list", e2b_dir, &e)
        }
    })?;
    for (name, meta) in children {
        let child_rel = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let e2b = format!("{}/{name}", e2b_dir.trim_end_matches('/'));
        // Gone between the listing and the stat: skip it, as a listing races any writer.
        let Ok(info) = entry_info(entry, files, &child_rel, &e2b) else {
            continue;
        };
        out.push(info);
        if meta.is_dir() && depth > 1 {
            walk(entry, files, &child_rel, &e2b, depth - 1, out)?;
        }
    }
    Ok(())
}

fn remove(entry: &SandboxEntry, msg: &Value, role: Role) -> RpcResult<Value> {
    let (files, rel, e2b) = path_arg(entry, msg, "path", role, true, Follow::Parents)?;
    if rel.is_empty() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!("{e2b} cannot be removed"),
        ));
    }
    files
        .remove(&rel)
        .map_err(|e| io_error("cannot remove", &e2b, &e))?;
    Ok(json!({}))
}

fn move_entry(entry: &SandboxEntry, msg: &Value, role: Role) -> RpcResult<Value> {
    let (src, src_rel, src_e2b) = path_arg(entry, msg, "source", role, true, Follow::Parents)?;
    let (dst, dst_rel, dst_e2b) = path_arg(entry, msg, "destination", role, true, Follow::Parents)?;
    if src_rel.is_empty() || dst_rel.is_empty() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "the sandbox's own directories cannot be moved or replaced",
        ));
    }
    if src.symlink_metadata(&src_rel).is_err() {
        return Err(RpcError::new(
            Code::NotFound,
            format!("source file not found: {src_e2b}"),
        ));
    }
    src.rename(&src_rel, &dst, &dst_rel)
        .map_err(|e| io_error("cannot move", &src_e2b, &e))?;
    Ok(json!({"entry": entry_info(entry, &dst, &dst_rel, &dst_e2b)?}))
}

/// envd's `EntryInfo` for one path. A symlink reports its target's type and size (when the
/// target stays in the sandbox), and its target as an absolute E2B path.
fn entry_info(entry: &SandboxEntry, files: &Beneath, rel: &str, e2b: &str) -> RpcResult<Value> {
    let link = files
        .symlink_metadata(rel)
        .map_err(|e| io_error("cannot stat", e2b, &e))?;
    let is_link = link.file_type().is_symlink();
    // The target as an E2B path: a relative one is taken from the link's folder.
    let target = if is_link {
        files.read_link(rel).ok().map(|t| {
            let t = t.to_string_lossy();
            if t.starts_with('/') {
                paths::lexical(&t)
            } else {
                let parent = e2b.rsplit_once('/').map_or("/", |(p, _)| p);
                paths::lexical(&format!("{parent}/{t}"))
            }
        })
    } else {
        None
    };
    // What the link leads to, looked up in the sandbox as the sandbox would resolve it (the
    // lookups never leave the sandbox's directories).
    let target_meta = target.as_deref().and_then(|t| {
        let (b, r) = entry
            .sandbox
            .files(&resolve(entry, t, Follow::All).ok()?)
            .ok()?;
        b.metadata(&r).ok()
    });
    let meta: &FsMetadata = target_meta.as_ref().unwrap_or(&link);
    let file_type = if is_link && target_meta.is_none() {
        "FILE_TYPE_SYMLINK"
    } else if meta.is_dir() {
        "FILE_TYPE_DIRECTORY"
    } else if meta.is_file() {
        "FILE_TYPE_FILE"
    } else {
        "FILE_TYPE_UNSPECIFIED"
    };
    let name = e2b.rsplit('/').next().unwrap_or("");
    let perm = meta.permissions().mode() & 0o777;
    let owner = owner_of(e2b);
    let mut info = Map::new();
    info.insert("name".into(), json!(name));
    info.insert("type".into(), json!(file_type));
    info.insert("path".into(), json!(e2b));
    // envd reports no size for a directory.
    if meta.len() > 0 && !meta.is_dir() {
        info.insert("size".into(), json!(meta.len().to_string()));
    }
    if perm != 0 {
        info.insert("mode".into(), json!(perm));
    }
    info.insert(
        "permissions".into(),
        json!(permissions(meta.is_dir(), perm)),
    );
    info.insert("owner".into(), json!(owner));
    info.insert("group".into(), json!(owner));
    if let Ok(t) = meta.modified() {
        info.insert(
            "modifiedTime".into(),
            json!(humantime::format_rfc3339_nanos(t).to_string()),
        );
    }
    if is_link {
        if let Some(target) = target {
            info.insert("symlinkTarget".into(), json!(target));
        }
        info.insert("isSymlink".into(), json!(true));
    }
    Ok(Value::Object(info))
}

/// Go's `FileMode.String()` for a plain file or directory: `drwxr-xr-x`, `-rw-r--r--`.
fn permissions(dir: bool, perm: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(if dir { 'd' } else { '-' });
    for shift in [6, 3, 0] {
        let bits = (perm >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multipart_like_httpx_sends_it() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a \\\"b\\\".txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\nworld\r\n--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n--XyZ--\r\n";
        let parts = multipart(body, "XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name.as_deref(), Some("file"));
        assert_eq!(parts[0].filename.as_deref(), Some("/home/user/a \"b\".txt"));
        assert_eq!(parts[0].data, b"hello\r\nworld");
        assert_eq!(parts[1].name.as_deref(), Some("other"));
        assert_eq!(parts[1].data, b"x");
        assert!(multipart(b"--XyZ\r\nno end", "XyZ").is_err());
    }

    #[test]
    fn media_params() {
        assert_eq!(
            media_param("multipart/form-data; boundary=abc123", "boundary").as_deref(),
            Some("abc123")
        );
        assert_eq!(
            media_param("multipart/form-data; boundary=\"a b\"; x=y", "boundary").as_deref(),
            Some("a b")
        );
        assert_eq!(media_param("text/plain", "boundary"), None);
    }

    #[test]
    fn go_permission_strings() {
        assert_eq!(permissions(true, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(false, 0o644), "-rw-r--r--");
    }
}
