//! `wmo-e2b project ...`: persistent project sandboxes.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Subcommand;
use wmo_e2b::project::session::{self, TurnOptions};
use wmo_e2b::project::{self, Notice, Project, ProjectError};
use wmo_e2b::sandbox::leased::LeasedBackend;
use wmo_e2b::sandbox::ledger::Ledger;
use wmo_e2b::sandbox::Backend;
use wmo_e2b::tree::TreeBounds;

use super::{open_backend_with, BackendKind, Exit, LocalArgs, UsageError};
use wmo_e2b::sandbox::e2b::E2bOptions;
use wmo_e2b::sandbox::local::LocalOptions;

#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Create a project and its sandbox.
    Create {
        name: String,
        #[arg(long, value_enum, default_value = "local")]
        backend: BackendKind,
        #[arg(long)]
        template: Option<String>,
        /// Sandbox lifetime (a later command replaces an expired sandbox from the mirror).
        #[arg(long, default_value = "6h", value_parser = super::bounds::duration)]
        timeout: Duration,
    },
    /// List projects.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Kill the project's sandbox and forget the project.
    Close {
        name: String,
        /// Default: the backend the project was created on.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
    },
    /// Write a file into the project (from --from FILE, or stdin with `--from -`).
    Put {
        name: String,
        path: String,
        #[arg(long, default_value = "-")]
        from: String,
        /// Default: the backend the project was created on.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
    },
    /// Print a file of the project (falls back to the host mirror if the sandbox cannot).
    Get {
        name: String,
        path: String,
        /// Default: the backend the project was created on.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
    },
    /// Run a command with bash in the project workspace; exits with its exit code.
    Exec {
        name: String,
        #[arg(long, default_value = "60s", value_parser = super::bounds::duration)]
        timeout: Duration,
        /// Default: the backend the project was created on.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Write a local directory tree under DEST in the project, validated before any write.
    Stage {
        name: String,
        #[arg(long, value_name = "DIR")]
        from: PathBuf,
        #[arg(long, value_name = "DEST")]
        to: String,
        #[arg(long, default_value_t = 1024)]
        max_files: usize,
        #[arg(long, default_value_t = 8 << 20)]
        max_bytes: u64,
        /// Default: the backend the project was created on.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
    },
    /// Run one agent turn in the project (tools answered on the host; network locked).
    Run {
        name: String,
        #[arg(long)]
        instruction: String,
        /// `scripted` answers with --script FILE's steps; anything else is a model name on
        /// an OpenAI-compatible API.
        #[arg(long, default_value = "scripted")]
        model: String,
        /// For `--model scripted`: a JSON array of model_script steps.
        #[arg(long, value_name = "FILE")]
        script: Option<PathBuf>,
        #[arg(long, default_value = "https://api.openai.com/v1")]
        base_url: String,
        #[arg(long, default_value = "OPENAI_API_KEY")]
        api_key_env: String,
        /// Offer the agent a bash tool (its writes bypass the mirror, so a lost sandbox
        /// fails the turn instead of replaying it).
        #[arg(long)]
        allow_bash: bool,
        /// Project paths the agent may write (repeatable); without it every path is writable.
        #[arg(long, value_name = "PATH")]
        writable: Vec<String>,
        #[arg(long, default_value = "6h", value_parser = super::bounds::duration)]
        timeout: Duration,
        /// Where to append the turn's events (JSON Lines).
        #[arg(long, value_name = "FILE")]
        events: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Default: the backend the project was created on.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
    },
    /// Harvest a project directory as a bounded source tree.
    Snapshot {
        name: String,
        /// Project directory to harvest ("." for the whole workspace).
        dir: String,
        /// Write the tree here (atomically; the directory must not exist yet).
        #[arg(long, value_name = "LOCALDIR", conflicts_with = "json")]
        out: Option<PathBuf>,
        /// Print the files and the tree hash as JSON.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 1024)]
        max_files: usize,
        #[arg(long, default_value_t = 8 << 20)]
        max_bytes: u64,
        /// Default: the backend the project was created on.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
    },
}

fn leased(kind: BackendKind, name: &str, local: &LocalArgs) -> Result<Arc<dyn Backend>> {
    let ledger = Ledger::open(&wmo_e2b::state::state_dir(), &format!("project:{name}"))
        .context("cannot open the lease ledger")?;
    let local = LocalOptions {
        isolation: local.isolation.into(),
        ..LocalOptions::default()
    };
    Ok(Arc::new(LeasedBackend::new(
        open_backend_with(kind, E2bOptions::default(), local)?,
        ledger,
        "project",
    )))
}

/// The backend a project command works on: the one given, else the project's own.
fn backend_of(name: &str, given: Option<BackendKind>) -> BackendKind {
    given.unwrap_or_else(|| {
        let recorded = project::list(&wmo_e2b::state::state_dir())
            .into_iter()
            .find(|p| p.name == name)
            .map(|p| p.backend);
        match recorded.as_deref() {
            Some("e2b") => BackendKind::E2b,
            _ => BackendKind::Local,
        }
    })
}

fn open(kind: Option<BackendKind>, name: &str, local: &LocalArgs) -> Result<Project> {
    let kind = backend_of(name, kind);
    let mut p = Project::open(
        &wmo_e2b::state::state_dir(),
        name,
        leased(kind, name, local)?,
    )
    .map_err(user_facing)?;
    for n in p.take_notices() {
        match n {
            Notice::Replaced { old, new, files } => eprintln!(
                "note: project {name}'s sandbox {old} was gone; created {new} and replayed {files} mirrored file(s) (files written by commands inside the sandbox are lost)"
            ),
        }
    }
    Ok(p)
}

/// Bad paths, names and trees are the user's to fix (exit 2); the rest is infrastructure.
fn user_facing(e: ProjectError) -> anyhow::Error {
    match e {
        ProjectError::BadName(_)
        | ProjectError::Exists(_)
        | ProjectError::NotFound(_)
        | ProjectError::WrongBackend { .. }
        | ProjectError::BadPath { .. }
        | ProjectError::Missing { .. }
        | ProjectError::Tree(_)
        | ProjectError::Snapshot(_) => UsageError(wmo_e2b::errors::error_chain(&e)).into(),
        other => anyhow::Error::new(other),
    }
}

/// `wmo-e2b project [--isolation ...] <command>`.
#[derive(Debug, clap::Args)]
pub struct ProjectArgs {
    #[command(flatten)]
    local: LocalArgs,
    #[command(subcommand)]
    command: ProjectCommand,
}

pub fn run(args: ProjectArgs) -> Result<Exit> {
    let state = wmo_e2b::state::state_dir();
    let local = args.local;
    match args.command {
        ProjectCommand::Create {
            name,
            backend,
            template,
            timeout,
        } => {
            let p = Project::create(
                &state,
                &name,
                leased(backend, &name, &local)?,
                template,
                timeout,
            )
            .map_err(user_facing)?;
            println!("created project {name} (sandbox {})", p.state().sandbox_id);
        }
        ProjectCommand::List { json } => {
            let all = project::list(&state);
            if json {
                println!("{}", serde_json::to_string(&all)?);
            } else if all.is_empty() {
                println!("no projects");
            } else {
                println!(
                    "{:<24}  {:<7}  {:<24}  replaced",
                    "project", "backend", "sandbox"
                );
                for p in all {
                    println!(
                        "{:<24}  {:<7}  {:<24}  {}",
                        p.name, p.backend, p.sandbox_id, p.replacements
                    );
                }
            }
        }
        ProjectCommand::Close { name, backend } => {
            let p = open(backend, &name, &local)?;
            let id = p.state().sandbox_id.clone();
            p.close().map_err(user_facing)?;
            println!("closed project {name} (sandbox {id} killed)");
        }
        ProjectCommand::Put {
            name,
            path,
            from,
            backend,
        } => {
            let content = if from == "-" {
                let mut buf = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut buf)
                    .context("cannot read stdin")?;
                buf
            } else {
                std::fs::read(&from).with_context(|| format!("cannot read {from}"))?
            };
            let mut p = open(backend, &name, &local)?;
            let rel = p.put(&path, &content).map_err(user_facing)?;
            eprintln!("wrote {} bytes to {rel}", content.len());
        }
        ProjectCommand::Get {
            name,
            path,
            backend,
        } => {
            let mut p = open(backend, &name, &local)?;
            let bytes = p.get(&path).map_err(user_facing)?;
            std::io::stdout().write_all(&bytes)?;
        }
        ProjectCommand::Exec {
            name,
            timeout,
            backend,
            command,
        } => {
            let p = open(backend, &name, &local)?;
            let out = p.exec(&command.join(" "), timeout).map_err(user_facing)?;
            print!("{}", out.output);
            if out.timed_out {
                eprintln!("[timed out after {}s]", timeout.as_secs());
            }
            // The command's own exit code is ours (a signal reads as 128 + 9, as in a shell).
            let code = out.exit_code.unwrap_or(137);
            std::io::stdout().flush()?;
            std::process::exit(code);
        }
        ProjectCommand::Stage {
            name,
            from,
            to,
            max_files,
            max_bytes,
            backend,
        } => {
            let mut p = open(backend, &name, &local)?;
            let bounds = TreeBounds {
                max_files,
                max_bytes,
                ..TreeBounds::default()
            };
            let n = p.stage(&from, &to, bounds).map_err(user_facing)?;
            println!("staged {n} file(s) under {to}");
        }
        ProjectCommand::Run {
            name,
            instruction,
            model,
            script,
            base_url,
            api_key_env,
            allow_bash,
            writable,
            timeout,
            events,
            json,
            backend,
        } => {
            let provider: Arc<dyn wmo_e2b::provider::Provider> = match (&script, model.as_str()) {
                (Some(path), "scripted") => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    let steps: Vec<wmo_e2b::task::ScriptStep> = serde_json::from_str(&text)
                        .map_err(|e| UsageError(format!("{}: {e}", path.display())))?;
                    Arc::new(wmo_e2b::provider::scripted::FixedScript(steps))
                }
                _ => {
                    super::make_provider(&model, &base_url, &api_key_env, Duration::from_secs(120))?
                }
            };
            let writable = if writable.is_empty() {
                None
            } else {
                Some(
                    writable
                        .iter()
                        .map(|p| project::project_path(p))
                        .collect::<Result<_, _>>()
                        .map_err(user_facing)?,
                )
            };
            let mut p = open(backend, &name, &local)?;
            let events_path = events.unwrap_or_else(|| {
                project::projects_dir(&state).join(&name).join(format!(
                    "events-{}.jsonl",
                    wmo_e2b::sandbox::ledger::unix_now()
                ))
            });
            let mut log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&events_path)
                .with_context(|| format!("cannot open {}", events_path.display()))?;
            let opts = TurnOptions {
                instruction,
                allow_bash,
                writable,
                timeout,
                ..TurnOptions::default()
            };
            let cancel = wmo_e2b::cancel::CancelToken::new();
            let result = session::run_turn(&mut p, provider.as_ref(), &opts, &cancel, &mut log);
            for n in p.take_notices() {
                let Notice::Replaced { old, new, files } = n;
                eprintln!("note: the turn moved from sandbox {old} to {new} ({files} mirrored file(s) replayed)");
            }
            let r = result.context("the project turn failed")?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"result": r, "events": events_path})
                );
            } else {
                match &r.answer {
                    Some(a) => println!("{a}"),
                    None => eprintln!("the agent ended without submitting ({})", r.reason),
                }
                eprintln!("events: {}", events_path.display());
            }
        }
        ProjectCommand::Snapshot {
            name,
            dir,
            out,
            json,
            max_files,
            max_bytes,
            backend,
        } => {
            let p = open(backend, &name, &local)?;
            let bounds = TreeBounds {
                max_files,
                max_bytes,
                ..TreeBounds::default()
            };
            let snap = p.snapshot(&dir, bounds).map_err(user_facing)?;
            if json {
                let files: Vec<serde_json::Value> = snap
                    .files
                    .iter()
                    .map(|(path, content)| serde_json::json!({"path": path, "content": content}))
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"files": files, "tree_hash": snap.tree_hash(),
                                       "total_bytes": snap.total_bytes()})
                );
            } else {
                if let Some(out) = &out {
                    snap.write_to(out).with_context(|| {
                        format!("cannot write the snapshot to {}", out.display())
                    })?;
                }
                for path in snap.files.keys() {
                    println!("{path}");
                }
                eprintln!(
                    "{} file(s), {} bytes, tree hash {}",
                    snap.files.len(),
                    snap.total_bytes(),
                    snap.tree_hash()
                );
            }
        }
    }
    Ok(Exit::Success)
}
