//! # leasehold
//!
//! PostgreSQL-native leases: time-bounded ownership of a named key that lapses
//! unless renewed, with a monotonic fencing epoch on every grant, and guards
//! that make protected resources refuse writes from a superseded holder.
//!
//! The SQL side lives in `migrations/` (schema `lease`, the functions
//! `lease.acquire`, `lease.renew`, `lease.release`, `lease.inspect`) and is
//! installed by [`install()`]. The Rust side is a thin, synchronous, typed layer
//! over diesel: every operation takes `&mut PgConnection` and so composes with
//! the caller's own transactions; [`LeaseClient`] does the same over an r2d2
//! pool.
//!
//! ```no_run
//! use std::time::Duration;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel::Connection;
//! let mut conn = diesel::PgConnection::establish("postgres://localhost/app")?;
//! leasehold::install(&mut conn)?;
//! let ttl = Duration::from_secs(30);
//! if let leasehold::Acquisition::Granted(lease) = leasehold::acquire(&mut conn, "job-42", "worker-a1", ttl)? {
//!     // ... work, presenting lease.token() to guards, renewing before ttl passes ...
//!     let _ = leasehold::renew(&mut conn, lease.key(), lease.owner(), lease.epoch(), ttl)?;
//!     let _ = leasehold::release(&mut conn, lease.key(), lease.owner(), lease.epoch())?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Map
//!
//! Every public item is exported here, at the crate root; the modules
//! behind them are private and each does one job:
//!
//! | module | job |
//! |---|---|
//! | `sql` | the only place with SQL text, constraint names and answer decoding |
//! | `outcome` | grants, refusals and observed states, as values |
//! | `leases` | acquire, renew, release, inspect on a caller's connection |
//! | `many` | [`renew_many`], [`release_many`]: many keys of one owner in one call |
//! | `groups` | [`join_group`], [`renew_group`]: one row write keeps many keys alive |
//! | `guards` | fenced database writes ([`run_fenced`], [`admit`], ...) |
//! | `operator` | operator actions: namespace rules ([`bind_namespace`], ...), [`force_release`], [`raise_generation`]; and [`generation`] |
//! | `token` | the fencing token and its text form |
//! | `errors` | typed errors that keep their sources |
//! | `pool`, `client` | the connection pool and [`LeaseClient`] over it |
//! | `waiting` | [`LeaseWaiter`]: wake-on-release waiting and its listener |
//! | `holding` | [`Keeper`], [`KeeperSet`], [`run_while_held`], [`CancelToken`] |
//! | `install` | the embedded migrations and their installer |
//! | `migration_sql` | the migrations' text, handed to the command that generates the `CREATE EXTENSION` files |
//! | `prune` | [`prune`]: removing rows lapsed or unused for long |
//! | `field_text` | the percent-encoding of token fields |
//! | `libpq` | the listener's libpq FFI: the only module allowed `unsafe` |
//! | `telemetry` | spans, events and metrics (features `tracing`, `metrics`) |
//!
//! # Telemetry
//!
//! Two cargo features, both off by default (and then the instrumentation
//! compiles to nothing); the library installs no subscriber and no
//! recorder, the application does.
//!
//! With `tracing`, every lease call (the single-key calls, the batch and
//! group calls, the operator calls and [`prune`]) runs in a `DEBUG` span
//! `lease` (target `leasehold::lease`), every guard call in a span `guard`
//! (`leasehold::guard`), and a [`LeaseWaiter`] acquire in a span
//! `lease_wait` (`leasehold::waiter`), with the fields `operation`,
//! `owner`, `epoch`, `outcome` and `duration_us`. Events: a
//! [`Keeper`]'s loss (`WARN`, `leasehold::keeper`, with `reason`), a
//! waiter's wake-up (`DEBUG`, `leasehold::waiter`, with `cause`), the
//! listener's connection and loss (`INFO`/`WARN`, `leasehold::listener`).
//! Lease keys and resource names (`key`, `resource`) are recorded only
//! after [`set_trace_keys`]`(`[`TraceKeys::Recorded`]`)`: they are the
//! application's own names, and traces usually leave the process.
//!
//! With `metrics`, through the `metrics` facade ([`describe_metrics`]
//! gives the recorder their help texts). Labels come from small closed
//! sets; keys are never labels.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `leasehold_calls_total` | counter | `operation`, `outcome` | every lease and guard call, by result |
//! | `leasehold_acquire_total` | counter | `outcome` | acquire attempts (also each attempt of a waiter) |
//! | `leasehold_guard_refused_total` | counter | `kind` | guard calls that refused a writer |
//! | `leasehold_call_duration_seconds` | histogram | `operation` | client-side time of one lease or guard call |
//! | `leasehold_lease_lost_total` | counter | `reason` | leases a [`crate::Keeper`] lost |
//! | `leasehold_wait_duration_seconds` | histogram | `outcome` | time a [`crate::LeaseWaiter`] acquire waited |
//! | `leasehold_waiter_wakeups_total` | counter | `cause` | times a blocked waiter woke to try again |
//! | `leasehold_listener_up` | gauge | | waiters' listener sessions connected (one per database URL) |
//!
//! Label values:
//! - `operation`: `acquire`, `renew`, `release`, `inspect`, `renew_many`,
//!   `release_many`, `join_group`, `renew_group`, `admit`, `check_held`,
//!   `admit_held`, `renew_admit`, `fence`, `inspect_guard`,
//!   `force_release`, `bind_namespace`, `unbind_namespace`,
//!   `list_namespaces`, `generation`, `raise_generation`, `prune`.
//! - `outcome` of a call: `granted`, `denied` (acquire); `renewed`,
//!   `released` (renew, release) or the refusal `not_owner`, `lapsed`,
//!   `epoch_mismatch`; `held`, `unowned`, `unknown` (inspect); `admitted`,
//!   `held` (check_held), `fenced`, `found`, `absent` (guards); a guard
//!   refusal's `kind`; `all`, `partial`, `none` (a batch: how many keys got
//!   `renewed` or `released`); `joined`, `refused` (join_group);
//!   `released`, `newer_grant`, `already_free`, `no_such_grant`,
//!   `never_leased` (force_release); `done`, `absent` (namespace rules,
//!   raise_generation), `listed`, `read` (generation), `not_above`;
//!   `pruned`, `dry_run`; or the failure `invalid`, `timed_out`,
//!   `forbidden`, `outcome_unknown`, `read_only`, `retry`, `not_installed`, `error`.
//! - `kind` of a guard refusal: `stale_epoch`, `wrong_lease_key`,
//!   `epoch_not_granted`, `lease_not_held`, `forbidden`.
//! - `reason` of a keeper's loss: `not_owner`, `lapsed`, `epoch_mismatch`
//!   (a renew was refused), `deadline_passed` (no renew succeeded in time).
//! - `outcome` of a wait: `granted`, `timed_out`, `cancelled`, `error`.
//! - `cause` of a wake-up: `listener` (a release notification for the key,
//!   or the listener session going down or up), `timer` (the holder's
//!   expiry, a poll or re-check, or the wait's deadline).
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

mod client;
mod errors;
mod field_text;
mod groups;
pub mod guard;
mod guards;
mod holding;
mod install;
mod leases;
#[allow(unsafe_code)]
mod libpq;
mod many;
mod migration_sql;
mod operator;
mod outcome;
mod pool;
mod prune;
mod sql;
// With both telemetry features off only the pass-throughs are used.
#[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
mod telemetry;
mod token;
mod waiting;

pub use client::LeaseClient;
pub use errors::{
    GenerationError, GuardError, InstallError, LeaseError, NamespaceError, Operation,
    LOCK_WAIT_BOUND,
};
pub use groups::{join_group, renew_group, GroupId, GroupJoin, GroupRenewal};
pub use guards::{
    admit, admit_held, check_held, fence, inspect_guard, renew_and_admit, run_fenced, Check,
    FencedError, GuardRecord,
};
pub use holding::{
    run_while_held, CancelToken, Keeper, KeeperBuilder, KeeperError, KeeperEvent, KeeperSet,
    KeeperSetBuilder, KeeperSetEvent, LeaseLoss, StopReason, WorkContext, WorkOutcome,
};
pub use install::{
    install, installed_versions, uninstall, InstallReport, INSTALL_LOCK_TIMEOUT, MIGRATIONS,
};
pub use leases::{acquire, acquire_waiting, inspect, release, renew};
pub use many::{release_many, renew_many, MAX_KEYS_PER_CALL};
pub use operator::{
    bind_namespace, force_release, force_release_epoch, generation, list_namespaces,
    raise_generation, unbind_namespace, BoundRole, ForcedRelease, Generation, NamespaceRule,
    GENERATION_SHIFT, MAX_GENERATION,
};
pub use outcome::{
    Acquisition, KeyRelease, KeyRenewal, Lease, LeaseState, Refusal, Release, Renewal,
};
pub use pool::{build_pool, PgPool, PreparedStatements};
pub use prune::{prune, PruneError, PruneOptions, PruneReport, DEFAULT_PRUNE_BATCH};
pub use telemetry::{describe_metrics, set_trace_keys, trace_keys, TraceKeys};
pub use token::{FencingToken, TokenError};
pub use waiting::{
    LeaseWaiter, LeaseWaiterBuilder, ListenerStatus, PollingReason, Wait, WaitError, WakeMode,
    DEFAULT_FALLBACK_POLL, DEFAULT_RECHECK, LISTENER_APPLICATION_NAME, UNDELIVERED_RETRY,
    WAITER_LIMIT,
};

/// Plumbing shared with the adapter crates in `guards/` (not a public API:
/// it may change in any release).
#[doc(hidden)]
pub mod __private {
    /// The percent-encoding of token fields, also used by fenced files'
    /// headers so both spell a key the same way.
    pub mod field_text {
        pub use crate::field_text::{decode, encode};
    }

    /// What the `leasehold` command needs to generate the PostgreSQL
    /// extension from the migrations (a build-time job, kept out of the
    /// library): each migration's text, and the schema-ownership check the
    /// extension replaces with its own.
    pub mod extension_inputs {
        pub use crate::migration_sql::MIGRATION_SQL;
        pub use crate::sql::install::SCHEMA_OWNER_CHECK;
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
}
