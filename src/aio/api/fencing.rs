use std::future::Future;

use chrono::{DateTime, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};

use crate::aio::FencedWork;
use crate::error::LeaseError;
use crate::guard::database::FencedError;
use crate::guard::database::{Check, GuardRecord};
use crate::lease::epoch::Epoch;
use crate::lease::token::FencingToken;

use super::on_connection;
use super::sealed::{OnAsyncConnection, Token};

/// [`Fencing`](crate::guard::Fencing) as `Send` futures: the same calls, answers and errors.
pub trait AsyncFencing: OnAsyncConnection {
    /// [`Fencing::admit`](crate::guard::Fencing::admit), awaited.
    fn admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
        check: Check,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>, LeaseError>> + Send {
        let token = grant.as_ref();
        on_connection!(self, |conn| crate::guard::database::admit_checked(
            conn, resource, token, check
        ))
    }

    /// [`Fencing::present`](crate::guard::Fencing::present), awaited.
    fn present(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send {
        let token = grant.as_ref();
        on_connection!(self, |conn| crate::guard::table::present(conn, token))
    }

    /// [`Fencing::check_held`](crate::guard::Fencing::check_held), awaited.
    fn check_held(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> impl Future<Output = Result<DateTime<Utc>, LeaseError>> + Send {
        let token = grant.as_ref();
        on_connection!(self, |conn| crate::guard::database::check_held(conn, token))
    }

    /// [`Fencing::fence`](crate::guard::Fencing::fence), awaited.
    fn fence(
        &mut self,
        resource: &str,
        lease_key: &str,
        up_to: Epoch,
    ) -> impl Future<Output = Result<Epoch, LeaseError>> + Send {
        on_connection!(self, |conn| crate::guard::database::fence(
            conn, resource, lease_key, up_to
        ))
    }

    /// [`Fencing::inspect_guard`](crate::guard::Fencing::inspect_guard), awaited.
    fn inspect_guard(
        &mut self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<GuardRecord>, LeaseError>> + Send {
        on_connection!(self, |conn| crate::guard::database::inspect_guard(
            conn, resource
        ))
    }

    /// [`Fencing::run_fenced`](crate::guard::Fencing::run_fenced), awaited, on the [`Check`] given.
    /// ```no_run
    /// # async fn demo(conn: &mut diesel_async::AsyncPgConnection, lease: &leasehold::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// # use {diesel_async::SimpleAsyncConnection, leasehold::{aio::AsyncFencing, guard::Check}};
    /// conn.run_fenced("reports", lease, Check::LeaseHeld, async |c| c.batch_execute("INSERT INTO reports VALUES (1)").await).await?;
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
        E: Send + 'a,
    {
        let token = grant.as_ref();
        on_connection!(self, |conn| run_fenced(conn, resource, token, check, work))
    }
}

/// The sync face's `guard::database::run_fenced` with diesel-async's transaction.
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
        crate::guard::database::admit_and_present(conn, resource, token, check)
            .await
            .map_err(FencedError::Guard)?;
        work(conn).await.map_err(FencedError::Work)
    })
    .await
}
