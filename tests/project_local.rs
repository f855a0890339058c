//! `wmo-e2b project` on the local backend: lifecycle, contained paths, bounds, snapshot
//! rejections, replacement from the mirror.

use serde_json::Value;

mod support;

use support::project::{lies_beside_the_project, stdout, Env};
use support::text;

/// A user's mistake is a usage error (2), not the infrastructure's (3).
#[test]
fn mistakes_through_the_sandbox_are_usage_errors() {
    let env = Env::new();
    let o = env.exec("ln -s /etc/hostname lnk");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.put("lnk", "over the host's file?");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("symlink"), "{}", text(&o));
    let o = env.run(&[
        "project",
        "create",
        "other",
        "--isolation",
        "none",
        "--on-idle",
        "pause",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--isolation bwrap"), "{}", text(&o));
}

/// `exec -- PROGRAM ARGS...` passes its arguments as given; a string for the shell is
/// `--shell`, and naming both is a usage error.
#[test]
fn exec_passes_arguments_as_given() {
    let env = Env::new();
    let argv = |args: &[&str]| {
        let mut all = vec!["project", "exec", "demo", "--"];
        all.extend(args);
        env.run(&all)
    };
    let o = argv(&["bash", "-c", "echo hi; exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    assert_eq!(stdout(&o), "hi\n");
    let o = argv(&["printf", "%s|", "a b", "$HOME", "it's", "*"]);
    assert_eq!(stdout(&o), "a b|$HOME|it's|*|", "{}", text(&o));
    let o = env.run(&["project", "exec", "demo", "--shell", "true", "--", "true"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn put_get_exec_and_close() {
    let env = Env::new();
    assert_eq!(
        env.put("src/main.rs", "fn main() {}\n").status.code(),
        Some(0)
    );
    let o = env.run(&["project", "get", "demo", "src/main.rs"]);
    assert_eq!(stdout(&o), "fn main() {}\n", "{}", text(&o));

    let o = env.exec("cat src/main.rs; echo err >&2; exit 3");
    assert_eq!(
        o.status.code(),
        Some(3),
        "the command's exit code is ours: {}",
        text(&o)
    );
    assert!(stdout(&o).contains("fn main() {}") && stdout(&o).contains("err"));

    let o = env.exec("head -c 100000 /dev/zero | tr '\\0' x");
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("bytes truncated"), "no marker");
    assert!(o.stdout.len() < 34 * 1024, "{} bytes", o.stdout.len());

    let o = env.run(&[
        "project",
        "exec",
        "demo",
        "--timeout",
        "1s",
        "--shell",
        "sleep 30",
    ]);
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));

    // The mirror answers when the sandbox cannot.
    assert_eq!(env.exec("rm src/main.rs").status.code(), Some(0));
    let o = env.run(&["project", "get", "demo", "src/main.rs"]);
    assert_eq!(stdout(&o), "fn main() {}\n", "{}", text(&o));
    let o = env.run(&["project", "get", "demo", "never/written"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    let id = env.sandbox_id();
    let o = env.run(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.run(&["sandbox", "list", "--json"]);
    assert!(!stdout(&o).contains(&id), "{}", text(&o));
    let o = env.run(&["project", "get", "demo", "src/main.rs"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no project named demo"));
}

#[test]
fn timeouts_out_of_range_are_refused_before_anything_starts() {
    let env = Env::new();
    let before = env.sandbox_id();
    for args in [
        &["project", "create", "short", "--timeout", "0s"][..],
        &["project", "create", "long", "--timeout", "8d"],
        &[
            "project",
            "exec",
            "demo",
            "--timeout",
            "0s",
            "--shell",
            "true",
        ],
        &[
            "project",
            "run",
            "demo",
            "--instruction",
            "x",
            "--timeout",
            "0s",
        ],
    ] {
        let o = env.run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("--timeout") && err.contains("from 1s to 7days"),
            "{err}"
        );
    }
    let o = env.run(&["project", "list", "--json"]);
    let all: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(env.sandbox_id(), before);
}

/// A turn needs something to answer it: a model on the API or a script. Without one it is
/// refused as usage, before the project's sandbox is touched.
#[test]
fn a_turn_without_a_model_or_a_script_is_a_usage_error() {
    let env = Env::new();
    let before = env.sandbox_id();
    for extra in [&[][..], &["--model", "scripted"]] {
        let mut args = vec!["project", "run", "demo", "--instruction", "x"];
        args.extend_from_slice(extra);
        let o = env.run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--model") && err.contains("--script"), "{err}");
    }
    assert_eq!(env.sandbox_id(), before);
}

#[test]
fn hostile_paths_are_rejected_by_name() {
    let env = Env::new();
    for bad in ["../escape", "/etc/passwd", "a/../../b", ""] {
        let o = env.put(bad, "x");
        assert_eq!(o.status.code(), Some(2), "put {bad:?}: {}", text(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("relative project path"));
        let o = env.run(&["project", "get", "demo", bad]);
        assert_eq!(o.status.code(), Some(2), "get {bad:?}: {}", text(&o));
        let o = env.run(&["project", "snapshot", "demo", bad]);
        assert_eq!(o.status.code(), Some(2), "snapshot {bad:?}: {}", text(&o));
    }
    let tree = env.path("tree");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("a.txt"), "a").unwrap();
    let o = env.run(&[
        "project",
        "stage",
        "demo",
        "--from",
        tree.to_str().unwrap(),
        "--to",
        "../up",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    for name in ["escape", "b", "up"] {
        assert!(!lies_beside_the_project(&env, name), "{name} escaped");
    }
    let o = env.run(&["project", "create", "Bad/Name"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = env.run(&["project", "create", "demo"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
}

#[test]
fn stage_validates_everything_before_writing_anything() {
    let env = Env::new();
    let tree = env.path("tree");
    std::fs::create_dir_all(tree.join("src")).unwrap();
    for i in 0..5 {
        std::fs::write(tree.join(format!("src/f{i}.rs")), format!("// {i}\n")).unwrap();
    }
    let from = tree.to_str().unwrap();
    // Stages the tree to `app`, within `bounds`.
    let stage = |bounds: &[&str]| {
        let stage = ["project", "stage", "demo", "--from", from, "--to", "app"];
        env.run(&[&stage[..], bounds].concat())
    };
    let o = stage(&["--max-files", "4"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("more than 4 files"));
    let o = stage(&["--max-bytes", "10"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(
        env.exec("test -e app").status.code(),
        Some(1),
        "something was written"
    );

    std::fs::write(tree.join("bad.bin"), [0xffu8, 0xfe]).unwrap();
    let o = stage(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad.bin"));
    std::fs::remove_file(tree.join("bad.bin")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", tree.join("src/link")).unwrap();
    let o = stage(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("src/link"));
    std::fs::remove_file(tree.join("src/link")).unwrap();

    let o = stage(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.exec("cat app/src/f3.rs");
    assert_eq!(stdout(&o), "// 3\n");
}

#[test]
fn snapshot_harvests_a_sorted_tree_and_rejects_what_is_not_a_plain_file() {
    let env = Env::new();
    assert_eq!(
        env.exec("mkdir -p out/b out/a && echo one > out/b/1.txt && echo two > out/a/2.txt && echo 3 > out/z.txt")
            .status
            .code(),
        Some(0)
    );
    let o = env.run(&["project", "snapshot", "demo", "out", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let snap: Value = serde_json::from_slice(&o.stdout).unwrap();
    let paths: Vec<&str> = snap["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["a/2.txt", "b/1.txt", "z.txt"]);
    assert_eq!(snap["files"][0]["content"], "two\n");
    let again: Value = serde_json::from_slice(
        &env.run(&["project", "snapshot", "demo", "out", "--json"])
            .stdout,
    )
    .unwrap();
    assert_eq!(snap["tree_hash"], again["tree_hash"], "not deterministic");
    // Computed from the documented encoding, independently of this crate.
    assert_eq!(
        snap["tree_hash"],
        "9ed57639665a32cc1ddcd882a426e92f6b546c9af26da174bef17deb00f6c25e"
    );

    let local = env.path("harvest");
    let harvest = || {
        env.run(&[
            "project",
            "snapshot",
            "demo",
            "out",
            "--out",
            local.to_str().unwrap(),
        ])
    };
    let o = harvest();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(local.join("b/1.txt")).unwrap(),
        "one\n"
    );
    let o = harvest();
    assert_ne!(o.status.code(), Some(0), "overwrote an existing directory");

    let rejections = [
        ("ln -s /etc/passwd out/link", "out/link", "link (symlink)"),
        ("mkfifo out/pipe", "out/pipe", "pipe (fifo)"),
        (
            "printf '\\377\\376' > out/bin.dat",
            "out/bin.dat",
            "bin.dat is not valid UTF-8",
        ),
        (
            "d=$(printf 'x%.0s' $(seq 1 200)); mkdir -p out/deep/$d/$d && touch out/deep/$d/$d/$d",
            "out/deep",
            "longer than 512 bytes",
        ),
        (
            // Directories only, far deeper than the walker could recurse: the path bound
            // stops it first.
            "cd out && perl -e 'for (1..20000) { mkdir \"chain\" or die; chdir \"chain\" or die }'",
            "out/chain",
            "longer than 512 bytes",
        ),
    ];
    for (make, cleanup, needle) in rejections {
        assert_eq!(env.exec(make).status.code(), Some(0), "{make}");
        let o = env.run(&["project", "snapshot", "demo", "out"]);
        assert_eq!(o.status.code(), Some(2), "{make}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{make}: {err}");
        assert_eq!(
            env.exec(&format!("rm -rf {cleanup}")).status.code(),
            Some(0)
        );
    }

    assert_eq!(
        env.exec("for i in 1 2 3 4 5; do echo $i > out/n$i; done")
            .status
            .code(),
        Some(0)
    );
    let o = env.run(&["project", "snapshot", "demo", "out", "--max-files", "4"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("more than 4 files"));
    let o = env.run(&["project", "snapshot", "demo", "out", "--max-bytes", "8"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("more than 8 bytes"));
}

#[test]
fn a_lost_sandbox_is_replaced_and_the_mirror_replayed() {
    let env = Env::new();
    assert_eq!(env.put("notes/plan.md", "step 1\n").status.code(), Some(0));
    // Files written inside the sandbox are not mirrored.
    assert_eq!(
        env.exec("echo scratch > scratch.txt").status.code(),
        Some(0)
    );
    let old = env.sandbox_id();
    // A reap never takes a live project's sandbox, though the command that made it is gone.
    let o = env.run(&["reap", "--json"]);
    assert!(!stdout(&o).contains(&old), "{}", text(&o));

    let o = env.run(&["sandbox", "kill", &old]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = env.exec("cat notes/plan.md; test -e scratch.txt || echo no-scratch");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(stdout(&o), "step 1\nno-scratch\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("was gone") && err.contains("replayed 1"),
        "{err}"
    );
    let new = env.sandbox_id();
    assert_ne!(old, new);
    let o = env.run(&["sandbox", "list", "--json"]);
    let live: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0]["kind"], "project");
    assert_eq!(live[0]["lease_state"], "active");
}
