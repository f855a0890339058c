//! `wmo-e2b eval`: options, wiring, Ctrl-C, and the final summary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use wmo_e2b::cancel::CancelToken;
use wmo_e2b::eval::{self, results, run_lock, EvalLimits, EvalRun, EvalSummary, Harness};
use wmo_e2b::provider::Provider;
use wmo_e2b::report::{self, ReportMode};
use wmo_e2b::runner::BootstrapOpts;
use wmo_e2b::sandbox::leased::LeasedBackend;
use wmo_e2b::sandbox::ledger::Ledger;
use wmo_e2b::sandbox::local::LocalOptions;
use wmo_e2b::sandbox::pool::{self, Pool, PoolConfig};
use wmo_e2b::sandbox::{Backend, CreateSpec, Metadata};
use wmo_e2b::task;
use wmo_e2b::tree::TreeBounds;

use super::{open_backend_with, open_local, BackendKind, Exit, LocalArgs, UsageError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvKind {
    Sandbox,
    WorldModel,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Tasks file: JSON Lines, one task per line.
    #[arg(long, value_name = "FILE")]
    tasks: PathBuf,
    /// Where sandboxes run.
    #[arg(long, value_enum, default_value = "local")]
    backend: BackendKind,
    /// Sandbox template (e2b; defaults to E2B's `base`, which has Node 20).
    #[arg(long)]
    template: Option<String>,
    /// Sandbox creates per second at most (e2b).
    #[arg(long, default_value = "4", value_parser = super::bounds::create_rate)]
    create_rate: f64,
    /// Live sandboxes at once at most (e2b: match your plan, e.g. 20 or 100).
    #[arg(long, default_value_t = 20)]
    max_sandboxes: usize,
    /// `scripted` replays each task's model_script; anything else is a model name sent to an
    /// OpenAI-compatible chat-completions API.
    #[arg(long, default_value = "scripted")]
    model: String,
    /// Base URL of the OpenAI-compatible API.
    #[arg(long, default_value = "https://api.openai.com/v1")]
    base_url: String,
    /// Environment variable holding the API key (read on the host; never sent to a sandbox).
    #[arg(long, default_value = "OPENAI_API_KEY")]
    api_key_env: String,
    /// Tasks running at once.
    #[arg(short = 'j', long = "jobs", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    jobs: u16,
    /// Output directory (default: runs/<UTC timestamp>).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Skip tasks already finished in DIR/results.jsonl (needs --out).
    #[arg(long)]
    resume: bool,
    /// Run only the tasks whose stable id hash falls in shard I of N (0-based), e.g. 0/4.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Replays of an episode on a fresh sandbox after a transport failure.
    #[arg(long, default_value_t = 1)]
    transport_retries: u32,
    /// Model calls per episode, unless a task sets max_turns.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    max_turns: u32,
    /// Environment tool calls per episode.
    #[arg(long, default_value_t = 40)]
    max_tool_actions: u32,
    /// Wall-clock budget of an episode, unless a task sets timeout_s (e.g. 300s, 10m).
    #[arg(long, default_value = "300s", value_parser = super::bounds::duration)]
    episode_timeout: Duration,
    /// Time limit of one bash tool call.
    #[arg(long, default_value = "120s", value_parser = super::bounds::duration)]
    bash_timeout: Duration,
    /// How long a new runner may take to say hello.
    #[arg(long, default_value = "60s", value_parser = super::bounds::duration)]
    hello_timeout: Duration,
    /// Per-request timeout of model API calls.
    #[arg(long, default_value = "120s", value_parser = super::bounds::duration)]
    request_timeout: Duration,
    /// What runs in the runner: `builtin` (its own tool-calling loop), `pi` (the real pi
    /// agent loop, its npm packages installed once into a cache under the state dir), or a
    /// directory holding `agent.mjs` that exports `runEpisode(ctx)` (sent with every episode).
    #[arg(long, default_value = "builtin", value_name = "builtin|pi|DIR")]
    harness: String,
    /// Where tool calls land: `sandbox` runs them in the episode's sandbox; `world-model`
    /// has a model simulate them (no sandbox command runs; files, setup and verify unused).
    #[arg(long = "env", value_enum, default_value = "sandbox")]
    environment: EnvKind,
    /// The simulating model for `--env world-model`: `scripted` replays each task's
    /// `world_script`; any other name uses --base-url and --api-key-env like --model.
    #[arg(long, default_value = "scripted")]
    world_model: String,
    /// Print events as JSON Lines on stdout instead of the progress and summary table.
    #[arg(long)]
    json: bool,
    /// Give every task a fresh sandbox instead of resetting a used one (slower; the reset
    /// already proves each task starts clean).
    #[arg(long)]
    no_reuse: bool,
    #[command(flatten)]
    local: LocalArgs,
}

pub fn run(args: EvalArgs) -> Result<Exit> {
    if args.resume && args.out.is_none() {
        return Err(
            UsageError("--resume needs --out DIR: the run directory to resume".into()).into(),
        );
    }
    if args.backend == BackendKind::E2b && usize::from(args.jobs) > args.max_sandboxes {
        // Each running task holds one sandbox; more workers than the cap would only queue
        // behind it and time out.
        return Err(UsageError(format!(
            "-j {} needs {} sandboxes at once, more than --max-sandboxes {}: lower -j or raise --max-sandboxes to your plan's limit",
            args.jobs, args.jobs, args.max_sandboxes
        ))
        .into());
    }
    let shard = args.shard.as_deref().map(parse_shard).transpose()?;
    let all = task::load_tasks(&args.tasks)?;
    let out_dir = args.out.clone().unwrap_or_else(default_out_dir);
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create the output directory {}", out_dir.display()))?;
    // Held to the end of the run, before anything reads or writes the directory.
    let _out_lock = run_lock::lock_out_dir(&out_dir).map_err(|e| match e {
        // Two runs chose one --out: the user's to change.
        run_lock::RunLockError::Held { .. } => UsageError(e.to_string()).into(),
        other => anyhow::Error::new(other),
    })?;
    let done = if args.resume {
        let path = out_dir.join("results.jsonl");
        let finished = results::finished_ids(&path)?;
        if finished.unreadable > 0 {
            eprintln!(
                "warning: skipped {} unreadable line(s) of {} (a line torn by a crash, say); their tasks run again",
                finished.unreadable,
                path.display()
            );
        }
        finished.ids
    } else {
        Default::default()
    };
    let mut skipped = 0;
    let tasks: Vec<task::Task> = all
        .into_iter()
        .filter(|t| shard.is_none_or(|(i, n)| task::shard_of(&t.id, n) == i))
        .filter(|t| {
            let keep = !done.contains(&t.id);
            skipped += usize::from(!keep);
            keep
        })
        .collect();

    let provider = make_provider(&args, &args.model)?;
    let world_model = match args.environment {
        EnvKind::Sandbox => None,
        EnvKind::WorldModel => Some(make_provider(&args, &args.world_model)?),
    };
    let harness = match args.harness.as_str() {
        "builtin" => Harness::Builtin,
        "pi" => Harness::Pi,
        dir => {
            let files =
                wmo_e2b::tree::read_harness(std::path::Path::new(dir), TreeBounds::default())
                    .map_err(|e| UsageError(format!("--harness {dir}: {e}")))?;
            Harness::Files(
                files
                    .into_iter()
                    .map(|(k, v)| (k, serde_json::Value::String(v)))
                    .collect(),
            )
        }
    };

    // Local sandboxes share one install on the host; remote ones get pi inside themselves
    // (prebaked by the template recipe, or installed at bootstrap).
    let pi_on_host = matches!(harness, Harness::Pi) && args.backend == BackendKind::Local;
    let pi_in_sandbox = matches!(harness, Harness::Pi) && !pi_on_host;
    let run_id = out_dir
        .file_name()
        .map_or_else(|| "eval".to_string(), |n| n.to_string_lossy().into_owned());
    let ledger = Ledger::open(&wmo_e2b::state::state_dir(), &run_id)
        .context("cannot open the lease ledger")?;
    let (inner, pi_modules): (Arc<dyn Backend>, Option<PathBuf>) = match args.backend {
        BackendKind::Local => {
            let mut local = LocalOptions {
                isolation: args.local.isolation.into(),
                ..LocalOptions::default()
            };
            let install = if pi_on_host {
                let install = wmo_e2b::runner::pi::ensure_installed(&wmo_e2b::state::state_dir())
                    .context("cannot install the pi agent packages")?;
                local.system_read_only.push(install.local_mount());
                Some(install)
            } else {
                None
            };
            let backend = open_local(local)?;
            let modules = install.map(|i| i.modules_seen_by(backend.isolation()));
            (backend, modules)
        }
        BackendKind::E2b => (
            open_backend_with(args.backend, e2b_options(&args), LocalOptions::default())?,
            None,
        ),
    };
    // Every sandbox of the run is leased before it is created.
    let backend: Arc<dyn Backend> = Arc::new(LeasedBackend::new(inner, ledger, "eval"));
    let max_episode = tasks
        .iter()
        .filter_map(|t| t.timeout_s)
        .map(Duration::from_secs_f64)
        .fold(args.episode_timeout, Duration::max);
    let pool = Arc::new(Pool::new(
        backend,
        PoolConfig {
            spec: CreateSpec {
                template: args.template.clone(),
                timeout_secs: 0,
                metadata: Metadata::new(),
                envs: Vec::new(),
                internet: true,
            },
            lease: pool::lease_for(max_episode),
            lifetime: pool::lifetime_for(max_episode),
            bootstrap: BootstrapOpts {
                hello_timeout: args.hello_timeout,
                pi_modules,
                pi_in_sandbox,
                ..BootstrapOpts::default()
            },
            workspace_dir: "workspace".into(),
            reuse: !args.no_reuse,
        },
    ));

    let cancel = CancelToken::new();
    let interrupted = install_ctrl_c(cancel.clone(), pool.clone())?;
    let mode = if args.json {
        ReportMode::Json
    } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ReportMode::Progress
    } else {
        ReportMode::Lines
    };
    let (tx, rx) = crossbeam_channel::unbounded();
    let reporter = std::thread::Builder::new()
        .name("reporter".into())
        .spawn(move || report::run_reporter(mode, rx))
        .context("cannot start the reporter thread")?;
    let outcome = eval::run(&EvalRun {
        tasks: &tasks,
        skipped,
        out_dir: &out_dir,
        jobs: usize::from(args.jobs),
        limits: EvalLimits {
            max_turns: args.max_turns,
            max_tool_actions: args.max_tool_actions,
            max_output_tokens: 4096,
            episode_timeout: args.episode_timeout,
            bash_timeout: args.bash_timeout,
            transport_retries: args.transport_retries,
        },
        pool: pool.clone(),
        provider,
        harness,
        world_model,
        events: tx,
        cancel: cancel.clone(),
        fatal: Default::default(),
    });
    // The run dropped its sender; the reporter drains and returns.
    let records = reporter.join().unwrap_or_default();
    let summary = outcome?;
    // Shown even when it cannot be saved: the summary is how a run that stopped says why.
    let saved = write_summary(&out_dir, &summary);
    if args.json {
        println!(
            "{}",
            serde_json::json!({"type": "summary", "summary": summary, "out_dir": out_dir})
        );
    } else {
        print!("{}", report::summary_table(&records, &summary));
        if let Some(fatal) = &summary.fatal {
            eprintln!("error: the run stopped early: {fatal}");
        }
        println!("results: {}", out_dir.join("results.jsonl").display());
    }
    saved?;
    Ok(exit_for(
        &summary,
        interrupted.load(std::sync::atomic::Ordering::SeqCst),
    ))
}

fn e2b_options(args: &EvalArgs) -> wmo_e2b::sandbox::e2b::E2bOptions {
    let mut o = wmo_e2b::sandbox::e2b::E2bOptions {
        create_rate: args.create_rate,
        max_sandboxes: args.max_sandboxes,
        ..Default::default()
    };
    if let Some(t) = &args.template {
        o.template = t.clone();
    }
    o
}

fn make_provider(args: &EvalArgs, model: &str) -> Result<Arc<dyn Provider>> {
    super::make_provider(
        model,
        &args.base_url,
        &args.api_key_env,
        args.request_timeout,
    )
}

fn exit_for(summary: &EvalSummary, interrupted: bool) -> Exit {
    if interrupted {
        Exit::Interrupted
    } else if summary.cleanup_error.is_some() || summary.fatal.is_some() {
        Exit::Infrastructure
    } else if summary.failed + summary.errors + summary.cancelled > 0 {
        Exit::TasksFailed
    } else {
        Exit::Success
    }
}

fn write_summary(out_dir: &std::path::Path, summary: &EvalSummary) -> Result<()> {
    let path = out_dir.join("summary.json");
    let text = serde_json::to_string_pretty(summary).context("cannot encode the summary")?;
    std::fs::write(&path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// First Ctrl-C: stop scheduling and cancel running episodes (finished results stay on disk,
/// the pool is closed normally). Second: kill every sandbox and exit at once.
fn install_ctrl_c(
    cancel: CancelToken,
    pool: Arc<Pool>,
) -> Result<Arc<std::sync::atomic::AtomicBool>> {
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = crossbeam_channel::bounded::<()>(4);
    ctrlc::set_handler(move || {
        // Never block inside the handler; a full queue means we are already exiting.
        let _ = tx.try_send(());
    })
    .context("cannot install the Ctrl-C handler")?;
    let flag = interrupted.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if rx.recv().is_err() {
                return;
            }
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            cancel.cancel();
            eprintln!("\ninterrupted: cancelling running tasks (Ctrl-C again to kill sandboxes and exit now)");
            if rx.recv().is_err() {
                return;
            }
            let _ = pool.close();
            std::process::exit(Exit::Interrupted as i32);
        })
        .context("cannot start the signal thread")?;
    Ok(interrupted)
}

fn parse_shard(s: &str) -> Result<(u32, u32)> {
    let bad = || {
        UsageError(format!(
            "--shard {s:?}: expected I/N with 0 <= I < N, e.g. 0/4"
        ))
    };
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let i: u32 = i.trim().parse().map_err(|_| bad())?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    if n == 0 || i >= n {
        return Err(bad().into());
    }
    Ok((i, n))
}

fn default_out_dir() -> PathBuf {
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let compact: String = stamp
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect::<String>()
        .replace('T', "-");
    PathBuf::from("runs").join(compact)
}
