//! The execute step, the one thing the sync and async faces do differently.
//! Every operation is written once as an `async fn` over [`Execute`]: the sync
//! face's load blocks and answers a finished future ([`finish`]), the async face
//! awaits; so both send the same SQL (`tests/leasehold/same_sql.rs` checks).

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use diesel::pg::PgConnection;
use diesel::result::{Error as DieselError, QueryResult};

/// A statement of [`super::calls`] with its row type, implemented by their macro
/// only, so no other text reaches a connection. Loads are per statement because
/// diesel's SQL-type-to-row bound is sealed.
pub(crate) trait Statement: Send + Sized {
    /// One row of the answer.
    type Row: Send + 'static;

    /// Runs the statement on a sync connection (`diesel::RunQueryDsl`).
    fn load_blocking(self, conn: &mut PgConnection) -> QueryResult<Vec<Self::Row>>;

    /// Runs the statement on an async connection.
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
    /// Whether a call autocommits. Read *before* the call: after a failure on a broken
    /// connection diesel's transaction manager can no longer tell.
    fn in_autocommit(&mut self) -> bool;

    /// Runs `statement`. Boxed so the operations' futures stay provably `Send`
    /// (rust-lang/rust#100013); the allocation is nothing beside a round trip.
    fn load<'c, Q>(&'c mut self, statement: Q) -> Rows<'c, Q::Row>
    where
        Q: Statement + 'c;
}

/// The rows of one statement, on their way.
pub(crate) type Rows<'c, R> = Pin<Box<dyn Future<Output = QueryResult<Vec<R>>> + Send + 'c>>;

/// Runs `statement` and answers its one row (`NotFound` for none).
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

/// Files a lost session as libpq does (`ClosedConnection`): diesel-async reports
/// it as `UnableToSendCommand`, or a FATAL (57P01) as an ordinary error. So both
/// faces map an unknown outcome alike (`ErrorKind::OutcomeUnknown`).
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
            if crate::sql::decode::is_session_terminated(info.as_ref()) || conn.is_broken() =>
        {
            DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, info)
        }
        other => other,
    }
}

/// Wakes the thread that runs [`finish`] (the sync futures never need it).
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a sync-face operation on this thread. Every step of one blocks
/// (statements, waits), so it is ready after its first poll: debug builds,
/// the tests among them, assert it; a release build would park until woken.
pub(crate) fn finish<F: Future>(operation: F) -> F::Output {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut operation = pin!(operation);
    let mut first = true;
    loop {
        match operation.as_mut().poll(&mut context) {
            Poll::Ready(output) => return output,
            Poll::Pending => {
                debug_assert!(!first, "a sync-face operation was not ready after one poll");
                first = false;
                std::thread::park();
            }
        }
    }
}
