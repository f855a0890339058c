//! What a conversation, an attempt, a task and a run count: one type, added up the same way
//! everywhere.

use std::ops::AddAssign;

use serde::{Deserialize, Serialize};

use crate::provider::Usage;

/// Token usage summed over model calls. `cached_input` is the part of `input` the provider
/// served from its prompt cache, `reasoning` the part of `output` spent on hidden reasoning;
/// both are 0 where the provider does not report them (and in records written before they
/// existed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenMeter {
    pub input: u64,
    pub output: u64,
    #[serde(default)]
    pub cached_input: u64,
    #[serde(default)]
    pub reasoning: u64,
    pub calls: u64,
}

impl TokenMeter {
    /// One model call's usage.
    /// Saturating: the figures come from a model API, which may say anything.
    pub fn add_call(&mut self, u: Usage) {
        *self += TokenMeter {
            input: u.input_tokens,
            output: u.output_tokens,
            cached_input: u.cached_input_tokens,
            reasoning: u.reasoning_tokens,
            calls: 1,
        };
    }
}

impl AddAssign for TokenMeter {
    fn add_assign(&mut self, other: TokenMeter) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cached_input = self.cached_input.saturating_add(other.cached_input);
        self.reasoning = self.reasoning.saturating_add(other.reasoning);
        self.calls = self.calls.saturating_add(other.calls);
    }
}

/// Dollars per million tokens of one model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub input: f64,
    pub output: f64,
    /// Input tokens the API served from its cache, where it reports them (default: `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
}

impl ModelPrice {
    /// Dollars for `tokens`; cached input tokens (a part of `input`) are priced at
    /// `cached_input` where it is known.
    pub fn dollars(&self, tokens: &TokenMeter) -> f64 {
        let cached = tokens.cached_input.min(tokens.input);
        let fresh = tokens.input - cached;
        (fresh as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + tokens.output as f64 * self.output)
            / 1e6
    }
}

/// What one attempt of a task may spend on the model (the task's `max_tokens` and
/// `max_cost_usd`), checked before each model call: the call that would start at or past a
/// limit is not made. One call may carry the spend past a limit; the next is then refused.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelBudget {
    /// Tokens, input and output, the task may use.
    pub tokens: Option<u64>,
    /// Dollars the task may spend, and the prices they are counted in.
    pub cost_usd: Option<(f64, ModelPrice)>,
    /// What the attempt's earlier episodes used (lost to a transport failure): the limits
    /// are the attempt's, not one episode's.
    pub spent_before: TokenMeter,
}

impl ModelBudget {
    /// Which limit `used` (this attempt's tokens) has reached, said for the record; `None`
    /// while under every one.
    pub fn reached(&self, used: TokenMeter) -> Option<String> {
        let mut all = self.spent_before;
        all += used;
        let tokens = all.input.saturating_add(all.output);
        if let Some(limit) = self.tokens.filter(|&l| tokens >= l) {
            return Some(format!(
                "the task's token limit was reached: {tokens} of {limit} tokens used"
            ));
        }
        let (limit, price) = self.cost_usd?;
        let spent = price.dollars(&all);
        (spent >= limit)
            .then(|| format!("the task's cost limit was reached: ${spent:.4} of ${limit} spent"))
    }
}

/// The work done: model calls, tool requests, tokens and the provider's retries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Model calls made.
    pub turns: u32,
    /// Tool requests answered (including rejected ones), skill reads aside: those are the
    /// host's, not the environment's.
    pub tool_calls: u32,
    pub tokens: TokenMeter,
    /// Model-call retries the provider needed.
    pub provider_retries: u32,
}

impl AddAssign for Counters {
    fn add_assign(&mut self, other: Counters) {
        self.turns += other.turns;
        self.tool_calls += other.tool_calls;
        self.tokens += other.tokens;
        self.provider_retries += other.provider_retries;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_field_by_field() {
        let mut a = Counters {
            turns: 1,
            tool_calls: 2,
            tokens: TokenMeter {
                input: 3,
                output: 4,
                cached_input: 2,
                reasoning: 1,
                calls: 1,
            },
            provider_retries: 5,
        };
        a += a;
        assert_eq!(
            a,
            Counters {
                turns: 2,
                tool_calls: 4,
                tokens: TokenMeter {
                    input: 6,
                    output: 8,
                    cached_input: 4,
                    reasoning: 2,
                    calls: 2
                },
                provider_retries: 10,
            }
        );
    }

    #[test]
    fn a_budget_is_reached_at_its_limit_counting_what_came_before() {
        let used = |input, output| TokenMeter {
            input,
            output,
            calls: 1,
            ..TokenMeter::default()
        };
        let tokens = ModelBudget {
            tokens: Some(100),
            spent_before: used(30, 10),
            ..ModelBudget::default()
        };
        assert_eq!(tokens.reached(used(50, 9)), None);
        assert_eq!(
            tokens.reached(used(50, 10)).as_deref(),
            Some("the task's token limit was reached: 100 of 100 tokens used")
        );
        // A dollar per million input tokens, half that when cached, two per million output.
        let price = ModelPrice {
            input: 1.0,
            output: 2.0,
            cached_input: Some(0.5),
        };
        let cost = ModelBudget {
            cost_usd: Some((3.0, price)),
            ..ModelBudget::default()
        };
        let mut meter = used(1_000_000, 500_000);
        meter.cached_input = 1_000_000;
        assert_eq!(price.dollars(&meter), 1.5);
        assert_eq!(cost.reached(meter), None);
        meter.output = 1_250_000;
        assert_eq!(
            cost.reached(meter).as_deref(),
            Some("the task's cost limit was reached: $3.0000 of $3 spent")
        );
        assert_eq!(
            ModelBudget::default().reached(used(u64::MAX, u64::MAX)),
            None
        );
        // An API that claims every token there is reaches the limit; it does not overflow.
        let mut huge = used(u64::MAX, u64::MAX);
        huge += huge;
        assert!(tokens.reached(huge).is_some());
    }

    #[test]
    fn a_call_adds_every_usage_figure_and_records_name_them() {
        let mut t = TokenMeter::default();
        let u = Usage {
            input_tokens: 10,
            output_tokens: 5,
            cached_input_tokens: 7,
            reasoning_tokens: 3,
        };
        t.add_call(u);
        t.add_call(u);
        assert_eq!(
            serde_json::to_value(t).unwrap(),
            serde_json::json!({"input": 20, "output": 10, "cached_input": 14, "reasoning": 6, "calls": 2})
        );
        // A record from before the cached and reasoning figures still reads.
        let old: TokenMeter =
            serde_json::from_value(serde_json::json!({"input": 1, "output": 2, "calls": 3}))
                .unwrap();
        assert_eq!((old.cached_input, old.reasoning, old.calls), (0, 0, 3));
    }
}
