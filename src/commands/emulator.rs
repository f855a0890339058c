//! `wmo-e2b emulator`: serve the E2B API and envd on one port, backed by local sandboxes,
//! until Ctrl-C or SIGTERM; then kill every sandbox it created.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use wmo_e2b::emulator::{Emulator, EmulatorConfig, FaultSpec, Plan, TlsIdentity, DEFAULT_SEED};

use super::{Exit, UsageError};

#[derive(Debug, Args)]
pub struct EmulatorArgs {
    /// Address to listen on; port 0 picks a free one (printed at start).
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    listen: SocketAddr,
    /// The API key clients must send as X-API-Key (E2B_API_KEY); without one a random key
    /// is made and printed. Whoever holds it can run commands as root in every sandbox the
    /// emulator serves, so never use a key a task could guess.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Injected faults, e.g. create-429=0.2,create-503=0.05,drop-stream=0.05,kill-fail=0.1,
    /// create-delay-ms=200, settimeout-429=0.5 (also kill, connect, list, info, network),
    /// create-502-after=0.1, retry-after=1, should-retry=0.
    #[arg(long, value_name = "SPEC", default_value = "")]
    fault: String,
    /// Seed of the fault sequence: the same seed replays the same faults.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Where the local sandboxes live (default: $WMO_E2B_HOME/emulator).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Live sandboxes at once; more creates are answered 429.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_sandboxes: u32,
    /// Template builds running at once; a build started past it is answered 429, as E2B
    /// bounds a team's concurrent builds (default: the CPUs this process may use).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_builds: Option<u32>,
    /// The E2B plan to enforce: hobby (timeouts up to 1 h) or pro (24 h).
    #[arg(long, value_enum, default_value_t = PlanArg::Hobby)]
    plan: PlanArg,
    /// A template a create may name besides `base` (repeatable); any other is answered 404.
    /// Every template runs on the same local sandbox.
    #[arg(long = "template", value_name = "NAME")]
    templates: Vec<String>,
    /// A PEM certificate chain for the sandboxes' hosts (e.g. `*.e2b.app`): with
    /// --tls-key, a client whose HTTPS_PROXY is the emulator reaches
    /// `https://<port>-<id>.<domain>` (a sandbox's port) as it would on E2B.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Local sandboxes starting at once (default: the CPUs this process may use).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    create_concurrency: Option<u16>,
    /// Log every request to stderr.
    #[arg(short, long)]
    verbose: bool,
    /// Print JSON lines on stdout instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PlanArg {
    Hobby,
    Pro,
}

pub fn run(args: EmulatorArgs) -> Result<Exit> {
    let faults: FaultSpec = args
        .fault
        .parse()
        .map_err(|e| UsageError(format!("--fault {:?}: {e}", args.fault)))?;
    let api_key = match args.api_key {
        Some(k) if k.is_empty() => {
            return Err(UsageError("--api-key must not be empty".into()).into())
        }
        Some(k) => k,
        None => format!(
            "e2b_{}",
            wmo_e2b::id::random_hex(20)
                .map_err(|e| anyhow::anyhow!("cannot make a random API key: {e}"))?
        ),
    };
    let state_dir = args
        .state_dir
        .unwrap_or_else(|| wmo_e2b::state::state_dir().join("emulator"));
    let mut config = EmulatorConfig::new(args.listen, api_key.clone(), state_dir);
    config.faults = faults;
    config.seed = args.seed;
    config.max_sandboxes = args.max_sandboxes as usize;
    config.max_builds = args.max_builds.map(|n| n as usize);
    config.create_concurrency = args.create_concurrency.map(usize::from);
    config.plan = match args.plan {
        PlanArg::Hobby => Plan::Hobby,
        PlanArg::Pro => Plan::Pro,
    };
    if let Some(t) = args.templates.iter().find(|t| t.trim().is_empty()) {
        return Err(UsageError(format!("--template {t:?}: a template needs a name")).into());
    }
    config.templates = args.templates;
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = Some(TlsIdentity::load(cert, key).map_err(|e| UsageError(e.to_string()))?);
    }
    if args.verbose {
        // A line names what a client asked for: escaped, so a request cannot drive the
        // terminal.
        config.access_log = Some(Arc::new(|line: &str| {
            eprintln!("emulator: {}", wmo_e2b::terminal::escape(line))
        }));
    }

    // Installed before starting, so a signal can never leave sandboxes behind.
    let (tx, rx) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        // Never block in the handler; a full queue means we are already stopping.
        let _ = tx.try_send(());
    })
    .context("cannot install the Ctrl-C/SIGTERM handler")?;

    let plan = config.plan;
    let emulator = Emulator::start(config).context("cannot start the emulator")?;
    let url = emulator.url();
    if args.json {
        print_json(&Listening {
            kind: "listening",
            url: &url,
            api_key: &api_key,
        });
    } else {
        println!("{url}");
        eprintln!("emulator: serving the E2B API and envd at {url}; Ctrl-C stops it");
        eprintln!(
            "emulator: as a team on the {} plan: timeouts up to {} s (--plan)",
            plan.name(),
            plan.max_timeout_secs()
        );
        eprintln!("emulator: export E2B_API_URL={url} E2B_SANDBOX_URL={url} E2B_API_KEY={api_key}");
    }

    // Blocks until Ctrl-C or SIGTERM (a dropped handler would also end it).
    let _ = rx.recv();
    let report = emulator.stop();
    if args.json {
        print_json(&Stopped {
            kind: "stopped",
            killed: report.killed.len(),
            failed: report
                .failed
                .iter()
                .map(|(id, error)| FailedKill {
                    sandbox_id: id,
                    error,
                })
                .collect(),
        });
    } else {
        eprintln!(
            "emulator: stopped; killed {} sandbox(es)",
            report.killed.len()
        );
        for (id, why) in &report.failed {
            eprintln!("emulator: could not prove that sandbox {id} was killed: {why}");
        }
    }
    Ok(if report.failed.is_empty() {
        Exit::Success
    } else {
        Exit::Infrastructure
    })
}

/// The first `--json` line. A struct, not `json!`, so `type` comes first.
#[derive(Serialize)]
struct Listening<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    url: &'a str,
    api_key: &'a str,
}

/// The last `--json` line.
#[derive(Serialize)]
struct Stopped<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    killed: usize,
    failed: Vec<FailedKill<'a>>,
}

#[derive(Serialize)]
struct FailedKill<'a> {
    sandbox_id: &'a str,
    error: &'a str,
}

fn print_json(value: &impl Serialize) {
    // Plain structs of strings and numbers always serialize.
    if let Ok(line) = serde_json::to_string(value) {
        println!("{line}");
    }
}
