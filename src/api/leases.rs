//! [`Leases`]: the calls an application makes.

use std::time::Duration;

use crate::batch::groups::{GroupId, GroupJoin, GroupRenewal};
use crate::batch::many::split_grants;
use crate::error::LeaseError;
use crate::lease::outcome::{
    Acquisition, KeyRelease, KeyRenewal, Lease, LeaseState, Release, Renewal,
};
use crate::lease::token::FencingToken;
use crate::sql::execute::finish;

use super::sealed::{OnConnection, Token};

/// The calls an application makes: acquire, renew, release and inspect a
/// lease, and the same for many keys of one owner at once, or through a
/// heartbeat group. On a [`PgConnection`](diesel::PgConnection) each runs
/// in the caller's open transaction; on a [`LeaseClient`](crate::LeaseClient)
/// on a pooled connection, autocommitting.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use leasehold::{Acquisition, LeaseClient, Leases};
///
/// fn try_job(leases: &mut impl Leases) -> Result<bool, leasehold::LeaseError> {
///     let ttl = Duration::from_secs(30);
///     Ok(match leases.acquire("job-42", "worker-a1", ttl)? {
///         Acquisition::Granted(lease) => {
///             leases.release(&lease)?;
///             true
///         }
///         Acquisition::Denied => false,
///     })
/// }
///
/// let mut client = LeaseClient::connect("postgres://localhost/app", 4)?;
/// try_job(&mut client)?;
/// # Ok(()) }
/// ```
pub trait Leases: OnConnection {
    /// Tries to acquire `key` for `owner` for `ttl`, without waiting for
    /// another owner. It may still wait up to [`crate::error::LOCK_WAIT_BOUND`] for a
    /// row lock another transaction holds on the key (an uncommitted grant, or
    /// an open lease-checked write), and returns [`LeaseError::TimedOut`] if
    /// that lock outlasts the bound.
    ///
    /// On a connection outside a transaction the grant commits before this
    /// returns. Inside a transaction it commits with it, and a rollback gives
    /// its epoch to the next grant: use its token only for guard writes in the
    /// same transaction, never for files or objects before the commit.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::Leases;
    /// use std::time::Duration;
    /// match conn.acquire("job-42", "worker-a1", Duration::from_secs(30))? {
    ///     leasehold::Acquisition::Granted(lease) => println!("epoch {}", lease.epoch()),
    ///     leasehold::Acquisition::Denied => println!("someone else has it"),
    /// }
    /// # Ok(()) }
    /// ```
    fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Acquisition, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::lease::acquire(conn, key, owner, ttl))
        })
    }

    /// Acquires `key`, waiting up to `wait` while another owner holds it: the
    /// SQL function's own `wait` argument, which polls every 50 ms inside one
    /// statement.
    ///
    /// This holds a connection and a transaction open for the whole wait; a
    /// [`crate::wait::LeaseWaiter`] needs neither and wakes on release. On timeout
    /// returns [`LeaseError::TimedOut`] (SQLSTATE 57014 in SQL).
    fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::lease::acquire_waiting(conn, key, owner, ttl, wait))
        })
    }

    /// Extends `grant` (a [`Lease`] or its [`FencingToken`]) to server time +
    /// `ttl`. Never changes the epoch. ([`Lease::renew`] renews a lease for
    /// its own ttl and records the new expiry in it.)
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection, lease: &leasehold::Lease) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::Leases;
    /// use std::time::Duration;
    /// let ttl = Duration::from_secs(30);
    /// if let leasehold::Renewal::Refused(why) = conn.renew(lease, ttl)? {
    ///     eprintln!("lease refused ({why}); stop working on it");
    /// }
    /// # Ok(()) }
    /// ```
    fn renew(
        &mut self,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> Result<Renewal, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::lease::renew(conn, grant.as_ref(), ttl))
        })
    }

    /// Releases `grant` (a [`Lease`] or its [`FencingToken`]): the key
    /// becomes free and its fencing counter moves past the grant's epoch, so
    /// that epoch is stale at every guard from now on.
    fn release(&mut self, grant: &impl AsRef<FencingToken>) -> Result<Release, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::lease::release(conn, grant.as_ref()))
        })
    }

    /// Reports `key`'s state; `None` for a key that was never leased.
    ///
    /// Advisory only: the answer may be stale by the time it arrives. Use it to
    /// decide what to try, never as permission to act.
    fn inspect(&mut self, key: &str) -> Result<Option<LeaseState>, LeaseError> {
        self.on_connection(Token, |conn| finish(crate::lease::inspect(conn, key)))
    }

    /// Renews every grant of `grants` (leases or tokens, all of one owner) to
    /// server time + `ttl` in one call, answering per key, in the order
    /// given. Grants of two owners are [`LeaseError::InvalidInput`]; no
    /// grants, no call (an empty answer).
    ///
    /// Each key's answer is what [`Leases::renew`] would have answered for it:
    /// a refused key (not_owner, lapsed, epoch_mismatch) changes nothing and
    /// locks nothing, and does not stop the other keys from being renewed.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection, held: Vec<leasehold::Lease>) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::Leases;
    /// use std::time::Duration;
    /// for answer in conn.renew_many(&held, Duration::from_secs(30))? {
    ///     if let leasehold::Renewal::Refused(why) = answer.renewal {
    ///         eprintln!("lost {} ({why}); stop working on it", answer.key);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    fn renew_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> Result<Vec<KeyRenewal>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::batch::many::renew_many(
                conn,
                split_grants(grants),
                ttl,
            ))
        })
    }

    /// Releases every grant of `grants` (of one owner) in one call,
    /// answering per key, in the order given: what [`Leases::release`] would
    /// have answered for each key alone.
    fn release_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::batch::many::release_many(conn, split_grants(grants)))
        })
    }

    /// Renews every grant of `grants` (of one owner) to server time +
    /// `ttl`, as [`Leases::renew_many`] does, and puts the renewed ones into a
    /// new heartbeat group, which [`Leases::renew_group`] then keeps alive in one row
    /// write. A renewed key that was in another group moves to the new one.
    ///
    /// Input rules and errors are [`Leases::renew_many`]'s (at most
    /// [`crate::batch::MAX_KEYS_PER_CALL`] keys, no key twice, ...), named for this
    /// call; nothing changes on an error.
    fn join_group(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> Result<GroupJoin, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::batch::groups::join_group(
                conn,
                split_grants(grants),
                ttl,
            ))
        })
    }

    /// One heartbeat for every member of `group`: extends the group to server
    /// time + `ttl` in one row write, while it is live and `owner`'s. A
    /// refusal changes nothing.
    fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> Result<GroupRenewal, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::batch::groups::renew_group(conn, group, owner, ttl))
        })
    }
}
