//! # leasehold
//!
//! PostgreSQL-native leases: time-bounded ownership of a named key that lapses
//! unless renewed, with a monotonic fencing epoch on every grant, and guards
//! that make protected resources refuse writes from a superseded holder.
//!
//! The SQL side lives in `migrations/` and `sql/functions/` (schema `lease`, the functions
//! `lease.acquire`, `lease.renew`, `lease.release`, `lease.inspect`) and is
//! installed by [`install()`]. The Rust side is a thin, synchronous, typed
//! layer over diesel with one API, the [`Leases`] trait (with
//! [`guard::Fencing`] and [`admin::Operator`] beside it): on a
//! `PgConnection` every operation runs in the caller's own transaction; on
//! a [`LeaseClient`] it runs on a pooled connection and autocommits. With
//! the cargo feature `async`, module `aio` has the same operations as
//! futures, on diesel-async's `AsyncPgConnection` and a pooled
//! `AsyncLeaseClient`, from the same code (docs/guide/async.md).
//!
//! ```no_run
//! use std::time::Duration;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel::Connection;
//! use leasehold::Leases;
//! let mut conn = diesel::PgConnection::establish("postgres://localhost/app")?;
//! leasehold::install(&mut conn)?;
//! let ttl = Duration::from_secs(30);
//! if let leasehold::Acquisition::Granted(lease) = conn.acquire("job-42", "worker-a1", ttl)? {
//!     // ... work, presenting lease.token() to guards, renewing before ttl passes ...
//!     let _ = conn.renew(&lease, ttl)?;
//!     let _ = conn.release(&lease)?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Where things are
//!
//! The crate root holds what a first program needs: [`Leases`] (the
//! application's calls), [`LeaseClient`] (the pooled implementation) and its
//! [`LeaseClientBuilder`], the answers
//! ([`Acquisition`], [`Renewal`], [`Release`], [`Refusal`],
//! [`LeaseState`]), the [`Lease`], its [`FencingToken`] and [`Epoch`], [`LeaseError`],
//! [`Keeper`] and [`install()`]. The rest is in public modules named by
//! concern, mostly the types of the operations:
//!
//! | module | what |
//! |---|---|
//! | [`guard`] | the one guard contract; the database guard's calls ([`guard::Fencing`]) and types |
//! | [`hold`] | [`hold::Keeper`], [`hold::KeeperSet`], [`hold::run_while_held`], [`hold::CancelToken`] |
//! | [`wait`] | [`wait::LeaseWaiter`]: waiting woken by release notifications; [`wait::ReleaseWatch`]: those wake-ups as events |
//! | [`batch`] | the types of the calls on many keys of one owner, and of heartbeat groups |
//! | [`admin`] | install, uninstall and the installed check; the operator calls ([`admin::Operator`]) and their types, the listing of keys ([`admin::ListFilter`]) among them; whether a role may run an operator function |
//! | [`pool`] | the pool's type and statement caching ([`LeaseClient::builder`] makes the pool) |
//! | [`error`] | the one error type, [`LeaseError`], and [`ErrorKind`], what to do about it |
//! | [`telemetry`] | spans, events and metrics (features `tracing`, `metrics`) |
//! | `aio` | feature `async`: the same operations as futures for tokio (`AsyncLeases`, `AsyncFencing`, `AsyncOperator` on diesel-async's `AsyncPgConnection` and on the pooled `AsyncLeaseClient`), `aio::Keeper` and `aio::KeeperSet` as tasks, `aio::run_while_held`, `aio::LeaseWaiter` and its `aio::ReleaseWatch` on the shared listener (docs/guide/async.md) |
//!
//! Each public module is a file or directory of that name. Behind them,
//! private modules each do one job: `api` (the three traits of the sync
//! face over their one sealed hook), `lease` (acquire, renew, release,
//! inspect, and the values they answer: grants, refusals, states, the
//! token and the epoch), `sql` (the only place with SQL text, constraint
//! names and answer decoding, and the execute step, the one thing the sync
//! and the async face do differently), `client`, `install`,
//! `sql_files` (the SQL's text: the migrations and the files of
//! functions, in install order), `field_text` (the percent-encoding of
//! token fields) and `libpq` (the listener's libpq FFI, the only module
//! allowed `unsafe`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

// Waiting reads its listener connection's socket through std::os::unix
// (src/wait/), so the crate builds on Unix-like systems only: stop with
// a message that says so instead of a missing-module error.
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
pub mod pool;
mod sql;
mod sql_files;
// With both telemetry features off only the pass-throughs are used.
#[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
pub mod telemetry;
pub mod wait;

// The crate root: what a newcomer reaches for first. Everything else is in
// a public module named by its concern, above.
pub use api::Leases;
pub use client::{LeaseClient, LeaseClientBuilder};
pub use error::{ErrorKind, LeaseError};
pub use hold::Keeper;
pub use install::install;
pub use lease::epoch::Epoch;
pub use lease::outcome::{Acquisition, Lease, LeaseState, Refusal, Release, Renewal};
pub use lease::token::FencingToken;

/// Plumbing shared with the adapter crates in `guards/` (not a public API:
/// it may change in any release).
#[doc(hidden)]
pub mod __private {
    /// The percent-encoding of token fields, also used by fenced files'
    /// headers so both spell a key the same way.
    pub mod field_text {
        pub use crate::field_text::{decode, encode};
    }

    /// leasehold's SQL as compiled in, and the extension generator's hook
    /// for an earlier layout, for the tests and tools of this repository.
    pub mod sql_files {
        pub use crate::admin::extension::install_script_of;
        pub use crate::sql_files::{
            functions_sql, functions_version, FUNCTION_SQL, MIGRATION_SQL, RETIRED_VERSIONS,
        };
    }

    /// The URL with the library's default connect timeout, for the
    /// `leasehold` command's own connections.
    pub fn with_connect_timeout(url: &str) -> String {
        crate::libpq::with_connect_timeout(url)
    }
}

/// Compiles the Rust examples of README.md as doc-tests, so the README
/// cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's pages (docs/guide/): their Rust compiles, as the README's.
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
