//! Benchmark: the host cost of one sandbox command (`run("true")` on a local sandbox, the way
//! every setup, tool call and verify starts) while this process holds many descriptors, as
//! an eval at high concurrency does (a runner's pipes and pidfd, a running command's, for
//! every live sandbox).
//!
//! A process start used to copy the parent's whole descriptor table and have the exec close
//! it again, so every start paid for every descriptor held; see `sandbox::local::spawn`.
//! Build this example against two commits and run both to compare.
//!
//! `cargo run --release --example bench_spawn -- --runs 200 --fds 0,2000,8000`
//! Prints one JSON line per descriptor count: CPU per command (this process and its reaped
//! children: the start helper and the command), and wall time per command.

use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Instant;

use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{Backend, RunOpts};

mod bench_common;
use bench_common::{arg, children_cpu_s, self_cpu_s, spec};

/// `n` descriptors (pipe ends, close-on-exec, as the backend's own are).
fn hold(n: usize) -> Vec<OwnedFd> {
    let mut held = Vec::with_capacity(n);
    while held.len() + 2 <= n {
        let mut fds = [-1; 2];
        // SAFETY: pipe2 writes two new descriptors into the array we own.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
        // SAFETY: both are new and ours.
        held.extend(fds.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
    }
    held
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs: usize = arg(&args, "--runs", "200").parse().unwrap();
    let counts: Vec<usize> = arg(&args, "--fds", "0,2000,8000")
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let state = tempfile::tempdir().expect("tempdir");
    let backend = LocalBackend::open(state.path()).expect("open the local backend");
    let sandbox = backend.create(&spec()).expect("create a sandbox");
    let opts = RunOpts::default();
    let run = || {
        let out = sandbox.run("true", &opts).expect("run");
        assert_eq!(out.exit_code, Some(0));
    };
    for &n in &counts {
        let held = hold(n);
        for _ in 0..5 {
            run();
        }
        let (s0, c0, t0) = (self_cpu_s(), children_cpu_s(), Instant::now());
        for _ in 0..runs {
            run();
        }
        let wall = t0.elapsed().as_secs_f64();
        let own = self_cpu_s() - s0;
        let children = children_cpu_s() - c0;
        let per = |v: f64| v / runs as f64 * 1e3;
        println!(
            "{}",
            serde_json::json!({
                "impl": "wmo-e2b", "mode": "sandbox_command", "fds_held": held.len(),
                "runs": runs, "isolation": format!("{:?}", backend.isolation()),
                "cpu_ms_per_command": per(own + children),
                "own_cpu_ms_per_command": per(own),
                "children_cpu_ms_per_command": per(children),
                "wall_ms_per_command": per(wall),
            })
        );
    }
    backend.kill(sandbox.id()).expect("kill the sandbox");
}
