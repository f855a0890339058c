//! `eval`'s spend caps and prices: the options, and the plan they make.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use wmo_e2b::eval::spend::{self, Caps, PriceError, PriceOptions};
use wmo_e2b::eval::{SpendPlan, TaskLimits, UnpricedCost};
use wmo_e2b::task::TaskList;

use super::{BackendKind, UsageError};

/// Spend caps and the prices they are counted in.
#[derive(Debug, clap::Args)]
pub struct CapArgs {
    /// Stop starting tasks before the run's cost could pass USD (needs prices).
    #[arg(long, value_name = "USD", value_parser = super::bounds::amount)]
    max_cost: Option<f64>,
    /// Stop starting tasks before the run's model tokens (input + output) could pass N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_tokens: Option<u64>,
    /// Stop starting tasks before the run's sandbox-seconds could pass S.
    #[arg(long, value_name = "S", value_parser = super::bounds::amount)]
    max_sandbox_seconds: Option<f64>,
    /// End a task's episode before a model call once the task has used N tokens (input +
    /// output), unless the task sets max_tokens.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    task_max_tokens: Option<u64>,
    /// End a task's episode before a model call once the task has spent USD on the model,
    /// unless the task sets max_cost_usd (needs prices).
    #[arg(long, value_name = "USD", value_parser = super::bounds::amount)]
    task_max_cost: Option<f64>,
    /// At a cap, cancel the running tasks too instead of letting them finish.
    #[arg(long)]
    max_cost_hard: bool,
    /// Price table (JSON, or TOML by its `.toml` name): per model, dollars per million
    /// input, output and cached input tokens; and `sandbox_per_second`.
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
    /// Dollars per million input tokens of --model (wins over --prices).
    #[arg(long, value_name = "USD", value_parser = super::bounds::amount)]
    price_in: Option<f64>,
    /// Dollars per million output tokens of --model (wins over --prices).
    #[arg(long, value_name = "USD", value_parser = super::bounds::amount)]
    price_out: Option<f64>,
    /// Dollars per sandbox-second (default: E2B's published rate for its default sandbox on
    /// the e2b backend, 0 on the local one).
    #[arg(long, value_name = "USD", value_parser = super::bounds::amount)]
    sandbox_price: Option<f64>,
}

/// The run's caps and prices from the options, checked against each other.
pub fn spend_plan(c: &CapArgs, backend: BackendKind, model: &str) -> Result<SpendPlan> {
    let default_sandbox = match backend {
        BackendKind::E2b => spend::E2B_DEFAULT_SANDBOX_PER_SECOND,
        BackendKind::Local => 0.0,
    };
    let prices = spend::resolve_prices(
        &PriceOptions {
            file: c.prices.clone(),
            input: c.price_in,
            output: c.price_out,
            sandbox_per_second: c.sandbox_price,
        },
        model,
        default_sandbox,
    )
    .map_err(|e| match e {
        PriceError::Read { .. } => anyhow::Error::new(e),
        e => UsageError(e.to_string()).into(),
    })?;
    let caps = Caps {
        cost_usd: c.max_cost,
        tokens: c.max_tokens,
        sandbox_seconds: c.max_sandbox_seconds,
        hard: c.max_cost_hard,
    };
    if caps.cost_usd.is_some() && prices.is_none() {
        return Err(UsageError(
            "--max-cost needs prices: give --prices FILE, or --price-in and --price-out (dollars per million tokens)".into(),
        )
        .into());
    }
    if caps.hard && !caps.any() {
        return Err(UsageError(
            "--max-cost-hard needs a cap: --max-cost, --max-tokens or --max-sandbox-seconds".into(),
        )
        .into());
    }
    Ok(SpendPlan {
        caps,
        prices,
        meter: Arc::default(),
        per_task: TaskLimits {
            tokens: c.task_max_tokens,
            cost_usd: c.task_max_cost,
        },
    })
}

/// A cost limit, the run's or a task's, with no prices to count it in is a usage error.
pub fn check_task_costs(plan: &SpendPlan, tasks: &TaskList) -> Result<()> {
    const HOW: &str =
        "give --prices FILE, or --price-in and --price-out (dollars per million tokens)";
    match plan.unpriced_cost_limit(tasks) {
        None => Ok(()),
        Some(UnpricedCost::Flag) => {
            Err(UsageError(format!("--task-max-cost needs prices: {HOW}")).into())
        }
        Some(UnpricedCost::Task(entry)) => Err(UsageError(format!(
            "{}:{}: task {:?}: field `max_cost_usd` needs prices: {HOW}",
            tasks.path().display(),
            entry.line,
            entry.id
        ))
        .into()),
    }
}
