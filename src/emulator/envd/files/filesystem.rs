//! The filesystem.Filesystem RPCs (Stat, MakeDir, ListDir, Remove, Move), each entry
//! reported as envd's `EntryInfo`.

use std::fs::Metadata as FsMetadata;
use std::io;
use std::os::unix::fs::PermissionsExt;

use serde_json::{json, Map, Value};

use super::locate::{locate, owner_of, resolve, root_only, Follow};
use super::metadata::metadata_of;
use crate::emulator::connect::{int_field, string_field, Code, RpcError, RpcResult};
use crate::emulator::paths;
use crate::emulator::state::SandboxEntry;
use crate::sandbox::local::confined::Beneath;
use crate::sandbox::Role;

/// Entries one ListDir returns at most.
const MAX_LIST_ENTRIES: usize = 100_000;
/// The longest path one ListDir reports (the kernel's `PATH_MAX`): it bounds how deep a
/// listing goes and the memory its paths take.
const MAX_LIST_PATH: usize = 4096;

pub(in crate::emulator) fn rpc(
    entry: &SandboxEntry,
    method: &str,
    msg: &Value,
    role: Role,
) -> RpcResult<Value> {
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
    if write && role == Role::Task && root_only(&e2b) {
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

/// Lists `rel` and, `depth` levels down, what it holds: each directory's entry followed by
/// its own entries, as a recursive listing gives them. Walks with an explicit stack (one
/// frame per open level, holding the entries still to report) and refuses a path past
/// [`MAX_LIST_PATH`], so a tree of any depth costs bounded stack and memory.
fn walk(
    entry: &SandboxEntry,
    files: &Beneath,
    rel: &str,
    e2b_dir: &str,
    depth: i64,
    out: &mut Vec<Value>,
) -> RpcResult<()> {
    let mut frames = vec![list_frame(files, rel, e2b_dir, depth, out.len())?];
    while let Some(frame) = frames.last_mut() {
        let Some((name, meta)) = frame.left.pop() else {
            frames.pop();
            continue;
        };
        let child_rel = if frame.rel.is_empty() {
            name.clone()
        } else {
            format!("{}/{name}", frame.rel)
        };
        let e2b = format!("{}/{name}", frame.e2b.trim_end_matches('/'));
        if e2b.len() > MAX_LIST_PATH {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("a path longer than {MAX_LIST_PATH} bytes; list a smaller depth"),
            ));
        }
        // Gone between the listing and the stat: skip it, as a listing races any writer.
        let Ok(info) = entry_info(entry, files, &child_rel, &e2b) else {
            continue;
        };
        out.push(info);
        let depth = frame.depth;
        if meta.is_dir() && depth > 1 {
            // What the frames still hold is listed too: it counts against the bound.
            let held: usize = frames.iter().map(|f| f.left.len()).sum();
            let next = list_frame(files, &child_rel, &e2b, depth - 1, out.len() + held)?;
            frames.push(next);
        }
    }
    Ok(())
}

/// One directory of a listing: its entries not yet reported, the next one last.
struct Frame {
    rel: String,
    e2b: String,
    depth: i64,
    left: Vec<(String, FsMetadata)>,
}

fn list_frame(
    files: &Beneath,
    rel: &str,
    e2b_dir: &str,
    depth: i64,
    listed: usize,
) -> RpcResult<Frame> {
    let left = MAX_LIST_ENTRIES.saturating_sub(listed);
    let mut children = files.list(rel, left).map_err(|e| {
        if e.kind() == io::ErrorKind::OutOfMemory {
            RpcError::new(
                Code::ResourceExhausted,
                format!("more than {MAX_LIST_ENTRIES} entries; list a smaller depth"),
            )
        } else {
            io_error("cannot list", e2b_dir, &e)
        }
    })?;
    children.reverse();
    Ok(Frame {
        rel: rel.to_string(),
        e2b: e2b_dir.to_string(),
        depth,
        left: children,
    })
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
    let target_files = target.as_deref().and_then(|t| {
        let (b, r) = entry
            .sandbox
            .files(&resolve(entry, t, Follow::All).ok()?)
            .ok()?;
        let m = b.metadata(&r).ok()?;
        Some((b, r, m))
    });
    let target_meta = target_files.as_ref().map(|(_, _, m)| m);
    let meta: &FsMetadata = target_meta.unwrap_or(&link);
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
    // envd reports what stat says, a directory's own size included (4096 on ext4).
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
    info.insert("owner".into(), json!(owner));
    info.insert("group".into(), json!(owner));
    if let Ok(t) = meta.modified() {
        info.insert(
            "modifiedTime".into(),
            json!(humantime::format_rfc3339_nanos(t).to_string()),
        );
    }
    // envd 0.6.13 says a link is one by its target alone: it does not send `isSymlink`
    // (newer protos have it), so the SDK reads a link to a file as a file, as on E2B.
    if let (true, Some(target)) = (is_link, target) {
        info.insert("symlinkTarget".into(), json!(target));
    }
    // envd reads the attributes through the link, as it reads the type.
    let file_meta = match &target_files {
        Some((b, r, _)) => metadata_of(b, r),
        None if is_link => Default::default(),
        None => metadata_of(files, rel),
    };
    if !file_meta.is_empty() {
        info.insert("metadata".into(), json!(file_meta));
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
    fn go_permission_strings() {
        assert_eq!(permissions(true, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(false, 0o644), "-rw-r--r--");
    }
}
