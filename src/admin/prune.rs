//! Pruning: an operator removes the rows of
//! keys nobody uses any more, so that a database that sees millions of
//! short-lived keys (job ids, request ids) does not grow for ever.
//!
//! What goes: key rows FREE or LAPSED for longer than the idle time, the
//! guard records of resources fenced only by such keys, and the waiter rows
//! of gone sessions for them. What never happens because of it: an epoch
//! granted twice, a counter going back, or a stale epoch admitted. A key
//! that comes back starts above every epoch it had (the watermark,
//! `lease.lineage.pruned_through`), and guards refuse every epoch of a
//! pruned incarnation (docs/SPECIFICATION.md, "Pruning", has the argument).
//!
//! The work is done in batches, each one short transaction (when the
//! connection is not inside a transaction of the caller's), so a prune never
//! holds locks for long and never waits for a lock a lease call holds: rows
//! anybody has locked are skipped, not waited for.
//!
//! The SQL functions are granted to nobody: the installing role runs them
//! or grants EXECUTE on `lease.prune_keys(interval, bytea, integer, boolean)`
//! and `lease.prune_guards(interval, bytea, integer, boolean)` to an
//! operator role (docs/guide/security.md, "Security model").

use crate::error::Repr;
use diesel::pg::data_types::PgInterval;
use diesel::sql_types::{BigInt, Binary, Bool, Integer, Interval, Nullable};
use std::time::Duration;

use crate::error::{LeaseError, Operation};
use crate::sql::execute::{get_result, Execute};
use crate::sql::input;
use crate::telemetry;

impl Operation {
    /// `lease.prune_keys` / `lease.prune_guards`.
    pub const PRUNE: Operation = Operation::writes("prune");
}

crate::sql::calls::lease_call! {
    /// `lease.prune_keys(idle, after, batch, dry_run)`: one batch of key pruning.
    PruneKeysCall { idle: PgInterval => Interval, after: Option<&'a [u8]> => Nullable<Binary>, batch: i32 => Integer, dry_run: bool => Bool }
    sql = "SELECT examined, pruned, sighted, waiters, watermark, next_after FROM lease.prune_keys";
    row = (Integer, Integer, Integer, Integer, BigInt, Nullable<Binary>);
    rust = (i32, i32, i32, i32, i64, Option<Vec<u8>>);
}

crate::sql::calls::lease_call! {
    /// `lease.prune_guards(idle, after, batch, dry_run)`: one batch of guard pruning.
    PruneGuardsCall { idle: PgInterval => Interval, after: Option<&'a [u8]> => Nullable<Binary>, batch: i32 => Integer, dry_run: bool => Bool }
    sql = "SELECT examined, pruned, next_after FROM lease.prune_guards";
    row = (Integer, Integer, Nullable<Binary>);
    rust = (i32, i32, Option<Vec<u8>>);
}

/// How many rows one batch looks at by default: small enough that a batch
/// locks for milliseconds, large enough that a prune of a million rows
/// takes a thousand round trips, not a million.
pub const DEFAULT_PRUNE_BATCH: u32 = 1000;

/// What to prune, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneOptions {
    /// Remove only rows idle for longer than this: LAPSED since before
    /// now − idle, or FREE at the same counter since a prune saw them at
    /// least this long ago (a FREE row carries no timestamp, so the first
    /// prune that sees it only records it). More than zero, at most 100
    /// years.
    pub idle: Duration,
    /// Change nothing; report what a prune would remove now.
    pub dry_run: bool,
    /// Rows looked at per batch (1 to 100 000).
    pub batch: u32,
}

impl PruneOptions {
    /// A real prune of rows idle for longer than `idle`, in batches of
    /// [`DEFAULT_PRUNE_BATCH`].
    pub fn new(idle: Duration) -> Self {
        PruneOptions {
            idle,
            dry_run: false,
            batch: DEFAULT_PRUNE_BATCH,
        }
    }
}

/// What a prune did (or, for a dry run, would do now).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Whether this was a dry run (nothing changed).
    pub dry_run: bool,
    /// Key rows looked at.
    pub keys_examined: u64,
    /// Key rows removed (dry run: removable now).
    pub keys_pruned: u64,
    /// FREE key rows seen for the first time at their counter: a later
    /// prune, at least the idle time later, removes them if they are still
    /// FREE at that counter (dry run: rows a prune would record).
    pub keys_sighted: u64,
    /// Waiter rows of gone sessions removed with their keys (a dry run
    /// does not count these).
    pub waiters_pruned: u64,
    /// Guard records looked at.
    pub guards_examined: u64,
    /// Guard records removed (dry run: removable now; records of keys
    /// that this prune would remove first are not counted).
    pub guards_pruned: u64,
    /// The watermark after the prune: every key that comes back gets a
    /// first epoch above it.
    pub watermark: i64,
    /// Batches run (each its own transaction when the connection is in
    /// autocommit).
    pub batches: u64,
}

/// The connection's `Operator::prune`: its documentation is there.
pub(crate) async fn prune(
    conn: &mut impl Execute,
    options: &PruneOptions,
) -> Result<PruneReport, LeaseError> {
    telemetry::lease_call(Operation::PRUNE, "", "", None, async move {
        let idle = input::interval("idle", options.idle).map_err(|violation| {
            LeaseError::from(Repr::InvalidInput {
                violations: vec![violation],
            })
        })?;
        let batch = i32::try_from(options.batch).unwrap_or(i32::MAX);
        let mut report = PruneReport {
            dry_run: options.dry_run,
            ..PruneReport::default()
        };
        let mut after: Option<Vec<u8>> = None;
        loop {
            let (examined, pruned, sighted, waiters, watermark, next) = get_result(
                conn,
                PruneKeysCall {
                    idle,
                    after: after.as_deref(),
                    batch,
                    dry_run: options.dry_run,
                    _borrow: std::marker::PhantomData,
                },
            )
            .await
            .map_err(|error| LeaseError::from_keyless(Operation::PRUNE, error, false))?;
            report.batches += 1;
            report.keys_examined += count(examined);
            report.keys_pruned += count(pruned);
            report.keys_sighted += count(sighted);
            report.waiters_pruned += count(waiters);
            report.watermark = watermark;
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        after = None;
        loop {
            let (examined, pruned, next) = get_result(
                conn,
                PruneGuardsCall {
                    idle,
                    after: after.as_deref(),
                    batch,
                    dry_run: options.dry_run,
                    _borrow: std::marker::PhantomData,
                },
            )
            .await
            .map_err(|error| LeaseError::from_keyless(Operation::PRUNE, error, false))?;
            report.batches += 1;
            report.guards_examined += count(examined);
            report.guards_pruned += count(pruned);
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok(report)
    })
    .await
}

/// A row count from the server (never negative).
fn count(rows: i32) -> u64 {
    u64::try_from(rows).unwrap_or(0)
}

impl telemetry::Outcome for PruneReport {
    fn outcome(&self) -> &'static str {
        if self.dry_run {
            "dry_run"
        } else {
            "pruned"
        }
    }
}
