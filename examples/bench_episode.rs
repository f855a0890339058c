//! Benchmark: runner start-up, warm reuse, host CPU per episode and runner memory, on the
//! local backend through the library (what `scripts/bench/run.sh` runs).
//!
//! Modes (each prints one JSON line):
//!
//! - `hello --reps 30`: per rep, interleaved: a bare `node -e ''` (spawn to exit, the
//!   baseline), then `runner::bootstrap` on a fresh local sandbox (upload, spawn, `hello`),
//!   then a cold `Pool::acquire` (create + bootstrap + lease).
//! - `hello-isolation --reps 30`: per rep, interleaved: `runner::bootstrap` on a fresh local
//!   sandbox under bwrap, then on one with `--isolation none` (the cost of confinement).
//! - `cycle --reps 10 --warm 10 [--isolation bwrap|none]`: what `eval` does per task
//!   (acquire, task files + setup, episode with the sandbox environment, verify, release,
//!   which resets the sandbox), timed; the first cycle of each fresh pool is cold, the rest
//!   reuse its sandbox.
//! - `soak --episodes 500 --harness builtin|files [--files-json F] [--transcript file|none]`:
//!   sequential warm episodes on one sandbox with an instant environment (as the
//!   reference's `bench_episode.py seq`): host CPU per episode (getrusage of this process),
//!   runner CPU, and the runner's VmRSS every 50 episodes. `--files-json` (a JSON object of
//!   path -> content) is sent as `episode_start.files`; `--harness files` adds an `agent.mjs`
//!   so the runner writes the files and runs the harness from them each episode.
//!
//! `cargo run --release --example bench_episode -- hello --reps 30`

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use wmo_e2b::cancel::CancelToken;
use wmo_e2b::environment::{self, SandboxEnvironment};
use wmo_e2b::episode::{self, Episode, EpisodeConfig, Opening, StopReason, Transcript};
use wmo_e2b::eval::HarnessFiles;
use wmo_e2b::pool::{self, Pool, PoolConfig, Warm};
use wmo_e2b::provider::scripted::ScriptedProvider;
use wmo_e2b::runner::{self, BootstrapOpts};
use wmo_e2b::sandbox::local::{IsolationChoice, LocalBackend, LocalOptions};
use wmo_e2b::sandbox::{Backend, RunOpts, Sandbox};
use wmo_e2b::task::Task;

mod bench_common;
use bench_common::{
    arg, descendant_named, median, ms, proc_cpu_s, proc_status_kb, scrubbed, self_cpu_s, spec,
    InstantEnv,
};

fn backend(dir: &Path) -> Arc<LocalBackend> {
    LocalBackend::open(dir).expect("open the local backend")
}

fn backend_with(dir: &Path, isolation: &str) -> Arc<LocalBackend> {
    let isolation = match isolation {
        "bwrap" => IsolationChoice::Bwrap,
        "none" => IsolationChoice::None,
        other => panic!("--isolation {other}: bwrap|none"),
    };
    LocalBackend::open_with(
        dir,
        LocalOptions {
            isolation,
            ..LocalOptions::default()
        },
    )
    .expect("open the local backend")
}

fn new_pool(backend: Arc<LocalBackend>) -> Pool {
    let episode = Duration::from_secs(300);
    Pool::new(
        backend as Arc<dyn Backend>,
        PoolConfig {
            spec: spec(),
            lease: pool::lease_for(episode),
            lifetime: pool::lifetime_for(episode),
            bootstrap: BootstrapOpts::default(),
            workspace_dir: "workspace".into(),
            reuse: true,
        },
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().cloned().unwrap_or_else(|| "hello".into());
    let state = tempfile::tempdir().expect("tempdir");
    let out = match mode.as_str() {
        "hello" => hello(state.path(), arg(&args, "--reps", "30").parse().unwrap()),
        "hello-isolation" => {
            hello_isolation(state.path(), arg(&args, "--reps", "30").parse().unwrap())
        }
        "cycle" => cycle(
            state.path(),
            arg(&args, "--reps", "10").parse().unwrap(),
            arg(&args, "--warm", "10").parse().unwrap(),
            &arg(&args, "--isolation", "bwrap"),
        ),
        "soak" => soak(
            state.path(),
            arg(&args, "--episodes", "500").parse().unwrap(),
            &arg(&args, "--harness", "builtin"),
            &arg(&args, "--files-json", ""),
            &arg(&args, "--transcript", "file"),
        ),
        other => panic!("unknown mode {other}: hello|cycle|soak"),
    };
    println!("{out}");
}

// ---------------------------------------------------------------------------------------
// hello

fn hello(state: &Path, reps: usize) -> Value {
    let backend = backend(state);
    let node_version = std::process::Command::new("node")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let (mut bare, mut bare_env, mut boot, mut acquire) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // One untimed round first: page cache, node's code cache.
    for rep in 0..=reps {
        // Bare node with the environment a sandbox process gets (the local backend scrubs
        // it: NODE_EXTRA_CA_CERTS and friends alone can cost node tens of ms).
        let t0 = Instant::now();
        let st = scrubbed(std::process::Command::new("node").args(["-e", ""]))
            .status()
            .expect("node");
        let t_bare = t0.elapsed().as_secs_f64();
        assert!(st.success());
        // ... and with this process's own environment.
        let t0 = Instant::now();
        let st = std::process::Command::new("node")
            .args(["-e", ""])
            .status()
            .expect("node");
        let t_bare_env = t0.elapsed().as_secs_f64();
        assert!(st.success());

        let sandbox: Arc<dyn Sandbox> = backend.create_local(&spec()).expect("create");
        let t0 = Instant::now();
        let started = runner::bootstrap(&sandbox, &BootstrapOpts::default()).expect("bootstrap");
        let t_boot = t0.elapsed().as_secs_f64();
        drop(started);
        let _ = backend.kill(sandbox.id());

        let pool = new_pool(backend.clone());
        let t0 = Instant::now();
        let warm = pool.acquire().expect("acquire");
        let t_acq = t0.elapsed().as_secs_f64();
        drop(warm);
        pool.close().expect("close");

        if rep > 0 {
            bare.push(t_bare);
            bare_env.push(t_bare_env);
            boot.push(t_boot);
            acquire.push(t_acq);
        }
    }
    json!({
        "impl": "wmo-e2b", "mode": "hello", "reps": reps, "node": node_version,
        "bare_node_ms": bare.iter().map(|v| ms(*v)).collect::<Vec<_>>(),
        "bootstrap_ms": boot.iter().map(|v| ms(*v)).collect::<Vec<_>>(),
        "cold_acquire_ms": acquire.iter().map(|v| ms(*v)).collect::<Vec<_>>(),
        "bare_node_inherited_env_ms": bare_env.iter().map(|v| ms(*v)).collect::<Vec<_>>(),
        "median_bare_node_ms": ms(median(&bare)),
        "median_bare_node_inherited_env_ms": ms(median(&bare_env)),
        "median_bootstrap_ms": ms(median(&boot)),
        "median_cold_acquire_ms": ms(median(&acquire)),
        "bootstrap_over_bare": median(&boot) / median(&bare),
    })
}

/// Spawn-to-hello under bwrap against unconfined, interleaved.
fn hello_isolation(state: &Path, reps: usize) -> Value {
    let confined = backend_with(&state.join("bwrap"), "bwrap");
    let plain = backend_with(&state.join("none"), "none");
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let boot = |backend: &Arc<LocalBackend>| {
        let sandbox: Arc<dyn Sandbox> = backend.create_local(&spec()).expect("create");
        let t0 = Instant::now();
        let started = runner::bootstrap(&sandbox, &BootstrapOpts::default()).expect("bootstrap");
        let t = t0.elapsed().as_secs_f64();
        drop(started);
        let _ = backend.kill(sandbox.id());
        t
    };
    // One untimed round first: page cache, node's code cache.
    for rep in 0..=reps {
        let (b, n) = if rep % 2 == 0 {
            let b = boot(&confined);
            (b, boot(&plain))
        } else {
            let n = boot(&plain);
            (boot(&confined), n)
        };
        if rep > 0 {
            with.push(b);
            without.push(n);
        }
    }
    json!({
        "impl": "wmo-e2b", "mode": "hello-isolation", "reps": reps,
        "bwrap_ms": with.iter().map(|v| ms(*v)).collect::<Vec<_>>(),
        "none_ms": without.iter().map(|v| ms(*v)).collect::<Vec<_>>(),
        "median_bwrap_ms": ms(median(&with)),
        "median_none_ms": ms(median(&without)),
        "bwrap_over_none": median(&with) / median(&without),
    })
}

// ---------------------------------------------------------------------------------------
// cycle: cold vs warm, the way eval runs a task

fn bench_task() -> Task {
    serde_json::from_value(json!({
        "id": "bench",
        "instruction": "Write hello to out.txt, show it, then submit.",
        "files": {"in.txt": "hello\n"},
        "verify": "test -s out.txt",
        "model_script": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "cp in.txt out.txt"}}]},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "cat out.txt"}}]},
            {"tool_calls": [{"name": "submit", "arguments": {"answer": "done"}}]}
        ]
    }))
    .expect("task")
}

fn config(system: String, files: Map<String, Value>) -> EpisodeConfig {
    EpisodeConfig {
        episode_id: wmo_e2b::id::new_episode_id(),
        // The runner picks the user harness when the files hold `agent.mjs`.
        harness: if files.contains_key("agent.mjs") {
            "user".into()
        } else {
            "builtin".into()
        },
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

struct Phases {
    acquire: f64,
    setup: f64,
    episode: f64,
    verify: f64,
    /// Of `verify`: stopping the agent.
    stop: f64,
    release: f64,
    total: f64,
    reused: bool,
}

/// One task the way `eval::run_attempt` does it.
fn one_task(pool: &Pool, task: &Task, transcripts: &Path, n: usize) -> Phases {
    let t0 = Instant::now();
    let mut warm: Warm = pool.acquire().expect("acquire");
    let t_acq = t0.elapsed().as_secs_f64();
    let sandbox = warm.sandbox.clone();
    let ws = pool.workspace_of(sandbox.as_ref());
    // As eval prepares a task with files and no setup: its limits in force, then the files
    // make the workspace.
    let t1 = Instant::now();
    sandbox
        .apply_limits(&wmo_e2b::sandbox::Limits::defaults())
        .expect("limits");
    for (rel, content) in &task.files {
        sandbox
            .write_file(&format!("{ws}/{rel}"), content.as_bytes())
            .expect("task file");
    }
    let t_setup = t1.elapsed().as_secs_f64();

    let tools = environment::default_tools();
    let cfg = config(environment::system_prompt(&ws, &tools), Map::new());
    let env = SandboxEnvironment::new(sandbox.clone(), ws.clone(), Duration::from_secs(120));
    let mut transcript =
        Transcript::append(&transcripts.join(format!("t{n}.jsonl"))).expect("transcript");
    let cancel = CancelToken::new();
    let t2 = Instant::now();
    let outcome = {
        let mut ep = Episode {
            opening: Opening::Episode {
                instruction: &task.instruction,
            },
            label: &task.id,
            script: task.model_script.as_deref(),
            config: &cfg,
            provider: &ScriptedProvider::new(),
            environment: &env,
            cancel: &cancel,
            observer: &mut transcript,
        };
        episode::run_episode(&mut ep, &mut warm.channel).expect("episode")
    };
    let t_ep = t2.elapsed().as_secs_f64();
    assert_eq!(outcome.stop_reason, StopReason::Submit);
    // The verify phase as eval runs it: the agent stopped (a fresh task namespace), then
    // the verifier in its fixed context.
    let t3 = Instant::now();
    sandbox.stop_agent(false).expect("stop the agent");
    let t_stop = t3.elapsed().as_secs_f64();
    let v = sandbox
        .run(
            task.verify.as_deref().unwrap(),
            &RunOpts {
                cwd: Some(ws.clone()),
                role: wmo_e2b::sandbox::Role::Verify,
                ..RunOpts::default()
            },
        )
        .expect("verify");
    assert_eq!(v.exit_code, Some(0));
    let t_verify = t3.elapsed().as_secs_f64();
    let _ = transcript.finish();
    let reused = warm.reused;
    let t4 = Instant::now();
    pool.release(warm, true).expect("release");
    let t_rel = t4.elapsed().as_secs_f64();
    Phases {
        acquire: t_acq,
        setup: t_setup,
        episode: t_ep,
        verify: t_verify,
        stop: t_stop,
        release: t_rel,
        total: t0.elapsed().as_secs_f64(),
        reused,
    }
}

fn cycle(state: &Path, reps: usize, warm_per_pool: usize, isolation: &str) -> Value {
    let backend = backend_with(state, isolation);
    let task = bench_task();
    let transcripts: PathBuf = state.join("transcripts");
    std::fs::create_dir_all(&transcripts).unwrap();
    let mut cold: Vec<Phases> = Vec::new();
    let mut warm: Vec<Phases> = Vec::new();
    let mut n = 0;
    let (mut resets, mut reset_s, mut unclean) = (0, 0.0, 0);
    // One untimed pool first (page cache, node's code cache).
    for rep in 0..=reps {
        let pool = new_pool(backend.clone());
        for _ in 0..=warm_per_pool {
            n += 1;
            let p = one_task(&pool, &task, &transcripts, n);
            if rep == 0 {
                continue;
            }
            if p.reused {
                warm.push(p);
            } else {
                cold.push(p);
            }
        }
        if rep > 0 {
            let usage = pool.usage();
            resets += usage.resets;
            unclean += usage.unclean;
            reset_s += usage.reset_seconds;
        }
        pool.close().expect("close");
    }
    let med =
        |v: &[Phases], f: fn(&Phases) -> f64| ms(median(&v.iter().map(f).collect::<Vec<_>>()));
    let phases = |v: &[Phases]| {
        json!({
            "n": v.len(),
            "total_ms": med(v, |p| p.total),
            "acquire_ms": med(v, |p| p.acquire),
            "setup_ms": med(v, |p| p.setup),
            "episode_ms": med(v, |p| p.episode),
            "verify_ms": med(v, |p| p.verify),
            "stop_ms": med(v, |p| p.stop),
            "release_ms": med(v, |p| p.release),
        })
    };
    let c = median(&cold.iter().map(|p| p.total).collect::<Vec<_>>());
    let w = median(&warm.iter().map(|p| p.total).collect::<Vec<_>>());
    json!({
        "impl": "wmo-e2b", "mode": "cycle", "isolation": isolation,
        "cold": phases(&cold), "warm": phases(&warm),
        "warm_over_cold": w / c,
        "resets": resets, "unclean": unclean,
        "mean_reset_ms": ms(reset_s / (resets + unclean).max(1) as f64),
    })
}

// ---------------------------------------------------------------------------------------
// soak: host CPU per episode and runner RSS over many episodes on one sandbox

struct Sample {
    wall: f64,
    cpu: f64,
    cpu_acquire: f64,
    cpu_episode: f64,
    cpu_release: f64,
    reused: bool,
}

/// A user harness doing what the builtin loop does, run from `episode_start.files`.
const AGENT_MJS: &str = r#"export async function runEpisode(ctx) {
  const messages = [{ role: "system", content: ctx.system }, { role: "user", content: ctx.instruction }];
  for (let t = 0; t < ctx.maxTurns; t++) {
    const c = await ctx.llm({ messages, tools: ctx.tools, max_tokens: ctx.maxOutputTokens });
    const m = c.choices[0].message;
    const calls = m.tool_calls || [];
    if (calls.length === 0) return m.content || "";
    messages.push({ role: "assistant", content: m.content || "", tool_calls: calls });
    for (const call of calls) {
      const args = JSON.parse(call.function.arguments || "{}");
      if (call.function.name === "submit") { ctx.submit(args.answer); return; }
      const r = await ctx.tool(call.function.name, args);
      messages.push({ role: "tool", tool_call_id: call.id, content: r.content });
    }
  }
}
"#;

/// 25 files, ~256 KB, for when the reference's harness files are not at hand.
fn synthetic_files() -> Map<String, Value> {
    let line = "export function step(state: State, input: string): State { return { ...state, \"n\": state.n + 1, text: `${input}\\n` }; }\n";
    (0..25)
        .map(|i| {
            let body = line.repeat(256_000 / 25 / line.len() + 1);
            (format!("src/mod{i}.ts"), Value::String(body))
        })
        .collect()
}

fn soak(state: &Path, episodes: usize, harness: &str, files_json: &str, transcript: &str) -> Value {
    let backend = backend(state);
    let pool = new_pool(backend);
    let task: Task = serde_json::from_value(json!({
        "id": "soak", "instruction": "Print hello then submit 42.",
        "model_script": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo hello"}}]},
            {"tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]}
        ]
    }))
    .unwrap();
    let mut files: Map<String, Value> = if files_json.is_empty() {
        if harness == "none" {
            Map::new()
        } else {
            synthetic_files()
        }
    } else {
        serde_json::from_str(&std::fs::read_to_string(files_json).expect("--files-json"))
            .expect("files json")
    };
    if harness == "files" {
        files.insert("agent.mjs".into(), Value::String(AGENT_MJS.into()));
    }
    let files_bytes: usize = files.values().map(|v| v.as_str().map_or(0, str::len)).sum();
    let transcripts = state.join("transcripts");
    std::fs::create_dir_all(&transcripts).unwrap();
    let tools = environment::default_tools();
    let system = environment::system_prompt("/home/user/workspace", &tools);
    let provider = ScriptedProvider::new();
    let cancel = CancelToken::new();

    // Built once: only the episode id changes between episodes, and, as `eval` does, the
    // harness files go to the runner with its first episode only (named by digest after).
    let mut base = config(system.clone(), files.clone());
    let harness_files = (!files.is_empty()).then(|| HarnessFiles::new(files.clone()));
    base.files = Map::new();
    base.files_digest = harness_files.as_ref().map(|h| h.digest.clone());
    let run_one = |i: usize| -> Sample {
        let c0 = self_cpu_s();
        let t0 = Instant::now();
        let mut warm = pool.acquire().expect("acquire");
        let c1 = self_cpu_s();
        let reused = warm.reused;
        let mut cfg = base.clone();
        cfg.episode_id = wmo_e2b::id::new_episode_id();
        if let Some(h) = &harness_files {
            if warm.harness_files.as_deref() != Some(h.digest.as_str()) {
                cfg.files = h.files.clone();
            }
        }
        let mut tr = if transcript == "file" {
            Transcript::append(&transcripts.join(format!("s{}.jsonl", i % 8))).unwrap()
        } else {
            Transcript::disabled()
        };
        let outcome = {
            let mut ep = Episode {
                opening: Opening::Episode {
                    instruction: &task.instruction,
                },
                label: &task.id,
                script: task.model_script.as_deref(),
                config: &cfg,
                provider: &provider,
                environment: &InstantEnv,
                cancel: &cancel,
                observer: &mut tr,
            };
            episode::run_episode(&mut ep, &mut warm.channel).expect("episode")
        };
        warm.harness_files = cfg.files_digest.clone();
        let _ = tr.finish();
        drop(cfg);
        let c2 = self_cpu_s();
        assert_eq!(
            (outcome.stop_reason, outcome.answer.as_str()),
            (StopReason::Submit, "42"),
            "{:?}",
            outcome.note
        );
        pool.release(warm, true).expect("release");
        let c3 = self_cpu_s();
        Sample {
            wall: t0.elapsed().as_secs_f64(),
            cpu: c3 - c0,
            cpu_acquire: c1 - c0,
            cpu_episode: c2 - c1,
            cpu_release: c3 - c2,
            reused,
        }
    };

    // Warm-up: the cold start, and the first episodes of the runner (JIT).
    let warmup = 2;
    let mut warmup_ms = Vec::new();
    for i in 0..warmup {
        warmup_ms.push(ms(run_one(i).wall));
    }
    // The runner's node: the pool's only sandbox, its only process (launched, so node is
    // the launcher's child).
    let runner_pid = {
        let w = pool.acquire().expect("acquire");
        let pid = w.channel.pid();
        pool.release(w, true).expect("release");
        descendant_named(pid, "node").expect("the runner's node process")
    };
    assert_eq!(pool.usage().count, 1, "one sandbox for the whole soak");
    let every = (episodes / 10).max(1);
    let mut rss = Vec::new();
    let mut walls = Vec::new();
    let mut cpus = Vec::new();
    let (mut cpu_acq, mut cpu_ep, mut cpu_rel) = (0.0, 0.0, 0.0);
    let self_rss_before = proc_status_kb(std::process::id(), "VmRSS:");
    let c_all = self_cpu_s();
    let r_all = proc_cpu_s(runner_pid);
    let t_all = Instant::now();
    for i in 0..episodes {
        if i % every == 0 {
            rss.push((i, proc_status_kb(runner_pid, "VmRSS:")));
        }
        let s = run_one(warmup + i);
        assert!(s.reused);
        walls.push(s.wall);
        cpus.push(s.cpu);
        cpu_acq += s.cpu_acquire;
        cpu_ep += s.cpu_episode;
        cpu_rel += s.cpu_release;
    }
    let total = t_all.elapsed().as_secs_f64();
    let host_cpu = self_cpu_s() - c_all;
    let runner_cpu = proc_cpu_s(runner_pid) - r_all;
    rss.push((episodes, proc_status_kb(runner_pid, "VmRSS:")));
    assert_eq!(pool.usage().count, 1, "one sandbox for the whole soak");
    // Least-squares slope of runner RSS over episodes, MiB per episode.
    let xs: Vec<f64> = rss.iter().map(|(i, _)| *i as f64).collect();
    let ys: Vec<f64> = rss.iter().map(|(_, kb)| *kb as f64 / 1024.0).collect();
    let (mx, my) = (
        xs.iter().sum::<f64>() / xs.len() as f64,
        ys.iter().sum::<f64>() / ys.len() as f64,
    );
    let slope = xs
        .iter()
        .zip(&ys)
        .map(|(x, y)| (x - mx) * (y - my))
        .sum::<f64>()
        / xs.iter().map(|x| (x - mx).powi(2)).sum::<f64>();
    // The same over the second half only (after the runner's heap has settled).
    let half: Vec<(f64, f64)> = xs
        .iter()
        .zip(&ys)
        .filter(|(x, _)| **x >= episodes as f64 / 2.0)
        .map(|(x, y)| (*x, *y))
        .collect();
    let (hx, hy) = (
        half.iter().map(|p| p.0).sum::<f64>() / half.len() as f64,
        half.iter().map(|p| p.1).sum::<f64>() / half.len() as f64,
    );
    let slope_2nd = half.iter().map(|(x, y)| (x - hx) * (y - hy)).sum::<f64>()
        / half.iter().map(|(x, _)| (x - hx).powi(2)).sum::<f64>();
    let start_line_bytes = wmo_e2b::channel::frame::encode(&json!({
        "type": "episode_start", "files": files, "system": system, "tools": tools,
    }))
    .len();
    let out = json!({
        "impl": "wmo-e2b", "mode": "soak", "harness": harness, "transcript": transcript,
        "episodes": episodes, "warmup_wall_ms": warmup_ms,
        "episode_files": files.len(), "episode_files_bytes": files_bytes,
        "episode_start_wire_bytes": start_line_bytes,
        "median_wall_ms": ms(median(&walls)),
        "episodes_per_s": episodes as f64 / total,
        "median_host_cpu_ms": ms(median(&cpus)),
        "host_cpu_ms_per_episode": ms(host_cpu / episodes as f64),
        "host_cpu_ms_per_episode_acquire": ms(cpu_acq / episodes as f64),
        "host_cpu_ms_per_episode_episode": ms(cpu_ep / episodes as f64),
        "host_cpu_ms_per_episode_release": ms(cpu_rel / episodes as f64),
        "runner_cpu_ms_per_episode": ms(runner_cpu / episodes as f64),
        "runner_rss_kb": rss,
        "runner_rss_slope_mib_per_episode": slope,
        "runner_rss_slope_2nd_half_mib_per_episode": slope_2nd,
        "runner_rss_growth_mib": (ys[ys.len() - 1] - ys[0]),
        "host_rss_before_kb": self_rss_before,
        "host_rss_after_kb": proc_status_kb(std::process::id(), "VmRSS:"),
        "host_peak_rss_kb": proc_status_kb(std::process::id(), "VmHWM:"),
    });
    pool.close().expect("close");
    out
}
