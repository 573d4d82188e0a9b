//! A handle over an r2d2 pool, for callers without a connection at hand.
//!
//! Each method checks a connection out for exactly one call and autocommits,
//! so nothing is held between calls. Callers that need an operation inside
//! their own transaction use the free functions with their connection.

use std::time::Duration;

use diesel::pg::PgConnection;

use crate::errors::LeaseError;
use crate::groups::{self, GroupId, GroupJoin, GroupRenewal};
use crate::leases;
use crate::many;
use crate::outcome::{Acquisition, KeyRelease, KeyRenewal, Lease, LeaseState, Release, Renewal};
use crate::pool::{self, with_conn, PgPool, PreparedStatements};

/// Lease operations over a connection pool.
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
/// let client = leasehold::LeaseClient::connect("postgres://localhost/app", 4)?;
/// if let Some(lease) = client.acquire("job-42", "worker-a1", Duration::from_secs(30))?.granted() {
///     client.release(lease.key(), lease.owner(), lease.epoch())?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseClient {
    pool: PgPool,
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

    /// [`leases::acquire`] on a pooled connection.
    pub fn acquire(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Acquisition, LeaseError> {
        with_conn(&self.pool, |conn| leases::acquire(conn, key, owner, ttl))
    }

    /// [`leases::acquire_waiting`] on a pooled connection (held for the
    /// whole wait).
    pub fn acquire_waiting(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LeaseError> {
        with_conn(&self.pool, |conn| {
            leases::acquire_waiting(conn, key, owner, ttl, wait)
        })
    }

    /// [`leases::renew`] on a pooled connection.
    pub fn renew(
        &self,
        key: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
    ) -> Result<Renewal, LeaseError> {
        with_conn(&self.pool, |conn| {
            leases::renew(conn, key, owner, epoch, ttl)
        })
    }

    /// [`leases::release`] on a pooled connection.
    pub fn release(&self, key: &str, owner: &str, epoch: i64) -> Result<Release, LeaseError> {
        with_conn(&self.pool, |conn| leases::release(conn, key, owner, epoch))
    }

    /// [`many::renew_many`] on a pooled connection: one round trip for all
    /// of `grants`.
    pub fn renew_many(
        &self,
        owner: &str,
        grants: &[(&str, i64)],
        ttl: Duration,
    ) -> Result<Vec<KeyRenewal>, LeaseError> {
        with_conn(&self.pool, |conn| {
            many::renew_many(conn, owner, grants, ttl)
        })
    }

    /// [`many::release_many`] on a pooled connection.
    pub fn release_many(
        &self,
        owner: &str,
        grants: &[(&str, i64)],
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        with_conn(&self.pool, |conn| many::release_many(conn, owner, grants))
    }

    /// [`groups::join_group`] on a pooled connection.
    pub fn join_group(
        &self,
        owner: &str,
        grants: &[(&str, i64)],
        ttl: Duration,
    ) -> Result<GroupJoin, LeaseError> {
        with_conn(&self.pool, |conn| {
            groups::join_group(conn, owner, grants, ttl)
        })
    }

    /// [`groups::renew_group`] on a pooled connection: one row write keeps
    /// every member alive.
    pub fn renew_group(
        &self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> Result<GroupRenewal, LeaseError> {
        with_conn(&self.pool, |conn| {
            groups::renew_group(conn, group, owner, ttl)
        })
    }

    /// [`crate::guards::run_fenced`] on a pooled connection: the whole fenced
    /// transaction runs on one connection, returned to the pool afterwards.
    pub fn run_fenced<T, E, F>(
        &self,
        resource: &str,
        token: &crate::FencingToken,
        check: crate::guards::Check,
        work: F,
    ) -> Result<T, crate::guards::FencedError<E>>
    where
        F: FnOnce(&mut PgConnection) -> Result<T, E>,
    {
        let mut conn = self.pool.get().map_err(|error| {
            crate::guards::FencedError::Guard(crate::error::GuardError::Pool(error))
        })?;
        let result = crate::guards::run_fenced(&mut conn, resource, token, check, work);
        if let Err(crate::guards::FencedError::Guard(crate::error::GuardError::ReadOnlyServer {
            ..
        })) = &result
        {
            // The server turned read-only (a failover): this connection
            // would keep reaching it, so it is not given back to the pool.
            pool::discard(&mut conn);
        }
        result
    }

    /// [`leases::inspect`] on a pooled connection.
    pub fn inspect(&self, key: &str) -> Result<Option<LeaseState>, LeaseError> {
        with_conn(&self.pool, |conn| leases::inspect(conn, key))
    }
}
