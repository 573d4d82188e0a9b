use chrono::{DateTime, Utc};
use diesel::pg::PgConnection;

use crate::error::LeaseError;
use crate::guard::database::FencedError;
use crate::guard::database::{Check, GuardRecord};
use crate::lease::epoch::Epoch;
use crate::lease::token::FencingToken;
use crate::sql::execute::finish;

use super::sealed::{OnConnection, Token};

/// The database guard's calls, run in the caller's transaction: an admission commits
/// with the writes, a refusal aborts them.
pub trait Fencing: OnConnection {
    /// Admits `grant` for `resource` at `check`'s strength, refusing an epoch below the
    /// highest admitted or a token of another key; outside a transaction it protects nothing.
    fn admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
        check: Check,
    ) -> Result<Option<DateTime<Utc>>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::database::admit_checked(
                conn,
                resource,
                grant.as_ref(),
                check,
            ))
        })
    }

    /// Checks the token's lease is held, and keeps it so until the transaction ends.
    fn check_held(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> Result<DateTime<Utc>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::database::check_held(conn, grant.as_ref()))
        })
    }

    /// Presents the token for the writes of the caller's current transaction to
    /// the tables its key fences; it authorises
    /// nothing after that transaction, or the savepoint it was made in, ends.
    /// A key under a namespace the session may not act on is
    /// [`ErrorKind::Forbidden`](crate::ErrorKind::Forbidden), as every call that names a key.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection, lease: &leasehold::Lease) -> Result<(), leasehold::LeaseError> {
    /// use diesel::connection::{Connection, SimpleConnection};
    /// use leasehold::guard::Fencing;
    /// conn.transaction::<_, leasehold::LeaseError, _>(|conn| {
    ///     conn.present(lease)?;
    ///     conn.batch_execute("UPDATE jobs SET state = 'done' WHERE id = 7")?;
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    fn present(&mut self, grant: &impl AsRef<FencingToken>) -> Result<(), LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::table::present(conn, grant.as_ref()))
        })
    }

    /// Operator action: refuses every epoch up to `up_to` for `resource`, so a
    /// writer that never saw a takeover is refused before the next holder writes.
    fn fence(
        &mut self,
        resource: &str,
        lease_key: &str,
        up_to: Epoch,
    ) -> Result<Epoch, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::database::fence(
                conn, resource, lease_key, up_to,
            ))
        })
    }

    /// A resource's guard record; `None` if nothing was ever admitted or fenced.
    fn inspect_guard(&mut self, resource: &str) -> Result<Option<GuardRecord>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::database::inspect_guard(conn, resource))
        })
    }

    /// Admits, [presents](Fencing::present) the token for fenced tables, runs
    /// `work`, commits (in a savepoint inside an open transaction): a refusal
    /// or error rolls back the writes and the guard record together.
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection, lease: &leasehold::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// # use {diesel::{Connection, connection::SimpleConnection}, leasehold::guard::{Check, Fencing}};
    /// conn.transaction(|c| c.admit("reports", lease, Check::Token))?; // then the writes, in that transaction
    /// conn.run_fenced("reports", lease, Check::LeaseHeld, |c| c.batch_execute("INSERT INTO reports VALUES (1)"))?;
    /// # Ok(()) }
    /// ```
    fn run_fenced<T, E, F>(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
        check: Check,
        work: F,
    ) -> Result<T, FencedError<E>>
    where
        F: FnOnce(&mut PgConnection) -> Result<T, E>,
    {
        self.on_connection(Token, |conn| {
            crate::guard::database::run_fenced(conn, resource, grant.as_ref(), check, work)
        })
    }
}
