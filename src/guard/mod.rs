//! One contract for every guard (database resource, fenced file, fenced object):
//! per resource a fencing key and a floor epoch; a token below the floor or of
//! another key is refused and changes nothing, one at or above it raises the
//! floor, a fence through N refuses up to N, and the floor never goes down.
//! [`Guard`] states it once so code can take any guard
//! and `guard_conformance` tests them alike; the database guard's own calls are
//! [`Fencing`]'s, in the caller's transaction.

pub(crate) mod database;
pub(crate) mod table;

pub use crate::api::Fencing;
pub use crate::guard::database::{Check, FencedError, GuardRecord};
pub use crate::guard::table::{FencedTable, TableFence};

use crate::error::LeaseError;
use crate::lease::epoch::Epoch;
use crate::lease::refusal::Refusal;
use crate::lease::token::FencingToken;
use crate::pool::{with_conn, PgPool};
use crate::sql::execute::finish;

/// Why a guard refused a token; other failures (I/O, database) are not refusals.
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

/// A resource that refuses superseded lease holders: a token below its floor epoch, or of another
/// key, is refused and changes nothing; one at or above it raises the floor, which never goes down.
pub trait Guard {
    /// What a call can fail with; [`Guard::refused`] picks the refusals out.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Admits `token` without writing anything else, raising the floor to its epoch
    /// (a resource never fenced is fenced to its key).
    fn admit(&self, token: &FencingToken) -> Result<(), Self::Error>;

    /// Operator action: refuses every epoch up to `through` (never lowers the floor).
    fn fence(&self, key: &str, through: Epoch) -> Result<(), Self::Error>;

    /// The resource's record, `None` if it was never fenced.
    fn record(&self) -> Result<Option<GuardRecord>, Self::Error>;

    /// The refusal `error` is, if it is one.
    fn refused(error: &Self::Error) -> Option<Refused>;
}

/// Takes over every resource in `guards` for `token`'s grant before the first write:
/// a file or object cannot read the lease table, so the superseded holder is refused
/// only once the floor rises. Stops at the first refusal; earlier ones stay taken over.
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

/// A database resource as a [`Guard`], each call in its own pooled transaction. For
/// a guarded *write*, [`crate::guard::Fencing::admit`] in the writer's transaction instead.
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
        match error.refusal()? {
            Refusal::StaleEpoch { accepted } => Some(Refused::Stale {
                presented: error.epoch()?,
                accepted,
            }),
            Refusal::WrongKey => Some(Refused::WrongKey {
                fenced_by: error.fenced_by()?.to_owned(),
                presented: error.key()?.to_owned(),
            }),
            _ => None,
        }
    }
}
