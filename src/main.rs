//! The `wmo-e2b` command line: argument parsing and dispatch only.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use wmo_e2b::terminal::{escape, escape_lines};

/// The exit codes every command shares, shown under `wmo-e2b --help`.
const EXIT_CODES: &str = "\
Exit codes:
  0    success (eval: every task passed; report: the run was read, whatever its verdicts)
  1    eval finished but some task failed, errored or was cancelled
  2    bad usage or input: options, the tasks file, a skills directory, an --out another eval is writing to,
       a report directory with no results, an image reference or registries.toml that does not parse,
       a Dockerfile or build context that cannot be read or is past its bounds, a malformed --build-arg
  3    infrastructure failure: a backend that cannot start, a model API that refuses the key
       or does not know the model, results that cannot be written, sandboxes whose kill
       could not be proven, a registry that refuses or fails a pull, an image build that fails
       or times out, no image builder on PATH
  4    eval stopped at a spend cap (--max-cost, --max-tokens, --max-sandbox-seconds)
  130  interrupted (Ctrl-C)
(`project exec` exits with the command's own code.)";

/// Run AI-agent episodes inside sandboxes; the host keeps the credentials and answers every
/// model and tool call.
#[derive(Parser)]
#[command(name = "wmo-e2b", version, about, long_about = None, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a tasks file (JSON Lines) in pooled sandboxes and write results as they finish.
    Eval(Box<commands::eval::EvalArgs>),
    /// Summarize finished eval runs (shards merged), compare with a baseline, export
    /// trajectories in ATIF.
    Report(commands::report::ReportArgs),
    /// Kill sandboxes that dead runs left behind (never one a live run holds).
    Reap(commands::reap::ReapArgs),
    /// Persistent project sandboxes: create, put, get, exec, stage, snapshot, list, close.
    Project(commands::project::ProjectArgs),
    /// List or kill this tool's sandboxes.
    #[command(subcommand)]
    Sandbox(commands::sandbox::SandboxCommand),
    /// Pull or build images into the store shared by every run on this machine, and list
    /// them.
    #[command(subcommand)]
    Image(commands::image::ImageCommand),
    /// Serve the E2B API and envd on one port, backed by local sandboxes (for tests and
    /// the official SDKs).
    Emulator(commands::emulator::EmulatorArgs),
}

fn main() -> ExitCode {
    // A panic's message can quote a task, a harness or a sandbox (an eval task's panic is
    // caught and recorded, but the hook runs first): shown escaped, like all such text.
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let msg = wmo_e2b::errors::panic_message(info.payload());
        eprintln!("panic{at}: {}", escape(msg));
    }));
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Eval(args) => commands::eval::run(*args),
        Command::Report(args) => commands::report::run(args),
        Command::Reap(args) => commands::reap::run(args),
        Command::Sandbox(cmd) => commands::sandbox::run(cmd),
        Command::Project(cmd) => commands::project::run(cmd),
        Command::Emulator(args) => commands::emulator::run(args),
        Command::Image(cmd) => commands::image::run(cmd),
    };
    match result {
        Ok(code) => code.into(),
        Err(err) => {
            // An error can quote a task, a sandbox or a server: escaped like all such text.
            eprintln!("error: {}", escape_lines(&err.to_string()));
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {}", escape_lines(&cause.to_string()));
            }
            commands::exit_code_of(&err).into()
        }
    }
}
