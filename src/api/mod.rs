//! The sync face: [`Leases`], [`Fencing`] and [`Operator`], written once over the
//! sealed hook [`sealed::OnConnection`] for [`PgConnection`] (the caller's
//! transaction, whose commit or rollback each call shares) and [`LeaseClient`]
//! (a pooled connection per call); sealed so methods can be added compatibly.

mod fencing;
mod leases;
mod operator;

use diesel::pg::PgConnection;

pub use fencing::Fencing;
pub use leases::Leases;
pub use operator::Operator;

use crate::client::LeaseClient;
use crate::pool::CallError;
use sealed::{OnConnection, Token};

pub(crate) mod sealed {
    use diesel::pg::PgConnection;

    use crate::pool::CallError;

    /// Proof that the caller is leasehold: keeps the hooks out of the public API.
    pub struct Token;

    /// Where a call's connection comes from, and what becomes of it after an error.
    pub trait OnConnection {
        /// Runs `call` on this connection, or on a pooled one that is discarded
        /// if the error [`CallError::discards_connection`].
        fn on_connection<T, E: CallError>(
            &mut self,
            _: Token,
            call: impl FnOnce(&mut PgConnection) -> Result<T, E>,
        ) -> Result<T, E>;
    }
}

impl OnConnection for PgConnection {
    fn on_connection<T, E: CallError>(
        &mut self,
        _: Token,
        call: impl FnOnce(&mut PgConnection) -> Result<T, E>,
    ) -> Result<T, E> {
        call(self)
    }
}

impl OnConnection for LeaseClient {
    fn on_connection<T, E: CallError>(
        &mut self,
        _: Token,
        call: impl FnOnce(&mut PgConnection) -> Result<T, E>,
    ) -> Result<T, E> {
        crate::pool::with_conn(&self.pool, call)
    }
}

impl Leases for PgConnection {}
impl Leases for LeaseClient {}
impl Fencing for PgConnection {}
impl Fencing for LeaseClient {}
impl Operator for PgConnection {}
impl Operator for LeaseClient {}
