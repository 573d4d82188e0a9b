//! The execute step: the one thing the sync face ([`crate::Leases`]) and
//! the async face (`crate::aio::AsyncLeases`, feature `async`) do
//! differently.
//!
//! Every operation of the library (input checks, the statement of
//! [`super::calls`], decoding, error mapping, telemetry) is written once,
//! as an `async fn` generic over [`Execute`]. The sync face runs it on a
//! `PgConnection`, whose [`Execute::load`] runs the statement with
//! `diesel::RunQueryDsl` and answers an already finished future, so
//! [`finish`] completes the operation in its first poll; the async face
//! awaits it on a `diesel_async::AsyncPgConnection`, whose
//! [`Execute::load`] runs the same statement value with
//! `diesel_async::RunQueryDsl`. So the two faces cannot send different SQL
//! or read an answer differently: nothing but this module knows which one
//! runs (`tests/leasehold/same_sql.rs` compares what each sends).

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use diesel::pg::PgConnection;
use diesel::result::{Error as DieselError, QueryResult};

/// A statement of [`super::calls`], with the Rust type of its rows: what
/// both faces can run. Implemented by every cacheable call (by the macro
/// that declares them) and by nothing else, so no text made up elsewhere
/// reaches a connection through here. Each face's load is spelled out per
/// statement because diesel's bound between a query's SQL type and its
/// row type is sealed.
pub(crate) trait Statement: Send + Sized {
    /// One row of the answer.
    type Row: Send + 'static;

    /// Runs the statement on a sync connection (`diesel::RunQueryDsl`).
    fn load_blocking(self, conn: &mut PgConnection) -> QueryResult<Vec<Self::Row>>;

    /// Runs the statement on an async connection
    /// (`diesel_async::RunQueryDsl`).
    #[cfg(feature = "async")]
    fn load_async<'c>(
        self,
        conn: &'c mut diesel_async::AsyncPgConnection,
    ) -> impl Future<Output = QueryResult<Vec<Self::Row>>> + Send + 'c
    where
        Self: 'c;
}

/// A connection the library's operations run on.
pub(crate) trait Execute: Send {
    /// Whether the connection is outside any transaction its diesel
    /// transaction manager knows of, so a call autocommits. Read *before*
    /// the call: once a call fails on a broken connection, diesel marks its
    /// transaction manager broken and the depth can no longer be read.
    fn in_autocommit(&mut self) -> bool;

    /// Runs `statement` and answers its rows. Boxed, so that the
    /// operations' futures hold no type of the statement's: with it they
    /// would not be provably `Send` (rust-lang/rust#100013), and the
    /// allocation is nothing beside a round trip.
    fn load<'c, Q>(&'c mut self, statement: Q) -> Rows<'c, Q::Row>
    where
        Q: Statement + 'c;
}

/// The rows of one statement, on their way.
pub(crate) type Rows<'c, R> = Pin<Box<dyn Future<Output = QueryResult<Vec<R>>> + Send + 'c>>;

/// Runs `statement` and answers its one row (`NotFound` when it answered
/// none), as diesel's `get_result` does.
pub(crate) async fn get_result<Q: Statement>(
    conn: &mut impl Execute,
    statement: Q,
) -> QueryResult<Q::Row> {
    conn.load(statement)
        .await?
        .into_iter()
        .next()
        .ok_or(DieselError::NotFound)
}

impl Execute for PgConnection {
    fn in_autocommit(&mut self) -> bool {
        use diesel::connection::{AnsiTransactionManager, TransactionManager};
        let depth = <AnsiTransactionManager as TransactionManager<PgConnection>>::transaction_manager_status_mut(self)
            .transaction_depth();
        matches!(depth, Ok(None))
    }

    fn load<'c, Q>(&'c mut self, statement: Q) -> Rows<'c, Q::Row>
    where
        Q: Statement + 'c,
    {
        // Blocks right here, so the future is finished when handed back.
        Box::pin(std::future::ready(statement.load_blocking(self)))
    }
}

#[cfg(feature = "async")]
impl Execute for diesel_async::AsyncPgConnection {
    fn in_autocommit(&mut self) -> bool {
        use diesel_async::{AnsiTransactionManager, TransactionManager};
        let depth = <AnsiTransactionManager as TransactionManager<
            diesel_async::AsyncPgConnection,
        >>::transaction_manager_status_mut(self)
        .transaction_depth();
        matches!(depth, Ok(None))
    }

    fn load<'c, Q>(&'c mut self, statement: Q) -> Rows<'c, Q::Row>
    where
        Q: Statement + 'c,
    {
        Box::pin(async move {
            let rows = statement.load_async(&mut *self).await;
            rows.map_err(|error| lost_session_as_libpq_says(self, error))
        })
    }
}

/// Files the loss of the session as libpq, under the sync face, files it:
/// `ClosedConnection`. tokio-postgres reports a session that is gone
/// (closed by the server, a broken socket) without a SQLSTATE, which
/// diesel-async files as `UnableToSendCommand`; and the server's last word
/// before it ends a session (a `FATAL` error such as `pg_terminate_backend`'s
/// "terminating connection due to administrator command", SQLSTATE 57P01)
/// arrives as an ordinary error, while libpq reports the session closed.
/// Such a `FATAL` is told by the client having closed, or, since the
/// client may not have read the end of the stream yet, by the server's
/// message (`lc_messages` may translate it; then only the closed client
/// tells). So the one error mapping (`LeaseError::from_diesel`) answers
/// both faces alike: a mutating call that autocommits has an unknown
/// outcome ([`crate::LeaseError::OutcomeUnknown`]) whichever face sent it.
#[cfg(feature = "async")]
fn lost_session_as_libpq_says(
    conn: &mut diesel_async::AsyncPgConnection,
    error: DieselError,
) -> DieselError {
    use diesel::result::DatabaseErrorKind;
    use diesel_async::pooled_connection::PoolableConnection;
    match error {
        DieselError::DatabaseError(DatabaseErrorKind::UnableToSendCommand, info) => {
            DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, info)
        }
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
            if info.message().starts_with("terminating connection") || conn.is_broken() =>
        {
            DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, info)
        }
        other => other,
    }
}

/// Wakes the thread that runs [`finish`] (never needed by the sync face's
/// own futures, which finish in their first poll, but a correct waker all
/// the same).
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs an operation of the sync face to its end on the calling thread.
/// Its statements run on a `PgConnection`, whose [`Execute::load`] blocks
/// and answers a finished future, so this returns after one poll.
pub(crate) fn finish<F: Future>(operation: F) -> F::Output {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut operation = pin!(operation);
    loop {
        match operation.as_mut().poll(&mut context) {
            Poll::Ready(output) => return output,
            Poll::Pending => std::thread::park(),
        }
    }
}
