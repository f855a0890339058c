//! Model providers: where an `llm_request` from the runner is answered, on the host.
//!
//! The runner sends an OpenAI chat-completions request body; a provider returns an OpenAI
//! chat-completion object plus the token usage it reports. Credentials live here and never
//! cross into a sandbox.

pub mod openai;
pub mod scripted;

use serde_json::Value;

use crate::cancel::CancelToken;
use crate::task::Task;

/// Tokens a provider reported for one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// One answered model call.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The OpenAI chat-completion object, forwarded to the runner as-is.
    pub body: Value,
    pub usage: Usage,
    /// Attempts beyond the first that this call needed (429s, 5xx, dropped connections).
    pub retries: u32,
}

/// What a provider needs to answer one call.
pub struct ModelCall<'a> {
    pub task: &'a Task,
    /// 0-based index of this call within the current episode attempt.
    pub index: usize,
    /// The OpenAI request body the runner built (messages, tools, max_tokens, ...).
    pub body: &'a Value,
    pub cancel: &'a CancelToken,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("the model API key is missing: set the environment variable {var}")]
    MissingKey { var: String },
    #[error("the model API answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the model API could not be reached at {url}")]
    Transport {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    #[error("the model API answered with a body that is not a chat completion: {detail}")]
    Decode { detail: String },
    #[error("gave up after {attempts} attempts")]
    RetriesExhausted {
        attempts: u32,
        #[source]
        last: Box<ProviderError>,
    },
    /// The runner's request cannot be sent as is (it comes from the sandbox, so it is checked).
    #[error("the model request is not valid: {detail}")]
    InvalidRequest { detail: String },
    #[error("scripted model error: {0}")]
    Scripted(String),
    #[error("the model call was cancelled")]
    Cancelled,
}

pub trait Provider: Send + Sync {
    fn complete(&self, call: &ModelCall<'_>) -> Result<Completion, ProviderError>;
}
