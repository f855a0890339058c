//! `wmo-e2b eval`: options, wiring, Ctrl-C, and the final summary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use wmo_e2b::eval::plan::{self, EvalOptions, PlanError};
use wmo_e2b::eval::{self, EvalLimits, EvalRun, Harness, RunControl, Verdict};
use wmo_e2b::pool::Pool;
use wmo_e2b::provider::Provider;
use wmo_e2b::report::{self, ReportMode};
use wmo_e2b::runner::BootstrapOpts;
use wmo_e2b::sandbox::leased::LeasedBackend;
use wmo_e2b::sandbox::ledger::Ledger;
use wmo_e2b::sandbox::local::LocalOptions;
use wmo_e2b::sandbox::Backend;

use super::{
    open_backend_with, open_local, BackendKind, Exit, LocalArgs, ModelApiArgs, UsageError,
};

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
    #[command(flatten)]
    api: ModelApiArgs,
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
    /// A directory of skills (`<name>.md` files with `name` and `description` front
    /// matter): the system prompt lists them and the agent reads one with `read_skill`.
    #[arg(long, value_name = "DIR")]
    skills: Option<PathBuf>,
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
    if args.backend == BackendKind::E2b && usize::from(args.jobs) > args.max_sandboxes {
        // Each running task holds one sandbox; more workers than the cap would only queue
        // behind it and time out.
        return Err(UsageError(format!(
            "-j {} needs {} sandboxes at once, more than --max-sandboxes {}: lower -j or raise --max-sandboxes to your plan's limit",
            args.jobs, args.jobs, args.max_sandboxes
        ))
        .into());
    }
    // Checked whole before the run's directory or any sandbox exists.
    let skills = super::load_skills(args.skills.as_deref())?;
    let plan = plan::plan(&EvalOptions {
        tasks_file: args.tasks.clone(),
        out: args.out.clone(),
        resume: args.resume,
        shard: args.shard.clone(),
        harness: args.harness.clone(),
    })
    .map_err(|e| match e {
        PlanError::Tasks(t) => anyhow::Error::new(t),
        e if e.is_usage() => UsageError(e.to_string()).into(),
        e => anyhow::Error::new(e),
    })?;
    if plan.unreadable_results > 0 {
        eprintln!(
            "warning: skipped {} unreadable line(s) of {} (a line torn by a crash, say); their tasks run again",
            plan.unreadable_results,
            plan.out_dir.join("results.jsonl").display()
        );
    }
    let provider = make_provider(&args, &args.model)?;
    let world_model = match args.environment {
        EnvKind::Sandbox => None,
        EnvKind::WorldModel => Some(make_provider(&args, &args.world_model)?),
    };

    // Local sandboxes share one install on the host; remote ones get pi inside themselves
    // (prebaked by the template recipe, or installed at bootstrap).
    let pi = matches!(plan.harness, Harness::Pi);
    let pi_on_host = pi && args.backend == BackendKind::Local;
    let ledger = Ledger::open(&wmo_e2b::state::state_dir(), &plan.run_id())
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
    let bootstrap = BootstrapOpts {
        hello_timeout: args.hello_timeout,
        pi_modules,
        pi_in_sandbox: pi && !pi_on_host,
        ..BootstrapOpts::default()
    };
    let pool = Arc::new(Pool::new(
        backend,
        plan.pool_config(
            args.template.clone(),
            args.episode_timeout,
            bootstrap,
            !args.no_reuse,
        ),
    ));

    let mode = if args.json {
        ReportMode::Json
    } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ReportMode::Progress
    } else {
        ReportMode::Lines
    };
    let (tx, rx) = crossbeam_channel::unbounded();
    let control = Arc::new(RunControl::new(tx));
    install_ctrl_c(control.clone(), pool.clone())?;
    let reporter = std::thread::Builder::new()
        .name("reporter".into())
        .spawn(move || report::run_reporter(mode, rx))
        .context("cannot start the reporter thread")?;
    let outcome = eval::run(&EvalRun {
        tasks: &plan.tasks,
        skipped: plan.skipped,
        out_dir: &plan.out_dir,
        jobs: usize::from(args.jobs),
        limits: EvalLimits {
            max_turns: args.max_turns,
            max_tool_actions: args.max_tool_actions,
            max_output_tokens: 4096,
            episode_timeout: args.episode_timeout,
            bash_timeout: args.bash_timeout,
            transport_retries: args.transport_retries,
        },
        pool,
        provider,
        harness: plan.harness.clone(),
        world_model,
        skills,
        control,
    });
    // The run closed its events; the reporter drains them (the summary last) and returns.
    let _ = reporter.join();
    Ok(exit_for(outcome?.verdict()))
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
    args.api.provider(model, args.request_timeout)
}

/// The one place a run's verdict becomes an exit code.
fn exit_for(verdict: Verdict) -> Exit {
    match verdict {
        Verdict::Passed => Exit::Success,
        Verdict::TasksFailed => Exit::TasksFailed,
        Verdict::Infrastructure => Exit::Infrastructure,
        Verdict::Interrupted => Exit::Interrupted,
    }
}

/// First Ctrl-C: the run is interrupted (no task starts, running episodes are cancelled,
/// finished results stay on disk, the pool is closed normally). Second: kill every sandbox
/// and exit at once.
fn install_ctrl_c(control: Arc<RunControl>, pool: Arc<Pool>) -> Result<()> {
    let (tx, rx) = crossbeam_channel::bounded::<()>(4);
    ctrlc::set_handler(move || {
        // Never block inside the handler; a full queue means we are already exiting.
        let _ = tx.try_send(());
    })
    .context("cannot install the Ctrl-C handler")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if rx.recv().is_err() {
                return;
            }
            control.interrupt();
            if rx.recv().is_err() {
                return;
            }
            let _ = pool.close();
            std::process::exit(Exit::Interrupted as i32);
        })
        .context("cannot start the signal thread")?;
    Ok(())
}
