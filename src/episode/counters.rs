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
    pub fn add_call(&mut self, u: Usage) {
        self.input += u.input_tokens;
        self.output += u.output_tokens;
        self.cached_input += u.cached_input_tokens;
        self.reasoning += u.reasoning_tokens;
        self.calls += 1;
    }
}

impl AddAssign for TokenMeter {
    fn add_assign(&mut self, other: TokenMeter) {
        self.input += other.input;
        self.output += other.output;
        self.cached_input += other.cached_input;
        self.reasoning += other.reasoning;
        self.calls += other.calls;
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
