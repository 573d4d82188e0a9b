//! The async face (cargo feature `async`): every operation of
//! [`Leases`](crate::Leases) as a future, for tokio applications.
//!
//! [`AsyncLeases`] has the methods of [`Leases`](crate::Leases), with the
//! same names, arguments, answers and errors, each returning a `Send`
//! future (so a task that `tokio::spawn`s may hold it). It is implemented
//! for diesel-async's [`AsyncPgConnection`], where a call runs in whatever
//! transaction the caller has open and commits or rolls back with it, and
//! for [`AsyncLeaseClient`], whose calls each check a connection out of a
//! pool (deadpool) and autocommit.
//!
//! Nothing is written twice: each method runs the one crate-private
//! function of the sync face's method, over the same statement values,
//! decoding, error mapping and telemetry (docs/ARCHITECTURE.md, "The two
//! faces"); only the execute step differs, `diesel_async::RunQueryDsl`
//! instead of `diesel::RunQueryDsl`. `tests/leasehold/same_sql.rs` fails if
//! the two faces ever send different SQL for one operation.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasehold::aio::{AsyncLeaseClient, AsyncLeases};
//! use leasehold::Acquisition;
//!
//! let mut client = AsyncLeaseClient::builder("postgres://localhost/app")
//!     .max_size(8)
//!     .build()
//!     .await?;
//! if let Acquisition::Granted(lease) = client
//!     .acquire("job-42", "worker-a1", Duration::from_secs(30))
//!     .await?
//! {
//!     // ... work, presenting lease.token() to guards ...
//!     client.release(&lease).await?;
//! }
//! # Ok(()) }
//! ```

mod client;
mod connect;
mod keeper;
mod keeper_set;
mod releases;
mod waiter;
mod worker;

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};

use crate::epoch::Epoch;
use crate::errors::{GuardError, LeaseError};
use crate::groups::{GroupId, GroupJoin, GroupRenewal};
use crate::guards::{Check, FencedError, GuardRecord};
use crate::listing::{ListFilter, Listing};
use crate::many::split_grants;
use crate::operator::{ForcedRelease, FunctionPrivilege, Generation, NamespaceRule};
use crate::outcome::{Acquisition, KeyRelease, KeyRenewal, Lease, LeaseState, Release, Renewal};
use crate::prune::{PruneOptions, PruneReport};
use crate::token::FencingToken;

pub(crate) use client::settle_lease;
use client::{checkout, settle_guard};
pub use client::{AsyncLeaseClient, AsyncLeaseClientBuilder, PoolError};
pub use connect::{connect, ConnectError};
pub use keeper::{Keeper, KeeperBuilder};
pub use keeper_set::{KeeperSet, KeeperSetBuilder};
pub use releases::ReleaseWatch;
pub use waiter::{LeaseWaiter, LeaseWaiterBuilder};
pub use worker::{run_while_held, WorkContext};

/// The async face's form of [`Lease::renew`], here with the rest of the
/// face (the operations below it do not know of it).
impl Lease {
    /// [`Lease::renew`] on the async face ([`AsyncLeases`]): renews this
    /// grant for its own ttl and, when renewed, records the new expiry.
    pub async fn renew_async(
        &mut self,
        leases: &mut impl AsyncLeases,
    ) -> Result<Renewal, LeaseError> {
        let renewal = leases.renew(self, self.ttl()).await;
        self.renewed(renewal)
    }
}

mod sealed {
    /// Only leasehold's own types implement [`super::AsyncLeases`].
    pub trait Sealed {}
    impl Sealed for diesel_async::AsyncPgConnection {}
    impl Sealed for super::AsyncLeaseClient {}
}

/// The caller's work inside [`AsyncLeases::run_fenced`]: an async closure
/// that takes the transaction's connection, `async |conn| { ... }`, and
/// whose future is `Send`. (Named as diesel-async names the callback of
/// its own `transaction`: a bound on an async closure's future cannot be
/// written directly yet.)
pub trait FencedWork<C, T, E>: FnOnce(C) -> <Self as FencedWork<C, T, E>>::Fut {
    /// The future the work runs as.
    type Fut: Future<Output = Result<T, E>>;
}

impl<F, C, Fut, T, E> FencedWork<C, T, E> for F
where
    F: FnOnce(C) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    type Fut = Fut;
}

/// Every operation of leasehold as a future, on an async connection or a
/// pooled async client (see the module's documentation). Sealed, as
/// [`Leases`](crate::Leases) is.
pub trait AsyncLeases: sealed::Sealed {
    /// [`Leases::acquire`](crate::Leases::acquire), awaited: the same call, the
    /// same answers and errors.
    fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Acquisition, LeaseError>> + Send;

    /// [`Leases::acquire_waiting`](crate::Leases::acquire_waiting), awaited: the same call, the
    /// same answers and errors.
    fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Lease, LeaseError>> + Send;

    /// [`Leases::renew`](crate::Leases::renew), awaited: the same call, the
    /// same answers and errors.
    fn renew(
        &mut self,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Renewal, LeaseError>> + Send;

    /// [`Leases::release`](crate::Leases::release), awaited: the same call, the
    /// same answers and errors.
    fn release(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<Release, LeaseError>> + Send;

    /// [`Leases::inspect`](crate::Leases::inspect), awaited: the same call, the
    /// same answers and errors.
    fn inspect(
        &mut self,
        key: &str,
    ) -> impl Future<Output = Result<Option<LeaseState>, LeaseError>> + Send;

    /// [`Leases::renew_many`](crate::Leases::renew_many), awaited: the same call, the
    /// same answers and errors.
    fn renew_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<KeyRenewal>, LeaseError>> + Send;

    /// [`Leases::release_many`](crate::Leases::release_many), awaited: the same call, the
    /// same answers and errors.
    fn release_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
    ) -> impl Future<Output = Result<Vec<KeyRelease>, LeaseError>> + Send;

    /// [`Leases::join_group`](crate::Leases::join_group), awaited: the same call, the
    /// same answers and errors.
    fn join_group(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> impl Future<Output = Result<GroupJoin, LeaseError>> + Send;

    /// [`Leases::renew_group`](crate::Leases::renew_group), awaited: the same call, the
    /// same answers and errors.
    fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<GroupRenewal, LeaseError>> + Send;

    /// [`Leases::admit`](crate::Leases::admit), awaited: the same call, the
    /// same answers and errors.
    fn admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<(), GuardError>> + Send;

    /// [`Leases::check_held`](crate::Leases::check_held), awaited: the same call, the
    /// same answers and errors.
    fn check_held(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<DateTime<Utc>, GuardError>> + Send;

    /// [`Leases::admit_held`](crate::Leases::admit_held), awaited: the same call, the
    /// same answers and errors.
    fn admit_held(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<DateTime<Utc>, GuardError>> + Send;

    /// [`Leases::renew_and_admit`](crate::Leases::renew_and_admit), awaited: the same call, the
    /// same answers and errors.
    fn renew_and_admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> impl Future<Output = Result<DateTime<Utc>, GuardError>> + Send;

    /// [`Leases::fence`](crate::Leases::fence), awaited: the same call, the
    /// same answers and errors.
    fn fence(
        &mut self,
        resource: &str,
        lease_key: &str,
        up_to: Epoch,
    ) -> impl Future<Output = Result<Epoch, GuardError>> + Send;

    /// [`Leases::inspect_guard`](crate::Leases::inspect_guard), awaited: the same call, the
    /// same answers and errors.
    fn inspect_guard(
        &mut self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<GuardRecord>, GuardError>> + Send;

    /// [`Leases::bind_namespace`](crate::Leases::bind_namespace), awaited: the same call, the
    /// same answers and errors.
    fn bind_namespace(
        &mut self,
        prefix: &str,
        role: &str,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// [`Leases::unbind_namespace`](crate::Leases::unbind_namespace), awaited: the same call, the
    /// same answers and errors.
    fn unbind_namespace(
        &mut self,
        prefix: &str,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send;

    /// [`Leases::list_namespaces`](crate::Leases::list_namespaces), awaited: the same call, the
    /// same answers and errors.
    fn list_namespaces(
        &mut self,
    ) -> impl Future<Output = Result<Vec<NamespaceRule>, LeaseError>> + Send;

    /// [`Leases::force_release`](crate::Leases::force_release), awaited: the same call, the
    /// same answers and errors.
    fn force_release(
        &mut self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Epoch>, LeaseError>> + Send;

    /// [`Leases::force_release_epoch`](crate::Leases::force_release_epoch), awaited: the same call, the
    /// same answers and errors.
    fn force_release_epoch(
        &mut self,
        key: &str,
        epoch: Epoch,
    ) -> impl Future<Output = Result<ForcedRelease, LeaseError>> + Send;

    /// [`Leases::generation`](crate::Leases::generation), awaited: the same call, the
    /// same answers and errors.
    fn generation(&mut self) -> impl Future<Output = Result<Generation, LeaseError>> + Send;

    /// [`Leases::raise_generation`](crate::Leases::raise_generation), awaited: the same call, the
    /// same answers and errors.
    fn raise_generation(
        &mut self,
        generation: i64,
    ) -> impl Future<Output = Result<i64, LeaseError>> + Send;

    /// [`Leases::prune`](crate::Leases::prune), awaited: the same call, the
    /// same answers and errors.
    fn prune(
        &mut self,
        options: &PruneOptions,
    ) -> impl Future<Output = Result<PruneReport, LeaseError>> + Send;

    /// [`Leases::list_leases`](crate::Leases::list_leases), awaited: the same call, the
    /// same answers and errors.
    fn list_leases(
        &mut self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Listing, LeaseError>> + Send;

    /// [`Leases::run_fenced`](crate::Leases::run_fenced), awaited: admits
    /// the token for `resource` with the chosen [`Check`], runs `work` on
    /// the transaction's connection, commits; any refusal or error rolls
    /// everything back, the guard record included. Inside an open
    /// transaction it runs in a savepoint.
    ///
    /// ```no_run
    /// # async fn demo(conn: &mut diesel_async::AsyncPgConnection, lease: &leasehold::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel_async::SimpleAsyncConnection;
    /// use leasehold::aio::AsyncLeases;
    /// use leasehold::guard::Check;
    /// conn.run_fenced("report-2026-11", lease, Check::LeaseHeld, async |conn| {
    ///     conn.batch_execute("INSERT INTO reports (month, body) VALUES ('2026-11', '...')")
    ///         .await
    /// })
    /// .await?;
    /// # Ok(()) }
    /// ```
    fn run_fenced<'a, T, E, F>(
        &'a mut self,
        resource: &'a str,
        grant: &'a impl AsRef<FencingToken>,
        check: Check,
        work: F,
    ) -> impl Future<Output = Result<T, FencedError<E>>> + Send + 'a
    where
        for<'r> F: AsyncFnOnce(&'r mut AsyncPgConnection) -> Result<T, E>
            + FencedWork<&'r mut AsyncPgConnection, T, E, Fut: Send>
            + Send
            + 'a,
        T: Send + 'a,
        E: Send + 'a;
}

/// Each call runs in the connection's open transaction, if any.
impl AsyncLeases for AsyncPgConnection {
    fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Acquisition, LeaseError>> + Send {
        crate::leases::acquire(self, key, owner, ttl)
    }

    fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Lease, LeaseError>> + Send {
        crate::leases::acquire_waiting(self, key, owner, ttl, wait)
    }

    fn renew(
        &mut self,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Renewal, LeaseError>> + Send {
        let token = grant.as_ref();
        crate::leases::renew(self, token, ttl)
    }

    fn release(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<Release, LeaseError>> + Send {
        let token = grant.as_ref();
        crate::leases::release(self, token)
    }

    fn inspect(
        &mut self,
        key: &str,
    ) -> impl Future<Output = Result<Option<LeaseState>, LeaseError>> + Send {
        crate::leases::inspect(self, key)
    }

    fn renew_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<KeyRenewal>, LeaseError>> + Send {
        let grants = split_grants(grants);
        crate::many::renew_many(self, grants, ttl)
    }

    fn release_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
    ) -> impl Future<Output = Result<Vec<KeyRelease>, LeaseError>> + Send {
        let grants = split_grants(grants);
        crate::many::release_many(self, grants)
    }

    fn join_group(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> impl Future<Output = Result<GroupJoin, LeaseError>> + Send {
        let grants = split_grants(grants);
        crate::groups::join_group(self, grants, ttl)
    }

    fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<GroupRenewal, LeaseError>> + Send {
        crate::groups::renew_group(self, group, owner, ttl)
    }

    fn admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<(), GuardError>> + Send {
        let token = grant.as_ref();
        crate::guards::admit(self, resource, token)
    }

    fn check_held(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<DateTime<Utc>, GuardError>> + Send {
        let token = grant.as_ref();
        crate::guards::check_held(self, token)
    }

    fn admit_held(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<DateTime<Utc>, GuardError>> + Send {
        let token = grant.as_ref();
        crate::guards::admit_held(self, resource, token)
    }

    fn renew_and_admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> impl Future<Output = Result<DateTime<Utc>, GuardError>> + Send {
        let token = grant.as_ref();
        crate::guards::renew_and_admit(self, resource, token, ttl)
    }

    fn fence(
        &mut self,
        resource: &str,
        lease_key: &str,
        up_to: Epoch,
    ) -> impl Future<Output = Result<Epoch, GuardError>> + Send {
        crate::guards::fence(self, resource, lease_key, up_to)
    }

    fn inspect_guard(
        &mut self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<GuardRecord>, GuardError>> + Send {
        crate::guards::inspect_guard(self, resource)
    }

    fn bind_namespace(
        &mut self,
        prefix: &str,
        role: &str,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send {
        crate::operator::bind_namespace(self, prefix, role)
    }

    fn unbind_namespace(
        &mut self,
        prefix: &str,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        crate::operator::unbind_namespace(self, prefix)
    }

    fn list_namespaces(
        &mut self,
    ) -> impl Future<Output = Result<Vec<NamespaceRule>, LeaseError>> + Send {
        crate::operator::list_namespaces(self)
    }

    fn force_release(
        &mut self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Epoch>, LeaseError>> + Send {
        crate::operator::force_release(self, key)
    }

    fn force_release_epoch(
        &mut self,
        key: &str,
        epoch: Epoch,
    ) -> impl Future<Output = Result<ForcedRelease, LeaseError>> + Send {
        crate::operator::force_release_epoch(self, key, epoch)
    }

    fn generation(&mut self) -> impl Future<Output = Result<Generation, LeaseError>> + Send {
        crate::operator::generation(self)
    }

    fn raise_generation(
        &mut self,
        generation: i64,
    ) -> impl Future<Output = Result<i64, LeaseError>> + Send {
        crate::operator::raise_generation(self, generation)
    }

    fn prune(
        &mut self,
        options: &PruneOptions,
    ) -> impl Future<Output = Result<PruneReport, LeaseError>> + Send {
        crate::prune::prune(self, options)
    }

    fn list_leases(
        &mut self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Listing, LeaseError>> + Send {
        crate::listing::list_leases(self, filter)
    }

    fn run_fenced<'a, T, E, F>(
        &'a mut self,
        resource: &'a str,
        grant: &'a impl AsRef<FencingToken>,
        check: Check,
        work: F,
    ) -> impl Future<Output = Result<T, FencedError<E>>> + Send + 'a
    where
        for<'r> F: AsyncFnOnce(&'r mut AsyncPgConnection) -> Result<T, E>
            + FencedWork<&'r mut AsyncPgConnection, T, E, Fut: Send>
            + Send
            + 'a,
        T: Send + 'a,
        E: Send + 'a,
    {
        run_fenced(self, resource, grant.as_ref(), check, work)
    }
}

/// Each call checks a connection out of the client's pool for that call.
impl AsyncLeases for AsyncLeaseClient {
    fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Acquisition, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::leases::acquire(&mut *conn, key, owner, ttl).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Lease, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::leases::acquire_waiting(&mut *conn, key, owner, ttl, wait).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn renew(
        &mut self,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Renewal, LeaseError>> + Send {
        let token = grant.as_ref();
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::leases::renew(&mut *conn, token, ttl).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn release(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<Release, LeaseError>> + Send {
        let token = grant.as_ref();
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::leases::release(&mut *conn, token).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn inspect(
        &mut self,
        key: &str,
    ) -> impl Future<Output = Result<Option<LeaseState>, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::leases::inspect(&mut *conn, key).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn renew_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<KeyRenewal>, LeaseError>> + Send {
        let grants = split_grants(grants);
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::many::renew_many(&mut *conn, grants, ttl).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn release_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
    ) -> impl Future<Output = Result<Vec<KeyRelease>, LeaseError>> + Send {
        let grants = split_grants(grants);
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::many::release_many(&mut *conn, grants).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn join_group(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> impl Future<Output = Result<GroupJoin, LeaseError>> + Send {
        let grants = split_grants(grants);
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::groups::join_group(&mut *conn, grants, ttl).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<GroupRenewal, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::groups::renew_group(&mut *conn, group, owner, ttl).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<(), GuardError>> + Send {
        let token = grant.as_ref();
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::guards::admit(&mut *conn, resource, token).await;
            settle_guard(conn, &result);
            result
        }
    }

    fn check_held(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<DateTime<Utc>, GuardError>> + Send {
        let token = grant.as_ref();
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::guards::check_held(&mut *conn, token).await;
            settle_guard(conn, &result);
            result
        }
    }

    fn admit_held(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<DateTime<Utc>, GuardError>> + Send {
        let token = grant.as_ref();
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::guards::admit_held(&mut *conn, resource, token).await;
            settle_guard(conn, &result);
            result
        }
    }

    fn renew_and_admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> impl Future<Output = Result<DateTime<Utc>, GuardError>> + Send {
        let token = grant.as_ref();
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::guards::renew_and_admit(&mut *conn, resource, token, ttl).await;
            settle_guard(conn, &result);
            result
        }
    }

    fn fence(
        &mut self,
        resource: &str,
        lease_key: &str,
        up_to: Epoch,
    ) -> impl Future<Output = Result<Epoch, GuardError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::guards::fence(&mut *conn, resource, lease_key, up_to).await;
            settle_guard(conn, &result);
            result
        }
    }

    fn inspect_guard(
        &mut self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<GuardRecord>, GuardError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::guards::inspect_guard(&mut *conn, resource).await;
            settle_guard(conn, &result);
            result
        }
    }

    fn bind_namespace(
        &mut self,
        prefix: &str,
        role: &str,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::operator::bind_namespace(&mut *conn, prefix, role).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn unbind_namespace(
        &mut self,
        prefix: &str,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::operator::unbind_namespace(&mut *conn, prefix).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn list_namespaces(
        &mut self,
    ) -> impl Future<Output = Result<Vec<NamespaceRule>, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::operator::list_namespaces(&mut *conn).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn force_release(
        &mut self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Epoch>, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::operator::force_release(&mut *conn, key).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn force_release_epoch(
        &mut self,
        key: &str,
        epoch: Epoch,
    ) -> impl Future<Output = Result<ForcedRelease, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::operator::force_release_epoch(&mut *conn, key, epoch).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn generation(&mut self) -> impl Future<Output = Result<Generation, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::operator::generation(&mut *conn).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn raise_generation(
        &mut self,
        generation: i64,
    ) -> impl Future<Output = Result<i64, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::operator::raise_generation(&mut *conn, generation).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn prune(
        &mut self,
        options: &PruneOptions,
    ) -> impl Future<Output = Result<PruneReport, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::prune::prune(&mut *conn, options).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn list_leases(
        &mut self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Listing, LeaseError>> + Send {
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool).await?;
            let result = crate::listing::list_leases(&mut *conn, filter).await;
            settle_lease(conn, &result);
            result
        }
    }

    fn run_fenced<'a, T, E, F>(
        &'a mut self,
        resource: &'a str,
        grant: &'a impl AsRef<FencingToken>,
        check: Check,
        work: F,
    ) -> impl Future<Output = Result<T, FencedError<E>>> + Send + 'a
    where
        for<'r> F: AsyncFnOnce(&'r mut AsyncPgConnection) -> Result<T, E>
            + FencedWork<&'r mut AsyncPgConnection, T, E, Fut: Send>
            + Send
            + 'a,
        T: Send + 'a,
        E: Send + 'a,
    {
        let token = grant.as_ref();
        let pool = &self.pool;
        async move {
            let mut conn = checkout(pool)
                .await
                .map_err(|error| FencedError::Guard(GuardError::AsyncPool(error)))?;
            let result = run_fenced(&mut conn, resource, token, check, work).await;
            // As the sync face: a server that turned read-only (a
            // failover) keeps the connection out of the pool.
            if let Err(FencedError::Guard(GuardError::ReadOnlyServer { .. })) = &result {
                client::discard(conn);
            }
            result
        }
    }
}

/// The fenced transaction of [`AsyncLeases::run_fenced`] on one
/// connection: the sync face's `guards::run_fenced` with diesel-async's
/// transaction, and the same admission (`guards::admit_checked`).
async fn run_fenced<T, E, F>(
    conn: &mut AsyncPgConnection,
    resource: &str,
    token: &FencingToken,
    check: Check,
    work: F,
) -> Result<T, FencedError<E>>
where
    for<'r> F: AsyncFnOnce(&'r mut AsyncPgConnection) -> Result<T, E>
        + FencedWork<&'r mut AsyncPgConnection, T, E, Fut: Send>
        + Send,
    T: Send,
    E: Send,
{
    conn.transaction(async move |conn| {
        crate::guards::admit_checked(conn, resource, token, check)
            .await
            .map_err(FencedError::Guard)?;
        work(conn).await.map_err(FencedError::Work)
    })
    .await
}

/// [`crate::admin::function_privilege`] on an async connection: whether the
/// connected role may execute `function`, a signature as `GRANT` names it.
pub async fn function_privilege(
    conn: &mut AsyncPgConnection,
    function: &str,
) -> Result<FunctionPrivilege, LeaseError> {
    crate::operator::function_privilege_on(conn, function).await
}
