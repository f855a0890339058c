//! As root, every local sandbox has a user namespace of its own mapping its ids onto a host
//! range no other sandbox and no host account has: whatever the kernel keys by uid (per-user
//! process counts, keyrings, signal rights, file ownership) never crosses sandboxes. The
//! attacks: a task counting against another sandbox's per-user limit, and files or processes
//! that show the same host uid in two sandboxes.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use wmo_e2b::sandbox::{Backend, SpawnOpts};

mod support;

use support::local::*;
use support::wait_for;

/// Without root, sandboxes map the caller's own uid (one range per host user): no ranges to
/// test, which is said.
fn is_root() -> bool {
    support::is_root("sandboxes map the caller's own uid, and have no range of their own")
}

/// The host uid of the only running process named `marker` (its launcher, outside, only
/// mentions it).
fn host_uid_of(marker: &str) -> u32 {
    let pids = named(marker);
    assert_eq!(pids.len(), 1, "{marker}: {pids:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", pids[0])).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The ids `/etc/passwd` of the host names.
fn host_accounts() -> Vec<u32> {
    std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        .collect()
}

fn named(marker: &str) -> Vec<u32> {
    running(marker)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(marker.as_bytes()))
        })
        .collect()
}

fn meta_ids(state: &Path, id: &str) -> Option<u64> {
    let text = std::fs::read_to_string(state.join("sandboxes").join(id).join("meta.json")).ok()?;
    let meta: serde_json::Value = serde_json::from_str(&text).ok()?;
    meta["ids"]["base"].as_u64()
}

#[test]
fn each_sandbox_runs_as_host_ids_no_one_else_has() {
    if !is_root() {
        return;
    }
    let (state, b) = backend();
    let accounts = host_accounts();
    let mut seen = Vec::new();
    for n in 0..2 {
        let sb = create(&b);
        let base = meta_ids(state.path(), sb.id()).expect("an id range in meta.json") as u32;
        let marker = format!("uid-marker-{n}-{}", sb.id());
        let _p = sb
            .spawn(&format!("exec -a {marker} sleep 30"), &SpawnOpts::default())
            .unwrap();
        wait_for("the marked process", WAIT, || named(&marker).len() == 1);
        let host = host_uid_of(&marker);
        assert_eq!(host, base + 1000, "the sandbox user is its range's 1000");
        assert!(host >= 1 << 30 && !accounts.contains(&host), "{host}");
        // Inside, it is uid 1000 of a namespace mapping exactly its range (and the host's
        // root, which only the holders run as).
        let out = sh(&*sb, "id -u; cat /proc/self/uid_map");
        let text = out.stdout.to_text();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("1000"), "{text}");
        let maps: Vec<Vec<u64>> = lines
            .map(|l| l.split_whitespace().map(|f| f.parse().unwrap()).collect())
            .collect();
        assert!(maps.contains(&vec![0, base as u64, 65536]), "{maps:?}");
        assert!(
            maps.iter().all(|m| m[1] == 0 || m[1] == base as u64),
            "{maps:?}"
        );
        // What it writes is its range's on the host too.
        assert_eq!(sh(&*sb, "touch ~/mine").exit_code, Some(0));
        let file = state
            .path()
            .join("sandboxes")
            .join(sb.id())
            .join("root/mine");
        assert_eq!(std::fs::metadata(file).unwrap().uid(), host);
        seen.push((sb, host));
    }
    assert!(
        seen[0].1.abs_diff(seen[1].1) >= 65536,
        "{:?}",
        (seen[0].1, seen[1].1)
    );
}

#[test]
fn a_per_user_process_limit_counts_one_sandbox_alone() {
    if !is_root() {
        return;
    }
    let (_state, b) = backend();
    let busy = create(&b);
    let other = create(&b);
    // 30 processes of `busy`'s user...
    let _p = busy
        .spawn(
            "for i in $(seq 30); do sleep 60 & done; wait",
            &SpawnOpts::default(),
        )
        .unwrap();
    // (Besides the namespace's own `sleep infinity`.)
    wait_for("30 sleeps", WAIT, || {
        let count = sh(&*busy, "cat /proc/[0-9]*/comm | grep -c '^sleep$'");
        count.stdout.to_text().trim().parse::<u32>().unwrap_or(0) > 30
    });
    // ... are none of `other`'s: under a limit of 20 processes for its user it starts 5.
    let out = sh(
        &*other,
        "ulimit -u 20 && for i in 1 2 3 4 5; do sleep 5 & done && wait && echo started",
    );
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr.to_text());
    assert_eq!(out.stdout.to_text().trim(), "started");
}

#[test]
fn a_killed_sandbox_gives_its_ids_back() {
    if !is_root() {
        return;
    }
    let (state, b) = backend();
    let sb = create(&b);
    let id = sb.id().to_string();
    let ranges = state.path().join("id-ranges");
    let held = || {
        std::fs::read_dir(&ranges)
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t == id))
            .count()
    };
    assert_eq!(held(), 1);
    b.kill(&id).unwrap();
    assert_eq!(held(), 0);
}
