//! # leasehold
//!
//! PostgreSQL-native leases: time-bounded ownership of a named key that lapses
//! unless renewed, with a monotonic fencing epoch on every grant, and guards
//! that make protected resources refuse writes from a superseded holder.
//!
//! The SQL side lives in `migrations/` (schema `lease`, the functions
//! `lease.acquire`, `lease.renew`, `lease.release`, `lease.inspect`) and is
//! installed by [`install`]. The Rust side is a thin, synchronous, typed layer
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
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod calls;
mod cancel;
mod client;
mod errors;
pub mod field_text;
pub mod guards;
mod install;
mod keeper;
mod leases;
mod libpq;
mod listener;
mod pooled;
mod token;
mod wait;
mod worker;

pub use cancel::CancelToken;
pub use client::{LeaseClient, PgPool};
pub use errors::{GuardError, InstallError, LeaseError};
pub use guards::{run_fenced, Check, FencedError};
pub use install::{install, installed_versions, uninstall, InstallReport, MIGRATIONS};
pub use keeper::{Keeper, KeeperBuilder, KeeperError, KeeperEvent, LeaseLoss};
pub use leases::{
    acquire, acquire_waiting_in_sql, inspect, release, renew, Acquisition, Lease, LeaseState,
    LostLease, Release, Renewal,
};
pub use listener::{ListenerStatus, LISTENER_APPLICATION_NAME};
pub use token::{FencingToken, TokenError};
pub use wait::{
    LeaseWaiter, LeaseWaiterBuilder, Wait, WaitError, DEFAULT_FALLBACK_POLL, DEFAULT_RECHECK,
};
pub use worker::{run_while_held, StopReason, WorkContext, WorkOutcome};
