//! A pool serves each task a sandbox of its own environment: a warm sandbox of one image never
//! serves a task of another (or of the host's system), and making one for a new environment
//! retires the coldest idle sandbox of another, so a run over many environments holds no
//! more sandboxes than one over a single one.

use std::time::Duration;

use wmo_e2b::pool::{lease_for, lifetime_for, Pool, PoolConfig};
use wmo_e2b::runner::BootstrapOpts;
use wmo_e2b::sandbox::{Backend, CreateSpec, Metadata, RunOpts};

mod support;

use support::local::*;

#[test]
fn a_warm_sandbox_serves_only_its_own_environment() {
    if !support::local::image_roots_available() {
        return;
    }
    let (_state, backend) = support::local::backend();
    let images = tempfile::tempdir().unwrap();
    let (a, b) = (images.path().join("a"), images.path().join("b"));
    let (a, b) = (
        busybox_image(&a, "sha256:aaaa"),
        busybox_image(&b, "sha256:bbbb"),
    );
    let episode = Duration::from_secs(60);
    let pool = Pool::new(
        backend.clone(),
        PoolConfig {
            spec: CreateSpec {
                internet: true,
                ..CreateSpec::default()
            },
            lease: lease_for(episode),
            lifetime: lifetime_for(episode),
            bootstrap: BootstrapOpts::default(),
            workspace_dir: "workspace".into(),
            reuse: true,
        },
    );
    let live = || -> Vec<String> {
        let mut ids: Vec<String> = backend
            .list(&Metadata::new())
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        ids.sort();
        ids
    };
    let on_image = |w: &wmo_e2b::pool::Warm| {
        let out = w.sandbox.run("test -e /etc/marker", &RunOpts::default());
        out.unwrap().exit_code == Some(0)
    };

    let first = pool.acquire_for(Some(&a)).unwrap();
    let on_a = first.sandbox.id().to_string();
    assert!(on_image(&first));
    pool.release(first, true).unwrap();
    // The same environment again: the warm one.
    let again = pool.acquire_for(Some(&a)).unwrap();
    assert_eq!(again.sandbox.id(), on_a);
    assert!(again.reused);
    pool.release(again, true).unwrap();

    // Another image: a sandbox of its own, and the idle one of `a` retired for it.
    let other = pool.acquire_for(Some(&b)).unwrap();
    let on_b = other.sandbox.id().to_string();
    assert_ne!(on_b, on_a);
    assert!(!other.reused);
    assert_eq!(live(), vec![on_b.clone()]);
    pool.release(other, true).unwrap();

    // The host's system: never a sandbox of an image.
    let plain = pool.acquire_for(None).unwrap();
    assert_ne!(plain.sandbox.id(), on_b);
    assert!(!on_image(&plain));
    assert_eq!(live(), vec![plain.sandbox.id().to_string()]);
    pool.release(plain, true).unwrap();
    pool.close().unwrap();
    assert!(live().is_empty());
}
