//! Benchmark helper for `wmo-e2b reap` on an E2B-compatible endpoint (normally
//! `wmo-e2b emulator`): leak sandboxes the way a crashed run does, and the baseline reap is
//! measured against (a sequential kill loop with the same client). `scripts/bench/e2b/run.sh`
//! times `wmo-e2b reap --backend e2b` between the two.
//!
//! ```text
//! E2B_API_KEY=.. E2B_API_URL=.. E2B_SANDBOX_URL=.. WMO_E2B_HOME=DIR \
//!   cargo run --release --example bench_e2b_reap -- leak --n 500 [--threads 16]
//!   cargo run --release --example bench_e2b_reap -- kill-loop --run RUN
//!   cargo run --release --example bench_e2b_reap -- count [--run RUN]
//! ```
//!
//! `leak`: creates N sandboxes through `LeasedBackend` over `E2bBackend` (leases in
//! `$WMO_E2B_HOME/leases`, kind `eval`, run `bench-leak-<pid>`), from `--threads` threads,
//! then exits without killing any: every lease names this process, which is then dead.
//! Prints the run tag. If a create fails, every sandbox made so far is killed first.
//! `kill-loop`: lists the sandboxes tagged with RUN and kills them one by one with one
//! `E2bBackend` (default options, as `reap` opens it); times the list and the loop.
//! `reap-lib`: what `wmo-e2b reap --backend e2b` does (`reap::plan` then `reap::execute`,
//! default options), in process, with the two phases timed separately.
//! `count`: how many sandboxes the endpoint lists (with RUN's tag, if given).
//!
//! With WMO_BENCH_EMULATOR_PID set, `kill-loop` and `reap-lib` also report the CPU the
//! emulator (and the sandbox processes it reaped) used meanwhile.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::json;
use wmo_e2b::sandbox::e2b::{E2bBackend, E2bOptions};
use wmo_e2b::sandbox::leased::LeasedBackend;
use wmo_e2b::sandbox::ledger::{Ledger, TAG_RUN};
use wmo_e2b::sandbox::{Backend, CreateSpec, Killed};

mod bench_common;
use bench_common::{arg, self_cpu_s};

/// CPU seconds of the emulator and its reaped children (WMO_BENCH_EMULATOR_PID), if known.
fn emulator_cpu_s() -> Option<f64> {
    let pid = std::env::var("WMO_BENCH_EMULATOR_PID").ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    if f.len() < 15 {
        return None;
    }
    let ticks: f64 = f[11..15]
        .iter()
        .map(|v| v.parse::<f64>().unwrap_or(0.0))
        .sum();
    // SAFETY: sysconf has no preconditions.
    Some(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

fn cpu_since(client: f64, emulator: Option<f64>) -> serde_json::Value {
    let server = emulator.zip(emulator_cpu_s()).map(|(a, b)| b - a);
    json!({"client_cpu_s": self_cpu_s() - client, "emulator_cpu_s": server})
}

fn e2b(options: E2bOptions) -> Arc<E2bBackend> {
    E2bBackend::from_env(options).expect("E2B_API_KEY / E2B_API_URL / E2B_SANDBOX_URL")
}

fn leak(args: &[String]) -> Result<(), String> {
    let n: usize = arg(args, "--n", "500").parse().expect("--n");
    let threads: usize = arg(args, "--threads", "16").parse().expect("--threads");
    let inner = e2b(E2bOptions {
        create_rate: 1000.0,
        max_sandboxes: n.max(1),
        ..E2bOptions::default()
    });
    let run = format!("bench-leak-{}", std::process::id());
    let ledger =
        Ledger::open(&wmo_e2b::state::state_dir(), &run).map_err(|e| format!("ledger: {e}"))?;
    let leased = LeasedBackend::new(inner.clone(), ledger, "eval");
    let next = AtomicUsize::new(0);
    let ids = Mutex::new(Vec::with_capacity(n));
    let failures = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, n.max(1)) {
            s.spawn(|| {
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    match leased.create(&CreateSpec {
                        timeout_secs: 3600,
                        ..CreateSpec::default()
                    }) {
                        Ok(sbx) => ids.lock().unwrap().push(sbx.id().to_string()),
                        Err(e) => failures.lock().unwrap().push(format!("{e:#}")),
                    }
                }
            });
        }
    });
    let ids = ids.into_inner().unwrap();
    let failures = failures.into_inner().unwrap();
    if !failures.is_empty() {
        // A half-made leak is not worth measuring: clean up through the ledger's wrapper.
        for id in &ids {
            let _ = leased.kill(id);
        }
        return Err(format!(
            "{} of {n} creates failed, first: {}",
            failures.len(),
            failures[0]
        ));
    }
    println!(
        "{}",
        json!({"bench": "leak", "run": run, "leaked": ids.len(), "pid": std::process::id(),
               "seconds": start.elapsed().as_secs_f64()})
    );
    // Exit without killing: the leases stay `active`, owned by this (soon dead) process.
    std::process::exit(0);
}

fn tagged(backend: &E2bBackend, run: Option<String>) -> Result<Vec<String>, String> {
    let mut filter = BTreeMap::new();
    if let Some(run) = run {
        filter.insert(TAG_RUN.to_string(), run);
    }
    Ok(backend
        .list(&filter)
        .map_err(|e| format!("list: {e:#}"))?
        .into_iter()
        .map(|s| s.id)
        .collect())
}

fn kill_loop(args: &[String]) -> Result<(), String> {
    let run = arg(args, "--run", "");
    if run.is_empty() {
        return Err("kill-loop needs --run RUN (printed by leak)".into());
    }
    let backend = e2b(E2bOptions::default());
    let (cpu, emu) = (self_cpu_s(), emulator_cpu_s());
    let start = Instant::now();
    let ids = tagged(&backend, Some(run))?;
    let listed = start.elapsed();
    let (mut killed, mut gone, mut failed) = (0, 0, 0);
    for id in &ids {
        match backend.kill(id) {
            Ok(Killed::Now) => killed += 1,
            Ok(Killed::AlreadyGone) => gone += 1,
            Err(_) => failed += 1,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"bench": "kill-loop", "listed": ids.len(), "killed": killed,
               "already_gone": gone, "failed": failed, "seconds": secs,
               "list_seconds": listed.as_secs_f64(), "cpu": cpu_since(cpu, emu)})
    );
    if failed > 0 {
        return Err(format!("{failed} kills failed"));
    }
    Ok(())
}

fn reap_lib() -> Result<(), String> {
    use wmo_e2b::reap::{self, ReapOptions};
    let state = wmo_e2b::state::state_dir();
    let backend = e2b(E2bOptions::default());
    let (cpu, emu) = (self_cpu_s(), emulator_cpu_s());
    let start = Instant::now();
    let plan = reap::plan(backend.as_ref(), &state, &ReapOptions::default())
        .map_err(|e| format!("plan: {e}"))?;
    let planned = start.elapsed();
    let outcomes = reap::execute(backend.as_ref(), &state, &plan, false);
    let secs = start.elapsed().as_secs_f64();
    let mut results: BTreeMap<String, usize> = BTreeMap::new();
    for o in &outcomes {
        *results.entry(o.result.clone()).or_default() += 1;
    }
    println!(
        "{}",
        json!({"bench": "reap-lib", "candidates": plan.candidates.len(), "results": results,
               "seconds": secs, "plan_seconds": planned.as_secs_f64(),
               "execute_seconds": secs - planned.as_secs_f64(),
               "workers": reap::MAX_KILL_WORKERS, "cpu": cpu_since(cpu, emu)})
    );
    match results.get("failed") {
        Some(n) => Err(format!("{n} kills failed")),
        None => Ok(()),
    }
}

fn count(args: &[String]) -> Result<(), String> {
    let run = Some(arg(args, "--run", "")).filter(|r| !r.is_empty());
    let backend = e2b(E2bOptions::default());
    println!("{}", tagged(&backend, run)?.len());
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("leak") => leak(&args),
        Some("kill-loop") => kill_loop(&args),
        Some("reap-lib") => reap_lib(),
        Some("count") => count(&args),
        _ => Err("usage: bench_e2b_reap leak|kill-loop|reap-lib|count [options]".into()),
    };
    if let Err(e) = result {
        eprintln!("bench_e2b_reap: {e}");
        std::process::exit(1);
    }
}
