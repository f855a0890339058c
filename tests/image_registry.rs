//! Pulling from a real registry (`docker-registry`) images pushed with real tools
//! (`buildah`), directly and through a front that misbehaves: the registry and the front are
//! attackers here, and every refusal is a typed error that leaves nothing in the store.

#[path = "support/registry.rs"]
mod registry;
mod support;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use registry::{Buildah, Faults, Front, Registry};
use wmo_e2b::cancel::CancelToken;
use wmo_e2b::image::manifest::{host_platform, OCI_INDEX};
use wmo_e2b::image::registry::{RegistryClient, RetryPolicy};
use wmo_e2b::image::settings::RegistrySettings;
use wmo_e2b::image::store::StoreError;
use wmo_e2b::image::{pull_with, ImageError, PulledImage, Reference, RegistryConfig, Store};

/// A bcrypt of `PASSWORD` (cost 5), for the registry's htpasswd.
const HTPASSWD: &str = "tester:$2b$05$846BL35JA4wujs7Pys85AO1x6c2UrzFskHvADXjgTkEuSHwDh.kya";
const PASSWORD: &str = "hunter2-registry";

struct Scratch {
    dir: tempfile::TempDir,
    store: Store,
}

fn scratch() -> Scratch {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("images")).unwrap();
    Scratch { dir, store }
}

/// A client that reads no Docker config of this machine and retries quickly.
fn client(
    config: RegistryConfig,
    docker_config: Option<std::path::PathBuf>,
    dir: &std::path::Path,
) -> RegistryClient {
    let mut config = config;
    config.docker_config = Some(docker_config.unwrap_or_else(|| dir.join("no-docker-config.json")));
    RegistryClient::new(config, CancelToken::new())
        .unwrap()
        .with_retry(RetryPolicy {
            retries: 3,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(50),
        })
}

fn pull(s: &Scratch, reference: &str, config: RegistryConfig) -> Result<PulledImage, ImageError> {
    let client = client(config, None, s.dir.path());
    pull_with(&Reference::parse(reference).unwrap(), &s.store, &client)
}

/// Blobs in the store and files left in its tmp/.
fn store_files(store: &Store) -> (usize, usize) {
    let count = |d: &str| std::fs::read_dir(store.root().join(d)).unwrap().count();
    (count("blobs/sha256"), count("tmp"))
}

fn assert_busybox_config(image: &PulledImage) {
    let c = &image.config;
    assert!(
        c.env.contains(&"GREETING=hello from the image".to_string()),
        "{:?}",
        c.env
    );
    assert_eq!(c.working_dir.as_deref(), Some("/work"));
    assert_eq!(c.user.as_deref(), Some("1000:1000"));
    assert_eq!(c.entrypoint, Some(vec!["/bin/busybox".to_string()]));
    assert_eq!(c.cmd, Some(vec!["sh".to_string()]));
    assert_eq!(image.layers.len(), 1);
    assert_eq!(c.diff_ids.len(), 1);
    let layer = &image.layers[0];
    assert_eq!(
        wmo_e2b::digest::sha256_file(&layer.path).unwrap(),
        layer.digest.as_str()
    );
}

#[test]
fn pull_by_tag_then_by_digest_with_the_registry_gone() {
    let reg = Registry::start();
    Buildah::new().push_busybox(&reg.addr, "test/img:v1", None);
    let s = scratch();
    let by_tag = pull(
        &s,
        &format!("{}/test/img:v1", reg.addr),
        RegistryConfig::default(),
    )
    .unwrap();
    assert_busybox_config(&by_tag);
    let (bytes, _) = registry::get_manifest(&reg.addr, "test/img", "v1");
    assert_eq!(by_tag.digest.as_str(), wmo_e2b::digest::sha256(&bytes));
    assert_eq!(by_tag.manifest_digest, by_tag.digest);

    let by_digest_ref = format!("{}/test/img@{}", reg.addr, by_tag.digest);
    let by_digest = pull(&s, &by_digest_ref, RegistryConfig::default()).unwrap();
    assert_eq!(
        (&by_digest.config, &by_digest.layers),
        (&by_tag.config, &by_tag.layers)
    );
    // Everything a digest names is in the store: no network call is needed, or made.
    drop(reg);
    let offline = pull(&s, &by_digest_ref, RegistryConfig::default()).unwrap();
    assert_eq!(offline.config_digest, by_tag.config_digest);
    let refs: Vec<String> = s
        .store
        .records()
        .unwrap()
        .into_iter()
        .map(|r| r.reference)
        .collect();
    assert_eq!(refs.len(), 2, "{refs:?}");
    let tag_record = s.store.lookup(
        &Reference::parse(&format!("{}/test/img:v1", offline.reference.registry))
            .unwrap()
            .to_string(),
    );
    assert_eq!(tag_record.unwrap().digest, by_tag.digest.to_string());
}

#[test]
fn an_index_resolves_to_this_platform_and_one_without_it_is_refused() {
    let reg = Registry::start();
    Buildah::new().push_busybox(&reg.addr, "test/multi:base", None);
    let (ours, ours_type) = registry::get_manifest(&reg.addr, "test/multi", "base");
    let ours_digest = wmo_e2b::digest::sha256(&ours);
    // Another platform's manifest: the same layer under a config that says so.
    let manifest: serde_json::Value = serde_json::from_slice(&ours).unwrap();
    let config_digest = manifest["config"]["digest"].as_str().unwrap();
    let s = scratch();
    let base = pull(
        &s,
        &format!("{}/test/multi:base", reg.addr),
        RegistryConfig::default(),
    )
    .unwrap();
    let config_bytes = std::fs::read(s.store.blob_path(&base.config_digest)).unwrap();
    assert_eq!(base.config_digest.as_str(), config_digest);
    let mut foreign_config: serde_json::Value = serde_json::from_slice(&config_bytes).unwrap();
    let other_arch = if host_platform().architecture == "s390x" {
        "riscv64"
    } else {
        "s390x"
    };
    foreign_config["architecture"] = other_arch.into();
    let foreign_config = serde_json::to_vec(&foreign_config).unwrap();
    let foreign_config_digest = registry::upload_blob(&reg.addr, "test/multi", &foreign_config);
    let mut foreign = manifest.clone();
    foreign["config"]["digest"] = foreign_config_digest.clone().into();
    foreign["config"]["size"] = foreign_config.len().into();
    let foreign = serde_json::to_vec(&foreign).unwrap();
    let foreign_digest = registry::put_manifest(
        &reg.addr,
        "test/multi",
        &wmo_e2b::digest::sha256(&foreign),
        &ours_type,
        &foreign,
    );
    let entry = |digest: &str, size: usize, arch: &str| {
        serde_json::json!({"mediaType": ours_type, "digest": digest, "size": size,
                           "platform": {"os": "linux", "architecture": arch}})
    };
    let index = |entries: Vec<serde_json::Value>| {
        serde_json::to_vec(
            &serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}),
        )
        .unwrap()
    };
    let host = host_platform();
    let both = index(vec![
        entry(&foreign_digest, foreign.len(), other_arch),
        entry(&ours_digest, ours.len(), &host.architecture),
    ]);
    let both_digest = registry::put_manifest(&reg.addr, "test/multi", "both", OCI_INDEX, &both);
    let image = pull(
        &s,
        &format!("{}/test/multi:both", reg.addr),
        RegistryConfig::default(),
    )
    .unwrap();
    assert_eq!(
        image.digest.as_str(),
        both_digest,
        "the index's digest is the image's content digest"
    );
    assert_eq!(image.manifest_digest.as_str(), ours_digest);
    assert_eq!(image.config_digest.as_str(), config_digest);
    assert!(!s
        .store
        .has_blob(&wmo_e2b::image::Digest::parse(&foreign_config_digest).unwrap()));

    let none = index(vec![
        entry(&foreign_digest, foreign.len(), other_arch),
        entry(&foreign_digest, foreign.len(), "mips64le"),
    ]);
    registry::put_manifest(&reg.addr, "test/multi", "elsewhere", OCI_INDEX, &none);
    let err = pull(
        &s,
        &format!("{}/test/multi:elsewhere", reg.addr),
        RegistryConfig::default(),
    )
    .unwrap_err();
    match &err {
        ImageError::NoPlatform {
            offered, wanted, ..
        } => {
            assert_eq!(
                offered,
                &[format!("linux/{other_arch}"), "linux/mips64le".to_string()]
            );
            assert_eq!(wanted, &host.to_string());
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_registry_behind_htpasswd_is_read_with_the_docker_config() {
    let reg = Registry::start_with(Some(HTPASSWD));
    let creds = format!("tester:{PASSWORD}");
    Buildah::new().push_busybox(&reg.addr, "private/img:v1", Some(&creds));
    let s = scratch();
    let reference = Reference::parse(&format!("{}/private/img:v1", reg.addr)).unwrap();
    let anonymous = client(RegistryConfig::default(), None, s.dir.path());
    let err = pull_with(&reference, &s.store, &anonymous).unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized { .. }), "{err}");

    let wrong = registry::docker_config(s.dir.path(), &reg.addr, "tester", "not-the-password");
    let err = pull_with(
        &reference,
        &s.store,
        &client(RegistryConfig::default(), Some(wrong), s.dir.path()),
    )
    .unwrap_err();
    assert!(matches!(err, ImageError::Unauthorized { .. }), "{err}");
    assert!(!err.to_string().contains("not-the-password"), "{err}");

    let right = registry::docker_config(s.dir.path(), &reg.addr, "tester", PASSWORD);
    let image = pull_with(
        &reference,
        &s.store,
        &client(RegistryConfig::default(), Some(right), s.dir.path()),
    )
    .unwrap();
    assert_busybox_config(&image);
}

#[test]
fn a_bearer_challenge_is_answered_with_a_token_once() {
    let reg = Registry::start();
    Buildah::new().push_busybox(&reg.addr, "test/img:v1", None);
    let front = Front::start(
        &reg.addr,
        Faults {
            bearer: Some("tok-123".into()),
            ..Faults::default()
        },
    );
    let s = scratch();
    let image = pull(
        &s,
        &format!("{}/test/img:v1", front.addr),
        RegistryConfig::default(),
    )
    .unwrap();
    assert_busybox_config(&image);
    assert_eq!(
        front.count("/token"),
        1,
        "the token is reused for every blob"
    );
    let refused = front
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.status == 401)
        .count();
    assert_eq!(refused, 1);

    // Blobs redirected (as registries send them to storage) are followed, the token going
    // along to the same host.
    let front = Front::start(
        &reg.addr,
        Faults {
            bearer: Some("tok-456".into()),
            redirect_blobs: true,
            ..Faults::default()
        },
    );
    let reference = format!("{}/test/img:v1", front.addr);
    assert_busybox_config(&pull(&scratch(), &reference, RegistryConfig::default()).unwrap());
    assert_eq!(front.count("/moved/"), 2);

    // A realm over plain HTTP to a host that is neither loopback nor named insecure would
    // carry credentials in the clear: refused before any request goes there.
    let front = Front::start(
        &reg.addr,
        Faults {
            bearer: Some("tok-123".into()),
            realm: Some("http://auth.example.com/token".into()),
            ..Faults::default()
        },
    );
    let err = pull(
        &scratch(),
        &format!("{}/test/img:v1", front.addr),
        RegistryConfig::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, ImageError::PlainHttpRefused { ref url } if url.contains("auth.example.com")),
        "{err}"
    );
}

#[test]
fn a_429_with_retry_after_is_waited_out() {
    let reg = Registry::start();
    Buildah::new().push_busybox(&reg.addr, "test/img:v1", None);
    let front = Front::start(
        &reg.addr,
        Faults {
            throttle: 2,
            ..Faults::default()
        },
    );
    let s = scratch();
    let image = pull(
        &s,
        &format!("{}/test/img:v1", front.addr),
        RegistryConfig::default(),
    )
    .unwrap();
    assert_busybox_config(&image);
    let seen = front.seen.lock().unwrap().clone();
    assert_eq!((seen[0].status, seen[1].status), (429, 429));
    // The schedule's own waits are 50 ms at most: a gap of a second is the server's ask.
    for pair in seen.windows(2).take(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(gap >= Duration::from_millis(900), "retried after {gap:?}");
    }
}

#[test]
fn corrupted_and_truncated_blobs_are_refused_and_leave_nothing() {
    let reg = Registry::start();
    Buildah::new().push_busybox(&reg.addr, "test/img:v1", None);
    for (faults, truncated) in [
        (
            Faults {
                corrupt_blobs: true,
                ..Faults::default()
            },
            false,
        ),
        (
            Faults {
                truncate_blobs: true,
                ..Faults::default()
            },
            true,
        ),
    ] {
        let front = Front::start(&reg.addr, faults);
        let s = scratch();
        let err = pull(
            &s,
            &format!("{}/test/img:v1", front.addr),
            RegistryConfig::default(),
        )
        .unwrap_err();
        match (&err, truncated) {
            (ImageError::Store(StoreError::DigestMismatch { .. }), false) => {}
            (ImageError::Store(StoreError::Truncated { .. }), true) => {}
            (other, _) => panic!("truncated: {truncated}: {other:?}"),
        }
        // The manifest came whole and is kept; no blob it names, no temp file, no record.
        assert_eq!(store_files(&s.store), (1, 0));
        assert!(s.store.records().unwrap().is_empty());
    }
}

#[test]
fn two_threads_pulling_one_image_download_each_blob_once() {
    let reg = Registry::start();
    Buildah::new().push_busybox(&reg.addr, "test/img:v1", None);
    let front = Front::start(&reg.addr, Faults::default());
    let s = Arc::new(scratch());
    let start = Arc::new(Barrier::new(2));
    let reference = format!("{}/test/img:v1", front.addr);
    let pulls: Vec<_> = (0..2)
        .map(|_| {
            let (s, start, reference) = (s.clone(), start.clone(), reference.clone());
            std::thread::spawn(move || {
                start.wait();
                pull(&s, &reference, RegistryConfig::default()).unwrap()
            })
        })
        .collect();
    let images: Vec<PulledImage> = pulls.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(images[0], images[1]);
    let gets = front.blob_gets();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert!(gets.values().all(|&n| n == 1), "{gets:?}");
}

#[test]
fn mirrors_are_tried_first_and_a_dead_one_falls_back_to_the_registry() {
    let reg = Registry::start();
    Buildah::new().push_busybox(&reg.addr, "test/img:v1", None);
    let mirror = Front::start(&reg.addr, Faults::default());
    let upstream = Front::start(&reg.addr, Faults::default());
    let s = scratch();
    let via_mirror = RegistryConfig::default().with(
        &upstream.addr,
        RegistrySettings {
            mirrors: vec![mirror.addr.clone()],
            insecure: false,
        },
    );
    let image = pull(&s, &format!("{}/test/img:v1", upstream.addr), via_mirror).unwrap();
    assert_busybox_config(&image);
    assert_eq!(mirror.count("/manifests/v1"), 1);
    assert_eq!(mirror.blob_gets().len(), 2);
    assert_eq!(
        upstream.count("/v2/"),
        0,
        "the registry was asked while its mirror served"
    );

    // A mirror that is down costs one try; the registry itself serves.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let s = scratch();
    let dead_mirror = RegistryConfig::default().with(
        &reg.addr,
        RegistrySettings {
            mirrors: vec![dead],
            insecure: false,
        },
    );
    assert_busybox_config(&pull(&s, &format!("{}/test/img:v1", reg.addr), dead_mirror).unwrap());
}

#[test]
fn the_cli_pulls_lists_and_exits_by_the_documented_codes() {
    let reg = Registry::start();
    Buildah::new().push_busybox(&reg.addr, "test/img:v1", None);
    let env = support::Env::new();
    let cli = |args: &[&str]| {
        let mut c = env.cmd(args);
        // Never this machine's Docker credentials.
        c.env("DOCKER_CONFIG", env.path("docker"));
        c.output().unwrap()
    };
    let reference = format!("{}/test/img:v1", reg.addr);
    let o = cli(&["image", "pull", "--json", &reference]);
    assert_eq!(o.status.code(), Some(0), "{}", support::text(&o));
    let pulled: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(pulled["layers"], 1);
    let o = cli(&["image", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed[0]["reference"].as_str(), Some(reference.as_str()));
    assert_eq!(listed[0]["digest"], pulled["digest"]);
    let o = cli(&["image", "list"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&reference));

    let o = cli(&["image", "pull", "Not/A:Reference:"]);
    assert_eq!(o.status.code(), Some(2), "{}", support::text(&o));
    let o = cli(&["image", "pull", &format!("{}/test/absent:v1", reg.addr)]);
    assert_eq!(o.status.code(), Some(3), "{}", support::text(&o));
    std::fs::create_dir_all(env.home()).unwrap();
    std::fs::write(
        env.home().join("registries.toml"),
        "[registries.\"x.io\"]\nmirors = []\n",
    )
    .unwrap();
    let o = cli(&["image", "pull", &reference]);
    assert_eq!(o.status.code(), Some(2), "{}", support::text(&o));
    assert!(
        support::text(&o).contains("registries.toml"),
        "{}",
        support::text(&o)
    );
}
