//! Frames and the channels that carry them between the host and a runner.

pub mod durable;
pub mod frame;
mod lines;
pub mod renewal;
pub mod stdio;

pub use frame::{frame_type, Frame, FrameError};
pub use renewal::LeaseRenewal;
pub use stdio::{ChannelError, StdioChannel};
