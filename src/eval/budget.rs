//! A run's spend caps at work: the gate before each task, the watch that cancels running
//! tasks at a hard cap, and each record's cost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::results::TaskRecord;
use super::spend::{Cap, Caps, CostRecord, Prices, Spend};
use super::RunControl;
use crate::episode::{ModelBudget, TokenMeter};
use crate::pool::Pool;
use crate::provider::metered::UsageMeter;
use crate::sync::lock;
use crate::task::{Task, TaskEntry, TaskList};

/// How often a hard cap is checked while tasks run.
const HARD_CAP_POLL: Duration = Duration::from_millis(100);

/// The caps and prices of a run, and the meter its model calls go through.
pub struct SpendPlan {
    pub caps: Caps,
    pub prices: Option<Prices>,
    /// Tokens of every model call of the run so far (the providers are metered with it).
    pub meter: std::sync::Arc<UsageMeter>,
    /// Each task's own limits where it names none (`--task-max-tokens`, `--task-max-cost`).
    pub per_task: TaskLimits,
}

/// What one task may spend on the model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TaskLimits {
    pub tokens: Option<u64>,
    pub cost_usd: Option<f64>,
}

impl SpendPlan {
    /// `task`'s model budget, its own limits winning over the run's; `spent_before` is what
    /// its earlier attempts used. A cost limit without prices cannot be counted: the run
    /// refuses one before it starts (see [`SpendPlan::unpriced_cost_limit`]).
    pub fn task_budget(&self, task: &Task, spent_before: TokenMeter) -> ModelBudget {
        let cost = task.max_cost_usd.or(self.per_task.cost_usd);
        ModelBudget {
            tokens: task.max_tokens.or(self.per_task.tokens),
            cost_usd: cost.zip(self.prices.as_ref().map(|p| p.per_mtok)),
            spent_before,
        }
    }

    /// A cost limit set with no prices to count it in, if any.
    pub fn unpriced_cost_limit<'t>(&self, tasks: &'t TaskList) -> Option<UnpricedCost<'t>> {
        if self.prices.is_some() {
            return None;
        }
        if self.per_task.cost_usd.is_some() {
            return Some(UnpricedCost::Flag);
        }
        tasks
            .entries()
            .iter()
            .find(|e| e.cost_limited)
            .map(UnpricedCost::Task)
    }
}

/// Where a cost limit without prices was set: the run's `--task-max-cost`, or a task's
/// `max_cost_usd`.
#[derive(Debug)]
pub enum UnpricedCost<'t> {
    Flag,
    Task(&'t TaskEntry),
}

pub(super) struct RunBudget<'a> {
    plan: &'a SpendPlan,
    pool: &'a Pool,
    /// What finished tasks spent, and how many finished (for the mean per task).
    finished: Mutex<(Spend, usize)>,
    stopped: OnceLock<Cap>,
}

impl<'a> RunBudget<'a> {
    pub fn new(plan: &'a SpendPlan, pool: &'a Pool) -> RunBudget<'a> {
        let zero = Spend::of(&TokenMeter::default(), 0.0, plan.prices.as_ref());
        RunBudget {
            plan,
            pool,
            finished: Mutex::new((zero, 0)),
            stopped: OnceLock::new(),
        }
    }

    /// Everything spent so far: finished tasks, running ones, and idle pooled sandboxes.
    pub fn spent(&self) -> Spend {
        let (usage, calls) = self.plan.meter.totals();
        let tokens = TokenMeter {
            input: usage.input_tokens,
            output: usage.output_tokens,
            cached_input: usage.cached_input_tokens,
            reasoning: usage.reasoning_tokens,
            calls,
        };
        Spend::of(
            &tokens,
            self.pool.usage().seconds,
            self.plan.prices.as_ref(),
        )
    }

    /// `Some(why)` when a cap keeps the next task from starting; from then on every task
    /// is kept from starting, so the run stops at one cap, not a mean later.
    pub fn refuse_next(&self) -> Option<String> {
        let caps = &self.plan.caps;
        if !caps.any() {
            return None;
        }
        let spent = self.spent();
        let cap = match self.stopped.get() {
            Some(&cap) => cap,
            None => {
                let (total, n) = *lock(&self.finished);
                let cap = caps.next_task_would_pass(spent, Spend::per_task(total, n))?;
                *self.stopped.get_or_init(|| cap)
            }
        };
        Some(format!(
            "not started: the next task could pass {} ({})",
            cap.flag(),
            caps.describe(cap, spent)
        ))
    }

    /// Adds a finished task to the mean, and fills in its cost.
    pub fn finished(&self, record: &mut TaskRecord) {
        let prices = self.plan.prices.as_ref();
        record.cost = prices.map(|p| CostRecord {
            usd: p.cost(&record.tokens, record.sandbox.seconds),
            prices: p.clone(),
        });
        let mut f = lock(&self.finished);
        let spend = Spend::of(&record.tokens, record.sandbox.seconds, prices);
        f.0 = Spend {
            tokens: f.0.tokens + spend.tokens,
            sandbox_seconds: f.0.sandbox_seconds + spend.sandbox_seconds,
            cost_usd: f.0.cost_usd.zip(spend.cost_usd).map(|(a, b)| a + b),
        };
        f.1 += 1;
    }

    /// With a hard cap: until `done`, cancels the running tasks once a cap is reached.
    pub fn watch_hard_cap(&self, control: &RunControl, done: &AtomicBool) {
        let caps = &self.plan.caps;
        if !caps.hard || !caps.any() {
            return;
        }
        while !done.load(Ordering::Acquire) {
            if let Some(cap) = caps.reached(self.spent()) {
                self.stopped.get_or_init(|| cap);
                control.cancel_running();
                return;
            }
            std::thread::sleep(HARD_CAP_POLL);
        }
    }

    pub fn stopped_by(&self) -> Option<Cap> {
        self.stopped.get().copied()
    }
}
