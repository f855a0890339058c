//! What a conversation, an attempt, a task and a run count: one type, added up the same way
//! everywhere.

use std::ops::AddAssign;

use serde::{Deserialize, Serialize};

use crate::provider::Usage;

/// Token usage summed over model calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenMeter {
    pub input: u64,
    pub output: u64,
    pub calls: u64,
}

impl TokenMeter {
    /// One model call's usage.
    pub fn add_call(&mut self, u: Usage) {
        self.input += u.input_tokens;
        self.output += u.output_tokens;
        self.calls += 1;
    }
}

impl AddAssign for TokenMeter {
    fn add_assign(&mut self, other: TokenMeter) {
        self.input += other.input;
        self.output += other.output;
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
                    calls: 2
                },
                provider_retries: 10,
            }
        );
    }
}
