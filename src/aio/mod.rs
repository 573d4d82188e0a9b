//! The async face (feature `async`): the sync face's operations as `Send`
//! futures for tokio, with the same names, answers and errors, on diesel-async's
//! [`AsyncPgConnection`] (the caller's transaction) or a pooled [`AsyncLeaseClient`].
//! Each method runs the same function as the sync face's method; only the step
//! that executes a statement differs, so both send the same SQL.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use leasehold::aio::{AsyncLeaseClient, AsyncLeases};
//! let mut client = AsyncLeaseClient::builder("postgres://localhost/app").build().await?;
//! if let Some(lease) = client.acquire("job-42", "worker-a1", std::time::Duration::from_secs(30)).await?.granted() {
//!     client.release(&lease).await?;
//! }
//! # Ok(()) }
//! ```

mod api;
mod client;
mod connect;
mod election;
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
pub use client::{AsyncLeaseClient, AsyncLeaseClientBuilder};
pub use connect::connect;
pub use election::{Election, LeaderWatch, Leadership};
pub use keeper::{Keeper, KeeperBuilder};
pub use keeper_set::{KeeperSet, KeeperSetBuilder};
pub use releases::ReleaseWatch;
pub use waiter::{LeaseWaiter, LeaseWaiterBuilder};
pub use worker::{run_while_held, WorkContext};

/// The async face's [`Lease::renew`], kept here with the rest of the face.
impl Lease {
    /// [`Lease::renew`] on the async face: renews for the lease's own ttl, recording the expiry.
    pub async fn renew_async(
        &mut self,
        leases: &mut impl AsyncLeases,
    ) -> Result<Renewal, LeaseError> {
        let renewal = leases.renew(self, self.ttl()).await;
        self.renewed(renewal)
    }
}

/// The work inside [`AsyncFencing::run_fenced`], `async |conn| { ... }` with a `Send`
/// future: named so because a bound on an async closure's future cannot be written yet.
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

/// [`crate::admin::function_privilege`] on an async connection.
pub async fn function_privilege(
    conn: &mut AsyncPgConnection,
    function: &str,
) -> Result<FunctionPrivilege, LeaseError> {
    crate::admin::operator::function_privilege_on(conn, function).await
}
