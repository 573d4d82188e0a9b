//! The `leasehold` command, driven as a real process (the built binary)
//! against a real PostgreSQL server. Modules by what they prove.

mod demo;
mod doctor;
mod exit_codes;
mod extension;
mod listing;
mod local;
mod logging;
mod operations;
mod operator;
mod prune;
mod run;
mod statements;
mod support;
