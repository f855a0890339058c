//! Files: `GET /files` and `POST /files` (multipart or octet-stream, optionally gzipped), and
//! the filesystem.Filesystem RPCs (Stat, MakeDir, ListDir, Remove, Move) with `EntryInfo`
//! shaped as envd sends it.

use std::fs::{self, File, Metadata as FsMetadata};
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use flate2::read::GzDecoder;
use serde_json::{json, Map, Value};

use super::connect::{int_field, string_field, Code, RpcError, RpcResult};
use super::envd::{files_user, plain_error};
use super::http::{Body, Request, Response, MAX_BODY_BYTES};
use super::paths::{self, PathError};
use super::server::SandboxEntry;
use crate::sandbox::{ErrorClass, Sandbox, SandboxError};

/// Entries one ListDir returns at most.
const MAX_LIST_ENTRIES: usize = 100_000;
/// The owner and group E2B reports for the default user's files.
const OWNER: &str = "user";

pub(super) fn download(entry: &SandboxEntry, req: &Request) -> Response {
    if let Err(resp) = files_user(req) {
        return resp;
    }
    let Some(path) = req.query("path").filter(|p| !p.is_empty()) else {
        return plain_error(400, "path is required");
    };
    let (local, e2b) = match paths::to_local(&entry.home, path) {
        Ok(p) => p,
        Err(e) => return plain_error(400, &e.to_string()),
    };
    let meta = match fs::metadata(&local) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return plain_error(404, &format!("path '{e2b}' does not exist"))
        }
        Err(e) => return plain_error(500, &format!("cannot stat '{e2b}': {e}")),
    };
    if meta.is_dir() {
        return plain_error(400, &format!("path '{e2b}' is a directory"));
    }
    let file = match File::open(&local) {
        Ok(f) => f,
        Err(e) => return plain_error(500, &format!("cannot open '{e2b}': {e}")),
    };
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
        body: Body::File(file, meta.len()),
    }
}

pub(super) fn upload(entry: &SandboxEntry, req: &Request) -> Response {
    if let Err(resp) = files_user(req) {
        return resp;
    }
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
        let (local, e2b) = match paths::to_local(&entry.home, &path) {
            Ok(p) => p,
            Err(e) => return plain_error(400, &e.to_string()),
        };
        if resolved.iter().any(|(_, e, _)| *e == e2b) {
            return plain_error(400, &format!("path '{e2b}' is written twice"));
        }
        resolved.push((local, e2b, data));
    }
    let mut written = Vec::new();
    for (local, e2b, data) in resolved {
        if local.is_dir() {
            return plain_error(400, &format!("path '{e2b}' is a directory"));
        }
        let Some(local_str) = local.to_str() else {
            return plain_error(400, &format!("path '{e2b}' is not UTF-8"));
        };
        if let Err(e) = entry.sandbox.write_file(local_str, &data) {
            return write_error(&e2b, &e);
        }
        let name = e2b.rsplit('/').next().unwrap_or("").to_string();
        written.push(json!({"path": e2b, "name": name, "type": "file"}));
    }
    Response::json(200, &Value::Array(written))
}

fn write_error(e2b: &str, e: &SandboxError) -> Response {
    let text = super::server::error_chain(e);
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

fn path_error(e: &PathError) -> RpcError {
    RpcError::new(Code::InvalidArgument, e.to_string())
}

fn io_error(what: &str, e2b: &str, e: &io::Error) -> RpcError {
    match e.kind() {
        io::ErrorKind::NotFound => RpcError::new(
            Code::NotFound,
            format!("{what}: no such file or directory: {e2b}"),
        ),
        io::ErrorKind::PermissionDenied => RpcError::new(
            Code::InvalidArgument,
            format!("{what}: permission denied: {e2b}"),
        ),
        _ => RpcError::new(Code::Internal, format!("{what} {e2b}: {e}")),
    }
}

pub(super) fn rpc(entry: &SandboxEntry, method: &str, msg: &Value) -> RpcResult<Value> {
    match method {
        "Stat" => stat(entry, msg),
        "MakeDir" => make_dir(entry, msg),
        "ListDir" => list_dir(entry, msg),
        "Remove" => remove(entry, msg),
        "Move" => move_entry(entry, msg),
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

fn path_arg(
    entry: &SandboxEntry,
    msg: &Value,
    name: &str,
) -> RpcResult<(std::path::PathBuf, String)> {
    let path = string_field(msg, name, name)?.unwrap_or_default();
    paths::to_local(&entry.home, &path).map_err(|e| path_error(&e))
}

fn stat(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let (local, e2b) = path_arg(entry, msg, "path")?;
    match fs::symlink_metadata(&local) {
        Ok(_) => Ok(json!({"entry": entry_info(entry, &local, &e2b)?})),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(RpcError::new(
            Code::NotFound,
            format!("file not found: {e2b}"),
        )),
        Err(e) => Err(io_error("cannot stat", &e2b, &e)),
    }
}

fn make_dir(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let (local, e2b) = path_arg(entry, msg, "path")?;
    match fs::metadata(&local) {
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
    fs::create_dir_all(&local).map_err(|e| io_error("cannot create directory", &e2b, &e))?;
    Ok(json!({"entry": entry_info(entry, &local, &e2b)?}))
}

fn list_dir(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let (local, e2b) = path_arg(entry, msg, "path")?;
    let depth = int_field(msg, "depth", "depth")?.unwrap_or(0).max(1);
    let meta = fs::metadata(&local).map_err(|e| match e.kind() {
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
    walk(entry, &local, &e2b, depth, &mut entries)?;
    if entries.is_empty() {
        return Ok(json!({}));
    }
    Ok(json!({"entries": entries}))
}

fn walk(
    entry: &SandboxEntry,
    dir: &Path,
    e2b_dir: &str,
    depth: i64,
    out: &mut Vec<Value>,
) -> RpcResult<()> {
    let read = fs::read_dir(dir).map_err(|e| io_error("cannot list", e2b_dir, &e))?;
    let mut children: Vec<(String, std::path::PathBuf)> = read
        .flatten()
        .filter_map(|d| Some((d.file_name().to_str()?.to_string(), d.path())))
        .collect();
    children.sort();
    for (name, local) in children {
        if out.len() >= MAX_LIST_ENTRIES {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("more than {MAX_LIST_ENTRIES} entries; list a smaller depth"),
            ));
        }
        let e2b = format!("{}/{name}", e2b_dir.trim_end_matches('/'));
        // Gone between read_dir and stat: skip it, as a listing races any writer anyway.
        let Ok(info) = entry_info(entry, &local, &e2b) else {
            continue;
        };
        out.push(info);
        let is_real_dir = fs::symlink_metadata(&local).is_ok_and(|m| m.is_dir());
        if is_real_dir && depth > 1 {
            walk(entry, &local, &e2b, depth - 1, out)?;
        }
    }
    Ok(())
}

fn remove(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let (local, e2b) = path_arg(entry, msg, "path")?;
    if local == entry.home {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "the sandbox home cannot be removed",
        ));
    }
    let removed = match fs::symlink_metadata(&local) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => fs::remove_dir_all(&local),
        Ok(_) => fs::remove_file(&local),
    };
    match removed {
        Ok(()) => Ok(json!({})),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(json!({})),
        Err(e) => Err(io_error("cannot remove", &e2b, &e)),
    }
}

fn move_entry(entry: &SandboxEntry, msg: &Value) -> RpcResult<Value> {
    let (src, src_e2b) = path_arg(entry, msg, "source")?;
    let (dst, dst_e2b) = path_arg(entry, msg, "destination")?;
    if src == entry.home || dst == entry.home {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "the sandbox home cannot be moved or replaced",
        ));
    }
    if fs::symlink_metadata(&src).is_err() {
        return Err(RpcError::new(
            Code::NotFound,
            format!("source file not found: {src_e2b}"),
        ));
    }
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| io_error("cannot create directory", &dst_e2b, &e))?;
    }
    fs::rename(&src, &dst).map_err(|e| io_error("cannot move", &src_e2b, &e))?;
    Ok(json!({"entry": entry_info(entry, &dst, &dst_e2b)?}))
}

/// envd's `EntryInfo` for one path. A symlink reports its target's type and size, and its
/// target (in E2B form when it points into the home).
fn entry_info(entry: &SandboxEntry, local: &Path, e2b: &str) -> RpcResult<Value> {
    let link = fs::symlink_metadata(local).map_err(|e| io_error("cannot stat", e2b, &e))?;
    let is_link = link.file_type().is_symlink();
    let target_meta = if is_link {
        fs::metadata(local).ok()
    } else {
        None
    };
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
    let mut info = Map::new();
    info.insert("name".into(), json!(name));
    info.insert("type".into(), json!(file_type));
    info.insert("path".into(), json!(e2b));
    if meta.len() > 0 {
        info.insert("size".into(), json!(meta.len().to_string()));
    }
    if perm != 0 {
        info.insert("mode".into(), json!(perm));
    }
    info.insert(
        "permissions".into(),
        json!(permissions(meta.is_dir(), perm)),
    );
    info.insert("owner".into(), json!(OWNER));
    info.insert("group".into(), json!(OWNER));
    if let Ok(t) = meta.modified() {
        info.insert(
            "modifiedTime".into(),
            json!(humantime::format_rfc3339_nanos(t).to_string()),
        );
    }
    if is_link {
        if let Ok(target) = fs::read_link(local) {
            let absolute = if target.is_absolute() {
                target.clone()
            } else {
                local.parent().unwrap_or(Path::new("/")).join(&target)
            };
            let shown = paths::to_e2b(&entry.home, &absolute)
                .unwrap_or_else(|| target.to_string_lossy().into_owned());
            info.insert("symlinkTarget".into(), json!(shown));
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
