//! `wmo-e2b reap`: plan, show, and carry out the cleanup of leaked sandboxes.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use wmo_e2b::reap::{self, ReapOptions};
use wmo_e2b::terminal::escape;

use super::{open_backend, BackendKind, Exit};

#[derive(Debug, Args)]
pub struct ReapArgs {
    #[arg(long, value_enum, default_value = "local")]
    backend: BackendKind,
    /// Show what would be reaped; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Also reap tagged sandboxes with no lease here once they are older than this (e.g. 2h).
    #[arg(long, value_parser = super::bounds::age)]
    older_than: Option<Duration>,
    /// Also reap tagged sandboxes with no lease here (another host's, a lost state dir),
    /// unless their owner is provably alive.
    #[arg(long)]
    include_foreign: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ReapArgs) -> Result<Exit> {
    let state = wmo_e2b::state::state_dir();
    let backend = open_backend(args.backend)?;
    let opts = ReapOptions {
        dry_run: args.dry_run,
        older_than: args.older_than,
        include_foreign: args.include_foreign,
    };
    let plan = reap::plan(backend.as_ref(), &state, &opts).context("cannot plan the reap")?;
    for s in &plan.skipped_files {
        eprintln!(
            "warning: skipped lease file {}: {}",
            escape(&s.path.display().to_string()),
            escape(&s.reason)
        );
    }
    let outcomes = reap::execute(backend.as_ref(), &state, &plan, args.dry_run);
    let failed = outcomes.iter().filter(|o| o.result == "failed").count();
    if args.json {
        let rows: Vec<serde_json::Value> = plan
            .candidates
            .iter()
            .zip(&outcomes)
            .map(|(c, o)| {
                let mut v = serde_json::to_value(c).unwrap_or_default();
                v["result"] = serde_json::json!(o.result);
                v["detail"] = serde_json::json!(o.detail);
                v
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"dry_run": args.dry_run, "backend": backend.name(),
                               "candidates": rows, "failed": failed})
        );
    } else if plan.candidates.is_empty() {
        super::say_backend(args.backend);
        println!("nothing to reap");
    } else {
        super::say_backend(args.backend);
        println!(
            "{:<24}  {:<8}  {:>7}  {:<10}  {:<40}  owner",
            "sandbox", "kind", "age", "result", "reason"
        );
        for (c, o) in plan.candidates.iter().zip(&outcomes) {
            println!(
                "{:<24}  {:<8}  {:>7}  {:<10}  {:<40}  {}{}",
                escape(c.sandbox_id.as_deref().unwrap_or("-")),
                escape(&c.kind),
                age(c.age_secs),
                o.result,
                escape(&c.reason),
                escape(&c.owner),
                o.detail
                    .as_deref()
                    .map(|d| format!("  ({})", escape(d)))
                    .unwrap_or_default()
            );
        }
        if args.dry_run {
            println!("dry run: nothing was changed; run without --dry-run to reap");
        }
    }
    if failed > 0 {
        eprintln!("error: {failed} kill(s) could not be proven; run reap again");
        return Ok(Exit::Infrastructure);
    }
    Ok(Exit::Success)
}

fn age(secs: u64) -> String {
    if secs >= 3600 {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    } else if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{secs}s")
    }
}
