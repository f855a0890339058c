//! How a channel to a runner fails: the same kinds for the stdio and the durable channel, so
//! the broker reads one error whatever carries its frames.

use std::time::Duration;

use crate::sandbox::SandboxError;

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("no frame from the runner within {waited:?}{}", tail_suffix(.stderr_tail))]
    Timeout {
        waited: Duration,
        stderr_tail: String,
    },
    #[error("the runner process exited ({}) mid-episode{}", exit_text(*.code), tail_suffix(.stderr_tail))]
    Exited {
        code: Option<i32>,
        stderr_tail: String,
    },
    #[error("the runner's output stream failed{}", tail_suffix(.stderr_tail))]
    StreamFailed {
        #[source]
        source: SandboxError,
        stderr_tail: String,
    },
    #[error("could not send a frame to the runner{}", tail_suffix(.stderr_tail))]
    Send {
        #[source]
        source: SandboxError,
        stderr_tail: String,
    },
    /// The durable transport cannot go on: a frame its outbox promises cannot be read, or the
    /// runner is gone with nothing more to read.
    #[error("{message}{}", tail_suffix(.stderr_tail))]
    Lost {
        message: String,
        stderr_tail: String,
    },
    /// The runner never acknowledged a frame sent over the durable transport.
    #[error("the live runner did not acknowledge inbound frame {seq} within {waited:?}")]
    Unacknowledged {
        seq: u64,
        waited: Duration,
        #[source]
        last_write_error: Option<SandboxError>,
    },
}

impl ChannelError {
    pub fn stderr_tail(&self) -> &str {
        match self {
            ChannelError::Timeout { stderr_tail, .. }
            | ChannelError::Exited { stderr_tail, .. }
            | ChannelError::StreamFailed { stderr_tail, .. }
            | ChannelError::Send { stderr_tail, .. }
            | ChannelError::Lost { stderr_tail, .. } => stderr_tail,
            ChannelError::Unacknowledged { .. } => "",
        }
    }
}

fn exit_text(code: Option<i32>) -> String {
    code.map_or_else(|| "killed by a signal".to_string(), |c| format!("exit {c}"))
}

fn tail_suffix(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!("; recent runner stderr:\n{tail}")
    }
}
