//! Image layers unpacked into root filesystems: layers built here (with hand-written headers
//! where a layer is hostile), and one image made by umoci, unpacked by us and by umoci alike.

#[path = "image_unpack/layers.rs"]
mod layers;
#[path = "image_unpack/umoci.rs"]
mod umoci;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Barrier};

use layers::*;
use wmo_e2b::image::tar_reader::TarError;
use wmo_e2b::image::unpack::{
    unpack_image, unpack_image_with, Bound, LayerBlob, Limits, UnpackError, Unsafe,
};

#[test]
fn whiteouts_hide_the_layers_below_and_never_appear() {
    let tmp = tempfile::tempdir().unwrap();
    let lower = Layer::new()
        .dir("etc/")
        .file("etc/a", "a")
        .file("etc/b", "b")
        .dir("opt/")
        .file("opt/x", "x")
        .dir("opt/sub/")
        .file("opt/sub/y", "y")
        .dir("var/")
        .file("var/old", "old")
        .blob(tmp.path(), OCI_GZIP);
    let upper = Layer::new()
        .file("etc/.wh.a", "")
        // The marker first, as writers put it: the lower entries go, this layer's stay.
        .dir("opt/")
        .file("opt/.wh..wh..opq", "")
        .file("opt/new", "new")
        // The marker after this layer's own entry: that entry stays all the same.
        .file("var/mine", "mine")
        .file("var/.wh..wh..opq", "")
        // A whiteout of this layer's own entry hides nothing.
        .file("z", "z")
        .file(".wh.z", "")
        // A whiteout of something that was never there is no error.
        .file("etc/.wh.never", "")
        .blob(tmp.path(), OCI_GZIP);
    let root = unpack(&[lower, upper], &tmp.path().join("roots")).unwrap();
    assert_eq!(
        names_under(&root),
        ["etc", "etc/b", "opt", "opt/new", "var", "var/mine", "z"]
    );
    assert_eq!(read(root.join("opt/new")), "new");
}

#[test]
fn later_entries_replace_earlier_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let lower = Layer::new()
        .dir("d/")
        .file("d/f", "in d")
        .file("f2", "a file")
        .file("h1", "one")
        .hardlink("h2", "h1")
        .symlink("s", "d")
        .blob(tmp.path(), OCI_TAR);
    let upper = Layer::new()
        .file("d", "now a file")
        .dir("f2/")
        .file("f2/inner", "inner")
        // A new h1 must not write through the inode h2 shares.
        .file("h1", "two")
        // Replacing a symlink to a directory replaces the link, not the directory.
        .file("s", "a file now")
        .blob(tmp.path(), OCI_TAR);
    let root = unpack(&[lower, upper], &tmp.path().join("roots")).unwrap();
    assert_eq!(read(root.join("d")), "now a file");
    assert_eq!(read(root.join("f2/inner")), "inner");
    assert_eq!(read(root.join("h1")), "two");
    assert_eq!(read(root.join("h2")), "one");
    assert_eq!(read(root.join("s")), "a file now");
}

#[test]
fn modes_owners_times_links_and_fifos_are_kept_and_devices_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let mut layer = Layer::new()
        .entry("bin/", tar::EntryType::Directory, 0o755, "", b"")
        .entry("bin/su", tar::EntryType::Regular, 0o4755, "", b"su")
        .entry("bin/wall", tar::EntryType::Regular, 0o2755, "", b"wall")
        .entry("tmp/", tar::EntryType::Directory, 0o1777, "", b"")
        .entry("secret", tar::EntryType::Regular, 0o600, "", b"s")
        .symlink("rel", "bin/su")
        .symlink("abs", "/etc/passwd")
        .hardlink("bin/su2", "bin/su")
        .entry("pipe", tar::EntryType::Fifo, 0o640, "", b"")
        .entry("dev/null", tar::EntryType::Char, 0o666, "", b"")
        .entry("dev/sda", tar::EntryType::Block, 0o660, "", b"");
    // An owner other than root, kept because the tests run as root; giving the file away
    // must not cost it its setuid and setgid bits.
    let mut h = tar::Header::new_ustar();
    h.set_path("owned").unwrap();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o6750);
    h.set_uid(1234);
    h.set_gid(5678);
    h.set_mtime(1_000_000);
    h.set_size(0);
    h.set_cksum();
    layer.0.append(&h, &b""[..]).unwrap();
    let blob = layer.blob(tmp.path(), OCI_TAR);
    let done =
        unpack_image_with(&[blob], &tmp.path().join("roots"), KEY, Limits::default()).unwrap();
    let root = done.root;
    let mode = |p: &str| {
        std::fs::symlink_metadata(root.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("bin/su"), 0o4755);
    assert_eq!(mode("bin/wall"), 0o2755);
    assert_eq!(mode("tmp"), 0o1777);
    assert_eq!(mode("secret"), 0o600);
    assert_eq!(
        std::fs::read_link(root.join("rel")).unwrap(),
        Path::new("bin/su")
    );
    assert_eq!(
        std::fs::read_link(root.join("abs")).unwrap(),
        Path::new("/etc/passwd")
    );
    let ino = |p: &str| std::fs::symlink_metadata(root.join(p)).unwrap().ino();
    assert_eq!(ino("bin/su"), ino("bin/su2"));
    let pipe = std::fs::symlink_metadata(root.join("pipe")).unwrap();
    assert!(pipe.file_type().is_fifo());
    assert_eq!(pipe.permissions().mode() & 0o7777, 0o640);
    assert_eq!(done.devices_skipped, 2);
    assert!(!root.join("dev/null").exists() && !root.join("dev/sda").exists());
    let owned = std::fs::metadata(root.join("owned")).unwrap();
    assert_eq!(
        (owned.uid(), owned.gid(), owned.mtime()),
        (1234, 5678, 1_000_000)
    );
    // Directory mtimes are set after their entries went in.
    assert_eq!(
        std::fs::metadata(root.join("bin")).unwrap().mtime(),
        1_600_000_000
    );
}

#[test]
fn a_path_through_a_symlink_is_refused_in_one_layer_or_across_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), "host secret").unwrap();
    let outside = outside.to_str().unwrap();
    let into = tmp.path().join("roots");
    // In one layer, to an absolute target and to a climbing one (from `roots/<temporary>/`).
    for target in [outside, "../../outside"] {
        let layer = Layer::new()
            .symlink("a", target)
            .file("a/passwd", "pwned")
            .blob(tmp.path(), OCI_TAR);
        let digest = layer.digest.clone();
        let (d, entry, why) = refused(unpack(&[layer], &into));
        assert_eq!(
            (d.as_str(), entry.as_str(), why),
            (digest.as_str(), "a/passwd", Unsafe::ThroughSymlink)
        );
    }
    // Across layers, and as a hard link's source (which would copy a host file in).
    let lower = Layer::new().symlink("a", outside).blob(tmp.path(), OCI_TAR);
    for upper in [
        Layer::new().file("a/passwd", "pwned"),
        Layer::new().dir("a/sub/"),
        Layer::new().hardlink("stolen", "a/secret"),
        Layer::new().file("a/.wh.secret", ""),
        Layer::new().file("a/.wh..wh..opq", ""),
    ] {
        let upper = upper.blob(tmp.path(), OCI_TAR);
        let (_, _, why) = refused(unpack(&[lower.clone(), upper], &into));
        assert_eq!(why, Unsafe::ThroughSymlink);
    }
    assert_eq!(names_under(Path::new(outside)), ["secret"]);
    assert_eq!(read(Path::new(outside).join("secret")), "host secret");
    assert!(
        store_listing(&into).is_empty(),
        "{:?}",
        store_listing(&into)
    );
}

#[test]
fn climbing_and_absolute_entries_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let into = tmp.path().join("roots").join("deeper");
    for (entry, why) in [
        ("../escaped", Unsafe::ParentDir),
        ("a/../../escaped", Unsafe::ParentDir),
        ("/tmp/escaped", Unsafe::Absolute),
    ] {
        let layer = Layer::new()
            .dir("a/")
            .file(entry, "x")
            .blob(tmp.path(), OCI_GZIP);
        let digest = layer.digest.clone();
        let err = unpack(&[layer], &into).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&digest) && text.contains(entry), "{text}");
        assert_eq!(refused(Err(err)), (digest, entry.to_string(), why));
    }
    for (target, why) in [
        ("../../secret", Unsafe::LinkOutside),
        ("/etc/passwd", Unsafe::LinkOutside),
        ("not-there", Unsafe::LinkTargetMissing),
        ("a", Unsafe::LinkTargetMissing),
    ] {
        let layer = Layer::new()
            .dir("a/")
            .hardlink("h", target)
            .blob(tmp.path(), OCI_TAR);
        assert_eq!(refused(unpack(&[layer], &into)).2, why, "{target}");
    }
    assert!(!tmp.path().join("roots/escaped").exists());
    assert!(!Path::new("/tmp/escaped").exists());
    assert!(store_listing(&into).is_empty());
}

#[test]
fn gzip_zstd_and_plain_layers_unpack_alike_and_an_unknown_type_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let tar = Layer::new()
        .dir("d/")
        .file("d/f", "same")
        .symlink("l", "d/f")
        .bytes();
    let mut roots = Vec::new();
    for (i, media_type) in [OCI_TAR, OCI_GZIP, OCI_ZSTD, DOCKER_GZIP]
        .iter()
        .enumerate()
    {
        let blob = write_blob(tmp.path(), media_type, &tar);
        let key = format!("sha256:{i:064x}");
        let root = unpack_image(&[blob], &tmp.path().join("roots"), &key).unwrap();
        roots.push((names_under(&root), read(root.join("d/f"))));
    }
    assert!(roots.iter().all(|r| *r == roots[0]), "{roots:?}");
    // A layer compressed by the zstd tool itself (`tar --format=posix | zstd -19`).
    let zstd_made = hex_bytes(ZSTD_TOOL_LAYER);
    let blob = write_blob(tmp.path(), OCI_TAR, &zstd_made);
    let blob = LayerBlob {
        media_type: OCI_ZSTD.into(),
        ..blob
    };
    let root = unpack(&[blob], &tmp.path().join("zstd-tool")).unwrap();
    assert_eq!(read(root.join("hello.txt")), "made by the zstd tool\n");
    assert_eq!(
        std::fs::read_link(root.join("link")).unwrap(),
        Path::new("hello.txt")
    );
    let blob = write_blob(
        tmp.path(),
        "application/vnd.oci.image.layer.v1.tar+lz4",
        &tar,
    );
    match unpack(&[blob], &tmp.path().join("roots")) {
        Err(UnpackError::UnknownMediaType { media_type, .. }) => {
            assert_eq!(media_type, "application/vnd.oci.image.layer.v1.tar+lz4")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pax_or_gnu_name_is_checked_like_any_other() {
    let tmp = tempfile::tempdir().unwrap();
    let into = tmp.path().join("roots");
    let pax = |key: &str, value: &str| {
        let record = format!(" {key}={value}\n");
        let mut len = record.len() + 1;
        len += format!("{len}").len() - 1;
        format!("{len}{record}").into_bytes()
    };
    // A harmless header name, overridden by an extended header that climbs out.
    for (key, value, entry, why) in [
        ("path", "../../escaped", "../../escaped", Unsafe::ParentDir),
        ("path", "/tmp/escaped", "/tmp/escaped", Unsafe::Absolute),
        (
            "linkpath",
            "../../etc/passwd",
            "harmless",
            Unsafe::LinkOutside,
        ),
    ] {
        let mut layer = Layer::new().file("target", "t").entry(
            "PaxHeaders/harmless",
            tar::EntryType::XHeader,
            0o644,
            "",
            &pax(key, value),
        );
        layer = match key {
            "linkpath" => layer.hardlink("harmless", "target"),
            _ => layer.file("harmless", "x"),
        };
        let (_, refused_entry, refused_why) =
            refused(unpack(&[layer.blob(tmp.path(), OCI_TAR)], &into));
        assert_eq!((refused_entry.as_str(), refused_why), (entry, why));
    }
    // A GNU long name that climbs out.
    let long = format!("{}/../../../escaped", "a".repeat(120));
    let layer = Layer::new()
        .entry(
            "././@LongLink",
            tar::EntryType::GNULongName,
            0o644,
            "",
            long.as_bytes(),
        )
        .file("harmless", "x");
    assert_eq!(
        refused(unpack(&[layer.blob(tmp.path(), OCI_TAR)], &into)).2,
        Unsafe::ParentDir
    );
    assert!(!tmp.path().join("escaped").exists() && !Path::new("/tmp/escaped").exists());
    assert!(store_listing(&into).is_empty());
}

#[test]
fn a_failing_layer_leaves_neither_a_result_nor_a_temporary_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let into = tmp.path().join("roots");
    let good = Layer::new()
        .dir("d/")
        .file("d/f", "fine")
        .blob(tmp.path(), OCI_GZIP);
    let mut truncated = Layer::new().file("big", &"x".repeat(10_000)).bytes();
    truncated.truncate(3000);
    let bad = write_blob(tmp.path(), OCI_TAR, &truncated);
    assert!(matches!(
        unpack(&[good.clone(), bad], &into),
        Err(UnpackError::Tar { .. })
    ));
    assert!(
        store_listing(&into).is_empty(),
        "{:?}",
        store_listing(&into)
    );
    // The key is free for a good try afterwards.
    let root = unpack(&[good], &into).unwrap();
    assert_eq!(read(root.join("d/f")), "fine");
    assert_eq!(store_listing(&into), [KEY]);
}

#[test]
fn a_wrong_diff_id_is_refused_and_the_right_one_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let tar = Layer::new().file("f", "content").bytes();
    let blob = LayerBlob {
        diff_id: Some(wmo_e2b::digest::sha256(b"something else")),
        ..write_blob(tmp.path(), OCI_GZIP, &tar)
    };
    let into = tmp.path().join("roots");
    assert!(matches!(
        unpack(std::slice::from_ref(&blob), &into),
        Err(UnpackError::DiffIdMismatch { .. })
    ));
    assert!(store_listing(&into).is_empty());
    let blob = LayerBlob {
        diff_id: Some(wmo_e2b::digest::sha256(&tar)),
        ..blob
    };
    assert_eq!(read(unpack(&[blob], &into).unwrap().join("f")), "content");
}

#[test]
fn threads_unpacking_one_key_at_once_unpack_it_once() {
    let tmp = tempfile::tempdir().unwrap();
    let mut layer = Layer::new().dir("many/");
    for i in 0..2000 {
        layer = layer.file(&format!("many/f{i}"), "x");
    }
    let blob = layer.blob(tmp.path(), OCI_GZIP);
    let into = tmp.path().join("roots");
    let start = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (blob, into, start) = (blob.clone(), into.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                unpack_image_with(&[blob], &into, KEY, Limits::default()).unwrap()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.fresh).count(), 1);
    assert!(results.iter().all(|r| r.root == into.join(KEY)));
    assert_eq!(
        std::fs::read_dir(into.join(KEY).join("many"))
            .unwrap()
            .count(),
        2000
    );
    assert_eq!(store_listing(&into), [KEY]);
}

/// Set in the processes that `processes_unpacking_one_key_at_once_unpack_it_once` starts:
/// the blob, its media type and the store directory, one a line.
const CHILD: &str = "WMO_E2B_TEST_UNPACK_CHILD";

#[test]
fn processes_unpacking_one_key_at_once_unpack_it_once() {
    const TEST: &str = "processes_unpacking_one_key_at_once_unpack_it_once";
    if let Some(job) = std::env::var_os(CHILD) {
        let job = job.into_string().unwrap();
        let [path, media_type, digest, into] = job.split('\n').collect::<Vec<_>>()[..] else {
            panic!("{job}");
        };
        let blob = LayerBlob {
            path: path.into(),
            media_type: media_type.into(),
            digest: digest.into(),
            diff_id: None,
        };
        let done = unpack_image_with(&[blob], Path::new(into), KEY, Limits::default()).unwrap();
        println!("fresh={}", done.fresh);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut layer = Layer::new().dir("many/");
    for i in 0..3000 {
        layer = layer.file(&format!("many/f{i}"), "x");
    }
    let blob = layer.blob(tmp.path(), OCI_GZIP);
    let into = tmp.path().join("roots");
    let job = format!(
        "{}\n{}\n{}\n{}",
        blob.path.display(),
        blob.media_type,
        blob.digest,
        into.display()
    );
    let children: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", TEST, "--test-threads", "1", "--nocapture"])
                .env(CHILD, &job)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut fresh = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && said.contains("1 passed"), "{said}");
        fresh += usize::from(said.contains("fresh=true"));
    }
    assert_eq!(fresh, 1);
    assert_eq!(
        std::fs::read_dir(into.join(KEY).join("many"))
            .unwrap()
            .count(),
        3000
    );
    assert_eq!(store_listing(&into), [KEY]);
}

#[test]
fn a_layer_past_the_byte_or_entry_bound_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let into = tmp.path().join("roots");
    // A megabyte of zeros compresses to a kilobyte: the bound is on what comes out.
    let bomb = Layer::new()
        .entry(
            "zeros",
            tar::EntryType::Regular,
            0o644,
            "",
            &vec![0u8; 1 << 20],
        )
        .blob(tmp.path(), OCI_GZIP);
    assert!(std::fs::metadata(&bomb.path).unwrap().len() < 1 << 16);
    let limits = Limits {
        max_bytes: 1 << 16,
        ..Limits::default()
    };
    match unpack_image_with(std::slice::from_ref(&bomb), &into, KEY, limits) {
        Err(UnpackError::Bound {
            bound: Bound::Bytes,
            digest,
        }) => assert_eq!(digest, bomb.digest),
        other => panic!("{other:?}"),
    }
    assert!(store_listing(&into).is_empty());
    // The budget is the image's, not each layer's.
    let small = Layer::new()
        .file("f", &"y".repeat(40_000))
        .blob(tmp.path(), OCI_TAR);
    let two = [small.clone(), small.clone()];
    assert!(matches!(
        unpack_image_with(&two, &into, KEY, limits),
        Err(UnpackError::Bound {
            bound: Bound::Bytes,
            ..
        })
    ));
    let mut many = Layer::new();
    for i in 0..20 {
        many = many.file(&format!("f{i}"), "");
    }
    let many = many.blob(tmp.path(), OCI_TAR);
    // 20 entries with 2- or 3-byte paths: past 10 entries, or past 40 bytes of paths.
    for (limits, bound) in [
        (
            Limits {
                max_entries: 10,
                ..Limits::default()
            },
            Bound::Entries,
        ),
        (
            Limits {
                max_path_memory: 40,
                ..Limits::default()
            },
            Bound::PathBytes,
        ),
    ] {
        match unpack_image_with(std::slice::from_ref(&many), &into, KEY, limits) {
            Err(UnpackError::Bound { bound: b, .. }) => assert_eq!(b, bound),
            other => panic!("{other:?}"),
        }
    }
    assert!(store_listing(&into).is_empty());
    assert!(unpack_image_with(
        &[small],
        &into,
        KEY,
        Limits {
            max_bytes: 1 << 16,
            ..Limits::default()
        }
    )
    .is_ok());
}

#[test]
fn a_path_too_long_or_too_deep_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let into = tmp.path().join("roots");
    // A GNU long name past PATH_MAX, written by the tar crate itself.
    let mut h = tar::Header::new_gnu();
    h.set_size(0);
    h.set_mode(0o644);
    let mut builder = tar::Builder::new(Vec::new());
    let long = vec!["n".repeat(250); 20].join("/");
    builder.append_data(&mut h, &long, &b""[..]).unwrap();
    let blob = write_blob(tmp.path(), OCI_TAR, &builder.into_inner().unwrap());
    match unpack(&[blob], &into) {
        Err(UnpackError::Tar { source, .. }) => {
            assert!(matches!(source, TarError::TooLong { .. }), "{source}")
        }
        other => panic!("{other:?}"),
    }
    let mut builder = tar::Builder::new(Vec::new());
    builder
        .append_data(&mut h, "d/".repeat(600) + "f", &b""[..])
        .unwrap();
    let blob = write_blob(tmp.path(), OCI_TAR, &builder.into_inner().unwrap());
    assert_eq!(refused(unpack(&[blob], &into)).2, Unsafe::TooDeep);
    assert!(store_listing(&into).is_empty());
}

#[test]
fn a_key_that_is_no_digest_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for key in [
        "../x",
        "sha256:../../etc",
        "",
        "sha256:ABC",
        &format!("sha256:{}/x", "a".repeat(64)),
    ] {
        assert!(matches!(
            unpack_image(&[], tmp.path(), key),
            Err(UnpackError::BadKey { .. })
        ));
    }
}
