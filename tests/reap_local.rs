//! Leases and reap on the local backend: crashes leave nothing `reap` cannot find, and reap
//! never touches a live run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use wmo_e2b::sandbox::ledger::{self, LeaseState, Ledger, Owner, TAG_LEASE, TAG_OWNER};
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{Backend, CreateSpec, Metadata};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_wmo-e2b"));
        c.args(args)
            .env("WMO_E2B_HOME", self.home())
            .current_dir(self.dir.path());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    fn tasks(&self, n: usize, delay_ms: u64) -> PathBuf {
        let p = self.dir.path().join("tasks.jsonl");
        let lines: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"id": "t{i:03}", "instruction": "x", "model_script": [{{"delay_ms": {delay_ms}, "tool_calls": [{{"name": "bash", "arguments": {{"command": "true"}}}}]}}, {{"tool_calls": [{{"name": "submit", "arguments": {{"answer": "ok"}}}}]}}]}}"#
                )
            })
            .collect();
        std::fs::write(&p, lines.join("\n")).unwrap();
        p
    }

    fn live(&self) -> Vec<Value> {
        let o = self.run(&["sandbox", "list", "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        serde_json::from_slice::<Vec<Value>>(&o.stdout).unwrap()
    }

    fn sandbox_dirs(&self) -> Vec<String> {
        std::fs::read_dir(self.home().join("sandboxes"))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn lease_states(&self) -> Vec<LeaseState> {
        ledger::read_leases(&self.home())
            .0
            .into_iter()
            .map(|(_, l)| l.state)
            .collect()
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn result_lines(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn result {l:?}: {e}")))
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn reap_after_a_sigkilled_eval_kills_every_leaked_sandbox_and_results_survive() {
    let env = Env::new();
    let tasks = env.tasks(40, 1500);
    let out = env.dir.path().join("out");
    let mut child = env
        .cmd(&[
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "-j",
            "8",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("a result", Duration::from_secs(60), || {
        !result_lines(&out).is_empty()
    });
    child.kill().unwrap(); // SIGKILL: no cleanup of any kind runs.
    child.wait().unwrap();
    let before = result_lines(&out);
    assert!(!before.is_empty());
    let leaked = env.live();
    assert!(!leaked.is_empty(), "the crash left no sandbox to reap");
    assert!(leaked.iter().all(|s| s["kind"] == "eval"));

    let o = env.run(&["reap", "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        env.live().len(),
        leaked.len(),
        "a dry run changed something"
    );

    let o = env.run(&["reap", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let killed = report["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["result"] == "killed")
        .count();
    assert!(killed >= leaked.len(), "{report}");
    assert!(env.live().is_empty());
    assert!(env.sandbox_dirs().is_empty(), "{:?}", env.sandbox_dirs());
    assert!(env.lease_states().iter().all(|s| *s == LeaseState::Retired));
    // Every result written before the kill is intact.
    assert_eq!(result_lines(&out), before);

    // A second reap finds nothing and changes nothing.
    let o = env.run(&["reap"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to reap"));
    assert!(env.lease_states().iter().all(|s| *s == LeaseState::Retired));
}

#[test]
fn reap_beside_a_live_eval_leaves_it_alone() {
    let env = Env::new();
    let tasks = env.tasks(24, 300);
    let out = env.dir.path().join("out");
    let mut child = env
        .cmd(&[
            "eval",
            "--tasks",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "-j",
            "4",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("live sandboxes", Duration::from_secs(60), || {
        !env.live().is_empty()
    });
    for _ in 0..3 {
        let o = env.run(&["reap", "--include-foreign", "--older-than", "0s", "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let report: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(report["candidates"], serde_json::json!([]), "{report}");
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let results = result_lines(&out);
    assert_eq!(results.len(), 24);
    assert!(results
        .iter()
        .all(|r| r["status"] == "passed" && r["attempts"] == 1));
    assert!(env.live().is_empty());
}

/// An owner that is provably dead: this process's pid with another start time.
fn dead_owner() -> Owner {
    let mut o = Owner::current();
    o.start_time += 1;
    o
}

#[test]
fn a_creating_lease_of_a_dead_owner_is_resolved_by_its_tag() {
    let env = Env::new();
    let backend = LocalBackend::open(&env.home()).unwrap();
    let ledger = Ledger::open(&env.home(), "crashed-run").unwrap();

    // Crashed between the create call and recording its id.
    let mut orphan = ledger.begin("eval", "local", None, 900).unwrap();
    orphan.owner = dead_owner();
    ledger.write(&orphan).unwrap();
    let mut meta = Metadata::new();
    meta.insert(TAG_LEASE.into(), orphan.lease.clone());
    meta.insert(TAG_OWNER.into(), orphan.owner.tag());
    let sb = backend
        .create(&CreateSpec {
            timeout_secs: 900,
            metadata: meta,
            ..CreateSpec::default()
        })
        .unwrap();
    // Crashed before the create call was even made.
    let mut never = ledger.begin("eval", "local", None, 900).unwrap();
    never.owner = dead_owner();
    ledger.write(&never).unwrap();
    // A foreign sandbox (tagged, no lease here) whose owner is alive, and one whose owner is dead.
    let mut live_meta = Metadata::new();
    live_meta.insert(TAG_LEASE.into(), "ls-elsewhere-live".into());
    live_meta.insert(TAG_OWNER.into(), Owner::current().tag());
    let live_foreign = backend
        .create(&CreateSpec {
            timeout_secs: 900,
            metadata: live_meta,
            ..CreateSpec::default()
        })
        .unwrap();
    let mut dead_meta = Metadata::new();
    dead_meta.insert(TAG_LEASE.into(), "ls-elsewhere-dead".into());
    dead_meta.insert(TAG_OWNER.into(), dead_owner().tag());
    let dead_foreign = backend
        .create(&CreateSpec {
            timeout_secs: 900,
            metadata: dead_meta,
            ..CreateSpec::default()
        })
        .unwrap();
    drop(backend);

    let o = env.run(&["reap", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ids: Vec<String> = env
        .live()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !ids.contains(&sb.id().to_string()),
        "the orphan of a creating lease survived"
    );
    assert!(
        ids.contains(&dead_foreign.id().to_string()),
        "foreign sandboxes need --include-foreign"
    );
    assert!(ids.contains(&live_foreign.id().to_string()));
    assert!(
        env.lease_states().iter().all(|s| *s == LeaseState::Retired),
        "{:?}",
        env.lease_states()
    );

    let o = env.run(&["reap", "--include-foreign"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ids: Vec<String> = env
        .live()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        ids,
        vec![live_foreign.id().to_string()],
        "only the live owner's sandbox stays"
    );

    let o = env.run(&["sandbox", "kill", live_foreign.id()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(env.live().is_empty());
    let o = env.run(&["sandbox", "kill", live_foreign.id()]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("already gone"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_torn_lease_file_is_named_not_fatal() {
    let env = Env::new();
    let dir = ledger::leases_dir(&env.home());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ls-torn.json"), b"{\"version\":1,\"lease\":").unwrap();
    let o = env.run(&["reap"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ls-torn.json"), "{err}");
    let o = env.run(&["sandbox", "list", "--json"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
}
