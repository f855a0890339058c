//! Leases and reap on the local backend: crashes leave nothing `reap` cannot find, and reap
//! never touches a live run.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use wmo_e2b::sandbox::ledger::{self, LeaseState, Ledger, Owner, TAG_LEASE, TAG_OWNER};
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{Backend, CreateSpec, Metadata};

mod support;

use support::{killed_by, reap_report, slow_tasks, text, wait_for, Env};

fn lease_states(env: &Env) -> Vec<LeaseState> {
    ledger::read_leases(&env.home())
        .0
        .into_iter()
        .map(|(_, l)| l.state)
        .collect()
}

fn listed_ids(env: &Env) -> BTreeSet<String> {
    env.sandbox_list()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn reap_after_a_sigkilled_eval_kills_every_leaked_sandbox_and_results_survive() {
    let env = Env::new();
    let tasks = env.write_tasks(&slow_tasks(40, 1500));
    let mut child = env.spawn_eval(&tasks, &["-j", "8"]);
    wait_for("a result", Duration::from_secs(60), || {
        !env.results().is_empty()
    });
    child.kill().unwrap(); // SIGKILL: no cleanup of any kind runs.
    child.wait().unwrap();
    let before = env.results();
    assert!(!before.is_empty());
    let leaked = env.sandbox_list();
    assert!(!leaked.is_empty(), "the crash left no sandbox to reap");
    assert!(leaked.iter().all(|s| s["kind"] == "eval"));

    let o = env.run(&["reap", "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        env.sandbox_list().len(),
        leaked.len(),
        "a dry run changed something"
    );

    let report = reap_report(&env.run(&["reap", "--json"]));
    let killed = killed_by(&report);
    assert!(killed >= leaked.len(), "{report}");
    assert!(env.sandbox_list().is_empty());
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
    assert!(lease_states(&env).iter().all(|s| *s == LeaseState::Retired));
    // Every result written before the kill is intact.
    assert_eq!(env.results(), before);

    // A second reap finds nothing and changes nothing.
    let o = env.run(&["reap"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to reap"));
    assert!(lease_states(&env).iter().all(|s| *s == LeaseState::Retired));
    // It says which backend it read, and that an E2B key set does not change it.
    let o = env
        .cmd(&["reap"])
        .env("E2B_API_KEY", "e2b_test")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains("backend: local") && said.contains("--backend e2b"),
        "{said}"
    );
}

/// The widest reap there is (foreign sandboxes too, of any age) finds nothing to do.
fn reap_everything_finds_nothing(env: &Env) {
    let report =
        reap_report(&env.run(&["reap", "--include-foreign", "--older-than", "0s", "--json"]));
    assert_eq!(report["candidates"], json!([]), "{report}");
}

#[test]
fn reap_beside_a_live_eval_leaves_it_alone() {
    const JOBS: usize = 4;
    let env = Env::new();
    // Every task holds its sandbox (in a tool call) until the test releases it, so the eval
    // is known to hold all its sandboxes while the reaps below run.
    let hold = json!({"tool_calls": [{"name": "bash", "arguments": {"command":
        "touch held; until [ -e released ]; do sleep 0.1; done"}}]});
    let submit = json!({"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]});
    let lines: Vec<String> = (0..JOBS)
        .map(|i| {
            json!({"id": format!("t{i}"), "instruction": "x", "model_script": [hold, submit]})
                .to_string()
        })
        .collect();
    let tasks = env.write_tasks(&lines);
    let mut child = env.spawn_eval(&tasks, &["-j", &JOBS.to_string()]);
    // The sandboxes whose task is in its tool call, by id.
    let holding = || -> BTreeSet<String> {
        env.live_sandboxes()
            .into_iter()
            .filter(|id| {
                env.home()
                    .join("sandboxes")
                    .join(id)
                    .join("root/workspace/held")
                    .exists()
            })
            .collect()
    };

    // Reaps while the eval leases and creates its sandboxes...
    wait_for(
        "every task to hold its sandbox",
        Duration::from_secs(60),
        || {
            assert!(child.try_wait().unwrap().is_none(), "the eval ended early");
            reap_everything_finds_nothing(&env);
            holding().len() == JOBS
        },
    );
    // ...and while it holds every one of them: each reap leaves them all running, and the
    // eval with them.
    let held = holding();
    for _ in 0..2 {
        reap_everything_finds_nothing(&env);
        let listed = listed_ids(&env);
        assert!(held.is_subset(&listed), "held {held:?}, listed {listed:?}");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the eval ended while its tasks were held"
        );
    }

    for id in &held {
        let workspace = env.home().join("sandboxes").join(id).join("root/workspace");
        std::fs::write(workspace.join("released"), "").unwrap();
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let results = env.results();
    assert_eq!(results.len(), JOBS, "{results:?}");
    for r in &results {
        assert_eq!(r["status"], "passed", "{r}");
        assert_eq!(r["attempts"], 1, "{r}");
        // Served to the end by the sandbox it held during the reaps.
        assert!(held.contains(r["sandbox"]["id"].as_str().unwrap()), "{r}");
    }
    assert!(env.sandbox_list().is_empty());
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
    let ids = listed_ids(&env);
    assert!(
        !ids.contains(sb.id()),
        "the orphan of a creating lease survived"
    );
    assert!(
        ids.contains(dead_foreign.id()),
        "foreign sandboxes need --include-foreign"
    );
    assert!(ids.contains(live_foreign.id()));
    assert!(
        lease_states(&env).iter().all(|s| *s == LeaseState::Retired),
        "{:?}",
        lease_states(&env)
    );

    let o = env.run(&["reap", "--include-foreign"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ids = listed_ids(&env);
    assert_eq!(
        ids,
        BTreeSet::from([live_foreign.id().to_string()]),
        "only the live owner's sandbox stays"
    );

    let o = env.run(&["sandbox", "kill", live_foreign.id()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(env.sandbox_list().is_empty());
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
