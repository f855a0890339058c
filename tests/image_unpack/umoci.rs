//! One image made by a real tool, umoci, unpacked by us and by umoci alike.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use wmo_e2b::image::unpack::LayerBlob;

use super::layers::{names_under, unpack};

/// A program the test needs, or a failure naming the package that brings it.
fn need(program: &str, package: &str) -> PathBuf {
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        if dir.join(program).is_file() {
            return dir.join(program);
        }
    }
    panic!("{program} is missing: install the Debian package {package} (scripts/system-deps.sh)");
}

fn run(cmd: &mut std::process::Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each path under `root` with its type, mode, owner, and content digest or link target.
fn describe(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for name in names_under(root) {
        let path = root.join(&name);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let what = if meta.file_type().is_symlink() {
            format!("-> {}", std::fs::read_link(&path).unwrap().display())
        } else if meta.is_file() {
            wmo_e2b::digest::sha256_file(&path).unwrap()
        } else {
            "dir".into()
        };
        let mode = meta.permissions().mode() & 0o7777;
        let mode = if meta.file_type().is_symlink() {
            0
        } else {
            mode
        };
        out.insert(
            name,
            format!("{mode:o} {}:{} {what}", meta.uid(), meta.gid()),
        );
    }
    out
}

#[test]
fn an_image_made_by_umoci_unpacks_as_umoci_unpacks_it() {
    let umoci = need("umoci", "umoci");
    let busybox = Path::new("/bin/busybox");
    assert!(
        busybox.is_file(),
        "/bin/busybox is missing: install busybox-static"
    );
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let image = format!("{}:t", layout.display());
    let umoci = |args: &[&str]| run(std::process::Command::new(&umoci).args(args));
    umoci(&["init", "--layout", layout.to_str().unwrap()]);
    umoci(&["new", "--image", &image]);
    // Layer one: busybox, its links, a setuid file, a directory with files.
    let bundle = tmp.path().join("bundle");
    umoci(&["unpack", "--image", &image, bundle.to_str().unwrap()]);
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::copy(busybox, rootfs.join("bin/busybox")).unwrap();
    for applet in ["sh", "ls", "cat"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    std::fs::create_dir_all(rootfs.join("etc/skel")).unwrap();
    std::fs::write(rootfs.join("etc/shadow"), "root:*:1::::::\n").unwrap();
    std::fs::set_permissions(
        rootfs.join("etc/shadow"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::write(rootfs.join("etc/skel/gone"), "removed in layer two\n").unwrap();
    std::fs::write(rootfs.join("bin/suid"), "x").unwrap();
    std::fs::set_permissions(
        rootfs.join("bin/suid"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    std::fs::hard_link(rootfs.join("etc/shadow"), rootfs.join("etc/shadow-")).unwrap();
    umoci(&["repack", "--image", &image, bundle.to_str().unwrap()]);
    // Layer two: a removal (a whiteout) and a change.
    let bundle2 = tmp.path().join("bundle2");
    umoci(&["unpack", "--image", &image, bundle2.to_str().unwrap()]);
    std::fs::remove_file(bundle2.join("rootfs/etc/skel/gone")).unwrap();
    std::fs::write(bundle2.join("rootfs/etc/motd"), "hello\n").unwrap();
    umoci(&["repack", "--image", &image, bundle2.to_str().unwrap()]);
    let theirs = tmp.path().join("theirs");
    umoci(&["unpack", "--image", &image, theirs.to_str().unwrap()]);

    let layers = oci_layers(&layout);
    assert_eq!(layers.len(), 2);
    let ours = unpack(&layers, &tmp.path().join("roots")).unwrap();
    let (ours, theirs) = (describe(&ours), describe(&theirs.join("rootfs")));
    assert!(ours.contains_key("bin/busybox") && !ours.contains_key("etc/skel/gone"));
    assert_eq!(ours, theirs);
}

/// The layers of the layout's one image, lowest first, with their diff_ids.
fn oci_layers(layout: &Path) -> Vec<LayerBlob> {
    let json = |digest: &str| -> serde_json::Value {
        let hex = digest.strip_prefix("sha256:").unwrap();
        serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap())
            .unwrap()
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest = json(index["manifests"][0]["digest"].as_str().unwrap());
    let config = json(manifest["config"]["digest"].as_str().unwrap());
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    layers
        .iter()
        .zip(diff_ids)
        .map(|(layer, diff_id)| {
            let digest = layer["digest"].as_str().unwrap().to_string();
            LayerBlob {
                path: layout
                    .join("blobs/sha256")
                    .join(digest.strip_prefix("sha256:").unwrap()),
                media_type: layer["mediaType"].as_str().unwrap().to_string(),
                digest,
                diff_id: diff_id.as_str().map(str::to_string),
            }
        })
        .collect()
}
