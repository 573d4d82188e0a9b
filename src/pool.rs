//! The connection pool every pooled part of the library uses: its type,
//! its one construction, and running one call on a pooled connection while
//! discarding the connection when the call found it dead.
//!
//! r2d2 asks diesel whether a returned connection is broken, and diesel
//! answers from its transaction manager only: an autocommit connection
//! whose server session died (terminated backend, server restart) looks
//! healthy and would be handed out again and again, failing each time,
//! unless the pool tests connections on checkout (an extra round trip per
//! call, which [`build`] turns off). The waiter and the
//! keeper retry after such failures, so they mark the connection broken
//! first: r2d2 then drops it and the retry gets a fresh one.
//!
//! A connection to a server that turned read-only is discarded the same
//! way. After a failover the old primary may stay up read-only (demoted,
//! or fenced with `default_transaction_read_only`), and every pooled
//! connection to it would keep answering "read-only" until it aged out;
//! a fresh connection lets libpq choose the new primary from a multi-host
//! URL (`postgres://u@h1,h2/db?target_session_attrs=read-write`).

use diesel::connection::{AnsiTransactionManager, TransactionManager};
use diesel::pg::PgConnection;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

use diesel::r2d2::{ConnectionManager, Pool};

use crate::errors::LeaseError;

/// The pool type leasehold works with.
pub type PgPool = Pool<ConnectionManager<PgConnection>>;

/// A pool of up to `max_size` connections to `database_url`, without r2d2's
/// `SELECT 1` on every checkout (a full round trip per operation): a
/// connection found dead by a call is discarded by [`with_conn`] instead,
/// so only that call fails and the next one gets a fresh connection.
pub(crate) fn build(database_url: &str, max_size: u32) -> Result<PgPool, r2d2::Error> {
    Pool::builder()
        .max_size(max_size.max(1))
        .test_on_check_out(false)
        .build(ConnectionManager::<PgConnection>::new(database_url))
}

/// Whether `error` says the connection (not the request) failed, or that
/// it reaches the wrong server: a read-only one, which is what a failover
/// leaves behind (the old primary demoted, or a standby not yet promoted).
/// Such a connection is not given back to the pool, and the waiter and
/// the keeper retry after such an error: the next connection is opened
/// anew, and libpq, given every host and `target_session_attrs=read-write`,
/// picks whichever server is the primary by then.
pub(crate) fn is_connection_error(error: &LeaseError) -> bool {
    match error {
        LeaseError::Pool(_)
        | LeaseError::OutcomeUnknown { .. }
        | LeaseError::ReadOnlyServer { .. } => true,
        LeaseError::Database { source, .. } => matches!(
            source,
            DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _)
                | DieselError::DatabaseError(DatabaseErrorKind::UnableToSendCommand, _)
                | DieselError::BrokenTransactionManager
        ),
        _ => false,
    }
}

/// Runs `call` on a connection from `pool`; when it fails because the
/// connection is dead, the connection is not returned to the pool.
pub(crate) fn with_conn<T>(
    pool: &PgPool,
    call: impl FnOnce(&mut PgConnection) -> Result<T, LeaseError>,
) -> Result<T, LeaseError> {
    let mut conn = pool.get()?;
    let result = call(&mut conn);
    if let Err(error) = &result {
        if is_connection_error(error) {
            discard(&mut conn);
        }
    }
    result
}

/// Marks a pooled connection broken, so r2d2 drops it instead of handing it
/// out again.
pub(crate) fn discard(conn: &mut PgConnection) {
    <AnsiTransactionManager as TransactionManager<PgConnection>>::transaction_manager_status_mut(
        conn,
    )
    .set_in_error();
}
