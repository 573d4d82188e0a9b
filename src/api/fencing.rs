//! [`Fencing`]: the database guard's calls.

use chrono::{DateTime, Utc};
use diesel::pg::PgConnection;

use crate::error::LeaseError;
use crate::guard::database::{Check, FencedError, GuardRecord};
use crate::lease::epoch::Epoch;
use crate::lease::token::FencingToken;
use crate::sql::execute::finish;

use super::sealed::{OnConnection, Token};

/// The database guard: admit a token for a resource in the caller's
/// transaction ([`admit`](Fencing::admit)), or run a closure's writes
/// behind the admission ([`run_fenced`](Fencing::run_fenced)); fence a
/// resource and read its record (docs/SPECIFICATION.md §2).
pub trait Fencing: OnConnection {
    /// Admits `grant` (a [`Lease`](crate::Lease) or a [`FencingToken`]; "the token"
    /// below) for `resource` in the caller's current transaction, with the
    /// strength `check` asks for:
    ///
    /// - [`Check::Token`]: compares the token's epoch with the resource's
    ///   record (G1–G5) and raises the record to it;
    /// - [`Check::LeaseHeld`]: also requires the lease to be held right now
    ///   by the token's owner and epoch, and keeps it so until the caller's
    ///   transaction ends (G6: a takeover waits);
    /// - [`Check::RenewAndAdmit`]: also renews the lease by the given ttl in
    ///   the same transaction, so the heartbeat commits only with the write.
    ///
    /// A stale token fails with [`LeaseError::StaleEpoch`], a token of
    /// another key with [`LeaseError::WrongLeaseKey`]. The first admission
    /// registers the resource as fenced by the token's key. Answers the
    /// lease's expiry when the check read the lease (`LeaseHeld`: as it is;
    /// `RenewAndAdmit`: the new one, valid once committed), `None` for
    /// `Check::Token`.
    ///
    /// Call it inside a transaction and write after it; outside one it commits
    /// at once and protects nothing.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection, token: &leasehold::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel::Connection;
    /// use leasehold::guard::{Check, Fencing};
    /// conn.transaction::<_, Box<dyn std::error::Error>, _>(|conn| {
    ///     conn.admit("invoices", token, Check::LeaseHeld)?;
    ///     // ... the writes the token protects ...
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
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

    /// Checks that the token's lease is held right now by its owner and epoch,
    /// and keeps it so until the caller's transaction ends (a takeover waits).
    /// Returns the lease's expiry.
    fn check_held(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> Result<DateTime<Utc>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::database::check_held(conn, grant.as_ref()))
        })
    }

    /// Presents the token for the writes of the caller's current transaction
    /// to the tables its key fences (docs/SPECIFICATION.md §2.1): each write
    /// there checks that the token is the key's live grant and keeps the
    /// lease from being taken over until the transaction ends. The token
    /// authorises nothing after the transaction (or the savepoint it was
    /// presented in) ends. Outside a transaction it ends at once, so call
    /// it inside one, before the writes; [`run_fenced`](Fencing::run_fenced)
    /// presents its token itself.
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

    /// Operator action: refuses every epoch up to and including `up_to` for
    /// `resource` from now on, without writing anything else. Registers the
    /// resource as fenced by `lease_key` if it is new. Returns the new record
    /// (the lowest epoch admitted).
    ///
    /// Typical use: after a holder lapsed or released, fence through the counter
    /// `inspect` reports, so even a writer that never saw the takeover is
    /// refused before the next holder writes.
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

    /// A resource's guard record; `None` if nothing was ever admitted or fenced
    /// for it.
    fn inspect_guard(&mut self, resource: &str) -> Result<Option<GuardRecord>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::database::inspect_guard(conn, resource))
        })
    }

    /// Runs `work` as a fenced transaction: admit the token for `resource` with
    /// the chosen [`Check`], [present](Fencing::present) it for fenced
    /// tables, run the caller's writes, commit. Any refusal or error rolls
    /// everything back, the guard record included.
    ///
    /// Inside an open transaction this runs in a savepoint, so a refusal undoes
    /// only the fenced part and the caller decides what happens to the rest.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection, lease: &leasehold::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// # use leasehold::guard::Fencing;
    /// use diesel::connection::SimpleConnection;
    /// use leasehold::guard::Check;
    /// conn.run_fenced("report-2026-11", lease, Check::LeaseHeld, |conn| {
    ///     conn.batch_execute("INSERT INTO reports (month, body) VALUES ('2026-11', '...')")
    /// })?;
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
