//! What several integration test files share.

#![allow(dead_code)]

pub mod contamination;
