//! A snapshot's `tree_hash` names its tree: the same files must hash the same on every host
//! and in every version, so the hash is pinned to values computed outside this crate from the
//! documented encoding (SHA-256 over each file in path order: path length as 4 bytes
//! big-endian, path, content length as 8 bytes big-endian, content).

use std::collections::BTreeMap;

use wmo_e2b::project::snapshot::Snapshot;

fn snapshot(files: &[(&str, &str)]) -> Snapshot {
    Snapshot {
        files: files
            .iter()
            .map(|(path, content)| (path.to_string(), content.to_string()))
            .collect::<BTreeMap<_, _>>(),
    }
}

#[test]
fn the_empty_tree_hashes_to_the_sha256_of_nothing() {
    assert_eq!(
        snapshot(&[]).tree_hash(),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

#[test]
fn a_small_tree_has_its_known_hash() {
    let tree = snapshot(&[("z.txt", "3\n"), ("a/2.txt", "two\n"), ("b/1.txt", "one\n")]);
    assert_eq!(
        tree.tree_hash(),
        "9ed57639665a32cc1ddcd882a426e92f6b546c9af26da174bef17deb00f6c25e"
    );
}

#[test]
fn lengths_count_bytes_and_order_is_by_bytes() {
    // Non-ASCII paths and content (bytes, not characters, are counted), an empty file, and
    // an upper-case name that sorts before every lower-case one.
    let tree = snapshot(&[
        ("z.txt", "3\n"),
        ("a/2.txt", "two\n"),
        ("b/1.txt", "one\n"),
        ("README", ""),
        ("é/ü.txt", "naïve\n"),
    ]);
    assert_eq!(
        tree.tree_hash(),
        "cb5b0259242040230277b277105449b09d1c68e366f617c0fec5de550c4ebccf"
    );
}
