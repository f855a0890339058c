//! The E2B-compatible emulator (being written).
