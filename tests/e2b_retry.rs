//! Retries as the real cloud needs them, judged by the emulator's faults: a rate-limit storm
//! on set-timeout costs no warm sandbox, a create whose answer is lost behind a 502 leaves one
//! sandbox, `Should-Retry: false` is final and `Retry-After` is waited out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wmo_e2b::emulator::FaultSpec;
use wmo_e2b::sandbox::e2b::E2bBackend;
use wmo_e2b::sandbox::{Backend, CreateSpec, ErrorClass, Metadata, RunOpts};

mod support;

use support::emulator::{client_of, start_with, Emu, KEY};
use support::{slow_tasks, text, Env};

/// The lease tag the leased backend puts on every create: its value is the idempotency key.
const TAG_LEASE: &str = "wmo-e2b.lease";

fn faults(spec: &str) -> FaultSpec {
    spec.parse().unwrap()
}

fn backend(emu: &Emu) -> Arc<E2bBackend> {
    client_of(emu.handle.url())
}

fn leased_spec(lease: &str) -> CreateSpec {
    let mut metadata = Metadata::new();
    metadata.insert(TAG_LEASE.into(), lease.into());
    CreateSpec {
        metadata,
        ..CreateSpec::default()
    }
}

#[test]
fn a_rate_limit_storm_on_set_timeout_loses_no_warm_sandbox() {
    // With this seed the set-timeout fault site answers 429 to its 2nd, 3rd and 4th draws and
    // to none of the next 76: three 429s in all, however the two workers' calls interleave,
    // and fewer than the four a single call would need to exhaust its retries.
    let emu = start_with(faults("settimeout-429=0.1,retry-after=0"), 22628);
    let env = Env::new();
    let tasks = env.write_tasks(&slow_tasks(8, 0));
    let o = env
        .eval_cmd(&tasks, &["--backend", "e2b", "-j", "2"])
        .env("E2B_API_KEY", KEY)
        .env("E2B_API_URL", emu.handle.url())
        .env("E2B_SANDBOX_URL", emu.handle.url())
        .env_remove("E2B_DEBUG")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rs = env.results();
    assert_eq!(rs.len(), 8, "{}", text(&o));
    assert!(rs.iter().all(|r| r["status"] == "passed"), "{rs:?}");
    let stats = emu.handle.stats();
    assert_eq!(stats.faults.call_429, 3, "the storm hit: {stats:?}");
    assert_eq!(
        stats.creates, 2,
        "two workers keep their two warm sandboxes through the storm: {stats:?}"
    );
    assert_eq!(stats.sandboxes, 0, "the run leaves nothing running");
}

#[test]
fn a_create_whose_answer_is_lost_behind_a_502_leaves_one_sandbox() {
    // With this seed the first create's answer is lost and a second create's would not be:
    // a repeat without the key makes (and keeps) a second sandbox.
    let emu = start_with(faults("create-502-after=0.5,retry-after=0"), 3);
    let b = backend(&emu);
    let sandbox = b
        .create(&leased_spec("ls-0123456789abcdef01234567"))
        .unwrap();
    let live = b.list(&Metadata::new()).unwrap();
    let ids: Vec<&str> = live.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [sandbox.id()], "one sandbox, the first create's");
    let stats = emu.handle.stats();
    assert_eq!((stats.creates, stats.faults.create_502_after), (2, 1));
    assert_eq!(b.counters().create_retries, 1);
    let out = sandbox.run("echo alive", &RunOpts::default()).unwrap();
    assert_eq!(out.stdout.to_text(), "alive\n");
    b.kill(sandbox.id()).unwrap();
}

#[test]
fn should_retry_false_is_final() {
    let emu = start_with(faults("create-429=1,should-retry=0,retry-after=0"), 1);
    let b = backend(&emu);
    let err = b.create(&CreateSpec::default()).err().unwrap();
    assert_eq!(err.class(), ErrorClass::Capacity, "{err}");
    assert_eq!(
        emu.handle.stats().creates,
        1,
        "a refused create is sent once"
    );
    assert_eq!(b.counters().create_retries, 0);
}

#[test]
fn retry_after_is_waited_out_before_the_repeat() {
    // Every kill is answered 429 with `Retry-After: 1`: the default schedule's three repeats
    // must each wait the second the server asked for (its own backoff would start at 0.1 s).
    let emu = start_with(faults("kill-429=1,retry-after=1"), 1);
    let b = backend(&emu);
    let sandbox = b.create(&CreateSpec::default()).unwrap();
    let started = Instant::now();
    let err = b.kill(sandbox.id()).unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.class(), ErrorClass::Capacity, "{err}");
    assert_eq!(b.counters().kill_retries, 3);
    assert_eq!(
        emu.handle.stats().faults.call_429,
        4,
        "one kill, three repeats"
    );
    assert!(
        waited >= Duration::from_secs(3),
        "three repeats after Retry-After: 1 took only {waited:?}"
    );
}
