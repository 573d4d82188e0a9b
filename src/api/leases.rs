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

/// The calls an application makes, on a key or on many keys of one owner.
///
/// ```no_run
/// # fn demo(client: &mut leasehold::LeaseClient) -> Result<(), leasehold::LeaseError> {
/// use leasehold::{Leases, Renewal};
/// let ttl = std::time::Duration::from_secs(30);
/// if let Some(lease) = client.acquire("job-42", "worker-a1", ttl)?.granted() {
///     if let Renewal::Refused(why) = client.renew(&lease, ttl)? { eprintln!("lost: {why}") }
///     for answer in client.renew_many(&[&lease], ttl)? { println!("{}: {:?}", answer.key, answer.renewal) }
///     client.release(&lease)?;
/// }
/// # Ok(()) }
/// ```
pub trait Leases: OnConnection {
    /// Tries to acquire `key` without waiting for another owner. Inside a transaction
    /// a rollback reuses the epoch: use the token only for writes in that transaction.
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

    /// Acquires `key`, polling in one statement for up to `wait` on a held connection.
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

    /// Extends `grant` to server time + `ttl`; never changes the epoch.
    fn renew(
        &mut self,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> Result<Renewal, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::lease::renew(conn, grant.as_ref(), ttl))
        })
    }

    /// Releases `grant`: the counter moves past its epoch, stale at every guard.
    fn release(&mut self, grant: &impl AsRef<FencingToken>) -> Result<Release, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::lease::release(conn, grant.as_ref()))
        })
    }

    /// `key`'s state, `None` if never leased. Advisory: never permission to act.
    fn inspect(&mut self, key: &str) -> Result<Option<LeaseState>, LeaseError> {
        self.on_connection(Token, |conn| finish(crate::lease::inspect(conn, key)))
    }

    /// Renews all `grants` (of one owner) in one call, per key as [`Leases::renew`] would.
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

    /// Releases all `grants` (of one owner) in one call, answering per key in order.
    fn release_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::batch::many::release_many(conn, split_grants(grants)))
        })
    }

    /// Renews `grants` as [`Leases::renew_many`] does and puts the renewed ones in
    /// a new heartbeat group that [`Leases::renew_group`] keeps alive in one row write.
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

    /// One heartbeat for every member of `group`, while it is live and `owner`'s.
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

/// The grant renews itself through either kind of `Leases`.
impl Lease {
    /// Renews this grant for its own ttl ([`renew`](Leases::renew)), recording the new expiry.
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection, lease: &mut leasehold::Lease) -> Result<(), leasehold::LeaseError> {
    /// let renewal = lease.renew(conn)?;
    /// # let _ = renewal; Ok(()) }
    /// ```
    pub fn renew(&mut self, leases: &mut impl Leases) -> Result<Renewal, LeaseError> {
        let renewal = leases.renew(self, self.ttl);
        self.renewed(renewal)
    }
}
