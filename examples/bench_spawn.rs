//! Benchmark: the host cost of starting a sandbox process, the way the local backend does it
//! (`Command::new("bash")` with a cleared environment that sets PATH, in its own process
//! group) against the same command with an absolute program path.
//!
//! With `env_clear()` + `env("PATH", ..)` and a program name without a slash, Rust's std
//! cannot use `posix_spawn` (it must search the child's PATH itself) and falls back to
//! `fork()`, which copies the page tables of the whole parent: the more threads and memory
//! the parent has (one eval worker, channel reader and pipe pumps per running task), the
//! more each spawn costs. An absolute path lets std use `posix_spawn` (`CLONE_VM|CLONE_VFORK`).
//!
//! `cargo run --release --example bench_spawn -- --spawns 300 --threads 0,64,384`
//! Prints one JSON line per (threads, variant): parent CPU ms per spawn, wall ms per spawn.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod bench_common;
use bench_common::{arg, self_cpu_s};

/// The first `name` on PATH.
fn which(name: &str) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .map(|d| format!("{d}/{name}"))
        .find(|p| std::path::Path::new(p).is_file())
        .unwrap_or_else(|| name.to_string())
}

fn spawn_once(program: &str) {
    let mut c = Command::new(program);
    c.args(["-c", "true"]).env_clear();
    if let Some(v) = std::env::var_os("PATH") {
        c.env("PATH", v);
    }
    c.env("HOME", "/tmp")
        .current_dir("/tmp")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let out = c.output().expect("spawn");
    assert!(out.status.success());
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spawns: usize = arg(&args, "--spawns", "300").parse().unwrap();
    let threads: Vec<usize> = arg(&args, "--threads", "0,64,384")
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let abs = which("bash");
    for &t in &threads {
        // Idle threads with touched stacks, standing in for eval workers, readers and pumps.
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..t)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let buf = [1u8; 64 * 1024];
                    std::hint::black_box(&buf);
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        for (variant, program) in [("bash_on_path", "bash"), ("absolute_path", abs.as_str())] {
            spawn_once(program);
            let c0 = self_cpu_s();
            let t0 = Instant::now();
            for _ in 0..spawns {
                spawn_once(program);
            }
            let wall = t0.elapsed().as_secs_f64();
            let cpu = self_cpu_s() - c0;
            println!(
                "{}",
                serde_json::json!({
                    "impl": "wmo-e2b", "mode": "spawn", "threads": t, "variant": variant,
                    "program": program, "spawns": spawns,
                    "parent_cpu_ms_per_spawn": cpu / spawns as f64 * 1e3,
                    "wall_ms_per_spawn": wall / spawns as f64 * 1e3,
                })
            );
        }
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
    }
}
