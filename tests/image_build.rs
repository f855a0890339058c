//! Dockerfiles built by a real buildah, offline, from a base image in a loopback registry:
//! the result imported into the store and unpacked like a pulled image; each build key
//! built once (across requests, threads and a CLI run), again when its content changes or
//! its image left the store; a failing or overlong build a typed error naming its log.

#[path = "support/registry.rs"]
mod registry;
mod support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use wmo_e2b::image::build::{BuildRecord, DEFAULT_BUILD_TIMEOUT};
use wmo_e2b::image::builder::{Builder, BuilderKind};
use wmo_e2b::image::unpack::{unpack_image, LayerBlob};
use wmo_e2b::image::{build, BuildError, BuildRequest, Built, PulledImage, RegistryConfig, Store};

/// A loopback registry holding `base:1`, kept running for the test.
struct Base {
    _registry: registry::Registry,
    reference: String,
}

fn base() -> Base {
    let registry = registry::Registry::start();
    let buildah = registry::Buildah::new();
    let reference = buildah.push_base(&registry.addr, "base:1");
    Base {
        _registry: registry,
        reference,
    }
}

/// buildah behind a script that counts its `build`s, so a test sees whether one ran.
struct Counted {
    builder: Builder,
    calls: PathBuf,
}

impl Counted {
    fn new(dir: &Path) -> Counted {
        registry::require("buildah", "buildah");
        let calls = dir.join("calls");
        let script = dir.join("buildah");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}\nexec buildah \"$@\"\n",
                calls.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Counted {
            builder: Builder {
                kind: BuilderKind::Buildah,
                program: script,
            },
            calls,
        }
    }

    fn builds(&self) -> usize {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split(' ').any(|w| w == "build"))
            .count()
    }
}

/// A context directory `name` under `dir` with `Dockerfile` and the given files.
fn context(dir: &Path, name: &str, dockerfile: &str, files: &[(&str, &str)]) -> PathBuf {
    let ctx = dir.join(name);
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(ctx.join("Dockerfile"), dockerfile).unwrap();
    for (path, content) in files {
        std::fs::write(ctx.join(path), content).unwrap();
    }
    ctx
}

fn request<'a>(ctx: &'a Path, dockerfile: &'a Path, logs: &'a Path) -> BuildRequest<'a> {
    BuildRequest {
        dockerfile,
        context: ctx,
        args: &[],
        timeout: DEFAULT_BUILD_TIMEOUT,
        log_dir: logs,
    }
}

fn build_in(
    ctx: &Path,
    store: &Store,
    builder: &Builder,
    logs: &Path,
) -> Result<Built, BuildError> {
    let dockerfile = ctx.join("Dockerfile");
    build(
        &request(ctx, &dockerfile, logs),
        Some(builder),
        store,
        &RegistryConfig::default(),
    )
}

fn unpacked(image: &PulledImage, store: &Store) -> PathBuf {
    let layers: Vec<LayerBlob> = image
        .layers
        .iter()
        .zip(&image.config.diff_ids)
        .map(|(l, diff)| LayerBlob {
            path: l.path.clone(),
            media_type: l.media_type.clone(),
            digest: l.digest.to_string(),
            diff_id: Some(diff.to_string()),
        })
        .collect();
    unpack_image(
        &layers,
        &store.root().join("rootfs"),
        image.manifest_digest.as_str(),
    )
    .unwrap()
}

fn record(store: &Store, built: &Built) -> BuildRecord {
    let path = store
        .root()
        .join("builds")
        .join(format!("{}.json", built.key.hex()));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_dockerfile_from_a_loopback_registry_builds_into_the_store_and_unpacks() {
    let base = base();
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    let builder = Builder::find().unwrap();
    let dockerfile = format!(
        "FROM {}\n\
         RUN mkdir -p /app/data && echo built > /app/data/run.txt && chmod 0750 /app/data\n\
         COPY hello.txt /app/hello.txt\n\
         ENV GREETING=\"hi there\"\n\
         WORKDIR /app\n\
         USER app\n",
        base.reference
    );
    let ctx = context(tmp.path(), "ctx", &dockerfile, &[("hello.txt", "hello\n")]);
    let logs = tmp.path().join("logs");
    let built = build_in(&ctx, &store, &builder, &logs).unwrap();
    assert!(built.fresh);
    assert_eq!(built.log, logs.join(format!("{}.log", built.key.hex())));
    let log = std::fs::read_to_string(&built.log).unwrap();
    assert!(log.contains("STEP 2/6: RUN"), "{log}");

    let image = &built.image;
    assert_eq!(image.config.working_dir.as_deref(), Some("/app"));
    assert_eq!(image.config.user.as_deref(), Some("app"));
    assert!(
        image.config.env.contains(&"GREETING=hi there".to_string()),
        "{:?}",
        image.config.env
    );
    assert!(image.config.env.contains(&"PATH=/bin".to_string()));
    let root = unpacked(image, &store);
    assert_eq!(
        std::fs::read_to_string(root.join("app/hello.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("app/data/run.txt")).unwrap(),
        "built\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(root.join("app/data"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o750);
    assert!(root.join("bin/busybox").is_file());

    // Recorded twice over: the build by its key, the image like a pulled one.
    let r = record(&store, &built);
    assert_eq!(r.key, built.key.as_str());
    assert_eq!(r.builder, "buildah");
    assert!(r.builder_version.starts_with("buildah version"), "{r:?}");
    assert_eq!(r.manifest_digest, image.manifest_digest.as_str());
    let listed = store.lookup(&r.reference).unwrap();
    assert_eq!(listed.manifest_digest, r.manifest_digest);
    // Its work directory is gone, and so is the builder's copy of the image (the store has
    // it); the base stays for later builds.
    let work = store.root().join("build/tmp").read_dir().unwrap();
    let hex = built.key.hex();
    assert!(!work
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(hex)));
    let images = std::process::Command::new("buildah")
        .arg("--root")
        .arg(store.root().join("build/root"))
        .arg("--runroot")
        .arg(store.root().join("build/run"))
        .args([
            "--storage-driver",
            "vfs",
            "images",
            "--format",
            "{{.Name}}:{{.Tag}}",
        ])
        .output()
        .unwrap();
    let images = String::from_utf8_lossy(&images.stdout);
    assert_eq!(images.trim(), base.reference, "{images}");
}

#[test]
fn the_same_content_builds_once_and_changed_content_or_a_lost_blob_builds_again() {
    let base = base();
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    let counted = Counted::new(tmp.path());
    let dockerfile = format!("FROM {}\nCOPY a.txt /a.txt\n", base.reference);
    let ctx = context(tmp.path(), "ctx", &dockerfile, &[("a.txt", "one")]);
    let logs = tmp.path().join("logs");
    let first = build_in(&ctx, &store, &counted.builder, &logs).unwrap();
    assert_eq!(counted.builds(), 1);
    let first_record = record(&store, &first);
    let log_before = std::fs::metadata(&first.log).unwrap().modified().unwrap();

    // Another request of the same content, through another handle on the store and with
    // its log elsewhere: found, nothing run, nothing rewritten.
    let again_store = Store::open(store.root()).unwrap();
    let again = build_in(
        &ctx,
        &again_store,
        &counted.builder,
        &tmp.path().join("other"),
    )
    .unwrap();
    assert!(!again.fresh);
    assert_eq!(counted.builds(), 1);
    assert_eq!(again.key, first.key);
    assert_eq!(again.image, first.image);
    assert_eq!(record(&store, &again), first_record);
    assert_eq!(
        std::fs::metadata(&first.log).unwrap().modified().unwrap(),
        log_before
    );
    assert!(!again.log.exists());

    // A changed file is another key.
    std::fs::write(ctx.join("a.txt"), "two").unwrap();
    let changed = build_in(&ctx, &store, &counted.builder, &logs).unwrap();
    assert!(changed.fresh);
    assert_ne!(changed.key, first.key);
    assert_eq!(counted.builds(), 2);
    let root = unpacked(&changed.image, &store);
    assert_eq!(std::fs::read_to_string(root.join("a.txt")).unwrap(), "two");

    // Back to the first content: its record serves.
    std::fs::write(ctx.join("a.txt"), "one").unwrap();
    assert!(
        !build_in(&ctx, &store, &counted.builder, &logs)
            .unwrap()
            .fresh
    );
    assert_eq!(counted.builds(), 2);

    // A record whose image lost a blob (a prune) is built again.
    let top = first.image.layers.last().unwrap();
    std::fs::remove_file(&top.path).unwrap();
    let rebuilt = build_in(&ctx, &store, &counted.builder, &logs).unwrap();
    assert!(rebuilt.fresh);
    assert_eq!(rebuilt.key, first.key);
    assert_eq!(counted.builds(), 3);
    assert!(rebuilt.image.layers.iter().all(|l| l.path.is_file()));
}

#[test]
fn two_threads_asking_for_one_key_at_once_build_it_once() {
    let base = base();
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    let counted = Arc::new(Counted::new(tmp.path()));
    let dockerfile = format!("FROM {}\nRUN echo once > /once\n", base.reference);
    let ctx = context(tmp.path(), "ctx", &dockerfile, &[]);
    let logs = tmp.path().join("logs");
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (store, counted, ctx, logs, barrier) = (
                store.clone(),
                counted.clone(),
                ctx.clone(),
                logs.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                build_in(&ctx, &store, &counted.builder, &logs).unwrap()
            })
        })
        .collect();
    let built: Vec<Built> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(counted.builds(), 1);
    assert_eq!(built.iter().filter(|b| b.fresh).count(), 1);
    assert_eq!(built[0].image, built[1].image);
}

#[test]
fn a_failing_run_is_a_typed_error_naming_the_dockerfile_and_its_log() {
    let base = base();
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    let builder = Builder::find().unwrap();
    let dockerfile = format!(
        "FROM {}\nRUN echo the-step-that-fails && exit 7\n",
        base.reference
    );
    let ctx = context(tmp.path(), "ctx", &dockerfile, &[]);
    let logs = tmp.path().join("logs");
    let e = build_in(&ctx, &store, &builder, &logs).unwrap_err();
    assert!(!e.is_bad_input());
    let BuildError::Failed {
        dockerfile,
        log,
        tail,
        status,
        ..
    } = &e
    else {
        panic!("{e:?}");
    };
    assert_eq!(dockerfile, &ctx.join("Dockerfile"));
    assert!(status.is_some_and(|s| !s.success()), "{e}");
    assert!(log.starts_with(&logs), "{e}");
    let text = std::fs::read_to_string(log).unwrap();
    assert!(text.contains("the-step-that-fails"), "{text}");
    assert!(!tail.is_empty() && tail.len() <= 20, "{tail:?}");
    let shown = e.to_string();
    assert!(
        shown.contains("Dockerfile") && shown.contains(&log.display().to_string()),
        "{shown}"
    );
    // Nothing recorded: asking again builds again (and fails again).
    assert_eq!(
        std::fs::read_dir(store.root().join("builds"))
            .unwrap()
            .filter(|e| e
                .as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "json"))
            .count(),
        0
    );
}

#[test]
fn a_build_past_its_timeout_is_killed_and_says_so() {
    let base = base();
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    let builder = Builder::find().unwrap();
    // The background sleep is the builder's grandchild's child, which no parent-death
    // signal reaches: only killing the builder's process group ends it.
    let dockerfile = format!("FROM {}\nRUN sleep 171 & sleep 120\n", base.reference);
    let ctx = context(tmp.path(), "ctx", &dockerfile, &[]);
    let logs = tmp.path().join("logs");
    let path = ctx.join("Dockerfile");
    let started = Instant::now();
    let e = build(
        &BuildRequest {
            timeout: Duration::from_secs(8),
            ..request(&ctx, &path, &logs)
        },
        Some(&builder),
        &store,
        &RegistryConfig::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, BuildError::TimedOut { timeout, .. } if timeout.as_secs() == 8),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    // The RUN's processes went with the builder's process group.
    let sleeping = |arg: &[u8]| {
        let cmdline = [b"sleep\x00".as_slice(), arg, b"\x00"].concat();
        support::proc_pids().into_iter().any(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == cmdline)
                && support::pid_alive(pid)
        })
    };
    // Killed at once; seen gone within a wait that a host busy with other builds' copies
    // still meets.
    let gone = support::eventually(Duration::from_secs(30), || {
        !sleeping(b"171") && !sleeping(b"120")
    });
    assert!(gone, "the build's processes outlived its timeout");
}

#[test]
fn a_context_symlink_pointing_outside_is_hashed_by_its_target_never_followed() {
    let base = base();
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store")).unwrap();
    let counted = Counted::new(tmp.path());
    let outside = tmp.path().join("outside.txt");
    std::fs::write(&outside, "secret one").unwrap();
    let dockerfile = format!("FROM {}\nCOPY . /ctx/\n", base.reference);
    let ctx = context(tmp.path(), "ctx", &dockerfile, &[]);
    std::os::unix::fs::symlink(&outside, ctx.join("link")).unwrap();
    let logs = tmp.path().join("logs");
    let first = build_in(&ctx, &store, &counted.builder, &logs).unwrap();
    let root = unpacked(&first.image, &store);
    let link = std::fs::read_link(root.join("ctx/link")).unwrap();
    assert_eq!(link, outside);
    // What the link points at is not the context's content: the key stays.
    std::fs::write(&outside, "secret two").unwrap();
    let again = build_in(&ctx, &store, &counted.builder, &logs).unwrap();
    assert_eq!((again.fresh, &again.key), (false, &first.key));
    // Where it points is.
    std::fs::remove_file(ctx.join("link")).unwrap();
    std::os::unix::fs::symlink("/elsewhere", ctx.join("link")).unwrap();
    let moved = build_in(&ctx, &store, &counted.builder, &logs).unwrap();
    assert!(moved.fresh);
    assert_ne!(moved.key, first.key);
    assert_eq!(counted.builds(), 2);
}

#[test]
fn image_build_prints_the_key_and_digest_and_exits_as_image_pull_does() {
    let base = base();
    let env = support::Env::new();
    let ctx = env.path("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(
        ctx.join("Containerfile"),
        "ARG BASE\nFROM ${BASE}\nARG WORD\nRUN echo \"$WORD\" > /word\n",
    )
    .unwrap();
    let file = ctx.join("Containerfile");
    let arg = format!("BASE={}", base.reference);
    let run = |word: &str| {
        env.run(&[
            "image",
            "build",
            "--json",
            "--build-arg",
            &arg,
            "--build-arg",
            &format!("WORD={word}"),
            "-f",
            file.to_str().unwrap(),
            ctx.to_str().unwrap(),
        ])
    };
    let o = run("a");
    assert_eq!(o.status.code(), Some(0), "{}", support::text(&o));
    let first: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(first["fresh"], true, "{first}");
    assert!(first["key"].as_str().unwrap().starts_with("sha256:"));
    assert!(first["manifest_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    let log = first["log"].as_str().unwrap();
    assert!(Path::new(log).starts_with(env.home()), "{log}");
    let o = run("a");
    let again: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(again["log"].is_null(), "{again}");
    assert_eq!(
        (again["fresh"].clone(), again["key"].clone()),
        (false.into(), first["key"].clone())
    );
    let o = run("b");
    let other: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_ne!(other["key"], first["key"]);
    // `image list` shows it like a pulled image.
    let o = env.run(&["image", "list", "--json"]);
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(listed.contains("localhost/wmo-e2b/build:"), "{listed}");

    // Bad input is 2; a build that fails is 3, naming its log.
    let o = env.run(&["image", "build", env.path("missing").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", support::text(&o));
    let o = env.run(&[
        "image",
        "build",
        "--build-arg",
        "1=x",
        ctx.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", support::text(&o));
    std::fs::write(
        ctx.join("Dockerfile"),
        format!("FROM {}\nRUN exit 3\n", base.reference),
    )
    .unwrap();
    let o = env.run(&["image", "build", ctx.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", support::text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(".log") && stderr.contains("Dockerfile"),
        "{stderr}"
    );
}
