use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use super::*;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("images")).unwrap();
    (dir, store)
}

fn leftovers(store: &Store) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in ["blobs/sha256", "tmp"] {
        for e in fs::read_dir(store.root().join(dir)).unwrap() {
            found.push(e.unwrap().path());
        }
    }
    found
}

#[test]
fn a_blob_is_checked_while_it_streams_and_a_bad_one_leaves_nothing() {
    let (_dir, store) = store();
    let content = vec![42u8; 200_000];
    let digest = Digest::of(&content);
    let open = |bytes: Vec<u8>| move || Ok::<_, StoreError>(io::Cursor::new(bytes));

    let mut flipped = content.clone();
    flipped[100_000] ^= 1;
    let e = store
        .fetch_blob(&digest, Some(200_000), open(flipped))
        .unwrap_err();
    assert!(matches!(e, StoreError::DigestMismatch { .. }), "{e}");
    let e = store
        .fetch_blob(&digest, Some(200_000), open(content[..1000].to_vec()))
        .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Truncated {
                received: 1000,
                expected: Some(200_000),
                ..
            }
        ),
        "{e}"
    );
    let mut longer = content.clone();
    longer.push(0);
    let e = store
        .fetch_blob(&digest, Some(200_000), open(longer))
        .unwrap_err();
    assert!(matches!(e, StoreError::Oversized { .. }), "{e}");
    assert!(leftovers(&store).is_empty(), "{:?}", leftovers(&store));
    assert!(!store.has_blob(&digest));

    let path = store
        .fetch_blob(&digest, None, open(content.clone()))
        .unwrap();
    assert_eq!(fs::read(&path).unwrap(), content);
    assert_eq!(leftovers(&store), vec![path]);
}

#[test]
fn threads_asking_for_one_blob_at_once_download_it_once() {
    let (_dir, store) = store();
    let content = b"one layer".to_vec();
    let digest = Digest::of(&content);
    let downloads = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (store, digest, content) = (store.clone(), digest.clone(), content.clone());
            let (downloads, start) = (downloads.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                store
                    .fetch_blob(&digest, None, || {
                        downloads.fetch_add(1, Ordering::SeqCst);
                        // Long enough that the others queue on the lock, not after it.
                        std::thread::sleep(Duration::from_millis(200));
                        Ok::<_, StoreError>(io::Cursor::new(content))
                    })
                    .unwrap()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(fs::read(t.join().unwrap()).unwrap(), content);
    }
    assert_eq!(downloads.load(Ordering::SeqCst), 1);
}

#[test]
fn prune_keeps_what_kept_images_use_and_removes_the_rest() {
    let (_dir, store) = store();
    let blob = |s: &str| {
        let d = Digest::of(s.as_bytes());
        store.put_blob(&d, s.as_bytes()).unwrap();
        d.to_string()
    };
    let (shared, a_only, b_only, loose) = (blob("shared"), blob("a"), blob("b"), blob("loose"));
    let record = |name: &str, digest: &str, blobs: Vec<String>| Record {
        reference: name.to_string(),
        digest: digest.to_string(),
        manifest_digest: digest.to_string(),
        blobs,
        pulled_at: unix_now(),
    };
    store
        .record(&record(
            "x.io/a:1",
            &a_only,
            vec![a_only.clone(), shared.clone()],
        ))
        .unwrap();
    store
        .record(&record(
            "x.io/b:1",
            &b_only,
            vec![b_only.clone(), shared.clone()],
        ))
        .unwrap();
    fs::write(store.root().join("tmp/left-by-a-crash"), b"x").unwrap();
    assert_eq!(store.lookup("x.io/a:1").unwrap().digest, a_only);
    assert_eq!(store.records().unwrap().len(), 2);

    let pruned = store.prune(&HashSet::from([a_only.clone()])).unwrap();
    assert_eq!((pruned.records, pruned.blobs), (1, 2));
    let d = |s: &str| Digest::parse(s).unwrap();
    assert!(store.has_blob(&d(&a_only)) && store.has_blob(&d(&shared)));
    assert!(!store.has_blob(&d(&b_only)) && !store.has_blob(&d(&loose)));
    assert!(store.lookup("x.io/b:1").is_none());
    assert_eq!(fs::read_dir(store.root().join("tmp")).unwrap().count(), 0);

    // A pull in progress holds the store: prune waits for it rather than taking its blobs.
    let pull = store.pull_lock().unwrap();
    let (s2, keep) = (store.clone(), HashSet::new());
    let pruning = std::thread::spawn(move || s2.prune(&keep).unwrap());
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        store.has_blob(&d(&a_only)),
        "prune ran while a pull held the store"
    );
    drop(pull);
    assert_eq!(pruning.join().unwrap().blobs, 2);
}
