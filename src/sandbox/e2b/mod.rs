//! The E2B backend (being written).
