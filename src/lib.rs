//! PostgreSQL leases: time-bounded ownership of a named key, with a fencing
//! epoch on every grant so guards refuse a superseded holder's writes. Start with
//! [`install()`], which puts the schema in place, and [`Leases`], the calls, on a
//! `PgConnection` (in the caller's transaction, if any) or a pooled [`LeaseClient`].
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> { use leasehold::Leases;
//! let mut client = leasehold::LeaseClient::connect("postgres://localhost/app", 4)?;
//! let answer = client.acquire("job-42", "worker-a1", std::time::Duration::from_secs(30))?;
//! # let _ = answer; Ok(()) }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

// The waiters read their listener's socket through std::os::unix: say so.
#[cfg(not(unix))]
compile_error!(
    "leasehold supports Unix-like systems only (Linux, macOS, the BSDs): its waiters use Unix socket APIs"
);

pub mod admin;
#[cfg(feature = "async")]
pub mod aio;
mod api;
pub mod batch;
mod client;
pub mod error;
mod field_text;
pub mod guard;
pub mod hold;
mod install;
mod lease;
#[allow(unsafe_code)]
mod libpq;
mod operation;
pub mod pool;
mod server_error;
mod sql;
mod sql_files;
// With both telemetry features off only the pass-throughs are used.
#[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
pub mod telemetry;
pub mod wait;

pub use api::Leases;
pub use client::{LeaseClient, LeaseClientBuilder};
pub use error::{ErrorKind, LeaseError};
pub use hold::Keeper;
pub use install::install;
pub use lease::epoch::Epoch;
pub use lease::outcome::{Acquisition, Lease, LeaseState, Refusal, Release, Renewal};
pub use lease::token::FencingToken;

/// Plumbing for the adapter crates in `guards/`; not a public API.
#[doc(hidden)]
pub mod __private {
    /// Token field encoding, shared so fenced files spell a key the same way.
    pub mod field_text {
        pub use crate::field_text::{decode, encode};
    }

    /// leasehold's SQL as compiled in, for this repository's tests and tools.
    pub mod sql_files {
        pub use crate::admin::extension::update_script;
        pub use crate::sql_files::{functions_sql, functions_version, FUNCTION_SQL, MIGRATION_SQL};
    }

    /// The URL with the library's default connect timeout, for the CLI.
    pub fn with_connect_timeout(url: &str) -> String {
        crate::libpq::with_connect_timeout(url)
    }
}

/// Compiles README.md's Rust examples, so the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's pages: their Rust compiles, as the README's.
#[cfg(doctest)]
pub mod guide_doctests {
    #[doc = include_str!("../docs/guide/getting-started.md")]
    pub struct GettingStarted;
    #[doc = include_str!("../docs/guide/guards.md")]
    pub struct Guards;
    #[doc = include_str!("../docs/guide/waiting-and-keeping.md")]
    pub struct WaitingAndKeeping;
    #[doc = include_str!("../docs/guide/security.md")]
    pub struct Security;
    #[doc = include_str!("../docs/guide/failover.md")]
    pub struct Failover;
    #[doc = include_str!("../docs/guide/poolers.md")]
    pub struct Poolers;
    #[doc = include_str!("../docs/guide/operations.md")]
    pub struct Operations;
    #[doc = include_str!("../docs/guide/benchmarks.md")]
    pub struct Benchmarks;
    #[cfg(feature = "async")]
    #[doc = include_str!("../docs/guide/async.md")]
    pub struct Async;
}
