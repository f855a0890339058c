//! The runner's Node.js as files any image can carry: the host's `node`, the shared libraries
//! it links and their loader, under [`NODE_LAYER_DIR`], started through that loader so it
//! needs nothing of the image but `/bin/sh`. A template made of a task's image copies it in,
//! so the runner starts on images that have no Node.js (most task images).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest as _, Sha256};

/// Where the layer lands in a sandbox; the runner's command puts its `bin` first on `PATH`.
pub const NODE_LAYER_DIR: &str = "/opt/wmo-e2b-node";
/// The directory the archive's entries sit in (copied into [`NODE_LAYER_DIR`] by pattern).
pub const NODE_LAYER_ARCHIVE_DIR: &str = "wmo-e2b-node";
/// The most a layer may hold: Node.js with its libraries is about 100 MiB.
const MAX_LAYER_BYTES: u64 = 512 << 20;
/// Libraries a `node` may link.
const MAX_LIBRARIES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum NodeLayerError {
    #[error("no `node` on PATH to carry into the sandbox's image (install Node.js 18 or newer)")]
    NoNode,
    #[error("cannot list the libraries of {}: {source}", node.display())]
    Ldd {
        node: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {why}", path.display())]
    Bad { path: PathBuf, why: String },
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One file of the layer: where it goes in the archive, where it comes from, its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    source: Option<PathBuf>,
    mode: u32,
    /// For a file made here (the wrapper).
    text: Option<String>,
}

/// The layer, found and digested; its archive is made only when a template needs it.
#[derive(Debug, Clone)]
pub struct NodeLayer {
    entries: Vec<Entry>,
    /// sha256 hex over every entry's name, mode and content: what names the layer.
    pub hash: String,
}

impl NodeLayer {
    /// The host's `node` (the first on `PATH`) and what it links.
    pub fn of_host() -> Result<NodeLayer, NodeLayerError> {
        let node = find_on_path("node").ok_or(NodeLayerError::NoNode)?;
        let node = std::fs::canonicalize(&node).map_err(|source| NodeLayerError::Read {
            path: node.clone(),
            source,
        })?;
        let out =
            Command::new("ldd")
                .arg(&node)
                .output()
                .map_err(|source| NodeLayerError::Ldd {
                    node: node.clone(),
                    source,
                })?;
        let (libraries, loader) = parse_ldd(&String::from_utf8_lossy(&out.stdout));
        NodeLayer::from_parts(&node, &libraries, loader.as_deref())
    }

    fn from_parts(
        node: &Path,
        libraries: &[PathBuf],
        loader: Option<&Path>,
    ) -> Result<NodeLayer, NodeLayerError> {
        if libraries.len() > MAX_LIBRARIES {
            return Err(NodeLayerError::Bad {
                path: node.to_path_buf(),
                why: format!("links more than {MAX_LIBRARIES} libraries"),
            });
        }
        let at = |p: &str| format!("{NODE_LAYER_ARCHIVE_DIR}/{p}");
        let file = |name: String, source: &Path| Entry {
            name,
            source: Some(source.to_path_buf()),
            mode: 0o755,
            text: None,
        };
        let base = |p: &Path| {
            p.file_name()
                .map(OsStr::to_string_lossy)
                .unwrap_or_default()
                .into_owned()
        };
        let mut entries = vec![file(at("bin/node.real"), node)];
        for lib in libraries
            .iter()
            .chain(loader.map(Path::to_path_buf).as_ref())
        {
            entries.push(file(at(&format!("lib/{}", base(lib))), lib));
        }
        let start = match loader {
            Some(l) => format!(
                "{NODE_LAYER_DIR}/lib/{} --library-path {NODE_LAYER_DIR}/lib {NODE_LAYER_DIR}/bin/node.real",
                base(l)
            ),
            None => format!("{NODE_LAYER_DIR}/bin/node.real"),
        };
        entries.push(Entry {
            name: at("bin/node"),
            source: None,
            mode: 0o755,
            text: Some(format!("#!/bin/sh\nexec {start} \"$@\"\n")),
        });
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries.dedup_by(|a, b| a.name == b.name);
        let hash = digest(&entries)?;
        Ok(NodeLayer { entries, hash })
    }

    /// The layer as a gzipped tar, the same bytes for the same files (no times, no owners).
    pub fn archive(&self) -> Result<Vec<u8>, NodeLayerError> {
        let mut tar = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
        let mut dirs: Vec<String> = Vec::new();
        for e in &self.entries {
            if let Some((dir, _)) = e.name.rsplit_once('/') {
                if !dirs.iter().any(|d| d == dir) {
                    dirs.push(dir.to_string());
                    append(
                        &mut tar,
                        &format!("{dir}/"),
                        0o755,
                        tar::EntryType::Directory,
                        &[],
                    )?;
                }
            }
            let bytes = content(e)?;
            append(&mut tar, &e.name, e.mode, tar::EntryType::Regular, &bytes)?;
        }
        let gz = tar.into_inner().map_err(write_error)?;
        gz.finish().map_err(write_error)
    }
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    mode: u32,
    kind: tar::EntryType,
    bytes: &[u8],
) -> Result<(), NodeLayerError> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(bytes.len() as u64);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    tar.append_data(&mut header, name, bytes)
        .map_err(write_error)
}

fn write_error(source: io::Error) -> NodeLayerError {
    NodeLayerError::Read {
        path: PathBuf::from("(the layer's archive)"),
        source,
    }
}

/// An entry's bytes, bounded.
fn content(e: &Entry) -> Result<Vec<u8>, NodeLayerError> {
    match (&e.text, &e.source) {
        (Some(text), _) => Ok(text.clone().into_bytes()),
        (None, Some(path)) => {
            let mut bytes = Vec::new();
            let read =
                File::open(path).and_then(|f| f.take(MAX_LAYER_BYTES + 1).read_to_end(&mut bytes));
            read.map_err(|source| NodeLayerError::Read {
                path: path.clone(),
                source,
            })?;
            if bytes.len() as u64 > MAX_LAYER_BYTES {
                return Err(NodeLayerError::Bad {
                    path: path.clone(),
                    why: format!("larger than {MAX_LAYER_BYTES} bytes"),
                });
            }
            Ok(bytes)
        }
        (None, None) => Ok(Vec::new()),
    }
}

/// sha256 over each entry's name, mode and content's sha256, in order.
fn digest(entries: &[Entry]) -> Result<String, NodeLayerError> {
    let mut total = 0u64;
    let mut all = Sha256::new();
    for e in entries {
        let bytes = content(e)?;
        total += bytes.len() as u64;
        if total > MAX_LAYER_BYTES {
            return Err(NodeLayerError::Bad {
                path: PathBuf::from(&e.name),
                why: format!("the layer passes {MAX_LAYER_BYTES} bytes"),
            });
        }
        let line = format!(
            "{} {:o} {}\n",
            e.name,
            e.mode,
            crate::digest::sha256_hex(&bytes)
        );
        all.update(line.as_bytes());
    }
    Ok(crate::digest::hex(&all.finalize()))
}

/// `ldd`'s answer: the libraries by path, and the loader (`None`: a static program).
fn parse_ldd(text: &str) -> (Vec<PathBuf>, Option<PathBuf>) {
    let mut libraries = Vec::new();
    let mut loader = None;
    for line in text.lines().map(str::trim) {
        if let Some((_, rest)) = line.split_once("=> ") {
            let path = rest.split(" (").next().unwrap_or("").trim();
            if path.starts_with('/') {
                libraries.push(PathBuf::from(path));
            }
        } else if line.starts_with('/') {
            let path = line.split(" (").next().unwrap_or("").trim();
            loader = Some(PathBuf::from(path));
        }
    }
    (libraries, loader)
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_libraries_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibdl.so.2 => /lib/x86_64-linux-gnu/libdl.so.2 (0x00007f68)\n\
                    \tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f68)\n\
                    \tlibmissing.so => not found\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f68)\n";
        let (libs, loader) = parse_ldd(text);
        assert_eq!(
            libs,
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libdl.so.2"),
                PathBuf::from("/lib/x86_64-linux-gnu/libstdc++.so.6")
            ]
        );
        assert_eq!(loader, Some(PathBuf::from("/lib64/ld-linux-x86-64.so.2")));
        assert_eq!(
            parse_ldd("\tnot a dynamic executable\n"),
            (Vec::new(), None)
        );
    }

    #[test]
    fn the_archive_is_the_same_bytes_for_the_same_files_and_starts_node_through_its_loader() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            p
        };
        let node = write("node", "ELF");
        let lib = write("libc.so.6", "libc");
        let loader = write("ld-linux-x86-64.so.2", "ld");
        let layer =
            NodeLayer::from_parts(&node, std::slice::from_ref(&lib), Some(&loader)).unwrap();
        let again =
            NodeLayer::from_parts(&node, std::slice::from_ref(&lib), Some(&loader)).unwrap();
        assert_eq!(layer.hash, again.hash);
        assert_eq!(layer.archive().unwrap(), again.archive().unwrap());
        let gz = layer.archive().unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&gz[..]));
        let mut names = Vec::new();
        let mut wrapper = String::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            if name == "wmo-e2b-node/bin/node" {
                entry.read_to_string(&mut wrapper).unwrap();
            }
            names.push(name);
        }
        assert!(
            names.contains(&"wmo-e2b-node/bin/node.real".to_string()),
            "{names:?}"
        );
        assert!(
            names.contains(&"wmo-e2b-node/lib/libc.so.6".to_string()),
            "{names:?}"
        );
        assert!(
            wrapper.contains("/opt/wmo-e2b-node/lib/ld-linux-x86-64.so.2 --library-path /opt/wmo-e2b-node/lib /opt/wmo-e2b-node/bin/node.real \"$@\""),
            "{wrapper}"
        );
        std::fs::write(&lib, "another libc").unwrap();
        let changed = NodeLayer::from_parts(&node, &[lib], Some(&loader)).unwrap();
        assert_ne!(changed.hash, layer.hash);
    }
}
