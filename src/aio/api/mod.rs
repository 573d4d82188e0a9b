//! The async traits, written once over the sealed hook [`sealed::OnAsyncConnection`]
//! for [`AsyncPgConnection`] and [`AsyncLeaseClient`], as on the sync face.

mod fencing;
mod leases;
mod operator;

use std::future::Future;

use diesel_async::pooled_connection::deadpool::Object;
use diesel_async::AsyncPgConnection;

pub use fencing::AsyncFencing;
pub use leases::AsyncLeases;
pub use operator::AsyncOperator;

use super::client::AsyncLeaseClient;
use crate::pool::settle_async as settle;
use sealed::{CallError, OnAsyncConnection, Token};

pub(crate) mod sealed {
    use std::future::Future;
    use std::ops::DerefMut;

    use diesel_async::AsyncPgConnection;

    pub use crate::api::sealed::Token;
    pub(crate) use crate::pool::CallError;

    /// The async twin of `crate::api::sealed::OnConnection`, split in check-out and
    /// settle because a closure cannot yet promise its future is `Send`.
    pub trait OnAsyncConnection: Send {
        /// A borrow of this connection, or a pooled one.
        type Connection<'c>: DerefMut<Target = AsyncPgConnection> + Send
        where
            Self: 'c;

        /// This connection, in its open transaction; or one from the pool.
        fn check_out<E: CallError + Send>(
            &mut self,
            _: Token,
        ) -> impl Future<Output = Result<Self::Connection<'_>, E>> + Send;

        /// Returns a pooled connection unless [`CallError::discards_connection`].
        fn settle<T, E: CallError>(connection: Self::Connection<'_>, result: &Result<T, E>);
    }
}

/// Runs one operation: check out, call, settle.
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

impl OnAsyncConnection for AsyncLeaseClient {
    type Connection<'c> = Object<AsyncPgConnection>;

    fn check_out<E: CallError + Send>(
        &mut self,
        _: Token,
    ) -> impl Future<Output = Result<Self::Connection<'_>, E>> + Send {
        let pool = &self.pool;
        async move {
            pool.get()
                .await
                .map_err(|error| E::from_checkout(Box::new(error)))
        }
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
