//! A handle over an r2d2 pool, for callers without a connection at hand.
//!
//! Its operations are those of [`crate::Leases`] (src/api.rs): each checks
//! a connection out for exactly one call and autocommits, so nothing is
//! held between calls. Callers that need an operation inside their own
//! transaction call the same methods on their connection.

use diesel::pg::PgConnection;

use crate::errors::{GuardError, LeaseError};
use crate::guards::{Check, FencedError};
use crate::pool::{self, PgPool, PreparedStatements};
use crate::token::FencingToken;

/// Every lease operation over a connection pool: the methods of
/// [`crate::Leases`]. Clone it for each thread or task that calls it (a
/// clone shares the pool).
///
/// `database_url` may name several hosts, as libpq allows
/// (`postgres://u@h1:5432,h2:5432/app?target_session_attrs=read-write`):
/// each new connection goes to the first host that accepts it and is
/// writable. After a failover, a call on a connection to the old primary
/// fails once ([`LeaseError::OutcomeUnknown`] when the connection broke
/// mid-call, [`LeaseError::ReadOnlyServer`] when the old primary stayed up
/// read-only, or [`LeaseError::Database`] when it broke before the call
/// was sent) and the connection is discarded, so the next call reaches the
/// new primary. docs/guide/failover.md, "Clients across a failover", has the whole story.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use leasehold::Leases;
/// let mut client = leasehold::LeaseClient::connect("postgres://localhost/app", 4)?;
/// if let Some(lease) = client.acquire("job-42", "worker-a1", Duration::from_secs(30))?.granted() {
///     client.release(lease.key(), lease.owner(), lease.epoch())?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseClient {
    pub(crate) pool: PgPool,
}

impl std::fmt::Debug for LeaseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseClient")
            .field("pool_state", &self.pool.state())
            .finish()
    }
}

impl LeaseClient {
    /// Wraps an existing pool.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Builds a pool of up to `max_size` connections to `database_url`.
    ///
    /// The pool skips r2d2's `SELECT 1` check on every checkout (a full
    /// round trip per operation); a connection found dead by a call is
    /// discarded instead of being returned to the pool, so only that call
    /// fails and the next one gets a fresh connection.
    ///
    /// One connection is opened first: a wrong password, user, host or
    /// database fails here with libpq's message ([`LeaseError::Connect`]).
    /// Every connection attempt gives up after libpq's `connect_timeout`,
    /// 5 seconds unless the URL sets one (`?connect_timeout=10`) or
    /// `PGCONNECT_TIMEOUT` is set.
    pub fn connect(database_url: &str, max_size: u32) -> Result<Self, LeaseError> {
        Ok(Self {
            pool: pool::build(database_url, max_size)?,
        })
    }

    /// [`LeaseClient::connect`] with the statement caching `prepared` says:
    /// [`PreparedStatements::Uncached`] for a URL that goes through a
    /// transaction-mode pooler (docs/guide/poolers.md, "Poolers").
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use leasehold::{LeaseClient, pool::PreparedStatements};
    /// let client = LeaseClient::connect_with("postgres://pgbouncer:6432/app", 4, PreparedStatements::Uncached)?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn connect_with(
        database_url: &str,
        max_size: u32,
        prepared: PreparedStatements,
    ) -> Result<Self, LeaseError> {
        Ok(Self {
            pool: pool::build_with(database_url, max_size, prepared)?,
        })
    }

    /// The underlying pool, for the caller's own queries.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// The whole fenced transaction of [`crate::Leases::run_fenced`] on one
/// connection of `pool`, returned to the pool afterwards unless the server
/// turned read-only (a failover): that connection would keep reaching it.
pub(crate) fn run_fenced_pooled<T, E, F>(
    pool: &PgPool,
    resource: &str,
    token: &FencingToken,
    check: Check,
    work: F,
) -> Result<T, FencedError<E>>
where
    F: FnOnce(&mut PgConnection) -> Result<T, E>,
{
    let mut conn = pool
        .get()
        .map_err(|error| FencedError::Guard(GuardError::Pool(error)))?;
    let result = crate::guards::run_fenced(&mut conn, resource, token, check, work);
    if let Err(FencedError::Guard(GuardError::ReadOnlyServer { .. })) = &result {
        pool::discard(&mut conn);
    }
    result
}
