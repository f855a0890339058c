//! The E2B client's limits and what they leave behind, judged by the emulator: a create
//! slower than its limit gives up with a typed error and its late sandbox is found by its
//! lease tag (by the client's own leases, and before an eval exits), concurrent creates with
//! one idempotency key make one sandbox, the pool's kill goes through the client's one retry
//! loop, and `reap` proves a kill that lands after a rate-limit window.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wmo_e2b::emulator::FaultSpec;
use wmo_e2b::errors::error_chain;
use wmo_e2b::sandbox::e2b::{E2bBackend, E2bOptions, RetryPolicy};
use wmo_e2b::sandbox::leased::LeasedBackend;
use wmo_e2b::sandbox::ledger::{self, LeaseState, Ledger, TAG_KIND, TAG_LEASE, TAG_OWNER, TAG_RUN};
use wmo_e2b::sandbox::{Backend, CreateSpec, ErrorClass, Metadata, SandboxError};

mod support;

use support::emulator::{agent, client_of, client_with, start_with, Emu, KEY};
use support::{reap_report, slow_tasks, text, Env};

fn faults(spec: &str) -> FaultSpec {
    spec.parse().unwrap()
}

/// The project's client of `emu` with a control-plane limit of `api_timeout` and `retries`
/// repeats a call.
fn client(emu: &Emu, api_timeout: Duration, retries: u32) -> Arc<E2bBackend> {
    client_with(
        emu.handle.url(),
        E2bOptions {
            create_rate: 100.0,
            api_timeout,
            retry: RetryPolicy {
                retries,
                base: Duration::from_millis(10),
                cap: Duration::from_millis(10),
                ..RetryPolicy::default()
            },
            ..E2bOptions::default()
        },
    )
}

/// Sandboxes the emulator runs.
fn live(emu: &Emu) -> Vec<Value> {
    let r = emu.api("GET", "/v2/sandboxes", None);
    assert_eq!(r.status, 200);
    r.json().as_array().cloned().unwrap_or_default()
}

/// The CLI on `env`'s state, pointed at `emu` as at E2B.
fn e2b(env: &Env, emu: &Emu, args: &[&str]) -> std::process::Command {
    let mut c = env.cmd(args);
    c.env("E2B_API_KEY", KEY)
        .env("E2B_API_URL", emu.handle.url())
        .env("E2B_SANDBOX_URL", emu.handle.url())
        .env_remove("E2B_DEBUG");
    c
}

/// One slow task through `eval --backend e2b -j 1` with `extra` options, into `env.out()`.
fn eval_one(env: &Env, emu: &Emu, extra: &[&str]) -> std::process::Output {
    let tasks = env.write_tasks(&slow_tasks(1, 0));
    e2b(
        env,
        emu,
        &["eval", "--backend", "e2b", "-j", "1", "--tasks"],
    )
    .arg(&tasks)
    .args(extra)
    .arg("--out")
    .arg(env.out())
    .output()
    .unwrap()
}

fn leases(env: &Env) -> Vec<ledger::LeaseRecord> {
    ledger::read_leases(&env.home())
        .0
        .into_iter()
        .map(|(_, l)| l)
        .collect()
}

#[test]
fn a_create_slower_than_its_limit_gives_up_typed_and_its_late_sandbox_is_found() {
    // The emulator makes the sandbox 3 s after the first attempt arrived; the client allows
    // each of its two attempts 1 s (the repeat carries the same key and is held behind the
    // first, so it makes nothing of its own).
    let emu = start_with(faults("create-delay-ms=3000"), 1);
    let state = tempfile::tempdir().unwrap();
    let leased = LeasedBackend::new(
        client(&emu, Duration::from_secs(1), 1),
        Ledger::open(state.path(), "run-slow").unwrap(),
        "eval",
    );
    let started = Instant::now();
    let err = leased.create(&CreateSpec::default()).err().unwrap();
    let gave_up = started.elapsed();
    assert!(
        matches!(err, SandboxError::CreateUnconfirmed { .. }),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Transport);
    let chain = error_chain(&err);
    assert!(
        chain.contains("no complete answer within 1.000 s"),
        "{chain}"
    );
    assert!(gave_up < Duration::from_millis(2800), "{gave_up:?}");
    assert!(live(&emu).is_empty(), "nothing made yet");

    // Its outcome unknown, the lease stays `creating`, saying why.
    let (all, _) = ledger::read_leases(state.path());
    assert_eq!(all.len(), 1);
    let lease = &all[0].1;
    assert_eq!(lease.state, LeaseState::Creating);
    assert!(
        lease
            .error
            .as_deref()
            .is_some_and(|e| e.contains("outcome unknown")),
        "{lease:?}"
    );

    // Settling waits for the late sandbox, finds it by its tag, kills it, retires the lease.
    leased.settle_creates().unwrap();
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert!(live(&emu).is_empty(), "{:?}", live(&emu));
    let (all, _) = ledger::read_leases(state.path());
    let lease = &all[0].1;
    assert_eq!(lease.state, LeaseState::Retired);
    assert!(
        lease
            .error
            .as_deref()
            .is_some_and(|e| e.contains("made a sandbox")),
        "{lease:?}"
    );
    assert_eq!(emu.handle.stats().creates, 2, "one attempt and its repeat");
}

#[test]
fn concurrent_creates_with_one_key_make_one_sandbox() {
    // Both arrive within the first one's half second: without the key held on arrival, both
    // would find no sandbox for it and each make one.
    let emu = start_with(faults("create-delay-ms=500"), 1);
    let url = emu.handle.url();
    let create = || {
        let mut resp = agent()
            .post(format!("{url}/v2/sandboxes"))
            .header("X-API-Key", KEY)
            .header("Idempotency-Key", "ls-0123456789abcdef01234567")
            .send_json(json!({"templateID": "base", "timeout": 60}))
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_json::<Value>().unwrap())
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(create);
        std::thread::sleep(Duration::from_millis(50));
        let b = s.spawn(create);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!((a.0, b.0), (201, 201), "{a:?} {b:?}");
    assert_eq!(a.1["sandboxID"], b.1["sandboxID"], "one key, one sandbox");
    let again = create();
    assert_eq!(again.1["sandboxID"], a.1["sandboxID"]);
    assert_eq!(live(&emu).len(), 1, "{:?}", live(&emu));
    assert_eq!(emu.handle.stats().creates, 3);
}

#[test]
fn the_pool_kills_through_the_clients_one_retry_loop() {
    // Every kill is rate-limited: the pool's one kill is the client's four attempts (one and
    // its three repeats), not four times that many.
    let emu = start_with(faults("kill-429=1,retry-after=0"), 1);
    let env = Env::new();
    let o = eval_one(&env, &emu, &[]);
    assert_eq!(o.status.code(), Some(3), "an unproven kill: {}", text(&o));
    assert_eq!(env.results()[0]["status"], "passed");
    let stats = emu.handle.stats();
    assert_eq!(stats.faults.call_429, 4, "{stats:?}");
    let states: Vec<LeaseState> = leases(&env).iter().map(|l| l.state).collect();
    assert_eq!(states, [LeaseState::CleanupFailed], "{}", text(&o));
}

#[test]
fn reap_proves_a_kill_that_lands_after_a_rate_limit_window() {
    // With this seed the call fault site lets reap's list through, then answers its kill
    // 429 twice (`Retry-After: 1`) and lets the third attempt kill.
    let emu = start_with(faults("kill-429=0.5,retry-after=1"), 3);
    let mut metadata = Metadata::new();
    metadata.insert(TAG_LEASE.into(), "ls-00112233445566778899aabb".into());
    metadata.insert(TAG_OWNER.into(), "another-host:1:1:another-boot".into());
    metadata.insert(TAG_RUN.into(), "run-elsewhere".into());
    metadata.insert(TAG_KIND.into(), "eval".into());
    let sandbox = client_of(emu.handle.url())
        .create(&CreateSpec {
            metadata,
            ..CreateSpec::default()
        })
        .unwrap();
    let env = Env::new();
    let started = Instant::now();
    let o = e2b(
        &env,
        &emu,
        &["reap", "--backend", "e2b", "--include-foreign", "--json"],
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = reap_report(&o);
    assert_eq!(support::killed_by(&report), 1, "{report}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "two windows waited out"
    );
    assert_eq!(emu.handle.stats().faults.call_429, 2);
    assert!(live(&emu).is_empty(), "{} still runs", sandbox.id());
}

#[test]
fn an_eval_whose_create_outlives_its_limit_leaves_no_sandbox_and_no_creating_lease() {
    // Each create attempt may take 1 s; the emulator makes the sandbox 6 s after the first
    // one arrived, well after the client's four attempts have given up.
    let emu = start_with(faults("create-delay-ms=6000"), 1);
    let env = Env::new();
    let o = eval_one(
        &env,
        &emu,
        &["--e2b-api-timeout", "1s", "--transport-retries", "0"],
    );
    assert_eq!(o.status.code(), Some(1), "the task errored: {}", text(&o));
    let rs = env.results();
    assert_eq!(rs[0]["status"], "error", "{rs:?}");
    assert!(
        rs[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("1.000 s")),
        "the limit is named: {rs:?}"
    );
    // Whatever the emulator still had in flight has landed by now.
    std::thread::sleep(Duration::from_millis(500));
    assert!(live(&emu).is_empty(), "{:?}", live(&emu));
    let all = leases(&env);
    assert!(!all.is_empty());
    assert!(
        all.iter().all(|l| l.state == LeaseState::Retired),
        "{all:?}"
    );
    assert!(
        all.iter().any(|l| l
            .error
            .as_deref()
            .is_some_and(|e| e.contains("made a sandbox"))),
        "the late sandbox was found and killed: {all:?}"
    );
}

#[test]
fn a_project_whose_create_outlives_its_limit_leaves_nothing_behind() {
    use wmo_e2b::project::{OnIdle, Project, ProjectError};
    // As above: the sandbox is made 3 s after the first attempt, long after the client
    // gave up; the project command must find and kill it before it returns.
    let emu = start_with(faults("create-delay-ms=3000"), 1);
    let state = tempfile::tempdir().unwrap();
    let leased: Arc<dyn Backend> = Arc::new(LeasedBackend::new(
        client(&emu, Duration::from_secs(1), 1),
        Ledger::open(state.path(), "project:p").unwrap(),
        "project",
    ));
    let started = Instant::now();
    let err = Project::create(
        state.path(),
        "p",
        leased,
        None,
        Duration::from_secs(600),
        OnIdle::Pause,
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            err,
            ProjectError::Sandbox {
                source: SandboxError::CreateUnconfirmed { .. },
                ..
            }
        ),
        "{err:?}"
    );
    // Past the moment the emulator made the late sandbox: none may be left.
    std::thread::sleep(Duration::from_secs(4).saturating_sub(started.elapsed()));
    assert!(live(&emu).is_empty(), "{:?}", live(&emu));
    let (all, _) = ledger::read_leases(state.path());
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].1.state, LeaseState::Retired, "{all:?}");
}
