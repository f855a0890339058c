//! `eval --backend e2b` end to end against a running `wmo-e2b emulator`: the real binary on
//! both sides, E2B's wire protocol in between.

use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

mod support;

use support::e2b_cli::{e2b, eval_cmd, Emulator, KEY};
use support::{killed_by, reap_report, results_in, slow_tasks, text, wait_for, Env};

fn run(env: &Env, emu: &Emulator, args: &[&str]) -> Output {
    e2b(env, emu, args).output().unwrap()
}

/// Starts an eval with `jobs` workers in the background; its output goes nowhere.
fn spawn_eval(env: &Env, emu: &Emulator, tasks: &Path, out: &Path, jobs: &str) -> Child {
    eval_cmd(env, emu, tasks, out, &["-j", jobs])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Runs an eval into `env.out()`.
fn eval(env: &Env, emu: &Emulator, tasks: &Path, extra: &[&str]) -> Output {
    eval_cmd(env, emu, tasks, &env.out(), extra)
        .output()
        .unwrap()
}

#[test]
fn the_example_tasks_pass_on_the_e2b_backend() {
    let env = Env::new();
    let emu = Emulator::start(&env.path("emu"), &[]);
    let tasks = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tasks.jsonl");
    let o = eval(&env, &emu, &tasks, &["-j", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rs = env.results();
    assert_eq!(rs.len(), 5);
    assert!(rs.iter().all(|r| r["status"] == "passed"), "{rs:?}");
    for r in &rs {
        let p = &r["provenance"];
        assert_eq!(
            (&p["backend"], &p["template"]),
            (&"e2b".into(), &"base".into()),
            "{r}"
        );
        assert!(p["tasks_file"]["line"].as_u64().unwrap() >= 1, "{r}");
    }
    assert!(emu.live().is_empty(), "{:?}", emu.live());
}

#[test]
fn a_fault_injected_run_records_every_task_and_leaves_nothing_running() {
    let env = Env::new();
    let emu = Emulator::start(
        &env.path("emu"),
        &[
            "--fault",
            "create-429=0.2,create-503=0.05,drop-stream=0.05,kill-fail=0.1",
            "--seed",
            "11",
        ],
    );
    let lines: Vec<String> = (0..100)
        .map(|i| {
            format!(
                r#"{{"id": "t{i:03}", "instruction": "x", "verify": "test -s f.txt", "model_script": [{{"tool_calls": [{{"name": "bash", "arguments": {{"command": "echo {i} > f.txt"}}}}]}}, {{"tool_calls": [{{"name": "submit", "arguments": {{"answer": "ok"}}}}]}}]}}"#
            )
        })
        .collect();
    let tasks = env.write_tasks(&lines);
    // An attempt makes a dozen envd calls (files, setup, tool calls, the stop before verify,
    // verify, the two reset scripts), each of whose streams may be dropped.
    let o = eval(&env, &emu, &tasks, &["-j", "8", "--transport-retries", "3"]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    let rs = env.results();
    assert_eq!(rs.len(), 100, "{}", text(&o));
    let mut ids: Vec<&str> = rs.iter().map(|r| r["id"].as_str().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 100);
    let passed = rs.iter().filter(|r| r["status"] == "passed").count();
    assert!(passed >= 95, "only {passed} of 100 passed: {}", text(&o));
    let stats = emu.stats();
    let retried: u64 = rs
        .iter()
        .map(|r| r["retries"]["transport"].as_u64().unwrap())
        .sum();
    let dropped = stats["faults"]["drop-stream"].as_u64().unwrap_or(0);
    assert!(dropped > 0, "no stream was dropped: {stats}");
    assert!(retried > 0, "dropped streams were not retried: {stats}");
    let summary: Value =
        serde_json::from_slice(&std::fs::read(env.out().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["transport_retries"].as_u64().unwrap(), retried);
    assert!(emu.live().is_empty(), "{:?}", emu.live());
}

/// Processes named npm that run in the sandboxes of one template (envd gives each process
/// `E2B_TEMPLATE_ID`), seen by reading the host's /proc every few milliseconds: a sandbox's
/// processes are the host's too. An `npm install` lasts seconds, so none goes unseen.
struct NpmWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl NpmWatch {
    fn start(template: &str) -> NpmWatch {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let env_line = format!("E2B_TEMPLATE_ID={template}");
        let thread = std::thread::spawn(move || {
            let mut seen = std::collections::BTreeMap::new();
            while !flag.load(Ordering::SeqCst) {
                for pid in support::proc_pids() {
                    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                        continue;
                    };
                    let argv: Vec<String> = cmdline
                        .split(|b| *b == 0)
                        .filter(|a| !a.is_empty())
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect();
                    // `npm ...` (or npm's own process title), or `node .../npm-cli.js ...`
                    let named = |arg: Option<&String>, names: &[&str]| {
                        arg.and_then(|a| a.split(' ').next())
                            .and_then(|a| a.rsplit('/').next())
                            .is_some_and(|base| names.contains(&base))
                    };
                    if !named(argv.first(), &["npm"]) && !named(argv.get(1), &["npm", "npm-cli.js"])
                    {
                        continue;
                    }
                    let ours = std::fs::read(format!("/proc/{pid}/environ"))
                        .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == env_line.as_bytes()));
                    if ours {
                        seen.insert(pid, argv.join(" "));
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen.into_values().collect()
        });
        NpmWatch { stop, thread }
    }

    /// The command lines seen, one per process.
    fn stop(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

/// pi on E2B with no npm in any sandbox: the host builds the bundle (here, the shared cache
/// in `target/pi-cache`), the bootstrap uploads that one file, and the runner runs the real
/// pi loop from it. The task itself starts one process named npm (a `sleep` under that
/// name), which shows that the watch sees what runs in the sandbox; it is the only one.
#[test]
fn the_pi_harness_runs_on_e2b_from_the_uploaded_bundle_and_no_npm_runs() {
    let env = Env::new();
    support::share_pi_install(&env);
    let template = format!("wmo-pi-no-npm-{}", std::process::id());
    let emu = Emulator::start(&env.path("emu"), &["--template", &template]);
    let decoy =
        r#"{"tool_calls": [{"name": "bash", "arguments": {"command": "exec -a npm sleep 1"}}]}"#;
    let submit = r#"{"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}"#;
    let tasks = env.write_tasks(&[format!(
        r#"{{"id": "pi", "instruction": "x", "model_script": [{decoy}, {submit}]}}"#
    )]);
    let watch = NpmWatch::start(&template);
    let o = eval(
        &env,
        &emu,
        &tasks,
        &["--harness", "pi", "--template", &template],
    );
    let npm_seen = watch.stop();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = &env.results()[0];
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["turns"], 2, "{r}");
    assert_eq!(npm_seen, ["npm 1"], "npm ran in a sandbox of the run");
    // provenance names the bundle the sandbox ran
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pi-cache");
    let bundle = wmo_e2b::runner::pi::find_installed(&cache)
        .unwrap()
        .unwrap()
        .bundle;
    assert_eq!(r["provenance"]["harness_digest"], bundle.digest(), "{r}");
    assert_eq!(r["provenance"]["template"], template.as_str(), "{r}");
    assert!(emu.live().is_empty());
}

#[test]
fn reap_cleans_up_after_a_sigkilled_e2b_eval_and_spares_a_live_one() {
    let env = Env::new();
    let emu = Emulator::start(&env.path("emu"), &[]);
    let tasks = env.write_tasks(&slow_tasks(40, 1500));
    let mut child = spawn_eval(&env, &emu, &tasks, &env.out(), "8");
    wait_for("a result", Duration::from_secs(60), || {
        !env.results().is_empty()
    });
    child.kill().unwrap(); // SIGKILL: nothing is cleaned up.
    child.wait().unwrap();
    let before = env.results();
    // A create the run sent just before it died still completes in the emulator.
    let leaked = emu.settled_live_count();
    assert!(leaked > 0, "the crash leaked nothing");

    // A second, live run on the same state dir is never touched by the reap.
    let live_out = env.path("live");
    let quick = env.write_tasks(&slow_tasks(16, 200));
    let mut live = spawn_eval(&env, &emu, &quick, &live_out, "4");
    wait_for("the live run's sandboxes", Duration::from_secs(60), || {
        emu.live().len() > leaked
    });

    let report = reap_report(&run(&env, &emu, &["reap", "--backend", "e2b", "--json"]));
    let killed = killed_by(&report);
    assert_eq!(killed, leaked, "{report}");

    assert_eq!(
        live.wait().unwrap().code(),
        Some(0),
        "the live run was disturbed"
    );
    let rs = results_in(&live_out);
    assert_eq!(rs.len(), 16);
    assert!(
        rs.iter()
            .all(|r| r["status"] == "passed" && r["attempts"] == 1),
        "{rs:?}"
    );
    assert!(emu.live().is_empty(), "{:?}", emu.live());
    assert_eq!(env.results(), before, "finished results changed");

    // Reaping again reaches the same end state.
    let o = run(&env, &emu, &["reap", "--backend", "e2b"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("nothing to reap"),
        "{}",
        text(&o)
    );
    let o = run(
        &env,
        &emu,
        &["sandbox", "list", "--backend", "e2b", "--json"],
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "[]",
        "{}",
        text(&o)
    );
}

#[test]
fn a_project_on_e2b_survives_a_runner_stream_dropped_mid_turn() {
    let env = Env::new();
    // Every runner's output stream is cut after a few events, mid-turn.
    let emu = Emulator::start(&env.path("emu"), &["--fault", "drop-stdin-stream-after=6"]);
    // Only create names the backend; later commands use the project's own.
    let p = |args: &[&str]| run(&env, &emu, &[&["project"][..], args].concat());
    let o = p(&["create", "demo", "--backend", "e2b"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let seed = env.path("seed.txt");
    std::fs::write(&seed, "seeded\n").unwrap();
    let o = p(&[
        "put",
        "demo",
        "notes/seed.txt",
        "--from",
        seed.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = p(&["exec", "demo", "--shell", "cat notes/seed.txt; exit 4"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "seeded\n");

    let script = env.path("script.json");
    std::fs::write(
        &script,
        serde_json::json!([
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "out/a.txt", "content": "A"}}]},
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "out/b.txt", "content": "B"}}]},
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes/seed.txt"}}]},
            {"tool_calls": [{"name": "submit", "arguments": {"answer": "wrote a and b"}}]}
        ])
        .to_string(),
    )
    .unwrap();
    let o = p(&[
        "run",
        "demo",
        "--instruction",
        "write a and b",
        "--script",
        script.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &v["result"];
    assert_eq!(r["answer"], "wrote a and b", "{v}");
    assert_eq!(r["stream_lost"], true, "the stream was never dropped: {v}");
    assert!(r["frames_from_disk"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(r["attempts"], 1, "the turn was replayed: {v}");
    assert_eq!(r["tokens"]["calls"], 4, "model calls were repeated: {v}");

    let o = p(&["snapshot", "demo", "out", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let snap: Value = serde_json::from_slice(&o.stdout).unwrap();
    let files: Vec<(&str, &str)> = snap["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["content"].as_str().unwrap()))
        .collect();
    assert_eq!(files, [("a.txt", "A"), ("b.txt", "B")]);

    // The same rejections as on the local backend.
    let o = p(&["put", "demo", "../escape", "--from", seed.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = p(&["get", "demo", "/etc/passwd"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    for (make, needle) in [
        ("ln -s /etc/passwd out/link", "link (symlink)"),
        ("rm out/link; mkfifo out/pipe", "pipe (fifo)"),
        (
            "rm out/pipe; printf '\\377' > out/bin.dat",
            "bin.dat is not valid UTF-8",
        ),
    ] {
        let o = p(&["exec", "demo", "--shell", make]);
        assert_eq!(o.status.code(), Some(0), "{make}: {}", text(&o));
        let o = p(&["snapshot", "demo", "out"]);
        assert_eq!(o.status.code(), Some(2), "{make}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(needle),
            "{make}: {}",
            text(&o)
        );
    }
    let o = p(&["snapshot", "demo", "out", "--max-files", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    // A sandbox that vanished is replaced on the next command, from the mirror.
    let list = p(&["list", "--json"]);
    let old: Vec<Value> = serde_json::from_slice(&list.stdout).unwrap();
    let old_id = old[0]["sandbox_id"].as_str().unwrap().to_string();
    let o = run(
        &env,
        &emu,
        &["sandbox", "kill", "--backend", "e2b", &old_id],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = p(&["get", "demo", "out/b.txt"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "B");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("was gone"),
        "{}",
        text(&o)
    );
    let o = p(&["exec", "demo", "--shell", "cat notes/seed.txt out/a.txt"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "seeded\nA",
        "{}",
        text(&o)
    );
    let o = p(&["close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(emu.live().is_empty(), "{:?}", emu.live());
}

#[test]
fn more_workers_than_the_sandbox_cap_is_a_usage_error() {
    let env = Env::new();
    let tasks = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tasks.jsonl");
    let o = env
        .cmd(&[
            "eval",
            "--backend",
            "e2b",
            "-j",
            "30",
            "--max-sandboxes",
            "20",
        ])
        .arg("--tasks")
        .arg(&tasks)
        .env("E2B_API_KEY", KEY)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--max-sandboxes 20"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_task_never_sees_what_an_earlier_task_left_on_the_e2b_backend() {
    let env = Env::new();
    let emu = Emulator::start(&env.path("emu"), &[]);
    let tasks = env.write_tasks(&support::contamination::tasks());
    let o = eval(&env, &emu, &tasks, &["-j", "1"]);
    support::contamination::check(&env.results());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(emu.live().is_empty(), "{:?}", emu.live());
}

#[test]
fn no_forgery_passes_a_failing_verify_on_the_e2b_backend() {
    let env = Env::new();
    let emu = Emulator::start(&env.path("emu"), &[]);
    let tasks = env.write_tasks(&support::attacks::tasks());
    let o = eval(&env, &emu, &tasks, &["-j", "2"]);
    support::attacks::check(&env.results());
    assert!(emu.live().is_empty(), "{:?}\n{}", emu.live(), text(&o));
}

/// Harbor tasks as they are on E2B: the verifier's reward is read from `/logs/verifier`.
#[test]
fn a_harbor_dataset_passes_under_oracle_and_fails_under_nop_on_the_e2b_backend() {
    let dataset = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/harbor/dataset");
    let env = Env::new();
    let emu = Emulator::start(&env.path("emu"), &[]);
    for (harness, status, reward) in [("oracle", "passed", 1.0), ("nop", "failed", 0.0)] {
        let out = env.path(harness);
        let o = eval_cmd(
            &env,
            &emu,
            &dataset,
            &out,
            &["--harness", harness, "-j", "2"],
        )
        .output()
        .unwrap();
        let results = results_in(&out);
        assert_eq!(results.len(), 3, "{}", text(&o));
        for r in &results {
            assert_eq!(r["status"], status, "{r}");
        }
        let hello = results.iter().find(|r| r["id"] == "hello-file").unwrap();
        assert_eq!(hello["reward"], reward, "{hello}");
    }
    assert!(emu.live().is_empty(), "{:?}", emu.live());
}
