//! The async face's traits: [`AsyncLeases`], [`AsyncFencing`] and
//! [`AsyncOperator`], the sync face's [`Leases`](crate::Leases),
//! [`Fencing`](crate::guard::Fencing) and
//! [`Operator`](crate::admin::Operator) as `Send` futures, implemented for
//! diesel-async's [`AsyncPgConnection`] and for [`AsyncLeaseClient`].
//!
//! As on the sync face, every method is written once, as a provided method
//! over one sealed hook, [`sealed::OnAsyncConnection`]: where the call's
//! connection comes from, and what becomes of it after an error.

mod fencing;
mod leases;
mod operator;

use std::future::Future;

use diesel_async::pooled_connection::deadpool::Object;
use diesel_async::AsyncPgConnection;

pub use fencing::AsyncFencing;
pub use leases::AsyncLeases;
pub use operator::AsyncOperator;

use super::client::{settle, AsyncLeaseClient};
use sealed::{CallError, OnAsyncConnection, Token};

pub(crate) mod sealed {
    use std::future::Future;
    use std::ops::DerefMut;

    use diesel_async::AsyncPgConnection;

    pub use crate::api::sealed::Token;
    pub(crate) use crate::error::CallError;

    /// The one thing the two async types do differently (the async twin of
    /// `crate::api::sealed::OnConnection`, split in two because a closure
    /// cannot yet promise that its future is `Send`).
    pub trait OnAsyncConnection: Send {
        /// The connection a call runs on: a borrow of this one, or a pooled
        /// connection.
        type Connection<'c>: DerefMut<Target = AsyncPgConnection> + Send
        where
            Self: 'c;

        /// This connection, in its open transaction; or one checked out of
        /// the pool.
        fn check_out<E: CallError + Send>(
            &mut self,
            _: Token,
        ) -> impl Future<Output = Result<Self::Connection<'_>, E>> + Send;

        /// After the call: a pooled connection goes back to its pool, unless
        /// the call's error names it unfit
        /// ([`CallError::discards_connection`]).
        fn settle<T, E: CallError>(connection: Self::Connection<'_>, result: &Result<T, E>);
    }
}

/// Runs one operation on the face's connection: check it out, run the
/// call, settle the connection with the call's answer.
macro_rules! on_connection {
    ($face:expr, |$conn:ident| $call:expr) => {
        async move {
            let mut connection = match $face.check_out(Token).await {
                Ok(connection) => connection,
                Err(error) => return Err(error),
            };
            let result = {
                let $conn: &mut diesel_async::AsyncPgConnection = &mut connection;
                $call.await
            };
            Self::settle(connection, &result);
            result
        }
    };
}
pub(crate) use on_connection;

/// Each call runs in the connection's open transaction, if any.
impl OnAsyncConnection for AsyncPgConnection {
    type Connection<'c> = &'c mut AsyncPgConnection;

    fn check_out<E: CallError + Send>(
        &mut self,
        _: Token,
    ) -> impl Future<Output = Result<Self::Connection<'_>, E>> + Send {
        std::future::ready(Ok(self))
    }

    fn settle<T, E: CallError>(_: Self::Connection<'_>, _: &Result<T, E>) {}
}

/// Each call checks a connection out of the client's pool for that call.
impl OnAsyncConnection for AsyncLeaseClient {
    type Connection<'c> = Object<AsyncPgConnection>;

    fn check_out<E: CallError + Send>(
        &mut self,
        _: Token,
    ) -> impl Future<Output = Result<Self::Connection<'_>, E>> + Send {
        let pool = &self.pool;
        async move { pool.get().await.map_err(E::from_async_checkout) }
    }

    fn settle<T, E: CallError>(connection: Self::Connection<'_>, result: &Result<T, E>) {
        settle(connection, result);
    }
}

impl AsyncLeases for AsyncPgConnection {}
impl AsyncLeases for AsyncLeaseClient {}
impl AsyncFencing for AsyncPgConnection {}
impl AsyncFencing for AsyncLeaseClient {}
impl AsyncOperator for AsyncPgConnection {}
impl AsyncOperator for AsyncLeaseClient {}
