//! Harbor task directories read, and refused, as they are.
use super::*;
use crate::task::environment::SOLUTION_DIR;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/harbor")
        .join(rel)
}

/// A minimal valid task at `dir/id`.
fn write_task(dir: &Path, id: &str) -> PathBuf {
    let t = dir.join(id);
    std::fs::create_dir_all(t.join("tests")).unwrap();
    std::fs::write(t.join("task.toml"), "version = \"1.0\"\n").unwrap();
    std::fs::write(t.join("instruction.md"), "do it\n").unwrap();
    std::fs::write(t.join("tests/test.sh"), "exit 0\n").unwrap();
    t
}

#[test]
fn a_dataset_reads_into_tasks_sorted_by_name() {
    let (tasks, digest) = load_dataset(&fixture("dataset")).unwrap();
    let ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["hello-file", "sum-numbers", "verifier-env"]);
    assert!(digest.starts_with("sha256:"), "{digest}");
    let hello = &tasks[0];
    assert_eq!(hello.timeout_s, Some(120.0));
    assert_eq!(hello.verify_timeout_s, Some(60.0));
    assert_eq!(hello.verify.as_deref(), Some(HARBOR_VERIFY));
    assert!(hello.tests.contains_key("test.sh"));
    assert_eq!(hello.metadata["difficulty"], "easy");
    assert_eq!(hello.metadata["tags"][1], "fixture");
    assert_eq!(hello.network, Some(Network::None));
    let limits = hello.limits.unwrap();
    assert_eq!(
        (limits.cpus, limits.memory_mb, limits.disk_mb),
        (Some(1.0), Some(1024), Some(512))
    );
    assert_eq!(hello.environment, None);
    let sum = &tasks[1];
    let solution = sum.solution.as_ref().unwrap();
    assert!(solution.files.contains_key("sum.awk"));
    assert_eq!(solution.command, HARBOR_SOLVE);
    assert!(HARBOR_SOLVE.contains(&format!("bash {SOLUTION_DIR}/solve.sh;")));
    assert!(HARBOR_SOLVE.contains(&format!("sh {SOLUTION_DIR}/solve.sh;")));
    assert_eq!(sum.network, None);
    assert_eq!(tasks[2].verify_env["EXPECTED_ANSWER"], "42");

    // One task is a dataset of one; a change to any file is a change of digest.
    let (one, one_digest) = load_dataset(&fixture("dataset/hello-file")).unwrap();
    assert_eq!(one.len(), 1);
    assert_ne!(one_digest, digest);
}

#[test]
fn an_environment_directory_is_the_dockerfile_and_its_context() {
    let dir = fixture("with-dockerfile");
    let (tasks, _) = load_dataset(&dir).unwrap();
    assert_eq!(
        tasks[0].environment,
        Some(EnvironmentSpec::Dockerfile {
            path: dir.join("environment/Dockerfile"),
            context: dir.join("environment"),
        })
    );
    let limits = tasks[0].limits.unwrap();
    assert_eq!((limits.memory_mb, limits.disk_mb), (Some(2048), Some(4096)));
    assert_eq!(tasks[0].build_timeout_s, Some(600.0));

    // `docker_image` names a prebuilt image of it, and wins.
    let tmp = tempfile::tempdir().unwrap();
    let t = write_task(tmp.path(), "prebuilt");
    std::fs::create_dir(t.join("environment")).unwrap();
    std::fs::write(t.join("environment/Dockerfile"), "FROM x\n").unwrap();
    std::fs::write(
        t.join("task.toml"),
        "[environment]\ndocker_image = \"registry.example/app@sha256:ab\"\n",
    )
    .unwrap();
    let (tasks, _) = load_dataset(&t).unwrap();
    assert_eq!(
        tasks[0].environment,
        Some(EnvironmentSpec::Image(
            "registry.example/app@sha256:ab".into()
        ))
    );
}

/// Each way a task directory can be wrong, refused naming the file and the field.
#[test]
fn a_bad_task_directory_is_refused_by_file_and_field() {
    type Break = fn(&Path);
    let cases: [(&str, Break, &str, &str); 14] = [
        (
            "unknown key",
            |t| append(t, "task.toml", "colour = \"red\"\n"),
            "task.toml",
            "colour",
        ),
        (
            "unknown section key",
            |t| append(t, "task.toml", "[agent]\nuser = \"x\"\n"),
            "task.toml",
            "agent",
        ),
        (
            "wrong type",
            |t| append(t, "task.toml", "[agent]\ntimeout_sec = \"soon\"\n"),
            "task.toml",
            "agent.timeout_sec",
        ),
        (
            "bad timeout",
            |t| append(t, "task.toml", "[verifier]\ntimeout_sec = -1\n"),
            "task.toml",
            "verifier.timeout_sec",
        ),
        (
            "bad memory",
            |t| append(t, "task.toml", "[environment]\nmemory = \"lots\"\n"),
            "task.toml",
            "environment.memory",
        ),
        (
            "both memories",
            |t| {
                append(
                    t,
                    "task.toml",
                    "[environment]\nmemory = \"1G\"\nmemory_mb = 1\n",
                )
            },
            "task.toml",
            "memory_mb",
        ),
        (
            "bad env name",
            |t| append(t, "task.toml", "[verifier.env]\nLD_PRELOAD = \"x\"\n"),
            "task.toml",
            "verify_env",
        ),
        (
            "no instruction",
            |t| remove(t, "instruction.md"),
            "instruction.md",
            "missing",
        ),
        (
            "no test.sh",
            |t| remove(t, "tests/test.sh"),
            "test.sh",
            "missing",
        ),
        (
            "no solve.sh",
            |t| std::fs::create_dir(t.join("solution")).unwrap(),
            "solve.sh",
            "missing",
        ),
        (
            "symlinked instruction",
            |t| {
                remove(t, "instruction.md");
                std::os::unix::fs::symlink("/etc/passwd", t.join("instruction.md")).unwrap();
            },
            "instruction.md",
            "symlink",
        ),
        (
            "binary instruction",
            |t| std::fs::write(t.join("instruction.md"), b"\xff\xfe").unwrap(),
            "instruction.md",
            "UTF-8",
        ),
        (
            "compose",
            |t| {
                std::fs::create_dir(t.join("environment")).unwrap();
                std::fs::write(t.join("environment/docker-compose.yaml"), "services: {}\n")
                    .unwrap();
            },
            "docker-compose.yaml",
            "sidecar services are not supported",
        ),
        (
            "symlinked test",
            |t| std::os::unix::fs::symlink("/etc/shadow", t.join("tests/secret")).unwrap(),
            "secret",
            "symlink",
        ),
    ];
    for (what, break_it, file, needle) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let t = write_task(tmp.path(), "broken");
        load_dataset(&t).unwrap_or_else(|e| panic!("{what}: the valid task fails: {e}"));
        break_it(&t);
        let e = load_dataset(&t).expect_err(what).to_string();
        assert!(e.contains(file) && e.contains(needle), "{what}: {e}");
        assert!(
            e.contains("broken"),
            "{what}: names the task's directory: {e}"
        );
    }
}

#[test]
fn trees_past_their_bounds_and_datasets_of_nothing_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let t = write_task(tmp.path(), "many");
    for i in 0..=TREE_BOUNDS.max_files {
        std::fs::write(t.join(format!("tests/f{i}")), "x").unwrap();
    }
    let e = load_dataset(&t).unwrap_err();
    assert!(
        matches!(e, HarborError::Tree(TreeError::TooManyFiles { .. })),
        "{e}"
    );

    let t = write_task(tmp.path(), "big");
    let file = std::fs::File::create(t.join("tests/big")).unwrap();
    file.set_len(TREE_BOUNDS.max_bytes + 1).unwrap();
    let e = load_dataset(&t).unwrap_err();
    assert!(
        matches!(e, HarborError::Tree(TreeError::TooManyBytes { .. })),
        "{e}"
    );

    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir(empty.path().join("not-a-task")).unwrap();
    let e = load_dataset(empty.path()).unwrap_err();
    assert!(matches!(e, HarborError::NotATask { .. }), "{e}");

    // A symlinked task would be read from wherever it points.
    let ds = tempfile::tempdir().unwrap();
    write_task(ds.path(), "real");
    std::os::unix::fs::symlink(t, ds.path().join("linked")).unwrap();
    let e = load_dataset(ds.path()).unwrap_err().to_string();
    assert!(e.contains("linked") && e.contains("symlink"), "{e}");
}

fn append(t: &Path, file: &str, text: &str) {
    let mut all = std::fs::read_to_string(t.join(file)).unwrap();
    all.push_str(text);
    std::fs::write(t.join(file), all).unwrap();
}

fn remove(t: &Path, file: &str) {
    std::fs::remove_file(t.join(file)).unwrap();
}

#[test]
fn sizes_read_as_harbor_writes_them() {
    assert_eq!(parse_size_mb("2G"), Some(2048));
    assert_eq!(parse_size_mb("512M"), Some(512));
    assert_eq!(parse_size_mb("4Gi"), Some(4096));
    assert_eq!(parse_size_mb("1024"), Some(1024));
    assert_eq!(parse_size_mb("2048K"), Some(2));
    for bad in ["", "G", "-1G", "2X", "0", "99999999999999999999T"] {
        assert_eq!(parse_size_mb(bad), None, "{bad}");
    }
}
