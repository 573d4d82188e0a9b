//! One lease call on a pooled connection, discarding the connection when
//! the call found it dead.
//!
//! r2d2 asks diesel whether a returned connection is broken, and diesel
//! answers from its transaction manager only: an autocommit connection
//! whose server session died (terminated backend, server restart) looks
//! healthy and would be handed out again and again, failing each time,
//! unless the pool tests connections on checkout (an extra round trip per
//! call, which [`crate::LeaseClient::connect`] turns off). The waiter and the
//! keeper retry after such failures, so they mark the connection broken
//! first: r2d2 then drops it and the retry gets a fresh one.

use diesel::connection::{AnsiTransactionManager, TransactionManager};
use diesel::pg::PgConnection;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::client::PgPool;
use crate::errors::LeaseError;

/// Whether `error` says the connection (not the request) failed.
pub(crate) fn is_connection_error(error: &LeaseError) -> bool {
    match error {
        LeaseError::Pool(_) | LeaseError::OutcomeUnknown { .. } => true,
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
            <AnsiTransactionManager as TransactionManager<PgConnection>>::transaction_manager_status_mut(&mut conn)
                .set_in_error();
        }
    }
    result
}
