//! Benchmark: the real pi agent as a harness, against the builtin harness, on the local
//! backend through the library (what `scripts/bench/pi/run.sh` runs). Each mode prints one
//! JSON line.
//!
//! - `install --state DIR --reps N`: N cold installs. Rep 0 installs into DIR (kept for the
//!   other modes), later reps into fresh temporary state dirs. Each rep times the first
//!   `runner::pi::ensure_installed` (`npm ci` and the bundling; `npm_config_cache` from the
//!   environment is honoured), then 30 more calls on the same dir (the warm path: the marker
//!   and the bundle's digest), then a pi runner on a fresh sandbox: spawn-to-hello and its
//!   first pi episode (the bundle's lazy import).
//! - `hello --state DIR --reps 30`: per rep, interleaved (order alternating): a bare
//!   `node -e ''` (scrubbed environment), a builtin runner and a pi-enabled runner
//!   (`BootstrapOpts.pi`, after a warm `ensure_installed`), each on a fresh sandbox,
//!   spawn-to-hello, then the first episode on that runner (instant environment).
//! - `episode --state DIR --episodes N [--env sandbox|instant] [--transcript file|none]`:
//!   two pools, one builtin and one pi-enabled, one warm sandbox each; episodes alternate
//!   between them, each acquire -> episode (scripted model: `bash`, then `submit`) -> release:
//!   wall time, host CPU (getrusage of this process, every thread) split by phase, runner CPU.
//! - `soak --state DIR --episodes 500 --harness pi|builtin [--files-json F]
//!   [--transcript file|none] [--samples 10]`: sequential warm episodes on one sandbox with an
//!   instant environment, as the reference's `bench_episode.py seq`: wall and host CPU per
//!   episode, runner CPU, the runner's VmRSS every `episodes / samples` episodes and its slope.
//!
//! One benchmark, so one file past 600 lines: its four modes share the pool, runner and
//! episode setup that a split would have to pass between files.
//!
//! `cargo run --release --example bench_pi -- hello --state target/pi-cache --reps 30`

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use wmo_e2b::cancel::CancelToken;
use wmo_e2b::environment::{self, Environment, SandboxEnvironment};
use wmo_e2b::episode::{self, Episode, EpisodeConfig, Opening, StopReason, Transcript};
use wmo_e2b::pool::{self, Pool, PoolConfig};
use wmo_e2b::provider::scripted::ScriptedProvider;
use wmo_e2b::runner::{self, pi, BootstrapOpts};
use wmo_e2b::sandbox::local::{LocalBackend, LocalOptions};
use wmo_e2b::sandbox::{Backend, RunOpts, Sandbox};
use wmo_e2b::task::Task;

mod bench_common;
use bench_common::{
    arg, descendant_named, median, ms, proc_cpu_s, proc_status_kb, scrubbed, self_cpu_s, spec,
    InstantEnv,
};

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if s.is_empty() {
        return f64::NAN;
    }
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn ms_list(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| ms(*x)).collect()
}

fn bootstrap_opts(pi: Option<&pi::PiShipment>) -> BootstrapOpts {
    BootstrapOpts {
        pi: pi.cloned(),
        ..BootstrapOpts::default()
    }
}

/// A local backend in `dir` whose runners see `install` (mounted as `eval` mounts it), and
/// what a runner is given of it.
fn backend_for(
    dir: &Path,
    install: Option<&pi::PiInstall>,
) -> (Arc<LocalBackend>, Option<pi::PiShipment>) {
    let backend = LocalBackend::open_with(
        dir,
        LocalOptions {
            system_read_only: install.iter().map(|i| i.local_mount()).collect(),
            ..LocalOptions::default()
        },
    )
    .expect("open the local backend");
    let shipment = install.map(|i| i.local_shipment(backend.isolation()));
    (backend, shipment)
}

fn new_pool(backend: Arc<LocalBackend>, pi: Option<&pi::PiShipment>) -> Pool {
    let episode = Duration::from_secs(300);
    Pool::new(
        backend as Arc<dyn Backend>,
        PoolConfig {
            spec: spec(),
            lease: pool::lease_for(episode),
            lifetime: pool::lifetime_for(episode),
            bootstrap: bootstrap_opts(pi),
            workspace_dir: "workspace".into(),
            reuse: true,
        },
    )
}

/// The pi install under `state` (built by the `install` mode, or an existing cache).
fn install_of(state: &Path) -> pi::PiInstall {
    pi::find_installed(state)
        .expect("the pi install")
        .unwrap_or_else(|| {
            panic!(
                "no pi install under {}: run the install mode first",
                state.display()
            )
        })
}

/// The reference's episode: `bash` (`echo hello`), then `submit` 42.
fn task() -> Task {
    serde_json::from_value(json!({
        "id": "bench-pi", "instruction": "Print hello then submit 42.",
        "model_script": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo hello"}}]},
            {"tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]}
        ]
    }))
    .expect("task")
}

fn config(harness: &str, system: String, files: Map<String, Value>) -> EpisodeConfig {
    EpisodeConfig {
        episode_id: wmo_e2b::id::new_episode_id(),
        harness: harness.into(),
        system,
        tools: environment::default_tools(),
        files,
        files_digest: None,
        max_turns: 20,
        max_tool_actions: 40,
        max_output_tokens: 4096,
        budget: Default::default(),
        temperature: None,
        wall: Duration::from_secs(300),
        skills: None,
        agent: None,
    }
}

/// Runs one episode on `channel` and checks it ended as scripted.
fn run_episode(
    channel: &mut wmo_e2b::channel::StdioChannel,
    cfg: &EpisodeConfig,
    env: &dyn Environment,
    transcript: &mut Transcript,
) {
    let task = task();
    let cancel = CancelToken::new();
    let outcome = {
        let mut ep = Episode {
            opening: Opening::Episode {
                instruction: &task.instruction,
            },
            label: &task.id,
            script: task.model_script.as_deref(),
            config: cfg,
            provider: &ScriptedProvider::new(),
            environment: env,
            cancel: &cancel,
            observer: transcript,
        };
        episode::run_episode(&mut ep, channel).expect("episode")
    };
    assert_eq!(
        (
            outcome.stop_reason,
            outcome.answer.as_str(),
            outcome.counters.turns,
            outcome.counters.tool_calls
        ),
        (StopReason::Submit, "42", 2, 1),
        "harness {}: {:?}",
        cfg.harness,
        outcome.note
    );
}

/// Bytes, bytes on disk and files under `dir`, not following symlinks.
fn tree_size(dir: &Path) -> (u64, u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut bytes, mut disk, mut files) = (0, 0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(md) = e.path().symlink_metadata() else {
                continue;
            };
            disk += md.blocks() * 512;
            if md.is_dir() {
                stack.push(e.path());
            } else {
                files += 1;
                bytes += md.len();
            }
        }
    }
    (bytes, disk, files)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().cloned().unwrap_or_else(|| "hello".into());
    // Absolute: an unconfined runner is given the bundle's host path.
    let state = std::path::absolute(arg(&args, "--state", "target/pi-cache")).expect("--state");
    let out = match mode.as_str() {
        "install" => install(&state, arg(&args, "--reps", "1").parse().unwrap()),
        "hello" => hello(&state, arg(&args, "--reps", "30").parse().unwrap()),
        "episode" => episodes(
            &state,
            arg(&args, "--episodes", "200").parse().unwrap(),
            &arg(&args, "--env", "sandbox"),
            &arg(&args, "--transcript", "file"),
        ),
        "soak" => soak(
            &state,
            arg(&args, "--episodes", "500").parse().unwrap(),
            &arg(&args, "--harness", "pi"),
            &arg(&args, "--files-json", ""),
            &arg(&args, "--transcript", "file"),
            arg(&args, "--samples", "10").parse().unwrap(),
        ),
        other => panic!("unknown mode {other}: install|hello|episode|soak"),
    };
    println!("{out}");
}

// ---------------------------------------------------------------------------------------
// install: cold and warm ensure_installed, and the first pi runner after a cold install

fn install(state: &Path, reps: usize) -> Value {
    let mut rows = Vec::new();
    let mut size = (0, 0, 0);
    for rep in 0..reps {
        let scratch = tempfile::tempdir().expect("tempdir");
        let dir = if rep == 0 {
            state.to_path_buf()
        } else {
            scratch.path().to_path_buf()
        };
        assert!(
            pi::find_installed(&dir).expect("find_installed").is_none(),
            "{} already holds pi: the install must be cold",
            dir.display()
        );
        let t0 = Instant::now();
        let installed = pi::ensure_installed(&dir).expect("ensure_installed (cold)");
        let t_cold = t0.elapsed().as_secs_f64();
        let mut warm = Vec::new();
        for _ in 0..30 {
            let t0 = Instant::now();
            let again = pi::ensure_installed(&dir).expect("ensure_installed (warm)");
            warm.push(t0.elapsed().as_secs_f64());
            assert_eq!(again, installed);
        }
        if rep == 0 {
            size = tree_size(&installed.dir);
        }
        // The first pi runner after the install: spawn-to-hello, then its first episode
        // (the runner imports pi lazily, at its first pi episode).
        let sandboxes = tempfile::tempdir().expect("tempdir");
        let (backend, shipment) = backend_for(sandboxes.path(), Some(&installed));
        let sandbox: Arc<dyn Sandbox> = backend.create_local(&spec()).expect("create");
        let t0 = Instant::now();
        let mut started = runner::bootstrap(&sandbox, &bootstrap_opts(shipment.as_ref()))
            .expect("bootstrap (pi)");
        let t_hello = t0.elapsed().as_secs_f64();
        assert_eq!(started.hello["pi_version"], pi::PI_VERSION);
        let tools = environment::default_tools();
        let cfg = config("pi", environment::system_prompt("/w", &tools), Map::new());
        let t0 = Instant::now();
        run_episode(
            &mut started.channel,
            &cfg,
            &InstantEnv,
            &mut Transcript::disabled(),
        );
        let t_first = t0.elapsed().as_secs_f64();
        drop(started);
        let _ = backend.kill(sandbox.id());
        rows.push(json!({
            "rep": rep,
            "install_cold_ms": ms(t_cold),
            "ensure_installed_warm_median_ms": ms(median(&warm)),
            "hello_after_install_ms": ms(t_hello),
            "first_pi_episode_ms": ms(t_first),
        }));
    }
    let cold: Vec<f64> = rows
        .iter()
        .map(|r| r["install_cold_ms"].as_f64().unwrap())
        .collect();
    json!({
        "impl": "wmo-e2b", "mode": "install", "reps": reps,
        "npm_config_cache": std::env::var("npm_config_cache").ok(),
        "specs": pi::specs(),
        "install_bytes": size.0, "install_disk_bytes": size.1, "install_files": size.2,
        "bundle_bytes": pi::find_installed(state).ok().flatten().map(|i| i.bundle.bytes().len()),
        "median_install_cold_ms": median(&cold),
        "rows": rows,
    })
}

// ---------------------------------------------------------------------------------------
// hello: spawn-to-hello, builtin vs pi enabled, and each runner's first episode

fn hello(state: &Path, reps: usize) -> Value {
    let sandboxes = tempfile::tempdir().expect("tempdir");
    let (backend, _) = backend_for(sandboxes.path(), Some(&install_of(state)));
    let node_version = std::process::Command::new("node")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let tools = environment::default_tools();
    let system = environment::system_prompt("/w", &tools);
    let (mut bare, mut ensure) = (Vec::new(), Vec::new());
    let (mut boot_b, mut boot_p, mut first_b, mut first_p) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // spawn-to-hello of one runner, then its first episode
    let one = |pi: Option<&pi::PiShipment>, harness: &str| -> (f64, f64) {
        let sandbox: Arc<dyn Sandbox> = backend.create_local(&spec()).expect("create");
        let t0 = Instant::now();
        let mut started = runner::bootstrap(&sandbox, &bootstrap_opts(pi)).expect("bootstrap");
        let t_boot = t0.elapsed().as_secs_f64();
        let cfg = config(harness, system.clone(), Map::new());
        let t0 = Instant::now();
        run_episode(
            &mut started.channel,
            &cfg,
            &InstantEnv,
            &mut Transcript::disabled(),
        );
        let t_first = t0.elapsed().as_secs_f64();
        drop(started);
        let _ = backend.kill(sandbox.id());
        (t_boot, t_first)
    };
    // One untimed round first: page cache, node's code cache.
    for rep in 0..=reps {
        let t0 = Instant::now();
        let st = scrubbed(std::process::Command::new("node").args(["-e", ""]))
            .status()
            .expect("node");
        let t_bare = t0.elapsed().as_secs_f64();
        assert!(st.success());
        let pi_run = || {
            // What a run pays to enable pi once the cache is warm: the marker, and the
            // bundle read and its digest checked.
            let t0 = Instant::now();
            let shipment = pi::ensure_installed(state)
                .expect("ensure_installed")
                .local_shipment(backend.isolation());
            let t_ensure = t0.elapsed().as_secs_f64();
            let (b, f) = one(Some(&shipment), "pi");
            (t_ensure, b, f)
        };
        let ((tb, fb), (te, tp, fp)) = if rep % 2 == 0 {
            let b = one(None, "builtin");
            (b, pi_run())
        } else {
            let p = pi_run();
            (one(None, "builtin"), p)
        };
        if rep > 0 {
            bare.push(t_bare);
            ensure.push(te);
            boot_b.push(tb);
            boot_p.push(tp);
            first_b.push(fb);
            first_p.push(fp);
        }
    }
    json!({
        "impl": "wmo-e2b", "mode": "hello", "reps": reps, "node": node_version,
        "bare_node_ms": ms_list(&bare),
        "builtin_hello_ms": ms_list(&boot_b),
        "pi_hello_ms": ms_list(&boot_p),
        "pi_ensure_installed_warm_ms": ms_list(&ensure),
        "builtin_first_episode_ms": ms_list(&first_b),
        "pi_first_episode_ms": ms_list(&first_p),
        "median_bare_node_ms": ms(median(&bare)),
        "median_builtin_hello_ms": ms(median(&boot_b)),
        "median_pi_hello_ms": ms(median(&boot_p)),
        "median_pi_ensure_installed_warm_ms": ms(median(&ensure)),
        "median_builtin_first_episode_ms": ms(median(&first_b)),
        "median_pi_first_episode_ms": ms(median(&first_p)),
        "pi_over_builtin_hello": median(&boot_p) / median(&boot_b),
    })
}

// ---------------------------------------------------------------------------------------
// episode: per-episode host overhead on a warm sandbox, builtin vs pi, interleaved

#[derive(Default)]
struct Acc {
    wall: Vec<f64>,
    episode_wall: Vec<f64>,
    cpu: Vec<f64>,
    cpu_acquire: f64,
    cpu_episode: f64,
    cpu_release: f64,
    runner_cpu: f64,
}

struct Side<'a> {
    name: &'static str,
    pool: Pool,
    cfg: EpisodeConfig,
    transcripts: &'a Path,
    runner_pid: u32,
    acc: Acc,
}

/// acquire -> (workspace) -> episode -> release, timed; returns (wall, episode wall, cpu phases).
fn cycle(
    side: &Side<'_>,
    env_kind: &str,
    transcript: &str,
    n: usize,
) -> (f64, f64, f64, f64, f64, bool) {
    let c0 = self_cpu_s();
    let t0 = Instant::now();
    let mut warm = side.pool.acquire().expect("acquire");
    let c1 = self_cpu_s();
    let reused = warm.reused;
    let mut cfg = side.cfg.clone();
    cfg.episode_id = wmo_e2b::id::new_episode_id();
    let mut tr = if transcript == "file" {
        Transcript::append(
            &side
                .transcripts
                .join(format!("{}{}.jsonl", side.name, n % 8)),
        )
        .unwrap()
    } else {
        Transcript::disabled()
    };
    let t1 = Instant::now();
    if env_kind == "sandbox" {
        let ws = side.pool.workspace_of(warm.sandbox.as_ref());
        let env = SandboxEnvironment::new(warm.sandbox.clone(), ws, Duration::from_secs(120));
        run_episode(&mut warm.channel, &cfg, &env, &mut tr);
    } else {
        run_episode(&mut warm.channel, &cfg, &InstantEnv, &mut tr);
    }
    let _ = tr.finish();
    let t_ep = t1.elapsed().as_secs_f64();
    let c2 = self_cpu_s();
    side.pool.release(warm, true).expect("release");
    let c3 = self_cpu_s();
    (
        t0.elapsed().as_secs_f64(),
        t_ep,
        c1 - c0,
        c2 - c1,
        c3 - c2,
        reused,
    )
}

fn episodes(state: &Path, n: usize, env_kind: &str, transcript: &str) -> Value {
    let sandboxes = tempfile::tempdir().expect("tempdir");
    let (backend, shipment) = backend_for(sandboxes.path(), Some(&install_of(state)));
    let transcripts = sandboxes.path().join("transcripts");
    std::fs::create_dir_all(&transcripts).unwrap();
    let tools = environment::default_tools();
    let mut sides: Vec<Side<'_>> = [("builtin", None), ("pi", shipment.as_ref())]
        .into_iter()
        .map(|(name, m)| {
            let pool = new_pool(backend.clone(), m);
            // The workspace the sandbox environment runs in, created once (eval's setup).
            let w = pool.acquire().expect("acquire");
            let ws = pool.workspace_of(w.sandbox.as_ref());
            let out = w
                .sandbox
                .run("mkdir -p workspace", &RunOpts::default())
                .expect("mkdir");
            assert_eq!(out.exit_code, Some(0));
            let runner_pid =
                descendant_named(w.channel.pid(), "node").expect("the runner's node process");
            pool.release(w, true).expect("release");
            Side {
                name,
                pool,
                cfg: config(name, environment::system_prompt(&ws, &tools), Map::new()),
                transcripts: &transcripts,
                runner_pid,
                acc: Acc::default(),
            }
        })
        .collect();
    // Warm-up: pi's import, both runners' JIT.
    for side in &sides {
        for i in 0..5 {
            cycle(side, env_kind, transcript, i);
        }
    }
    let r0: Vec<f64> = sides.iter().map(|s| proc_cpu_s(s.runner_pid)).collect();
    for i in 0..n {
        // alternate which side goes first, so neither always follows the other
        let order: [usize; 2] = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for k in order {
            let (wall, ep, ca, ce, cr, reused) = cycle(&sides[k], env_kind, transcript, i);
            assert!(reused, "one warm sandbox per side");
            let a = &mut sides[k].acc;
            a.wall.push(wall);
            a.episode_wall.push(ep);
            a.cpu.push(ca + ce + cr);
            a.cpu_acquire += ca;
            a.cpu_episode += ce;
            a.cpu_release += cr;
        }
    }
    for (k, s) in sides.iter_mut().enumerate() {
        s.acc.runner_cpu = proc_cpu_s(s.runner_pid) - r0[k];
        assert_eq!(s.pool.usage().count, 1, "one sandbox per side");
    }
    let per = |s: &Side<'_>| {
        let a = &s.acc;
        let nf = a.wall.len() as f64;
        json!({
            "episodes": a.wall.len(),
            "median_wall_ms": ms(median(&a.wall)),
            "p90_wall_ms": ms(pct(&a.wall, 0.9)),
            "median_episode_wall_ms": ms(median(&a.episode_wall)),
            "median_host_cpu_ms": ms(median(&a.cpu)),
            "host_cpu_ms_per_episode": ms(a.cpu.iter().sum::<f64>() / nf),
            "host_cpu_ms_per_episode_acquire": ms(a.cpu_acquire / nf),
            "host_cpu_ms_per_episode_episode": ms(a.cpu_episode / nf),
            "host_cpu_ms_per_episode_release": ms(a.cpu_release / nf),
            "runner_cpu_ms_per_episode": ms(a.runner_cpu / nf),
            "runner_rss_kb": proc_status_kb(s.runner_pid, "VmRSS:"),
        })
    };
    let out = json!({
        "impl": "wmo-e2b", "mode": "episode", "env": env_kind, "transcript": transcript,
        "builtin": per(&sides[0]), "pi": per(&sides[1]),
        "pi_over_builtin_wall": median(&sides[1].acc.wall) / median(&sides[0].acc.wall),
        "pi_over_builtin_host_cpu": sides[1].acc.cpu.iter().sum::<f64>()
            / sides[0].acc.cpu.iter().sum::<f64>(),
    });
    for s in &sides {
        s.pool.close().expect("close");
    }
    out
}

// ---------------------------------------------------------------------------------------
// soak: as the reference's `bench_episode.py seq`

fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    points.iter().map(|(x, y)| (x - mx) * (y - my)).sum::<f64>()
        / points.iter().map(|(x, _)| (x - mx).powi(2)).sum::<f64>()
}

fn soak(
    state: &Path,
    episodes: usize,
    harness: &str,
    files_json: &str,
    transcript: &str,
    samples: usize,
) -> Value {
    let install = (harness == "pi").then(|| install_of(state));
    let sandboxes = tempfile::tempdir().expect("tempdir");
    let (backend, shipment) = backend_for(sandboxes.path(), install.as_ref());
    let pool = new_pool(backend, shipment.as_ref());
    let files: Map<String, Value> = if files_json.is_empty() {
        Map::new()
    } else {
        serde_json::from_str(&std::fs::read_to_string(files_json).expect("--files-json"))
            .expect("files json")
    };
    assert!(!files.contains_key("agent.mjs"));
    let files_bytes: usize = files.values().map(|v| v.as_str().map_or(0, str::len)).sum();
    let transcripts = sandboxes.path().join("transcripts");
    std::fs::create_dir_all(&transcripts).unwrap();
    let tools = environment::default_tools();
    let system = environment::system_prompt("/home/user/workspace", &tools);
    let side = Side {
        name: "soak",
        pool,
        cfg: config(harness, system.clone(), files.clone()),
        transcripts: &transcripts,
        runner_pid: 0,
        acc: Acc::default(),
    };
    // Warm-up, as the reference's --warmup 2: the cold start and pi's first import.
    let mut warmup_ms = Vec::new();
    for i in 0..2 {
        warmup_ms.push(ms(cycle(&side, "instant", transcript, i).0));
    }
    let runner_pid = {
        let w = side.pool.acquire().expect("acquire");
        let pid = w.channel.pid();
        side.pool.release(w, true).expect("release");
        descendant_named(pid, "node").expect("the runner's node process")
    };
    let every = (episodes / samples.max(1)).max(1);
    let (mut rss, mut walls, mut cpus) = (Vec::new(), Vec::new(), Vec::new());
    let c_all = self_cpu_s();
    let r_all = proc_cpu_s(runner_pid);
    let t_all = Instant::now();
    for i in 0..episodes {
        if i % every == 0 {
            rss.push((i, proc_status_kb(runner_pid, "VmRSS:")));
        }
        let (wall, _, ca, ce, cr, reused) = cycle(&side, "instant", transcript, i);
        assert!(reused);
        walls.push(wall);
        cpus.push(ca + ce + cr);
    }
    let total = t_all.elapsed().as_secs_f64();
    let host_cpu = self_cpu_s() - c_all;
    let runner_cpu = proc_cpu_s(runner_pid) - r_all;
    rss.push((episodes, proc_status_kb(runner_pid, "VmRSS:")));
    assert_eq!(side.pool.usage().count, 1, "one sandbox for the whole soak");
    let pts: Vec<(f64, f64)> = rss
        .iter()
        .map(|(i, kb)| (*i as f64, *kb as f64 / 1024.0))
        .collect();
    let half: Vec<(f64, f64)> = pts
        .iter()
        .copied()
        .filter(|p| p.0 >= episodes as f64 / 2.0)
        .collect();
    let start_line_bytes = wmo_e2b::channel::frame::encode(&json!({
        "type": "episode_start", "harness": harness, "files": files, "system": system, "tools": tools,
    }))
    .len();
    let out = json!({
        "impl": "wmo-e2b", "mode": "soak", "harness": harness, "transcript": transcript,
        "episodes": episodes, "warmup_wall_ms": warmup_ms,
        "episode_files": files.len(), "episode_files_bytes": files_bytes,
        "episode_start_wire_bytes": start_line_bytes,
        "median_wall_ms": ms(median(&walls)),
        "p90_wall_ms": ms(pct(&walls, 0.9)),
        "episodes_per_s": episodes as f64 / total,
        "median_host_cpu_ms": ms(median(&cpus)),
        "host_cpu_ms_per_episode": ms(host_cpu / episodes as f64),
        "runner_cpu_ms_per_episode": ms(runner_cpu / episodes as f64),
        "runner_rss_kb": rss,
        "runner_rss_slope_mib_per_episode": slope(&pts),
        "runner_rss_slope_2nd_half_mib_per_episode": slope(&half),
        "runner_rss_growth_mib": pts[pts.len() - 1].1 - pts[0].1,
        "host_peak_rss_kb": proc_status_kb(std::process::id(), "VmHWM:"),
    });
    side.pool.close().expect("close");
    out
}
