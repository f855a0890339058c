//! `wmo-e2b project ...`: persistent project sandboxes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Subcommand;
use wmo_e2b::project::{self, Notice, OnIdle, Project, ProjectError, ProjectState};
use wmo_e2b::sandbox::leased::LeasedBackend;
use wmo_e2b::sandbox::ledger::Ledger;
use wmo_e2b::sandbox::{shell_quote, Backend, ErrorClass, Killed, Network, PauseKind, Paused};
use wmo_e2b::tree::TreeBounds;

use super::{
    local_network, open_backend_with, BackendKind, Exit, LocalArgs, NetworkArg, UsageError,
};
use wmo_e2b::sandbox::e2b::E2bOptions;
use wmo_e2b::state::state_dir;
use wmo_e2b::terminal::escape;

mod turn;
use turn::{run_turn, RunArgs};

#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Create a project and its sandbox.
    Create {
        name: String,
        #[arg(long, value_enum, default_value = "local")]
        backend: BackendKind,
        #[arg(long)]
        template: Option<String>,
        /// How long the sandbox stays up after the last project command before --on-idle
        /// applies (with `kill`, its whole lifetime; a later command then replaces it from
        /// the mirror).
        #[arg(long, default_value = "1h", value_parser = super::bounds::duration)]
        timeout: Duration,
        /// What the idle sandbox does: `pause` keeps memory and files (processes continue on
        /// the next command), `pause-filesystem` keeps the files only, `kill` ends it.
        /// Default: `pause`, or `pause-filesystem` where a memory pause cannot be had (a
        /// local sandbox without bwrap).
        #[arg(long, value_enum)]
        on_idle: Option<IdleArg>,
        /// What the sandbox reaches: `none`, `internet` or `host`, as for eval [default:
        /// internet where it works here, else none; e2b: internet].
        #[arg(long, value_enum)]
        network: Option<NetworkArg>,
    },
    /// Pause the project's sandbox now (the next project command resumes it).
    Pause {
        name: String,
        /// Keep only the files: processes end, and the resume is a fresh start.
        #[arg(long)]
        filesystem_only: bool,
        /// Default: the backend the project was created on.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
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
    /// Run a command in the project workspace (`-- PROGRAM ARGS...`, passed as given, or
    /// `--shell 'STRING'` for bash); exits with its exit code.
    Exec {
        name: String,
        #[arg(long, default_value = "60s", value_parser = super::bounds::duration)]
        timeout: Duration,
        /// Default: the backend the project was created on.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
        /// A string for bash to run, instead of a program and its arguments.
        #[arg(long, value_name = "STRING", conflicts_with = "command")]
        shell: Option<String>,
        #[arg(
            last = true,
            required_unless_present = "shell",
            value_name = "PROGRAM ARGS"
        )]
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
    Run(Box<RunArgs>),
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

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum IdleArg {
    Pause,
    PauseFilesystem,
    Kill,
}

impl From<IdleArg> for OnIdle {
    fn from(a: IdleArg) -> OnIdle {
        match a {
            IdleArg::Pause => OnIdle::Pause,
            IdleArg::PauseFilesystem => OnIdle::PauseFilesystem,
            IdleArg::Kill => OnIdle::Kill,
        }
    }
}

fn leased(kind: BackendKind, name: &str, local: &LocalArgs) -> Result<Arc<dyn Backend>> {
    let ledger = Ledger::open(&state_dir(), &format!("project:{name}"))
        .context("cannot open the lease ledger")?;
    Ok(Arc::new(LeasedBackend::new(
        unleased(kind, local)?,
        ledger,
        "project",
    )))
}

/// The backend itself, for what creates nothing (looking a sandbox up).
fn unleased(kind: BackendKind, local: &LocalArgs) -> Result<Arc<dyn Backend>> {
    open_backend_with(kind, E2bOptions::default(), local.options())
}

/// The backend a project recorded by name.
fn kind_named(recorded: &str) -> BackendKind {
    match recorded {
        "e2b" => BackendKind::E2b,
        _ => BackendKind::Local,
    }
}

/// The backend a project command works on: the one given, else the project's own.
fn backend_of(name: &str, given: Option<BackendKind>) -> BackendKind {
    given.unwrap_or_else(|| {
        project::list(&state_dir())
            .into_iter()
            .find(|p| p.name == name)
            .map_or(BackendKind::Local, |p| kind_named(&p.backend))
    })
}

fn open(kind: Option<BackendKind>, name: &str, local: &LocalArgs) -> Result<Project> {
    let kind = backend_of(name, kind);
    let mut p =
        Project::open(&state_dir(), name, leased(kind, name, local)?).map_err(user_facing)?;
    for n in p.take_notices() {
        match n {
            Notice::Replaced { old, new, files } => eprintln!(
                "note: project {name}'s sandbox {} was gone; created {} and replayed {files} mirrored file(s) (files written by commands inside the sandbox are lost)",
                escape(&old),
                escape(&new)
            ),
            Notice::Resumed { id } => eprintln!(
                "note: resumed project {name}'s paused sandbox {}",
                escape(&id)
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
        // A path the sandbox refuses (through a symlink, say), or options this host cannot
        // honour together: the user's to change, and the message says what.
        ProjectError::Sandbox { ref source, .. }
            if matches!(
                source.class(),
                ErrorClass::BadRequest | ErrorClass::Unsupported
            ) =>
        {
            UsageError(wmo_e2b::errors::error_chain(&e)).into()
        }
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
    let local = &args.local;
    match args.command {
        ProjectCommand::Create {
            name,
            backend,
            template,
            timeout,
            on_idle,
            network,
        } => create(
            &name,
            backend,
            template,
            timeout,
            on_idle.map(OnIdle::from),
            network,
            local,
        ),
        ProjectCommand::Pause {
            name,
            filesystem_only,
            backend,
        } => pause(&name, filesystem_only, backend, local),
        ProjectCommand::List { json } => list(json, local),
        ProjectCommand::Close { name, backend } => close(&name, backend, local),
        ProjectCommand::Put {
            name,
            path,
            from,
            backend,
        } => put(&name, &path, &from, backend, local),
        ProjectCommand::Get {
            name,
            path,
            backend,
        } => get(&name, &path, backend, local),
        ProjectCommand::Exec {
            name,
            timeout,
            backend,
            shell,
            command,
        } => {
            // Each argument as given: quoted for the shell that runs the line.
            let line = shell.unwrap_or_else(|| {
                let words: Vec<String> = command.iter().map(|a| shell_quote(a)).collect();
                words.join(" ")
            });
            exec(&name, &line, timeout, backend, local)
        }
        ProjectCommand::Stage {
            name,
            from,
            to,
            max_files,
            max_bytes,
            backend,
        } => {
            let bounds = tree_bounds(max_files, max_bytes);
            stage(&name, &from, &to, bounds, backend, local)
        }
        ProjectCommand::Run(run) => run_turn(*run, local),
        ProjectCommand::Snapshot {
            name,
            dir,
            out,
            json,
            max_files,
            max_bytes,
            backend,
        } => {
            let bounds = tree_bounds(max_files, max_bytes);
            snapshot(&name, &dir, out.as_deref(), json, bounds, backend, local)
        }
    }
}

fn tree_bounds(max_files: usize, max_bytes: u64) -> TreeBounds {
    TreeBounds {
        max_files,
        max_bytes,
        ..TreeBounds::default()
    }
}

fn create(
    name: &str,
    backend: BackendKind,
    template: Option<String>,
    timeout: Duration,
    on_idle: Option<OnIdle>,
    network: Option<NetworkArg>,
    local: &LocalArgs,
) -> Result<Exit> {
    let network = match backend {
        BackendKind::Local => local_network(
            network,
            wmo_e2b::sandbox::local::network_unavailable(local.isolation.into()),
        )?,
        BackendKind::E2b => network.map_or(Network::Internet, Network::from),
    };
    let make = |on_idle| {
        Project::create_with_network(
            &state_dir(),
            name,
            leased(backend, name, local)?,
            template.clone(),
            timeout,
            on_idle,
            network,
        )
        .map_err(anyhow::Error::from)
    };
    let p = match on_idle {
        Some(asked) => make(asked),
        None => match make(OnIdle::Pause) {
            // The default only: a memory pause this backend cannot do (a local sandbox
            // without namespaces) falls back to keeping the files.
            Err(e) if memory_pause_unsupported(&e) => {
                eprintln!(
                    "note: a memory pause is not available here; project {name} pauses with its files only when idle (--on-idle pause-filesystem)"
                );
                make(OnIdle::PauseFilesystem)
            }
            other => other,
        },
    }
    .map_err(|e| match e.downcast::<ProjectError>() {
        Ok(e) => user_facing(e),
        Err(e) => e,
    })?;
    println!(
        "created project {name} (sandbox {})",
        escape(&p.state().sandbox_id)
    );
    Ok(Exit::Success)
}

fn memory_pause_unsupported(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<ProjectError>(),
        Some(ProjectError::Sandbox { source, .. }) if source.class() == ErrorClass::Unsupported
    )
}

fn pause(
    name: &str,
    filesystem_only: bool,
    backend: Option<BackendKind>,
    local: &LocalArgs,
) -> Result<Exit> {
    let kind = if filesystem_only {
        PauseKind::Filesystem
    } else {
        PauseKind::Memory
    };
    let backend = leased(backend_of(name, backend), name, local)?;
    let outcome =
        Project::pause(&state_dir(), name, backend.as_ref(), kind).map_err(user_facing)?;
    match outcome {
        Some(Paused::Now) => println!("paused project {name}"),
        Some(Paused::AlreadyPaused) => println!("project {name} was paused already"),
        None => println!(
            "project {name}'s sandbox is gone; the next command replaces it from the mirror"
        ),
    }
    Ok(Exit::Success)
}

fn list(json: bool, local: &LocalArgs) -> Result<Exit> {
    let all = project::list(&state_dir());
    // Each kind of backend opened once, and only if a project lives on it.
    let mut backends: Vec<(BackendKind, Option<Arc<dyn Backend>>)> = Vec::new();
    let states: Vec<&'static str> = all
        .iter()
        .map(|p| {
            let kind = kind_named(&p.backend);
            let backend = match backends.iter().find(|(k, _)| *k == kind) {
                Some((_, b)) => b.clone(),
                None => {
                    let b = unleased(kind, local).ok();
                    backends.push((kind, b.clone()));
                    b
                }
            };
            sandbox_state(p, backend.as_deref())
        })
        .collect();
    if json {
        let rows: Vec<serde_json::Value> = all
            .iter()
            .zip(&states)
            .map(|(p, state)| {
                let mut v = serde_json::to_value(p).unwrap_or_default();
                v["sandbox_state"] = serde_json::json!(state);
                v
            })
            .collect();
        println!("{}", serde_json::to_string(&rows)?);
    } else if all.is_empty() {
        println!("no projects");
    } else {
        println!(
            "{:<24}  {:<7}  {:<24}  {:<8}  replaced",
            "project", "backend", "sandbox", "state"
        );
        for (p, state) in all.iter().zip(&states) {
            println!(
                "{:<24}  {:<7}  {:<24}  {:<8}  {}",
                p.name,
                p.backend,
                escape(&p.sandbox_id),
                state,
                p.replacements
            );
        }
    }
    Ok(Exit::Success)
}

/// `running`, `paused`, `gone`, or `unknown` when the backend cannot be asked.
fn sandbox_state(p: &ProjectState, backend: Option<&dyn Backend>) -> &'static str {
    match backend.map(|b| Project::sandbox_state(p, b)) {
        Some(Ok(Some(state))) => state.as_str(),
        Some(Ok(None)) => "gone",
        Some(Err(_)) | None => "unknown",
    }
}

fn close(name: &str, backend: Option<BackendKind>, local: &LocalArgs) -> Result<Exit> {
    let backend = leased(backend_of(name, backend), name, local)?;
    let (state, killed) =
        Project::close(&state_dir(), name, backend.as_ref()).map_err(user_facing)?;
    let id = escape(&state.sandbox_id);
    match killed {
        Killed::Now => println!("closed project {name} (sandbox {id} killed)"),
        Killed::AlreadyGone => println!("closed project {name} (sandbox {id} was gone already)"),
    }
    Ok(Exit::Success)
}

fn put(
    name: &str,
    path: &str,
    from: &str,
    backend: Option<BackendKind>,
    local: &LocalArgs,
) -> Result<Exit> {
    let content = if from == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("cannot read stdin")?;
        buf
    } else {
        std::fs::read(from).with_context(|| format!("cannot read {from}"))?
    };
    let mut p = open(backend, name, local)?;
    let rel = p.put(path, &content).map_err(user_facing)?;
    eprintln!("wrote {} bytes to {rel}", content.len());
    Ok(Exit::Success)
}

fn get(name: &str, path: &str, backend: Option<BackendKind>, local: &LocalArgs) -> Result<Exit> {
    let mut p = open(backend, name, local)?;
    let bytes = p.get(path).map_err(user_facing)?;
    std::io::stdout().write_all(&bytes)?;
    Ok(Exit::Success)
}

fn exec(
    name: &str,
    command: &str,
    timeout: Duration,
    backend: Option<BackendKind>,
    local: &LocalArgs,
) -> Result<Exit> {
    let p = open(backend, name, local)?;
    let out = p.exec(command, timeout).map_err(user_facing)?;
    print!("{}", out.output);
    if out.timed_out {
        eprintln!("[timed out after {}s]", timeout.as_secs());
    }
    // The command's own exit code is ours (a signal reads as 128 + 9, as in a shell).
    let code = out.exit_code.unwrap_or(137);
    std::io::stdout().flush()?;
    std::process::exit(code);
}

fn stage(
    name: &str,
    from: &Path,
    to: &str,
    bounds: TreeBounds,
    backend: Option<BackendKind>,
    local: &LocalArgs,
) -> Result<Exit> {
    let mut p = open(backend, name, local)?;
    let n = p.stage(from, to, bounds).map_err(user_facing)?;
    println!("staged {n} file(s) under {to}");
    Ok(Exit::Success)
}

fn snapshot(
    name: &str,
    dir: &str,
    out: Option<&Path>,
    json: bool,
    bounds: TreeBounds,
    backend: Option<BackendKind>,
    local: &LocalArgs,
) -> Result<Exit> {
    let p = open(backend, name, local)?;
    let snap = p.snapshot(dir, bounds).map_err(user_facing)?;
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
        return Ok(Exit::Success);
    }
    if let Some(out) = out {
        snap.write_to(out)
            .with_context(|| format!("cannot write the snapshot to {}", out.display()))?;
    }
    for path in snap.files.keys() {
        println!("{}", escape(path));
    }
    eprintln!(
        "{} file(s), {} bytes, tree hash {}",
        snap.files.len(),
        snap.total_bytes(),
        snap.tree_hash()
    );
    Ok(Exit::Success)
}
