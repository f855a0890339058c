//! `wmo-e2b sandbox list|kill`: look at and kill this tool's sandboxes.

use anyhow::Result;
use clap::Subcommand;
use wmo_e2b::sandbox::{inventory, Killed};
use wmo_e2b::terminal::escape;

use super::{open_backend, BackendKind, Exit};

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// This tool's live sandboxes, with owner, kind, age, deadline and lease state.
    List {
        #[arg(long, value_enum, default_value = "local")]
        backend: BackendKind,
        /// Every sandbox the backend lists, not only this tool's.
        #[arg(long)]
        all: bool,
        /// One JSON array (`[]` when nothing is live).
        #[arg(long)]
        json: bool,
    },
    /// Kill sandboxes by id and retire their leases.
    Kill {
        #[arg(long, value_enum, default_value = "local")]
        backend: BackendKind,
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
}

pub fn run(cmd: SandboxCommand) -> Result<Exit> {
    let state = wmo_e2b::state::state_dir();
    match cmd {
        SandboxCommand::List { backend, all, json } => {
            if !json {
                super::say_backend(backend);
            }
            let backend = open_backend(backend)?;
            let rows = inventory::list(backend.as_ref(), &state, all)?;
            if json {
                println!("{}", serde_json::to_string(&rows)?);
            } else if rows.is_empty() {
                println!("no live sandboxes");
            } else {
                let now = wmo_e2b::sandbox::ledger::unix_now();
                println!(
                    "{:<24}  {:<8}  {:<7}  {:>7}  {:>10}  {:<14}  owner",
                    "sandbox", "kind", "state", "age", "expires in", "lease"
                );
                for r in rows {
                    // A paused sandbox has no deadline while it stays paused.
                    let expires = match r.state {
                        "paused" => "-".to_string(),
                        _ => format!("{}s", r.deadline.saturating_sub(now)),
                    };
                    println!(
                        "{:<24}  {:<8}  {:<7}  {:>6}s  {:>10}  {:<14}  {}",
                        escape(&r.id),
                        escape(r.kind.as_deref().unwrap_or("-")),
                        r.state,
                        r.age_secs,
                        expires,
                        r.lease_state
                            .map(|s| format!("{s:?}").to_lowercase())
                            .unwrap_or_else(|| "none".into()),
                        escape(r.owner.as_deref().unwrap_or("-")),
                    );
                }
            }
            Ok(Exit::Success)
        }
        SandboxCommand::Kill { backend, ids } => {
            let backend = open_backend(backend)?;
            let mut failed = 0;
            for id in &ids {
                match inventory::kill(backend.as_ref(), &state, id) {
                    Ok(Killed::Now) => println!("killed {}", escape(id)),
                    Ok(Killed::AlreadyGone) => println!("{} was already gone", escape(id)),
                    Err(e) => {
                        failed += 1;
                        eprintln!(
                            "error: could not kill {}: {}",
                            escape(id),
                            escape(&wmo_e2b::errors::error_chain(&e))
                        );
                    }
                }
            }
            Ok(if failed > 0 {
                Exit::Infrastructure
            } else {
                Exit::Success
            })
        }
    }
}
