//! docs/SPECIFICATION.md §1.6, the failure model: every check runs against its own
//! throwaway cluster, because most of them stop, crash or break it.
//!
//! Nothing here waits for time to pass on hope. Expiry is awaited on the
//! server's clock (`clock_timestamp()`), a competitor is known to be waiting
//! when `pg_stat_activity` says so, a dead backend is gone when
//! `pg_stat_activity` no longer lists it, a paused process is paused when
//! `/proc/<pid>/stat` says `T`, and a lost answer is lost because a proxy
//! in this process dropped it after seeing the server's ReadyForQuery.
//!
//! Clusters whose point is durability run with `durable(true)` (fsync and
//! synchronous commit on); the others run without, to keep the suite fast.
//!
//! Modules follow the failure model's parts: `restarts`, `downtime`,
//! `durability`, `holders`, `election` (three candidate processes), `short_ttl`, `interrupted`, `lost_answers`,
//! `failover` (clients across a failover), `stopping` (a holder stops in
//! time whatever the database does); `common` is the
//! cluster fixture and the waits, `proxy` the TCP proxy that loses answers.

mod common;
mod downtime;
mod durability;
mod election;
mod failover;
mod holders;
mod interrupted;
mod lost_answers;
mod proxy;
mod restarts;
mod short_ttl;
mod stopping;
