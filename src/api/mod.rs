//! The sync face: [`Leases`] (what an application calls), [`Fencing`]
//! (the database guard's calls) and [`Operator`] (operator actions, granted
//! to nobody by default), each implemented for [`PgConnection`] and for
//! [`LeaseClient`](crate::LeaseClient):
//!
//! - on a `PgConnection` a call runs in whatever transaction the caller has
//!   open, and commits or rolls back with it (docs/SPECIFICATION.md §1.5);
//!   outside a transaction it autocommits;
//! - on a `LeaseClient` a call checks a connection out of the client's
//!   pool for exactly that call and autocommits; a connection found dead,
//!   or on a server that turned read-only, is discarded instead of going
//!   back to the pool.
//!
//! Every method is written once, as a provided method over one sealed hook,
//! [`sealed::OnConnection`], which is all that differs between the two
//! types. So code written against `impl Leases` runs unchanged on either,
//! and adding an operation is its function (generic over both faces' execute
//! step, `crate::sql::execute`) plus one provided method here and one in the
//! async face. The traits are sealed: leasehold implements them for those
//! two types only, and may add methods without breaking anybody.

mod fencing;
mod leases;
mod operator;

use diesel::pg::PgConnection;

pub use fencing::Fencing;
pub use leases::Leases;
pub use operator::Operator;

use crate::client::LeaseClient;
use crate::error::CallError;
use sealed::{OnConnection, Token};

pub(crate) mod sealed {
    use diesel::pg::PgConnection;

    use crate::error::CallError;

    /// Proof that the caller is leasehold: the hook's methods take it, and
    /// nothing outside the crate can name or make it, so the hooks stay out
    /// of the public API though the public traits extend them.
    pub struct Token;

    /// The one thing the two sync types do differently: where a call's
    /// connection comes from, and what becomes of it after an error.
    pub trait OnConnection {
        /// Runs `call` on a connection: this one, in its open transaction;
        /// or one checked out of the pool, discarded if `call` failed in a
        /// way [`CallError::discards_connection`] names.
        fn on_connection<T, E: CallError>(
            &mut self,
            _: Token,
            call: impl FnOnce(&mut PgConnection) -> Result<T, E>,
        ) -> Result<T, E>;
    }
}

/// Each call runs in the connection's open transaction, if any.
impl OnConnection for PgConnection {
    fn on_connection<T, E: CallError>(
        &mut self,
        _: Token,
        call: impl FnOnce(&mut PgConnection) -> Result<T, E>,
    ) -> Result<T, E> {
        call(self)
    }
}

/// Each call checks a connection out of the client's pool for that call.
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
