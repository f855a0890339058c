//! Benchmark: the E2B backend (`E2bBackend`) against an E2B-compatible endpoint, normally
//! `wmo-e2b emulator`. The official Python SDK runs the same workloads in
//! `scripts/bench/e2b/sdk_bench.py`; `scripts/bench/e2b/run.sh` runs both against one
//! emulator and prints the ratios.
//!
//! ```text
//! E2B_API_KEY=.. E2B_API_URL=http://127.0.0.1:PORT E2B_SANDBOX_URL=http://127.0.0.1:PORT \
//!   cargo run --release --example bench_e2b_client -- seq --n 50
//!   ... -- stream --bytes 50000000 [--via run|spawn]
//!   ... -- concurrent --n 100
//!   ... -- ops --op run|spawn|read|write --k 40
//!   ... -- captured [--bytes 50000000 --chunk 65536 --max 1048576]
//! Options: --create-rate R (creates/s, default 1000) --max-sandboxes N (default 200);
//! run.sh passes --create-rate 10000 so neither the gate nor the cap shapes the comparison.
//! ```
//!
//! `seq`: N times create -> run `true` -> kill, one after another (after one untimed cycle).
//! `stream`: one sandbox; one command printing BYTES to stdout; time from the command's start
//! request to its exit (the sandbox's create and kill are not timed).
//! `concurrent`: N threads, each create -> run `true` -> kill; wall time of the whole.
//! `ops`: diagnostics on one warm sandbox (see [`ops`]); `captured`: `Captured::push` alone.
//!
//! Sandboxes are created with the SDK's defaults (`WMO_BENCH_INTERNET=0` turns internet off,
//! as `CreateSpec::default()` has it). With WMO_BENCH_EMULATOR_PID set, the client's and the
//! emulator's CPU time are reported too. Prints one JSON object per measurement on stdout.
//! Every sandbox created is killed, even after a failure (the process exits non-zero then).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use wmo_e2b::sandbox::e2b::{E2bBackend, E2bOptions};
use wmo_e2b::sandbox::{Backend, CreateSpec, ProcessEvent, RunOpts, SpawnOpts};

mod bench_common;
use bench_common::{arg, self_cpu_s};

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// CPU seconds the emulator process and its reaped children (the sandbox processes) have
/// used (its pid in WMO_BENCH_EMULATOR_PID), if known.
fn emulator_cpu_s() -> Option<f64> {
    let pid = std::env::var("WMO_BENCH_EMULATOR_PID").ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised name; utime and stime are the 14th and 15th overall.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    if f.len() < 15 {
        return None;
    }
    // utime, stime, and cutime, cstime: the sandbox processes it has reaped count too.
    let ticks: f64 = f[11..15]
        .iter()
        .map(|v| v.parse::<f64>().unwrap_or(0.0))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz)
}

/// CPU used by this client and by the emulator since `Cpu::start`.
struct Cpu(f64, Option<f64>);

impl Cpu {
    fn start() -> Cpu {
        Cpu(self_cpu_s(), emulator_cpu_s())
    }

    fn json(&self) -> serde_json::Value {
        let server = match (self.1, emulator_cpu_s()) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        };
        json!({"client_cpu_s": self_cpu_s() - self.0, "emulator_cpu_s": server})
    }
}

fn backend(args: &[String]) -> Arc<E2bBackend> {
    let options = E2bOptions {
        create_rate: arg(args, "--create-rate", "1000")
            .parse()
            .expect("--create-rate"),
        max_sandboxes: arg(args, "--max-sandboxes", "200")
            .parse()
            .expect("--max-sandboxes"),
        ..E2bOptions::default()
    };
    E2bBackend::from_env(options).expect("E2B_API_KEY / E2B_API_URL / E2B_SANDBOX_URL")
}

/// What every sandbox here is created as: the SDK's defaults (template `base`, 300 s,
/// internet allowed). `CreateSpec::default()` has internet off, which the emulator serves
/// by starting every process in a fresh network namespace (a few ms more per command);
/// `WMO_BENCH_INTERNET=0` measures that instead.
fn spec() -> CreateSpec {
    CreateSpec {
        internet: std::env::var("WMO_BENCH_INTERNET").map_or(true, |v| v != "0"),
        ..CreateSpec::default()
    }
}

/// create -> run `true` -> kill, with the phases timed.
fn cycle(b: &E2bBackend) -> Result<[Duration; 3], String> {
    let t0 = Instant::now();
    let sbx = b.create(&spec()).map_err(|e| format!("create: {e:#}"))?;
    let t1 = Instant::now();
    let run = sbx.run("true", &RunOpts::default());
    let t2 = Instant::now();
    let kill = b.kill(sbx.id());
    let t3 = Instant::now();
    let out = run.map_err(|e| format!("run: {e:#}"))?;
    kill.map_err(|e| format!("kill: {e:#}"))?;
    if out.exit_code != Some(0) {
        return Err(format!("`true` exited {:?}", out.exit_code));
    }
    Ok([t1 - t0, t2 - t1, t3 - t2])
}

fn seq(args: &[String]) -> Result<(), String> {
    let n: usize = arg(args, "--n", "50").parse().expect("--n");
    let b = backend(args);
    // One untimed cycle so both clients start with a warm connection pool.
    cycle(&b)?;
    let mut totals = Vec::with_capacity(n);
    let mut phases = [0f64; 3];
    let cpu = Cpu::start();
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let p = cycle(&b)?;
        totals.push(ms(t.elapsed()));
        for (acc, d) in phases.iter_mut().zip(p) {
            *acc += ms(d);
        }
    }
    let wall = start.elapsed();
    totals.sort_by(f64::total_cmp);
    println!(
        "{}",
        json!({"client": "ours", "bench": "seq", "n": n, "wall_s": wall.as_secs_f64(),
               "per_cycle_ms": {"mean": ms(wall) / n as f64, "p50": percentile(&totals, 0.5),
                                "p90": percentile(&totals, 0.9)},
               "phase_mean_ms": {"create": phases[0] / n as f64, "run": phases[1] / n as f64,
                                 "kill": phases[2] / n as f64},
               "cpu": cpu.json(), "create_rate": b.options().create_rate})
    );
    Ok(())
}

fn stream(args: &[String]) -> Result<(), String> {
    let bytes: u64 = arg(args, "--bytes", "50000000").parse().expect("--bytes");
    let via = arg(args, "--via", "run");
    let b = backend(args);
    let sbx = b.create(&spec()).map_err(|e| format!("create: {e:#}"))?;
    let result = (|| {
        let cmd = format!("head -c {bytes} /dev/zero");
        // Warm-up: a small command on the same sandbox.
        sbx.run("true", &RunOpts::default())
            .map_err(|e| format!("warm-up: {e:#}"))?;
        let cpu = Cpu::start();
        let start = Instant::now();
        let (got, chunks) = match via.as_str() {
            "run" => {
                let out = sbx
                    .run(
                        &cmd,
                        &RunOpts {
                            timeout: Duration::from_secs(300),
                            ..RunOpts::default()
                        },
                    )
                    .map_err(|e| format!("run: {e:#}"))?;
                if out.exit_code != Some(0) {
                    return Err(format!("exit {:?}", out.exit_code));
                }
                let s = &out.stdout;
                (s.head.len() as u64 + s.tail.len() as u64 + s.dropped, None)
            }
            "spawn" => {
                let p = sbx
                    .spawn(&cmd, &SpawnOpts::default())
                    .map_err(|e| format!("spawn: {e:#}"))?;
                let (mut got, mut chunks) = (0u64, 0u64);
                loop {
                    match p.events.recv_timeout(Duration::from_secs(120)) {
                        Ok(ProcessEvent::Stdout(d)) => {
                            got += d.len() as u64;
                            chunks += 1;
                        }
                        Ok(ProcessEvent::Stderr(_)) => {}
                        Ok(ProcessEvent::Exit(code)) => {
                            if code != Some(0) {
                                return Err(format!("exit {code:?}"));
                            }
                            break;
                        }
                        Ok(ProcessEvent::Failed(e)) => return Err(format!("stream: {e:#}")),
                        Err(e) => return Err(format!("stream: {e}")),
                    }
                }
                (got, Some(chunks))
            }
            other => return Err(format!("--via {other}: want run or spawn")),
        };
        let secs = start.elapsed().as_secs_f64();
        if got != bytes {
            return Err(format!("got {got} bytes, want {bytes}"));
        }
        println!(
            "{}",
            json!({"client": "ours", "bench": "stream", "via": via, "bytes": got,
                   "seconds": secs, "mb_per_s": got as f64 / secs / 1e6, "chunks": chunks,
                   "cpu": cpu.json()})
        );
        Ok(())
    })();
    let killed = b.kill(sbx.id()).map_err(|e| format!("kill: {e:#}"));
    result.and(killed.map(drop))
}

fn concurrent(args: &[String]) -> Result<(), String> {
    let n: usize = arg(args, "--n", "100").parse().expect("--n");
    let b = backend(args);
    cycle(&b)?;
    let failures = Mutex::new(Vec::new());
    let done = AtomicU64::new(0);
    let lat = Mutex::new(Vec::with_capacity(n));
    let phases = Mutex::new([0f64; 3]);
    let cpu = Cpu::start();
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..n {
            s.spawn(|| {
                let t = Instant::now();
                match cycle(&b) {
                    Ok(p) => {
                        done.fetch_add(1, Ordering::Relaxed);
                        let mut acc = phases.lock().unwrap();
                        for (a, d) in acc.iter_mut().zip(p) {
                            *a += ms(d);
                        }
                        lat.lock().unwrap().push(ms(t.elapsed()));
                    }
                    Err(e) => failures.lock().unwrap().push(e),
                }
            });
        }
    });
    let wall = start.elapsed();
    let cpu = cpu.json();
    let failures = failures.into_inner().unwrap();
    let phases = phases.into_inner().unwrap();
    let done = done.into_inner();
    let ok = done.max(1) as f64;
    let mut lat = lat.into_inner().unwrap();
    lat.sort_by(f64::total_cmp);
    println!(
        "{}",
        json!({"client": "ours", "bench": "concurrent", "n": n, "ok": done,
               "failed": failures.len(), "wall_s": wall.as_secs_f64(), "cpu": cpu,
               "phase_mean_ms": {"create": phases[0] / ok, "run": phases[1] / ok,
                                 "kill": phases[2] / ok},
               "cycle_ms": {"p50": percentile(&lat, 0.5), "p90": percentile(&lat, 0.9),
                            "max": percentile(&lat, 1.0)},
               "create_rate": b.options().create_rate,
               "max_sandboxes": b.options().max_sandboxes,
               "counters": format!("{:?}", b.counters()),
               "first_failure": failures.first()})
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} of {n} cycles failed", failures.len()))
    }
}

/// Diagnostics: one sandbox, K of one operation (`run` or `spawn` of `true`, `read` or `write` of a
/// small file), then kill; mean latency per operation. Count the new TCP connections from
/// outside (`ss -tan state time-wait`) to see which operations reuse pooled connections.
fn ops(args: &[String]) -> Result<(), String> {
    let k: usize = arg(args, "--k", "20").parse().expect("--k");
    let op = arg(args, "--op", "run");
    let b = backend(args);
    let sbx = b.create(&spec()).map_err(|e| format!("create: {e:#}"))?;
    let path = format!("{}/probe.txt", sbx.home());
    let result = (|| {
        sbx.write_file(&path, b"hello\n")
            .map_err(|e| format!("write: {e:#}"))?;
        let start = Instant::now();
        let mut each = Vec::with_capacity(k);
        // For `spawn`: when the start event arrived.
        let mut started = Vec::with_capacity(k);
        for _ in 0..k {
            let t = Instant::now();
            match op.as_str() {
                "run" => drop(
                    sbx.run("true", &RunOpts::default())
                        .map_err(|e| format!("{e:#}"))?,
                ),
                "read" => drop(sbx.read_file(&path).map_err(|e| format!("{e:#}"))?),
                "spawn" => {
                    let p = sbx
                        .spawn("true", &SpawnOpts::default())
                        .map_err(|e| format!("{e:#}"))?;
                    started.push(ms(t.elapsed()));
                    loop {
                        match p.events.recv_timeout(Duration::from_secs(60)) {
                            Ok(ProcessEvent::Exit(_)) => break,
                            Ok(ProcessEvent::Failed(e)) => return Err(format!("{e:#}")),
                            Ok(_) => {}
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                }
                "write" => sbx
                    .write_file(&path, b"hello\n")
                    .map_err(|e| format!("{e:#}"))?,
                other => return Err(format!("--op {other}: want run, spawn, read or write")),
            }
            each.push(ms(t.elapsed()));
        }
        let wall = start.elapsed();
        each.sort_by(f64::total_cmp);
        started.sort_by(f64::total_cmp);
        println!(
            "{}",
            json!({"client": "ours", "bench": "ops", "op": op, "k": k,
                   "mean_ms": ms(wall) / k as f64, "p50_ms": percentile(&each, 0.5),
                   "p90_ms": percentile(&each, 0.9), "max_ms": percentile(&each, 1.0),
                   "started_p50_ms": (!started.is_empty()).then(|| percentile(&started, 0.5))})
        );
        Ok(())
    })();
    let killed = b.kill(sbx.id()).map_err(|e| format!("kill: {e:#}"));
    result.and(killed.map(drop))
}

/// Diagnostics, no network: the host cost of keeping a foreground command's output, i.e.
/// `Captured::push` of BYTES in CHUNK-byte pieces with `max` = MAX (the `RunOpts` default is
/// 1 MiB), against merely counting the bytes.
fn captured(args: &[String]) -> Result<(), String> {
    use wmo_e2b::sandbox::Captured;
    let bytes: usize = arg(args, "--bytes", "50000000").parse().expect("--bytes");
    let chunk: usize = arg(args, "--chunk", "65536").parse().expect("--chunk");
    let max: usize = arg(args, "--max", "1048576").parse().expect("--max");
    let data = vec![0u8; chunk];
    let start = Instant::now();
    let mut c = Captured::default();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk);
        c.push(&data[..n], max);
        left -= n;
    }
    let push = start.elapsed();
    let kept = c.head.len() + c.tail.len();
    println!(
        "{}",
        json!({"bench": "captured-push", "bytes": bytes, "chunk": chunk, "max": max,
               "seconds": push.as_secs_f64(), "kept": kept, "dropped": c.dropped,
               "gb_per_s": bytes as f64 / push.as_secs_f64() / 1e9})
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("seq") => seq(&args),
        Some("stream") => stream(&args),
        Some("concurrent") => concurrent(&args),
        Some("ops") => ops(&args),
        Some("captured") => captured(&args),
        _ => Err("usage: bench_e2b_client seq|stream|concurrent|ops|captured [options]".into()),
    };
    if let Err(e) = result {
        eprintln!("bench_e2b_client: {e}");
        std::process::exit(1);
    }
}
