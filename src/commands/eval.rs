//! `wmo-e2b eval`: options, wiring, Ctrl-C, and the final summary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use wmo_e2b::eval::environments::{BuildOptions, TemplatePlan};
use wmo_e2b::eval::plan::{self, EvalOptions, PlanError};
use wmo_e2b::eval::provenance::{self, Provenance, TasksFile};
use wmo_e2b::eval::shard;
use wmo_e2b::eval::templates::E2bTemplates;
use wmo_e2b::eval::{
    self, Environments, EvalLimits, EvalRun, Harness, RunControl, Verdict, VerifierMode,
};
use wmo_e2b::image::{RegistryConfig, Store};
use wmo_e2b::pool::Pool;
use wmo_e2b::provider::metered::Metered;
use wmo_e2b::provider::Provider;
use wmo_e2b::report::{self, ReportMode};
use wmo_e2b::runner::node_layer::NodeLayer;
use wmo_e2b::runner::BootstrapOpts;
use wmo_e2b::sandbox::e2b::E2bBackend;
use wmo_e2b::sandbox::leased::LeasedBackend;
use wmo_e2b::sandbox::ledger::Ledger;
use wmo_e2b::sandbox::limits::{self, Limits};
use wmo_e2b::sandbox::{Backend, Network};

use super::{
    local_network, open_local, BackendKind, Exit, LocalArgs, ModelApiArgs, NetworkArg, UsageError,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvKind {
    Sandbox,
    WorldModel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifierKind {
    Same,
    Separate,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Tasks file (JSON Lines, one task per line), or a Harbor task directory, or a
    /// directory of them (a dataset).
    #[arg(long, value_name = "FILE|DIR")]
    tasks: PathBuf,
    /// The image every task that names no environment runs on (an OCI reference).
    #[arg(long, value_name = "REF")]
    image: Option<String>,
    /// A build argument (`NAME=VALUE`) for every Dockerfile the tasks name; repeatable.
    #[arg(long = "build-arg", value_name = "NAME=VALUE")]
    build_args: Vec<String>,
    /// The reward a verifier's reward file must reach for its task to pass.
    #[arg(long, value_name = "X", default_value_t = 1.0, value_parser = super::bounds::amount)]
    pass_threshold: f64,
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
    /// Time limit of each attempt of an E2B control-plane call, creates included (e2b).
    #[arg(long, default_value = "60s", value_parser = super::bounds::duration)]
    e2b_api_timeout: Duration,
    /// `scripted` replays each task's model_script; anything else is a model name sent to an
    /// OpenAI-compatible chat-completions API.
    #[arg(long, default_value = "scripted")]
    model: String,
    #[command(flatten)]
    api: ModelApiArgs,
    /// Tasks running at once.
    #[arg(short = 'j', long = "jobs", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    jobs: u16,
    /// Output directory (default: runs/<UTC timestamp>); with --shard, the directory the
    /// shards share: each writes DIR/shard-I-of-N/.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Skip tasks already finished in DIR/results.jsonl (needs --out; with --shard, the
    /// shard's own directory's).
    #[arg(long)]
    resume: bool,
    /// Run only the tasks whose stable id hash falls in shard I of N (0-based), e.g. 0/4;
    /// `auto` or `auto/N` takes I (and N) from a Kubernetes Indexed Job
    /// (JOB_COMPLETION_INDEX, N from auto/N), a Slurm job array (SLURM_ARRAY_TASK_ID,
    /// _MIN, _COUNT) or an AWS Batch array job (AWS_BATCH_JOB_ARRAY_INDEX).
    #[arg(long, value_name = "I/N|auto|auto/N")]
    shard: Option<String>,
    /// Runs of each task, each in a clean sandbox with an episode of its own (`report`
    /// shows pass@1 to pass@K); with --resume, only the attempts not yet finished run.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(wmo_e2b::eval::schedule::MAX_ATTEMPTS)))]
    attempts: u32,
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
    /// Off a terminal (and with --json, as events): a line this often saying what every
    /// running task is doing.
    #[arg(long, default_value = "30s", value_parser = super::bounds::duration)]
    heartbeat: Duration,
    /// Time limit of one bash tool call.
    #[arg(long, default_value = "120s", value_parser = super::bounds::duration)]
    bash_timeout: Duration,
    /// Time limit of a task's verify, unless the task sets verify_timeout_s.
    #[arg(long, default_value = "300s", value_parser = super::bounds::duration)]
    verify_timeout: Duration,
    /// How long a new runner may take to say hello.
    #[arg(long, default_value = "60s", value_parser = super::bounds::duration)]
    hello_timeout: Duration,
    /// Per-request timeout of model API calls.
    #[arg(long, default_value = "120s", value_parser = super::bounds::duration)]
    request_timeout: Duration,
    /// What runs in the runner: `builtin` (its own tool-calling loop), `pi` (the real pi
    /// agent loop, its npm packages bundled into one file once, in a cache under the state
    /// dir, and that file sent to sandboxes), `oracle` (each task's reference solution, no
    /// model), `nop` (submits at once, no model), `agent:NAME` (a known agent, `claude-code`, `codex`
    /// or `mini-swe-agent`, installed from its package once and run as a process of the task, its model
    /// calls served by the runner), `cmd:COMMAND` (any agent so run, given the same
    /// endpoint variables), or a directory holding `agent.mjs` that exports
    /// `runEpisode(ctx)` (sent with every episode).
    #[arg(
        long,
        default_value = "builtin",
        value_name = "builtin|pi|oracle|nop|agent:NAME|cmd:COMMAND|DIR"
    )]
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
    /// Where `verify` runs once the agent is stopped: `same` (its sandbox, as the verifier)
    /// or `separate` (a fresh sandbox with the workspace copied in, so nothing the agent left
    /// runs before the tests look at it).
    #[arg(long, value_enum, default_value = "same")]
    verifier: VerifierKind,
    #[command(flatten)]
    caps: super::eval_spend::CapArgs,
    /// With --resume: add to results made with another harness, runner or model.
    #[arg(long, requires = "resume")]
    allow_mixed: bool,
    #[command(flatten)]
    local: LocalArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// What sandboxes reach: `none` (loopback only), `internet` (outbound through a
    /// user-mode network stack, never the host's loopback or another sandbox), `host` (the
    /// host's network itself: no boundary) [default: internet where slirp4netns is
    /// installed and wmo-e2b runs as root with bwrap, else none; e2b: internet]. A task's
    /// `network` may only narrow it.
    #[arg(long, value_enum)]
    network: Option<NetworkArg>,
}

/// What each task's sandbox may take of the host (local backend; E2B's template decides
/// there). 0 leaves a resource unbounded; a task's `limits` may only lower them.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Memory of a sandbox in MiB, the tmpfs pages it writes (/dev/shm) included.
    #[arg(long, value_name = "MIB", default_value_t = limits::DEFAULT_MEMORY_MB)]
    limit_memory_mb: u64,
    /// Processes (threads included) a sandbox may run at once.
    #[arg(long, value_name = "N", default_value_t = limits::DEFAULT_PIDS)]
    limit_pids: u64,
    /// CPUs' worth of time a sandbox may use (e.g. 0.5, 2).
    #[arg(long, value_name = "N", default_value_t = limits::DEFAULT_CPUS)]
    limit_cpus: f64,
    /// MiB a sandbox's home and /tmp may hold.
    #[arg(long, value_name = "MIB", default_value_t = limits::DEFAULT_DISK_MB)]
    limit_disk_mb: u64,
}

impl LimitArgs {
    fn limits(&self) -> Result<Limits, UsageError> {
        let set = |v: u64| (v > 0).then_some(v);
        let l = Limits {
            memory_mb: set(self.limit_memory_mb),
            pids: set(self.limit_pids),
            cpus: (self.limit_cpus != 0.0).then_some(self.limit_cpus),
            disk_mb: set(self.limit_disk_mb),
        };
        l.check().map_err(|(field, why)| {
            UsageError(format!("--limit-{}: {why}", field.replace('_', "-")))
        })?;
        Ok(l)
    }
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
    let sandbox_limits = args.limits.limits()?;
    let build_args = wmo_e2b::image::build_key::parse_build_args(&args.build_args)?;
    let skills = super::load_skills(args.skills.as_deref())?;
    let shard = args
        .shard
        .as_deref()
        .map(|s| shard::resolve(shard::parse(s)?, &shard::engine_env()))
        .transpose()
        .map_err(|e| UsageError(e.to_string()))?;
    let mut plan = plan::plan(&EvalOptions {
        tasks_file: args.tasks.clone(),
        out: args.out.clone(),
        resume: args.resume,
        shard,
        harness: args.harness.clone(),
        attempts: args.attempts,
        image: args.image.clone(),
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
    if plan.harness.is_scripted() && args.model != "scripted" {
        return Err(UsageError(format!(
            "--harness {} asks no model: leave --model out",
            plan.harness.name()
        ))
        .into());
    }
    let spend = super::eval_spend::spend_plan(&args.caps, args.backend, &args.model)?;
    super::eval_spend::check_task_costs(&spend, &plan.tasks)?;
    // Every model call goes through the run's meter, so caps see running tasks' tokens.
    let metered = |p: Arc<dyn Provider>| -> Arc<dyn Provider> {
        Arc::new(Metered {
            inner: p,
            meter: spend.meter.clone(),
        })
    };
    let provider = metered(make_provider(&args, &args.model)?);
    let world_model = match args.environment {
        EnvKind::Sandbox => None,
        EnvKind::WorldModel => Some(metered(make_provider(&args, &args.world_model)?)),
    };

    // The host builds pi's bundle once; local sandboxes see it through a read-only mount,
    // remote ones get it placed at bootstrap (a template's baked copy, or an upload).
    let pi = match plan.harness {
        Harness::Pi => Some(
            wmo_e2b::runner::pi::ensure_installed(&wmo_e2b::state::state_dir())
                .context("cannot build the pi agent bundle")?,
        ),
        _ => None,
    };
    let agent = super::eval_agent::install(&mut plan.harness, &args.model)?;
    let ledger = Ledger::open(&wmo_e2b::state::state_dir(), &plan.run_id())
        .context("cannot open the lease ledger")?;
    // On E2B, the backend that makes templates of the tasks' images.
    let mut e2b: Option<Arc<E2bBackend>> = None;
    // pi and an agent's install: seen through a mount locally, placed by the bootstrap on E2B.
    let (inner, pi_shipment, agent_ship, network): (Arc<dyn Backend>, _, _, _) = match args.backend
    {
        BackendKind::Local => {
            let mut local = args.local.options();
            if let Some(install) = &pi {
                local.system_read_only.push(install.local_mount());
            }
            if let Some(install) = &agent {
                local
                    .everyone_read_only
                    .push((install.dir.clone(), install.recipe.sandbox_dir()));
            }
            let backend = open_local(local)?;
            super::eval_agent::point_at_install(
                &mut plan.harness,
                agent.as_ref(),
                backend.isolation(),
            );
            if let Some(why) = backend.limits_unavailable() {
                eprintln!("warning: {why}");
            }
            let shipment = pi.as_ref().map(|i| i.local_shipment(backend.isolation()));
            let network = local_network(args.network, backend.network_unavailable())?;
            (backend, shipment, None, network)
        }
        // E2B's sandboxes are microVMs of their own: internet or not is all there is.
        BackendKind::E2b => {
            let backend = E2bBackend::from_env(e2b_options(&args))
                .map_err(|e| UsageError(format!("cannot use the e2b backend: {e}")))?;
            e2b = Some(backend.clone());
            (
                backend as Arc<dyn Backend>,
                pi.as_ref().map(|i| i.placed_shipment()),
                super::eval_agent::ship(&mut plan.harness, agent.as_ref())?,
                args.network.map_or(Network::Internet, Network::from),
            )
        }
    };
    let environments = make_environments(&args, &plan, &build_args, e2b.as_deref())?;
    let pi_digest = pi.as_ref().map(|i| i.bundle.digest());
    let provenance = run_provenance(&args, &plan, pi_digest.as_deref(), skills.as_deref())?;
    // Every sandbox of the run is leased before it is created.
    let backend: Arc<dyn Backend> = Arc::new(LeasedBackend::new(inner, ledger, "eval"));
    let bootstrap = BootstrapOpts {
        hello_timeout: args.hello_timeout,
        pi: pi_shipment,
        agent: agent_ship,
        ..BootstrapOpts::default()
    };
    let mut pool_config = plan.pool_config(
        args.template.clone(),
        args.episode_timeout,
        bootstrap,
        !args.no_reuse,
    );
    pool_config.spec.limits = sandbox_limits;
    pool_config.spec.internet = network != Network::None;
    pool_config.spec.network = network;
    let pool = Arc::new(Pool::new(backend, pool_config));

    let mode = if args.json {
        ReportMode::Json
    } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ReportMode::Progress
    } else {
        ReportMode::Lines
    };
    let heartbeat = args.heartbeat.max(Duration::from_secs(1));
    let (tx, rx) = crossbeam_channel::unbounded();
    let control = Arc::new(RunControl::new(tx));
    install_ctrl_c(control.clone(), pool.clone())?;
    let reporter = std::thread::Builder::new()
        .name("reporter".into())
        .spawn(move || report::run_reporter(mode, heartbeat, rx))
        .context("cannot start the reporter thread")?;
    let outcome = eval::run(&EvalRun {
        tasks: &plan.tasks,
        already_finished: plan.already_finished,
        attempts: &plan.attempts,
        out_dir: &plan.out_dir,
        jobs: usize::from(args.jobs),
        limits: EvalLimits {
            max_turns: args.max_turns,
            max_tool_actions: args.max_tool_actions,
            max_output_tokens: 4096,
            episode_timeout: args.episode_timeout,
            bash_timeout: args.bash_timeout,
            verify_timeout: args.verify_timeout,
            transport_retries: args.transport_retries,
            sandbox: sandbox_limits,
            network,
            pass_threshold: args.pass_threshold,
        },
        pool,
        provider,
        harness: plan.harness.clone(),
        world_model,
        skills,
        control,
        spend,
        provenance,
        environments: &environments,
        verifier: match args.verifier {
            VerifierKind::Same => VerifierMode::Same,
            VerifierKind::Separate => VerifierMode::Separate,
        },
    });
    // The run closed its events; the reporter drains them (the summary last) and returns.
    let _ = reporter.join();
    Ok(exit_for(outcome?.verdict()))
}

fn e2b_options(args: &EvalArgs) -> wmo_e2b::sandbox::e2b::E2bOptions {
    let mut o = wmo_e2b::sandbox::e2b::E2bOptions {
        create_rate: args.create_rate,
        max_sandboxes: args.max_sandboxes,
        api_timeout: args.e2b_api_timeout,
        ..Default::default()
    };
    if let Some(t) = &args.template {
        o.template = t.clone();
    }
    o
}

/// The images the tasks run on, pulled or built and unpacked before any sandbox starts, or
/// on E2B each made into a template; build logs go to `<out>/builds/`.
fn make_environments(
    args: &EvalArgs,
    plan: &plan::EvalPlan,
    build_args: &[(String, String)],
    e2b: Option<&E2bBackend>,
) -> Result<Environments> {
    if plan.images.is_empty() {
        return Ok(Environments::default());
    }
    let store = Store::open_default().context("cannot open the image store")?;
    let config = RegistryConfig::load_default()?;
    let log_dir = plan.out_dir.join("builds");
    eprintln!("preparing {} environment(s)", plan.images.len());
    if let Some(e2b) = e2b {
        let records = wmo_e2b::state::state_dir().join("e2b-templates");
        // The runner's Node.js goes into every template, so any image can run it.
        let node = NodeLayer::of_host().context("cannot carry Node.js into the templates")?;
        let maker = E2bTemplates {
            e2b,
            node: &node,
            records: &records,
            log_dir: &log_dir,
        };
        let template_for = |plan: &TemplatePlan| maker.make(plan);
        return Ok(Environments::make_templates(
            &plan.images,
            args.image.as_deref(),
            &store,
            &config,
            build_args,
            &template_for,
        )?);
    }
    let build = BuildOptions {
        args: build_args,
        log_dir: &log_dir,
    };
    Ok(Environments::make(
        &plan.images,
        args.image.as_deref(),
        &store,
        &config,
        &build,
    )?)
}

/// What produces this run's results; with `--resume`, refuses to add them to results made
/// by another harness, runner or model unless `--allow-mixed`.
fn run_provenance(
    args: &EvalArgs,
    plan: &plan::EvalPlan,
    pi_digest: Option<&str>,
    skills: Option<&wmo_e2b::skills::SkillSet>,
) -> Result<Provenance> {
    let tasks_digest = match plan.tasks.held_digest() {
        Some(digest) => digest.to_string(),
        None => wmo_e2b::digest::sha256_file(&args.tasks)
            .with_context(|| format!("cannot read {}", args.tasks.display()))?,
    };
    let (harness, harness_digest) = provenance::harness_of(&plan.harness, pi_digest);
    let scripted = args.model == "scripted";
    let p = Provenance {
        wmo_e2b: env!("CARGO_PKG_VERSION").to_string(),
        runner: wmo_e2b::runner::assets::runner_digest(),
        harness,
        harness_digest,
        environment: match args.environment {
            EnvKind::Sandbox => "sandbox",
            EnvKind::WorldModel => "world-model",
        }
        .to_string(),
        backend: match args.backend {
            BackendKind::Local => "local",
            BackendKind::E2b => "e2b",
        }
        .to_string(),
        template: (args.backend == BackendKind::E2b).then(|| e2b_options(args).template),
        model: args.model.clone(),
        provider_host: (!scripted)
            .then(|| provenance::url_host(&args.api.effective_base_url()))
            .flatten(),
        skills: skills.map(|s| format!("sha256:{}", s.digest())),
        tasks_file: TasksFile {
            sha256: tasks_digest,
            line: None,
        },
        image: None,
    };
    // Only results that are kept can be mixed with: those `--resume` runs again are not.
    if !args.allow_mixed {
        let earlier = plan.resumed_provenance.as_ref();
        if let Some((field, then, now)) = earlier.and_then(|e| p.mismatch(e)) {
            return Err(UsageError(format!(
                "--resume would mix results: those in {} were made with {field} {then}, this run's is {now}; use another --out, or --allow-mixed to mix them",
                plan.out_dir.display()
            ))
            .into());
        }
    }
    Ok(p)
}

fn make_provider(args: &EvalArgs, model: &str) -> Result<Arc<dyn Provider>> {
    args.api.provider(model, args.request_timeout)
}

/// The one place a run's verdict becomes an exit code.
fn exit_for(verdict: Verdict) -> Exit {
    match verdict {
        Verdict::Passed => Exit::Success,
        Verdict::TasksFailed => Exit::TasksFailed,
        Verdict::BudgetStopped => Exit::BudgetStopped,
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
