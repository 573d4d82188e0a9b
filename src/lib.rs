//! # leasehold
//!
//! PostgreSQL-native leases: time-bounded ownership of a named key that lapses
//! unless renewed, with a monotonic fencing epoch on every grant, and guards
//! that make protected resources refuse writes from a superseded holder.
//!
//! The SQL side lives in `migrations/` and `sql/functions/` (schema `lease`, the functions
//! `lease.acquire`, `lease.renew`, `lease.release`, `lease.inspect`) and is
//! installed by [`install()`]. The Rust side is a thin, synchronous, typed
//! layer over diesel with one API, the [`Leases`] trait: on a
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
//! The crate root holds what a first program needs: [`Leases`] (every
//! operation), [`LeaseClient`] (the pooled implementation) and its
//! [`LeaseClientBuilder`], the answers
//! ([`Acquisition`], [`Renewal`], [`Release`], [`Refusal`],
//! [`LeaseState`]), the [`Lease`], its [`FencingToken`] and [`Epoch`], [`LeaseError`],
//! [`Keeper`] and [`install()`]. The rest is in public modules named by
//! concern, mostly the types of the operations:
//!
//! | module | what |
//! |---|---|
//! | [`guard`] | the one guard contract and the database guard's types |
//! | [`hold`] | [`hold::Keeper`], [`hold::KeeperSet`], [`hold::run_while_held`], [`hold::CancelToken`] |
//! | [`wait`] | [`wait::LeaseWaiter`]: waiting woken by release notifications; [`wait::ReleaseWatch`]: those wake-ups as events |
//! | [`batch`] | the types of the calls on many keys of one owner, and of heartbeat groups |
//! | [`admin`] | install, uninstall and the installed check; the types of the operator calls and of the listing of keys ([`admin::ListFilter`]); whether a role may run an operator function |
//! | [`pool`] | the pool's type and statement caching ([`LeaseClient::builder`] makes the pool) |
//! | [`error`] | every error type |
//! | [`telemetry`] | spans, events and metrics (features `tracing`, `metrics`) |
//! | `aio` | feature `async`: the same operations as futures for tokio (`AsyncLeases` on diesel-async's `AsyncPgConnection` and on the pooled `AsyncLeaseClient`), `aio::Keeper` and `aio::KeeperSet` as tasks, `aio::run_while_held`, `aio::LeaseWaiter` and its `aio::ReleaseWatch` on the shared listener (docs/guide/async.md) |
//!
//! Behind them, private modules each do one job: `api` (the [`Leases`]
//! trait and its two implementations), `sql` (the only place with SQL
//! text, constraint names and answer decoding, and the execute step, the
//! one thing the sync and the async face do differently), `outcome` (grants,
//! refusals and states as values), `leases`, `many`, `groups`, `guards`,
//! `operator`, `prune`, `listing`, `install` (the operations on a
//! connection, which the trait calls), `token` (the fencing token and its
//! text form), `epoch` (the epoch's type), `errors`,
//! `client`, `waiting`, `holding`, `sql_files` (the SQL's text, migrations
//! and files of functions), `extension` (the `CREATE EXTENSION` files
//! generated from that text),
//! `field_text` (the percent-encoding of token fields) and `libpq` (the
//! listener's libpq FFI, the only module allowed `unsafe`).
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

// Waiting reads its listener connection's socket through std::os::unix
// (src/waiting/), so the crate builds on Unix-like systems only: stop with
// a message that says so instead of a missing-module error.
#[cfg(not(unix))]
compile_error!(
    "leasehold supports Unix-like systems only (Linux, macOS, the BSDs): its waiters use Unix socket APIs"
);

#[cfg(feature = "async")]
pub mod aio;
mod api;
mod client;
mod epoch;
mod errors;
mod extension;
mod field_text;
mod groups;
pub mod guard;
mod guards;
mod holding;
mod install;
mod leases;
#[allow(unsafe_code)]
mod libpq;
mod listing;
mod many;
mod operator;
mod outcome;
pub mod pool;
mod prune;
mod sql;
mod sql_files;
// With both telemetry features off only the pass-throughs are used.
#[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
pub mod telemetry;
mod token;
mod waiting;

// The crate root: what a newcomer reaches for first. Everything else is in
// a public module named by its concern, below.
pub use api::Leases;
pub use client::{LeaseClient, LeaseClientBuilder};
pub use epoch::Epoch;
pub use errors::LeaseError;
pub use holding::Keeper;
pub use install::install;
pub use outcome::{Acquisition, Lease, LeaseState, Refusal, Release, Renewal};
pub use token::FencingToken;

/// The types of the calls on many keys of one owner: [`Leases::renew_many`]
/// and [`Leases::release_many`] answer per key what the single-key calls
/// would; a heartbeat group ([`Leases::join_group`],
/// [`Leases::renew_group`]) keeps many grants alive with one row write.
pub mod batch {
    pub use crate::groups::{GroupId, GroupJoin, GroupRenewal};
    pub use crate::many::MAX_KEYS_PER_CALL;
    pub use crate::outcome::{KeyRelease, KeyRenewal};
}

/// Holding a lease over time: a [`Keeper`] renews one in the
/// background and reports its loss, a [`KeeperSet`](hold::KeeperSet) keeps
/// many with one heartbeat, and [`run_while_held`](hold::run_while_held)
/// runs work that stops when the lease is lost.
pub mod hold {
    pub use crate::holding::{
        run_while_held, CancelToken, Keeper, KeeperBuilder, KeeperEvent, KeeperSet,
        KeeperSetBuilder, KeeperSetEvent, LeaseLoss, StopReason, WorkContext, WorkOutcome,
    };
}

/// Waiting for a lease: a [`LeaseWaiter`](wait::LeaseWaiter) blocks until a
/// key is granted, woken by release notifications from one listener
/// session per database URL ([`Leases::acquire_waiting`] waits inside the
/// server instead); a [`ReleaseWatch`](wait::ReleaseWatch) reports those
/// wake-ups for keys it watches, from the same session.
pub mod wait {
    pub use crate::waiting::{
        LeaseWaiter, LeaseWaiterBuilder, ListenerStatus, PollingReason, ReleaseEvent, ReleaseWatch,
        Wait, WakeMode, DEFAULT_FALLBACK_POLL, DEFAULT_RECHECK, LISTENER_APPLICATION_NAME,
        UNDELIVERED_RETRY, WAITER_LIMIT,
    };
}

/// Operating leasehold: installing and removing it (and asking whether it
/// is installed), the types of the operator calls of [`Leases`] (namespace
/// rules, forced releases, the generation, pruning, listing keys), which
/// are granted to nobody by default (docs/guide/security.md), and asking
/// whether the connected role was granted one.
pub mod admin {
    pub use crate::extension::{
        extension_files, extension_version, ExtensionFile, EXTENSION_UPGRADES_FROM,
    };
    pub use crate::install::{
        install, installed_versions, is_installed, uninstall, InstallReport, Migrations, MIGRATIONS,
    };
    pub use crate::listing::{KeyState, ListFilter, ListOrder, ListedLease, Listing};
    pub use crate::operator::{
        function_privilege, BoundRole, ForcedRelease, FunctionPrivilege, Generation, NamespaceRule,
        GENERATION_SHIFT, MAX_GENERATION,
    };
    pub use crate::prune::{PruneOptions, PruneReport, DEFAULT_PRUNE_BATCH};
    pub use crate::sql::install::INSTALL_LOCK_TIMEOUT;
}

/// Every error type, each keeping its source. One call returns one of
/// them: lease calls [`LeaseError`], guard calls
/// [`GuardError`](error::GuardError), and so on.
pub mod error {
    pub use crate::errors::KeeperError;
    pub use crate::errors::{GuardError, InstallError, LeaseError, Operation, LOCK_WAIT_BOUND};
    pub use crate::extension::ExtensionError;
    pub use crate::guards::FencedError;
    pub use crate::token::TokenError;
    pub use crate::waiting::WaitError;
}

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
        pub use crate::extension::install_script_of;
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
