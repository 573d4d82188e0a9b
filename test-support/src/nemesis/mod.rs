//! The nemesis run (worker processes under pauses, kills and server
//! crash-restarts) and the checker that judges the history it records.
//!
//! Used by the short run in the test suite (`tests/nemesis/`) and by the
//! long-run command (`examples/nemesis.rs`), so both judge runs with exactly
//! the same rules.

pub mod history;
pub mod run;
