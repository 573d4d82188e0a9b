//! One contract for every guard: a database resource, a fenced file, a
//! fenced object.
//!
//! Each guard keeps, per resource, the lease key that fences it and the
//! lowest epoch it still admits, and refuses everything else
//! (docs/SPECIFICATION.md §2):
//!
//! * a token below the floor is refused as stale, and changes nothing;
//! * a token of another key is refused as a misuse, and changes nothing;
//! * a token at or above the floor is admitted and raises the floor to its
//!   epoch (the same epoch again is the same grant, admitted again);
//! * an operator's fence through epoch N refuses every epoch up to N;
//! * the floor never goes down.
//!
//! [`Guard`] says that once, in one vocabulary, for all three, so code that
//! protects "a resource" can take any of them, and one conformance suite
//! (`leasehold-test-support`'s `guard_conformance`) runs the same cases
//! against each. The guards' own APIs (the database guard's calls of
//! [`Fencing`] in the caller's transaction, `FencedFile::write`,
//! `FencedStore::write`) stay where a write must go with the admission;
//! this trait is their common floor.
//!
//! The database guard's calls are the methods of [`Fencing`]:
//! [`run_fenced`](Fencing::run_fenced) runs a closure's writes in one
//! transaction behind the admission; [`admit`](Fencing::admit) (with a
//! [`Check`] of the strength wanted) and [`check_held`](Fencing::check_held)
//! check a token in the caller's own transaction; [`fence`](Fencing::fence)
//! is the operator's action and [`inspect_guard`](Fencing::inspect_guard)
//! reads a resource's record. This module holds them and their types.

pub(crate) mod database;
pub(crate) mod table;

pub use crate::api::Fencing;
pub use crate::guard::database::{Check, GuardRecord};
pub use crate::guard::table::{FencedTable, TableFence};

use crate::error::LeaseError;
use crate::lease::epoch::Epoch;
use crate::lease::token::FencingToken;
use crate::pool::{with_conn, PgPool};
use crate::sql::execute::finish;

/// Why a guard refused a token, in the contract's words. Any other failure
/// (I/O, the database, a store whose answer was lost) is not a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// The token's epoch is below the floor: its holder was superseded.
    Stale {
        /// The token's epoch.
        presented: Epoch,
        /// The lowest epoch the resource admits.
        accepted: Epoch,
    },
    /// The resource is fenced by another lease key.
    WrongKey {
        /// The key that fences the resource.
        fenced_by: String,
        /// The token's key.
        presented: String,
    },
}

/// A resource that refuses superseded lease holders (see the module docs).
pub trait Guard {
    /// What a call can fail with; [`Guard::refused`] picks the refusals out.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Admits `token` without writing anything else: refused as stale below
    /// the floor or as a misuse for another key; otherwise the floor rises
    /// to the token's epoch (a resource never fenced is fenced to its key).
    fn admit(&self, token: &FencingToken) -> Result<(), Self::Error>;

    /// Operator action: refuses every epoch up to and including `through`
    /// from now on (never lowers the floor; a resource never fenced is
    /// fenced to `key`).
    fn fence(&self, key: &str, through: Epoch) -> Result<(), Self::Error>;

    /// The resource's record, `None` if it was never fenced.
    fn record(&self) -> Result<Option<GuardRecord>, Self::Error>;

    /// The refusal `error` is, if it is one.
    fn refused(error: &Self::Error) -> Option<Refused>;
}

/// Takes over every resource in `guards` for `token`'s grant: each admits
/// the token without a write, so its floor rises to the new epoch and the
/// holder that was superseded is refused there from now on, before the new
/// holder's first write. A database guard refuses a superseded epoch by
/// itself (it reads the lease table); a file or an object cannot, so a new
/// holder calls this right after its grant for every resource it will
/// write. Stops at the first refusal or failure and returns it; the
/// resources before it stay taken over.
///
/// ```no_run
/// # fn demo(lease: &leasehold::Lease, files: &[leasehold_fs::FencedFile]) -> Result<(), leasehold_fs::FenceError> {
/// leasehold::guard::take_over(lease.token(), files)?;
/// # Ok(()) }
/// ```
pub fn take_over<'a, G: Guard + 'a>(
    token: &FencingToken,
    guards: impl IntoIterator<Item = &'a G>,
) -> Result<(), G::Error> {
    guards.into_iter().try_for_each(|guard| guard.admit(token))
}

/// A database resource (a name in `lease.guards`) as a [`Guard`]: each
/// call runs in a transaction of its own on a pooled connection.
///
/// For a guarded *write*, call [`crate::guard::Fencing::admit`] (or [`crate::guard::Fencing::run_fenced`])
/// in the writer's own transaction instead: only there does the admission
/// commit or roll back with the write.
#[derive(Debug, Clone)]
pub struct DatabaseGuard {
    pool: PgPool,
    resource: String,
}

impl DatabaseGuard {
    /// The guard of `resource`, reached through `pool`.
    pub fn new(pool: PgPool, resource: impl Into<String>) -> Self {
        Self {
            pool,
            resource: resource.into(),
        }
    }

    /// The resource's name.
    pub fn resource(&self) -> &str {
        &self.resource
    }
}

impl Guard for DatabaseGuard {
    type Error = LeaseError;

    fn admit(&self, token: &FencingToken) -> Result<(), LeaseError> {
        with_conn(&self.pool, |conn| {
            finish(database::admit(conn, &self.resource, token))
        })
    }

    fn fence(&self, key: &str, through: Epoch) -> Result<(), LeaseError> {
        with_conn(&self.pool, |conn| {
            finish(database::fence(conn, &self.resource, key, through)).map(drop)
        })
    }

    fn record(&self) -> Result<Option<GuardRecord>, LeaseError> {
        with_conn(&self.pool, |conn| {
            finish(database::inspect_guard(conn, &self.resource))
        })
    }

    fn refused(error: &LeaseError) -> Option<Refused> {
        match error {
            LeaseError::StaleEpoch {
                presented,
                accepted,
                ..
            } => Some(Refused::Stale {
                presented: *presented,
                accepted: *accepted,
            }),
            LeaseError::WrongLeaseKey {
                fenced_by,
                presented,
                ..
            } => Some(Refused::WrongKey {
                fenced_by: fenced_by.clone(),
                presented: presented.clone(),
            }),
            _ => None,
        }
    }
}
