//! A provider that adds up the tokens of every call through it: what a run with spend caps
//! has spent so far, running tasks included, without waiting for their records.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Completion, ModelCall, Provider, ProviderError, Usage};

/// Tokens used so far by every call through the [`Metered`] providers that share it.
#[derive(Debug, Default)]
pub struct UsageMeter {
    input: AtomicU64,
    output: AtomicU64,
    cached_input: AtomicU64,
    reasoning: AtomicU64,
    calls: AtomicU64,
}

impl UsageMeter {
    /// The totals so far, and how many calls were answered.
    pub fn totals(&self) -> (Usage, u64) {
        let usage = Usage {
            input_tokens: self.input.load(Ordering::Relaxed),
            output_tokens: self.output.load(Ordering::Relaxed),
            cached_input_tokens: self.cached_input.load(Ordering::Relaxed),
            reasoning_tokens: self.reasoning.load(Ordering::Relaxed),
        };
        (usage, self.calls.load(Ordering::Relaxed))
    }

    fn add(&self, u: Usage) {
        self.input.fetch_add(u.input_tokens, Ordering::Relaxed);
        self.output.fetch_add(u.output_tokens, Ordering::Relaxed);
        self.cached_input
            .fetch_add(u.cached_input_tokens, Ordering::Relaxed);
        self.reasoning
            .fetch_add(u.reasoning_tokens, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

/// `inner`, with each answered call's usage added to `meter`.
pub struct Metered {
    pub inner: Arc<dyn Provider>,
    pub meter: Arc<UsageMeter>,
}

impl Provider for Metered {
    fn complete(&self, call: &ModelCall<'_>) -> Result<Completion, ProviderError> {
        let answer = self.inner.complete(call)?;
        self.meter.add(answer.usage);
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::CancelToken;
    use crate::provider::scripted::FixedScript;
    use crate::task::ScriptStep;

    #[test]
    fn every_answered_call_is_counted_once() {
        let meter = Arc::new(UsageMeter::default());
        let steps = vec![ScriptStep::default(); 2];
        let metered = Metered {
            inner: Arc::new(FixedScript(steps)),
            meter: meter.clone(),
        };
        let body = serde_json::json!({"messages": [{"role": "user", "content": "hello there"}]});
        let mut expected = Usage::default();
        for index in 0..2 {
            let c = metered
                .complete(&ModelCall {
                    label: "t",
                    script: None,
                    index,
                    body: &body,
                    cancel: &CancelToken::new(),
                })
                .unwrap();
            expected.input_tokens += c.usage.input_tokens;
            expected.output_tokens += c.usage.output_tokens;
        }
        assert!(expected.input_tokens > 0);
        assert_eq!(meter.totals(), (expected, 2));
    }
}
