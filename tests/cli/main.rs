//! The `leasehold` command, driven as a real process (the built binary)
//! against a real PostgreSQL server. Modules by what they prove.
#![cfg(all(feature = "cli", feature = "local"))]

mod demo;
mod exit_codes;
mod listing;
mod operations;
mod support;
