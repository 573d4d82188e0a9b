//! What leasehold's test binaries, benches and examples share, so that each
//! helper exists once: a PostgreSQL server per test binary and a database
//! per test ([`TestServer`], [`TestDb`]), waits on the *server's* clock,
//! small query helpers, the nemesis run with its history checker, and a
//! Patroni cluster for failover tests ([`patroni::PatroniCluster`]); for
//! the object-store adapter, moto ([`moto::MotoServer`]) and a proxy that
//! loses answers ([`fault_proxy::FaultProxy`]).
//!
//! Test tooling, not library code: helpers panic with a message saying what
//! failed instead of returning errors, because a failed setup step is a
//! failed test. Never published (`publish = false`).

pub mod catalog;
pub mod clock;
pub mod coverage;
pub mod database;
pub mod deployment;
pub mod fault_proxy;
pub mod grants;
pub mod guard_conformance;
pub mod json;
pub mod moto;
pub mod nemesis;
pub mod patroni;
pub mod pgbouncer;
pub mod process;
pub mod replication;
pub mod server;
pub mod sql;

pub use clock::{server_now, try_server_now, wait_until_server_time_passes};
pub use database::TestDb;
pub use deployment::Deployment;
pub use grants::{grant, grants};
pub use json::time_of;
pub use pgbouncer::{PgBouncer, PoolMode};
pub use replication::ReplicatedPair;
pub use server::TestServer;
pub use sql::{query_bool, query_lines, quote, wait_for_lock_waiter};
