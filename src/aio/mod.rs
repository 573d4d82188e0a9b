//! The async face (cargo feature `async`): every operation of the sync
//! face as a future, for tokio applications.
//!
//! [`AsyncLeases`], [`AsyncFencing`] and [`AsyncOperator`] have the methods
//! of [`Leases`](crate::Leases), [`Fencing`](crate::guard::Fencing) and
//! [`Operator`](crate::admin::Operator), with the same names, arguments,
//! answers and errors, each returning a `Send` future (so a task that
//! `tokio::spawn`s may hold it). They are implemented for diesel-async's
//! [`AsyncPgConnection`], where a call runs in whatever transaction the
//! caller has open and commits or rolls back with it, and for
//! [`AsyncLeaseClient`], whose calls each check a connection out of a pool
//! (deadpool) and autocommit.
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

mod api;
mod client;
mod connect;
mod keeper;
mod keeper_set;
mod releases;
mod waiter;
mod worker;

use std::future::Future;

use diesel_async::AsyncPgConnection;

use crate::admin::operator::FunctionPrivilege;
use crate::error::LeaseError;
use crate::lease::outcome::{Lease, Renewal};

pub use api::{AsyncFencing, AsyncLeases, AsyncOperator};
pub(crate) use client::settle;
pub use client::{AsyncLeaseClient, AsyncLeaseClientBuilder, PoolError};
pub use connect::connect;
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

/// The caller's work inside [`AsyncFencing::run_fenced`]: an async closure
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

/// [`crate::admin::function_privilege`] on an async connection: whether the
/// connected role may execute `function`, a signature as `GRANT` names it.
pub async fn function_privilege(
    conn: &mut AsyncPgConnection,
    function: &str,
) -> Result<FunctionPrivilege, LeaseError> {
    crate::admin::operator::function_privilege_on(conn, function).await
}
