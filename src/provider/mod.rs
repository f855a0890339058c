//! Model providers: where an `llm_request` from the runner is answered, on the host.
//!
//! The runner sends an OpenAI chat-completions request body; a provider returns an OpenAI
//! chat-completion object plus the token usage it reports, whatever API it speaks
//! (`anthropic` translates both ways). Credentials live here and never cross into a sandbox.

pub mod anthropic;
pub mod dialect;
mod http;
pub mod metered;
pub mod openai;
pub mod scripted;

use serde_json::Value;

use crate::cancel::CancelToken;
use crate::task::ScriptStep;

/// Tokens a provider reported for one call, counted as OpenAI counts them: the cached and
/// reasoning figures are parts of the input and output ones, not additions to them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Every prompt token, cached or not.
    pub input_tokens: u64,
    /// Every generated token, reasoning included.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's prompt cache; 0 when not reported.
    pub cached_input_tokens: u64,
    /// Output tokens spent on hidden reasoning; 0 when not reported.
    pub reasoning_tokens: u64,
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
#[derive(Clone, Copy)]
pub struct ModelCall<'a> {
    /// What runs (a task's id, a project's name): it names scripted completions.
    pub label: &'a str,
    /// The steps a scripted model plays: the task's `model_script` (or `world_script`).
    pub script: Option<&'a [ScriptStep]>,
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
    /// 401 or 403: the key is wrong for every call, not just this one.
    #[error("the model API refused the key in {var} (HTTP {status}): check it, or name the variable holding the right one with --api-key-env; the API said: {body}")]
    KeyRefused {
        status: u16,
        var: String,
        body: String,
    },
    /// 404 at the model endpoint (chat completions, messages): the model (or the endpoint
    /// itself) does not exist there, for every call.
    #[error("the model API does not know model {model:?} (HTTP 404): check --model (and --base-url); the API said: {body}")]
    ModelNotFound { model: String, body: String },
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

/// How far a failed model call reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureScope {
    /// An answer the episode deals with like any other (the agent sees the error, the
    /// episode ends `provider_error`, and the task is scored).
    Episode,
    /// The model API could not serve this call even after its retries: the task is an
    /// infrastructure error, not a verdict on the agent.
    Task,
    /// Every call of the run will fail the same way (a refused key, an unknown model): the
    /// run should stop.
    Run,
}

impl ProviderError {
    /// Retries made before the provider gave up with this error.
    pub fn retries(&self) -> u32 {
        match self {
            ProviderError::RetriesExhausted { attempts, .. } => attempts.saturating_sub(1),
            _ => 0,
        }
    }

    pub fn scope(&self) -> FailureScope {
        match self {
            ProviderError::MissingKey { .. }
            | ProviderError::KeyRefused { .. }
            | ProviderError::ModelNotFound { .. } => FailureScope::Run,
            // Transport failures that are not retried (TLS setup, a bad URL) repeat as
            // surely as the ones retried in vain.
            ProviderError::RetriesExhausted { .. } | ProviderError::Transport { .. } => {
                FailureScope::Task
            }
            ProviderError::Status { .. }
            | ProviderError::Decode { .. }
            | ProviderError::InvalidRequest { .. }
            | ProviderError::Scripted(_)
            | ProviderError::Cancelled => FailureScope::Episode,
        }
    }
}

/// The key in the environment variable `var`, trimmed; a missing or blank one is an error
/// naming the variable, so it stops the run before any sandbox starts rather than failing
/// every episode.
pub(crate) fn key_from_env(var: &str) -> Result<String, ProviderError> {
    let key = std::env::var(var).unwrap_or_default();
    // Keys pasted from files often carry a trailing newline, which is not a valid header byte.
    let key = key.trim();
    if key.is_empty() {
        return Err(ProviderError::MissingKey {
            var: var.to_string(),
        });
    }
    Ok(key.to_string())
}

pub trait Provider: Send + Sync {
    fn complete(&self, call: &ModelCall<'_>) -> Result<Completion, ProviderError>;
}
