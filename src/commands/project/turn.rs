//! `wmo-e2b project run`: one agent turn in a project's sandbox.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use wmo_e2b::project::session::{self, TurnOptions};
use wmo_e2b::project::{self, Notice};
use wmo_e2b::provider::scripted::FixedScript;
use wmo_e2b::provider::Provider;
use wmo_e2b::state::state_dir;
use wmo_e2b::task::ScriptStep;
use wmo_e2b::terminal::{escape, escape_lines};

use super::super::{BackendKind, Exit, LocalArgs, ModelApiArgs, UsageError};
use super::{open, user_facing};

/// `project run`: one agent turn.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    name: String,
    #[arg(long)]
    instruction: String,
    /// A model name on an OpenAI-compatible API. A turn needs this or --script.
    #[arg(long)]
    model: Option<String>,
    /// A JSON array of model_script steps answering the turn instead of a model.
    #[arg(long, value_name = "FILE")]
    script: Option<PathBuf>,
    #[command(flatten)]
    api: ModelApiArgs,
    /// Offer the agent a bash tool (its writes bypass the mirror, so a lost sandbox
    /// fails the turn instead of replaying it).
    #[arg(long)]
    allow_bash: bool,
    /// Project paths the agent may write (repeatable); without it every path is writable.
    #[arg(long, value_name = "PATH")]
    writable: Vec<String>,
    /// The turn's wall time. On E2B a turn longer than the idle window holds the sandbox
    /// up for its length, which the team's plan bounds (Hobby: 1 h).
    #[arg(long, default_value = "30m", value_parser = super::super::bounds::duration)]
    timeout: Duration,
    /// A directory of skills (`<name>.md` files with `name` and `description` front
    /// matter): the system prompt lists them and the agent reads one with `read_skill`.
    #[arg(long, value_name = "DIR")]
    skills: Option<PathBuf>,
    /// Where to append the turn's events (JSON Lines).
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    /// Default: the backend the project was created on.
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
}

/// Who answers the turn's model calls: a script file, or a model on the API.
fn turn_provider(args: &RunArgs) -> Result<Arc<dyn Provider>> {
    match (&args.script, args.model.as_deref()) {
        (Some(path), None | Some("scripted")) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let steps: Vec<ScriptStep> = serde_json::from_str(&text)
                .map_err(|e| UsageError(format!("{}: {e}", path.display())))?;
            Ok(Arc::new(FixedScript(steps)))
        }
        (Some(_), Some(model)) => Err(UsageError(format!(
            "--script answers the turn itself; drop it to use --model {model}"
        ))
        .into()),
        (None, Some("scripted") | None) => Err(UsageError(
            "project run needs --model NAME (a model on an OpenAI-compatible API) or --script FILE (scripted steps)".into(),
        )
        .into()),
        (None, Some(model)) => args.api.provider(model, Duration::from_secs(120)),
    }
}

pub(super) fn run_turn(args: RunArgs, local: &LocalArgs) -> Result<Exit> {
    let provider = turn_provider(&args)?;
    // Checked whole before the project's sandbox is touched (opening may replace it).
    let skills = super::super::load_skills(args.skills.as_deref())?;
    let writable = if args.writable.is_empty() {
        None
    } else {
        Some(
            args.writable
                .iter()
                .map(|p| project::project_path(p))
                .collect::<Result<_, _>>()
                .map_err(user_facing)?,
        )
    };
    let name = &args.name;
    let mut p = open(args.backend, name, local)?;
    let events_path = args.events.clone().unwrap_or_else(|| {
        project::projects_dir(&state_dir()).join(name).join(format!(
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
        instruction: args.instruction,
        allow_bash: args.allow_bash,
        writable,
        timeout: args.timeout,
        skills,
        ..TurnOptions::default()
    };
    let cancel = wmo_e2b::cancel::CancelToken::new();
    let result = session::run_turn(&mut p, provider.as_ref(), &opts, &cancel, &mut log);
    for n in p.take_notices() {
        if let Notice::Replaced { old, new, files } = n {
            eprintln!(
                "note: the turn moved from sandbox {} to {} ({files} mirrored file(s) replayed)",
                escape(&old),
                escape(&new)
            );
        }
    }
    let r = result.context("the project turn failed")?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"result": r, "events": events_path})
        );
    } else {
        match &r.answer {
            Some(a) => println!("{}", escape_lines(a)),
            None => eprintln!("the agent ended without submitting ({})", r.reason),
        }
        eprintln!("events: {}", events_path.display());
    }
    Ok(Exit::Success)
}
