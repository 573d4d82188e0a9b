//! A throwaway local PostgreSQL server for tests, examples and benchmarks.
//!
//! Leases are only as good as the database behaviour underneath them, so
//! leasehold's tests (and its users') run against a real PostgreSQL server
//! rather than a mock. [`LocalPostgres`] creates one in a private temporary
//! directory from the server binaries installed on this machine, waits until
//! it really accepts queries, and removes every trace of it when it is
//! dropped.
//!
//! Besides start and stop it can simulate the failures that fencing exists
//! for: [`LocalPostgres::kill_postmaster`] SIGKILLs the server (the database
//! then runs crash recovery on [`LocalPostgres::restart`]), and a restart
//! keeps the same URL so that connection pools can reconnect. For failover,
//! [`LocalPostgresBuilder::from_base_backup`] makes a streaming standby of a
//! running server (or a restore that ends on a new timeline), and
//! [`LocalPostgres::promote`] promotes it.
//!
//! This crate is separate from `leasehold` so that the library's users do
//! not get a process supervisor in their dependency tree or in its API; it
//! does not depend on `leasehold` at all.
//!
//! # Cleanup
//!
//! Dropping a [`LocalPostgres`] stops the server and removes its directory,
//! also while a panic unwinds. Servers kept in a `static` are never dropped,
//! and a test process may be killed outright, so every server also gets a
//! small watchdog shell process. It blocks reading a pipe whose only write end
//! this process holds; when this process exits for any reason the pipe
//! closes and the watchdog shuts the server down and deletes the directory.
//!
//! # Root
//!
//! `initdb` and `postgres` refuse to run as root. When this process runs as
//! root (containers, CI) the server runs as the `postgres` system user
//! instead, which the `postgresql` packages create.
//!
//! # Example
//!
//! ```no_run
//! use diesel::{Connection, RunQueryDsl};
//! use leasehold_local::LocalPostgres;
//!
//! let server = LocalPostgres::builder().durable(false).start()?;
//! let mut conn = diesel::pg::PgConnection::establish(&server.url())?;
//! diesel::sql_query("SELECT 1").execute(&mut conn)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

// Starting a server uses std::os::unix (process groups, ownership, modes):
// stop with a message that says so on any other target.
#[cfg(not(unix))]
compile_error!("leasehold-local supports Unix-like systems only (Linux, macOS, the BSDs)");

mod binaries;
mod builder;
mod control;
mod dev_server;
mod error;
mod from_env;
mod procfs;
mod replication;
mod root_dir;
mod server;
mod server_dirs;
mod server_log;
mod server_user;
mod url;
mod watchdog;

pub use binaries::BIN_DIR_ENV;
pub use builder::LocalPostgresBuilder;
pub use control::StopMode;
pub use dev_server::{DevServer, DevStatus, LOCAL_DIR_ENV};
pub use error::LocalServerError;
pub use from_env::{DatabaseServer, DATABASE_URL_ENV};
pub use replication::BackupMode;
pub use server::LocalPostgres;
