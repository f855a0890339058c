//! A task that leaves a directory tree deeper than any stack in its sandbox: the reset, the
//! kill, `reap` and a whole eval get through it, and nothing of it is left.
//!
//! The tree is built inside the sandbox, as a task would: perl (essential on Debian, so in
//! every sandbox's system directories) makes and enters one directory per level, each call
//! relative, so no path ever grows.

use std::path::Path;

use serde_json::json;
use wmo_e2b::sandbox::ledger::{Ledger, TAG_LEASE, TAG_OWNER};
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{Backend, CreateSpec, Killed, Metadata, Sandbox};

mod support;

use support::local::{backend, create, sh};
use support::{killed_by, reap_report, text, Env};

/// Far past what a recursive walk survives on a 2–8 MiB stack (15,000 levels already did not).
const DEPTH: usize = 100_000;

fn build_deep_tree(sb: &dyn Sandbox) {
    let cmd = format!(
        "perl -e 'for (1..{DEPTH}) {{ mkdir \"d\" or die \"mkdir: $!\"; \
         chdir \"d\" or die \"chdir: $!\" }} print \"deep\\n\"'"
    );
    let out = sh(sb, &cmd);
    assert_eq!(out.stdout.to_text(), "deep\n", "{}", out.stderr.to_text());
}

/// Entries of the state's sandboxes directory: live sandboxes, tombstones, staging.
fn sandbox_dir_entries(state: &Path) -> Vec<String> {
    std::fs::read_dir(state.join("sandboxes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_reset_takes_a_tree_deeper_than_any_stack_and_proves_the_sandbox_clean() {
    let (state, b) = backend();
    let sb = create(&b);
    sb.seal().unwrap();
    build_deep_tree(&*sb);
    sb.reset().unwrap();
    assert_eq!(sh(&*sb, "ls -A; echo ok").stdout.to_text(), "ok\n");
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
    assert_eq!(sandbox_dir_entries(state.path()), Vec::<String>::new());
}

#[test]
fn a_kill_removes_a_tree_deeper_than_any_stack() {
    let (state, b) = backend();
    let sb = create(&b);
    build_deep_tree(&*sb);
    assert_eq!(b.kill(sb.id()).unwrap(), Killed::Now);
    // No tombstone is left for a later sweep: the kill itself removed the tree.
    assert_eq!(sandbox_dir_entries(state.path()), Vec::<String>::new());
}

#[test]
fn reap_removes_a_leftover_tree_deeper_than_any_stack() {
    let env = Env::new();
    let backend = LocalBackend::open(&env.home()).unwrap();
    let ledger = Ledger::open(&env.home(), "crashed-run").unwrap();
    // A run that died holding this sandbox: its owner is this process with another start.
    let mut lease = ledger.begin("eval", "local", None, 900).unwrap();
    lease.owner.start_time += 1;
    ledger.write(&lease).unwrap();
    let mut meta = Metadata::new();
    meta.insert(TAG_LEASE.into(), lease.lease.clone());
    meta.insert(TAG_OWNER.into(), lease.owner.tag());
    let sb = backend
        .create(&CreateSpec {
            timeout_secs: 900,
            metadata: meta,
            ..CreateSpec::default()
        })
        .unwrap();
    build_deep_tree(&*sb);

    let o = env.run(&["reap", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = reap_report(&o);
    assert_eq!(killed_by(&report), 1, "{report}");
    assert_eq!(sandbox_dir_entries(&env.home()), Vec::<String>::new());
}

#[test]
fn an_eval_whose_task_builds_a_deep_tree_writes_its_results_and_the_next_task_runs_clean() {
    let env = Env::new();
    let build = format!("perl -e 'for (1..{DEPTH}) {{ mkdir \"d\"; chdir \"d\" }}'; echo built");
    let deep = json!({"id": "deep", "instruction": "x", "model_script": [
        {"tool_calls": [{"name": "bash", "arguments": {"command": build}}]},
        {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]},
    ]});
    // The next task in the same (reused or fresh) sandbox sees none of it.
    let next = json!({"id": "next", "instruction": "x", "verify": "test ! -e d", "model_script": [
        {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]},
    ]});
    let tasks = env.write_tasks(&[deep.to_string(), next.to_string()]);
    // The disk watch counts a tree this deep as over its limit (it will not walk it); off,
    // the tree reaches the reset, which is what this tests.
    let o = env.eval(&tasks, &["-j", "1", "--limit-disk-mb", "0"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(env.result("deep")["status"], "passed");
    assert_eq!(env.result("next")["status"], "passed");
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
    assert_eq!(sandbox_dir_entries(&env.home()), Vec::<String>::new());
}
