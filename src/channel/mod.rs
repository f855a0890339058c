//! Frames and the channels that carry them between the host and a runner.

pub mod durable;
mod error;
pub mod frame;
mod lines;
pub mod renewal;
pub mod stdio;

use std::time::Duration;

use serde_json::Value;

pub use durable::DurableChannel;
pub use error::ChannelError;
pub use frame::{frame_type, Frame, FrameError};
pub use renewal::LeaseRenewal;
pub use stdio::{FrameSink, StdioChannel};

/// Frames to and from one runner: the stdio channel of an eval episode, or the durable
/// channel of a project turn. The broker is written against this alone.
pub trait FrameChannel {
    /// Sends one frame.
    fn send(&mut self, frame: &Value) -> Result<(), ChannelError>;
    /// The next frame within `timeout` (`ChannelError::Timeout` when none came); `Ok(None)`
    /// once the host closed the channel.
    fn recv(&mut self, timeout: Duration) -> Result<Option<Frame>, ChannelError>;
    /// The conversation is over host-side (whatever its end): what the channel did for it
    /// alone (renewing the sandbox's lease) stops.
    fn conversation_ended(&mut self) {}
}

impl FrameChannel for StdioChannel {
    fn send(&mut self, frame: &Value) -> Result<(), ChannelError> {
        StdioChannel::send(self, frame)
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Frame>, ChannelError> {
        StdioChannel::recv(self, timeout)
    }

    fn conversation_ended(&mut self) {
        self.episode_ended();
    }
}

impl FrameChannel for DurableChannel {
    fn send(&mut self, frame: &Value) -> Result<(), ChannelError> {
        DurableChannel::send(self, frame)
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Frame>, ChannelError> {
        DurableChannel::recv(self, timeout)
    }
}
