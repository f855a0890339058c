//! `wmo-e2b project` on the local backend: lifecycle, contained paths, bounds, snapshot
//! rejections, replacement from the mirror.

use std::process::{Output, Stdio};

use serde_json::Value;

mod support;

use support::text;

/// The shared scratch environment with a project named `demo` in it.
struct Env(support::Env);

impl std::ops::Deref for Env {
    type Target = support::Env;
    fn deref(&self) -> &support::Env {
        &self.0
    }
}

impl Env {
    fn new() -> Env {
        let env = Env(support::Env::new());
        let o = env.run(&["project", "create", "demo"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        env
    }

    fn put(&self, path: &str, content: &str) -> Output {
        let mut child = self
            .cmd(&["project", "put", "demo", path])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(content.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    fn exec(&self, command: &str) -> Output {
        self.run(&["project", "exec", "demo", "--shell", command])
    }

    fn sandbox_id(&self) -> String {
        let o = self.run(&["project", "list", "--json"]);
        let v: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
        v[0]["sandbox_id"].as_str().unwrap().to_string()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

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

/// Whether `name` lies beside the project, where a `..` let through would put it: beside the
/// workspace in the sandbox, and beside the mirror on the host.
fn lies_beside_the_project(env: &Env, name: &str) -> bool {
    let o = env.exec(&format!("test -e ../{name}"));
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    o.status.code() == Some(0) || env.path(&format!("state/projects/demo/{name}")).exists()
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

fn script(env: &Env, steps: Value) -> String {
    let p = env.path(&format!("script-{}.json", rand_suffix()));
    std::fs::write(&p, steps.to_string()).unwrap();
    p.to_str().unwrap().to_string()
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn call(name: &str, args: Value) -> Value {
    serde_json::json!({"tool_calls": [{"name": name, "arguments": args}]})
}

fn events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn an_agent_turn_writes_through_the_mirror_within_its_grant() {
    let env = Env::new();
    let steps = serde_json::json!([
        call(
            "write_file",
            serde_json::json!({"path": "notes/plan.md", "content": "step 1\n"})
        ),
        call(
            "write_file",
            serde_json::json!({"path": "other.md", "content": "nope"})
        ),
        call(
            "write_file",
            serde_json::json!({"path": "../escape.md", "content": "nope"})
        ),
        call("bash", serde_json::json!({"command": "echo hi"})),
        call("read_file", serde_json::json!({"path": "notes/plan.md"})),
        call("submit", serde_json::json!({"answer": "planned"})),
    ]);
    let log = env.path("events.jsonl");
    let o = env.run(&[
        "project",
        "run",
        "demo",
        "--instruction",
        "make a plan",
        "--script",
        &script(&env, steps),
        "--writable",
        "notes/plan.md",
        "--events",
        log.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(stdout(&o), "planned\n");
    let ev = events(&log);
    let results: Vec<&Value> = ev.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 5, "{ev:?}");
    assert_eq!(results[0]["payload"]["is_error"], false);
    assert!(results[1]["payload"]["content"]
        .as_str()
        .unwrap()
        .contains("not writable"));
    assert!(results[2]["payload"]["content"]
        .as_str()
        .unwrap()
        .contains("'..'"));
    assert!(results[3]["payload"]["content"]
        .as_str()
        .unwrap()
        .contains("not available"));
    assert_eq!(results[4]["payload"]["content"], "step 1\n");
    // The granted write went through the mirror; the denied ones touched nothing.
    let o = env.run(&["project", "get", "demo", "notes/plan.md"]);
    assert_eq!(stdout(&o), "step 1\n");
    let o = env.run(&["project", "get", "demo", "other.md"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!env.path("state/projects/demo/mirror/other.md").exists());
    assert!(!lies_beside_the_project(&env, "escape.md"));
}

#[test]
fn bash_in_a_turn_runs_without_network() {
    let env = Env::new();
    let steps = serde_json::json!([
        call(
            "bash",
            serde_json::json!({"command": "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"})
        ),
        call("submit", serde_json::json!({"answer": "ok"})),
    ]);
    let log = env.path("events.jsonl");
    let o = env.run(&[
        "project",
        "run",
        "demo",
        "--instruction",
        "look",
        "--script",
        &script(&env, steps),
        "--allow-bash",
        "--events",
        log.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ev = events(&log);
    let r = ev.iter().find(|e| e["kind"] == "tool_result").unwrap();
    assert_eq!(r["payload"]["content"], "lo\n", "{r}");
}

/// Symlinks the sandbox made to host files (which it cannot see) and to a system directory
/// (which it can): every tool the host answers refuses to follow them, naming the path.
#[test]
fn host_answered_tools_never_follow_a_symlink_out_of_the_sandbox() {
    let env = Env::new();
    let secret = env.path("secret.txt");
    std::fs::write(&secret, "TOP SECRET").unwrap();
    let target = env.path("host.txt");
    std::fs::write(&target, "untouched").unwrap();
    let host_dir = env.path("hostdir");
    std::fs::create_dir(&host_dir).unwrap();
    let o = env.exec(&format!(
        "ln -s {} notes.txt && ln -s {} README.md && ln -s {} out && ln -s /etc secret \
         && mkdir -p real && ln -s ../real/x loop",
        secret.display(),
        target.display(),
        host_dir.display()
    ));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let o = env.run(&["project", "get", "demo", "notes.txt"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!stdout(&o).contains("TOP SECRET"));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("notes.txt"),
        "{}",
        text(&o)
    );
    assert_ne!(env.put("README.md", "pwned").status.code(), Some(0));
    assert_ne!(env.put("out/new.txt", "pwned").status.code(), Some(0));
    let skeleton = env.path("skeleton");
    std::fs::create_dir(&skeleton).unwrap();
    std::fs::write(skeleton.join("a.txt"), "a").unwrap();
    let o = env.run(&[
        "project",
        "stage",
        "demo",
        "--from",
        skeleton.to_str().unwrap(),
        "--to",
        "out/staged",
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    for root in ["secret", "secret/ssl"] {
        let o = env.run(&["project", "snapshot", "demo", root, "--json"]);
        assert_eq!(o.status.code(), Some(2), "{root}: {}", text(&o));
        assert!(stdout(&o).is_empty(), "{root}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("symlink"),
            "{root}: {}",
            text(&o)
        );
    }

    // The same through an agent turn's host-answered tools.
    let steps = serde_json::json!([
        call("read_file", serde_json::json!({"path": "notes.txt"})),
        call(
            "write_file",
            serde_json::json!({"path": "README.md", "content": "pwned"})
        ),
        call("submit", serde_json::json!({"answer": "tried"})),
    ]);
    let log = env.path("events.jsonl");
    let o = env.run(&[
        "project",
        "run",
        "demo",
        "--instruction",
        "read the notes",
        "--script",
        &script(&env, steps),
        "--writable",
        "README.md",
        "--events",
        log.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ev = events(&log);
    let results: Vec<&Value> = ev.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 2, "{ev:?}");
    for (r, path) in results.iter().zip(["notes.txt", "README.md"]) {
        let content = r["payload"]["content"].as_str().unwrap();
        assert_eq!(r["payload"]["is_error"], true, "{r}");
        assert!(content.contains(path) && content.contains("symlink"), "{r}");
        assert!(!content.contains("TOP SECRET"), "{r}");
    }

    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
    assert!(std::fs::read_dir(&host_dir).unwrap().next().is_none());
}
