//! One API for a connection and for a pool: the [`Leases`] trait.
//!
//! Every lease, guard, batch, group, waiting and operator operation is a
//! method of [`Leases`], implemented for [`PgConnection`] and for
//! [`LeaseClient`]:
//!
//! - on a `PgConnection` a call runs in whatever transaction the caller has
//!   open, and commits or rolls back with it (docs/SPECIFICATION.md §1.5);
//!   outside a transaction it autocommits;
//! - on a [`LeaseClient`] a call checks a connection out of the client's
//!   pool for exactly that call and autocommits; a connection found dead,
//!   or on a server that turned read-only, is discarded instead of going
//!   back to the pool.
//!
//! So code written against `impl Leases` runs unchanged on either. The
//! trait is sealed: leasehold implements it for those two types only, and
//! may add methods without breaking anybody.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasehold::{Acquisition, LeaseClient, Leases};
//!
//! fn try_job(leases: &mut impl Leases) -> Result<bool, leasehold::LeaseError> {
//!     let ttl = Duration::from_secs(30);
//!     Ok(match leases.acquire("job-42", "worker-a1", ttl)? {
//!         Acquisition::Granted(lease) => {
//!             leases.release(&lease)?;
//!             true
//!         }
//!         Acquisition::Denied => false,
//!     })
//! }
//!
//! let mut client = LeaseClient::connect("postgres://localhost/app", 4)?;
//! try_job(&mut client)?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::pg::PgConnection;

use crate::client::LeaseClient;
use crate::epoch::Epoch;
use crate::errors::{GuardError, LeaseError};
use crate::groups::{GroupId, GroupJoin, GroupRenewal};
use crate::guards::{Check, FencedError, GuardRecord};
use crate::listing::{ListFilter, Listing};
use crate::operator::{ForcedRelease, Generation, NamespaceRule};
use crate::outcome::{Acquisition, KeyRelease, KeyRenewal, Lease, LeaseState, Release, Renewal};
use crate::prune::{PruneOptions, PruneReport};
use crate::sql::execute::finish;
use crate::token::FencingToken;

mod sealed {
    /// Only leasehold's own types implement [`super::Leases`].
    pub trait Sealed {}
    impl Sealed for diesel::pg::PgConnection {}
    impl Sealed for crate::client::LeaseClient {}
}

/// Every operation of leasehold, on a connection or a pooled client (see
/// the module's documentation).
pub trait Leases: sealed::Sealed {
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
    fn acquire(&mut self, key: &str, owner: &str, ttl: Duration)
        -> Result<Acquisition, LeaseError>;

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
    ) -> Result<Lease, LeaseError>;

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
    ) -> Result<Renewal, LeaseError>;

    /// Releases `grant` (a [`Lease`] or its [`FencingToken`]): the key
    /// becomes free and its fencing counter moves past the grant's epoch, so
    /// that epoch is stale at every guard from now on.
    fn release(&mut self, grant: &impl AsRef<FencingToken>) -> Result<Release, LeaseError>;

    /// Reports `key`'s state; `None` for a key that was never leased.
    ///
    /// Advisory only: the answer may be stale by the time it arrives. Use it to
    /// decide what to try, never as permission to act.
    fn inspect(&mut self, key: &str) -> Result<Option<LeaseState>, LeaseError>;

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
    ) -> Result<Vec<KeyRenewal>, LeaseError>;

    /// Releases every grant of `grants` (of one owner) in one call,
    /// answering per key, in the order given: what [`Leases::release`] would
    /// have answered for each key alone.
    fn release_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
    ) -> Result<Vec<KeyRelease>, LeaseError>;

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
    ) -> Result<GroupJoin, LeaseError>;

    /// One heartbeat for every member of `group`: extends the group to server
    /// time + `ttl` in one row write, while it is live and `owner`'s. A
    /// refusal changes nothing.
    fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> Result<GroupRenewal, LeaseError>;

    /// Admits `grant` (a [`Lease`] or a [`FencingToken`]; "the token" below)
    /// for `resource` in the caller's current transaction: raises
    /// the record to the token's epoch, or fails with
    /// [`GuardError::StaleEpoch`] / [`GuardError::WrongLeaseKey`]. The first
    /// admission registers the resource as fenced by the token's key.
    ///
    /// Call it inside a transaction and write after it; outside one it commits
    /// at once and protects nothing.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection, token: &leasehold::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
    /// # use leasehold::Leases;
    /// use diesel::Connection;
    /// conn.transaction::<_, Box<dyn std::error::Error>, _>(|conn| {
    ///     conn.admit("invoices", token)?;
    ///     // ... the writes the token protects ...
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    fn admit(&mut self, resource: &str, grant: &impl AsRef<FencingToken>)
        -> Result<(), GuardError>;

    /// Checks that the token's lease is held right now by its owner and epoch,
    /// and keeps it so until the caller's transaction ends (a takeover waits).
    /// Returns the lease's expiry.
    fn check_held(&mut self, grant: &impl AsRef<FencingToken>)
        -> Result<DateTime<Utc>, GuardError>;

    /// [`Leases::check_held`] and [`Leases::admit`] in one call. Returns the lease's expiry.
    fn admit_held(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> Result<DateTime<Utc>, GuardError>;

    /// Renews the token's lease by `ttl` and admits the token for `resource`, in
    /// the caller's transaction. Returns the new expiry (valid once committed).
    fn renew_and_admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> Result<DateTime<Utc>, GuardError>;

    /// Operator action: refuses every epoch up to and including `up_to` for
    /// `resource` from now on, without writing anything else. Registers the
    /// resource as fenced by `lease_key` if it is new. Returns the new record
    /// (the lowest epoch admitted).
    ///
    /// Typical use: after a holder lapsed or released, fence through the counter
    /// `inspect` reports, so even a writer that never saw the takeover is
    /// refused before the next holder writes.
    fn fence(&mut self, resource: &str, lease_key: &str, up_to: Epoch)
        -> Result<Epoch, GuardError>;

    /// A resource's guard record; `None` if nothing was ever admitted or fenced
    /// for it.
    fn inspect_guard(&mut self, resource: &str) -> Result<Option<GuardRecord>, GuardError>;

    /// Runs `work` as a fenced transaction: admit the token for `resource` with
    /// the chosen [`Check`], run the caller's writes, commit. Any refusal or
    /// error rolls everything back, the guard record included.
    ///
    /// Inside an open transaction this runs in a savepoint, so a refusal undoes
    /// only the fenced part and the caller decides what happens to the rest.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection, lease: &leasehold::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// # use leasehold::Leases;
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
        F: FnOnce(&mut PgConnection) -> Result<T, E>;

    /// Operator action: binds `prefix` to the existing role named `role` (the
    /// name as stored, not an SQL identifier: no quotes, case matters), or
    /// rebinds it. From the commit on, names governed by this prefix may be used
    /// only by members of `role`.
    ///
    /// Rules protect names, not rows: a key already held by a non-member stays
    /// held, but its holder can no longer renew, release or admit with it, so
    /// bind prefixes before applications use them (or [`Leases::force_release`] the
    /// keys concerned).
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::Leases;
    /// conn.bind_namespace("billing/", "billing_app")?;
    /// # Ok(()) }
    /// ```
    fn bind_namespace(&mut self, prefix: &str, role: &str) -> Result<(), LeaseError>;

    /// Operator action: removes the rule for exactly `prefix`. Returns whether
    /// there was one. The names it governed fall to the next-longest bound
    /// prefix, or to no rule at all (every role may act).
    fn unbind_namespace(&mut self, prefix: &str) -> Result<bool, LeaseError>;

    /// Operator action: every namespace rule, ordered by prefix (byte order).
    fn list_namespaces(&mut self) -> Result<Vec<NamespaceRule>, LeaseError>;

    /// Operator action: frees `key` whatever its state. A held or lapsed grant
    /// ends as a release would end it: the counter moves on by one, so its
    /// epoch (and every lower one) is stale from then on, its holder's renew
    /// and release answer `not_owner`, and waiters for the key are woken.
    ///
    /// Returns the key's counter after the call, `None` for a key that was
    /// never leased (nothing is written). Every epoch at or below the counter
    /// is stale: fence resources up to it ([`Leases::fence`]) so that even a
    /// writer that never heard of the forced release is refused by a
    /// token-checked guard. A key that was already free keeps its counter.
    ///
    /// Acts on every key, whatever the namespace rules say: only the grant of
    /// EXECUTE on `lease.force_release(text)` limits who may call it. A role
    /// without it gets [`LeaseError::Database`], whose source is PostgreSQL's
    /// "permission denied for function force_release".
    fn force_release(&mut self, key: &str) -> Result<Option<Epoch>, LeaseError>;

    /// Operator action: ends exactly the grant (`key`, `epoch`), whoever holds
    /// it, held or lapsed, and never a newer one. Where [`Leases::force_release`] frees
    /// whatever grant the key has when the call runs (which may be a grant made
    /// after the operator looked), this form acts only on the grant the
    /// operator saw: a holder that released and re-acquired meanwhile keeps its
    /// new grant ([`ForcedRelease::NewerGrant`]).
    ///
    /// An ended grant is ended as a release ends it: counter + 1, waiters
    /// woken. An epoch below 1 is [`LeaseError::InvalidInput`] and nothing
    /// changes. Only the grant of EXECUTE on
    /// `lease.force_release(text, bigint)` limits who may call it (a role
    /// without it gets [`LeaseError::Database`], PostgreSQL's "permission
    /// denied for function force_release"); namespace rules do not.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::Leases;
    /// match conn.force_release_epoch("job-42", leasehold::Epoch::new(7))? {
    ///     leasehold::admin::ForcedRelease::Released { counter } => println!("fence up to {counter}"),
    ///     other => println!("nothing changed: {other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    fn force_release_epoch(&mut self, key: &str, epoch: Epoch)
        -> Result<ForcedRelease, LeaseError>;

    /// The server's current generation and timeline. Any role may ask; nothing
    /// is written, and it works on a standby.
    fn generation(&mut self) -> Result<Generation, LeaseError>;

    /// Operator action: raises the server's generation to `generation`, so that
    /// from the commit on every grant, of every key, has an epoch of at least
    /// `(generation << 40) + 1` (docs/SPECIFICATION.md §1.7). Returns the new
    /// generation.
    ///
    /// For what timelines cannot see: a server brought back by other means
    /// than promotion or archive recovery (a file-system snapshot restored onto
    /// the same timeline), or a margin after a split brain. A generation is only
    /// ever raised: a value at or below the current one is
    /// [`LeaseError::GenerationNotAbove`], one above [`MAX_GENERATION`](crate::admin::MAX_GENERATION) is
    /// [`LeaseError::GenerationTooHigh`], and nothing changes.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::Leases;
    /// let now = conn.generation()?;
    /// conn.raise_generation(now.generation + 1)?;
    /// # Ok(()) }
    /// ```
    fn raise_generation(&mut self, generation: i64) -> Result<i64, LeaseError>;

    /// Operator action: prunes key rows, then guard records, idle for longer
    /// than `options.idle` (docs/SPECIFICATION.md §1.8), batch by batch.
    /// Call it on a connection outside any transaction of yours, so that every
    /// batch commits on its own and holds its locks for one batch only.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::Leases;
    /// use std::time::Duration;
    /// let options = leasehold::admin::PruneOptions::new(Duration::from_secs(7 * 24 * 3600));
    /// let report = conn.prune(&options)?;
    /// println!("removed {} keys and {} guard records", report.keys_pruned, report.guards_pruned);
    /// # Ok(()) }
    /// ```
    fn prune(&mut self, options: &PruneOptions) -> Result<PruneReport, LeaseError>;

    /// Operator view: the keys `filter` selects, each with its state (held,
    /// lapsed or free), holder, epoch and effective expiry, read in one
    /// statement on one reading of the server's clock, which the answer
    /// carries ([`Listing::read_at`](crate::admin::Listing::read_at)). What
    /// `leasehold ls` and `leasehold watch` show.
    ///
    /// A state is decided as every lease call decides it (a grant in a
    /// heartbeat group is held until the later of its own and its group's
    /// expiry), so a row shows lapsed exactly when `acquire` would grant the
    /// key to someone else. Advisory, as [`Leases::inspect`] is: the
    /// answer may be stale by the time it arrives. Nothing is written, and
    /// namespace rules do not apply: the listing reads the tables.
    ///
    /// Reads `lease.leases` and `lease.groups`, which only their owner (the
    /// role that installed leasehold) and superusers may read, unless the
    /// owner granted SELECT on both to another role; any other role gets
    /// [`LeaseError::ListNotPermitted`] naming it, and the caller's
    /// transaction stays usable. A filter with an empty owner, a NUL
    /// character or a limit of zero is [`LeaseError::InvalidInput`].
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::Leases;
    /// use leasehold::admin::{KeyState, ListFilter, ListOrder};
    /// let filter = ListFilter::new().prefix("job-").state(KeyState::Lapsed).order(ListOrder::Expires);
    /// let listing = conn.list_leases(&filter)?;
    /// for lease in &listing.leases {
    ///     println!("{} lapsed at {:?}, held by {:?}", lease.key, lease.expires_at, lease.owner);
    /// }
    /// # Ok(()) }
    /// ```
    fn list_leases(&mut self, filter: &ListFilter) -> Result<Listing, LeaseError>;
}

/// Each call runs in the connection's open transaction, if any.
impl Leases for PgConnection {
    fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Acquisition, LeaseError> {
        finish(crate::leases::acquire(self, key, owner, ttl))
    }

    fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LeaseError> {
        finish(crate::leases::acquire_waiting(self, key, owner, ttl, wait))
    }

    fn renew(
        &mut self,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> Result<Renewal, LeaseError> {
        finish(crate::leases::renew(self, grant.as_ref(), ttl))
    }

    fn release(&mut self, grant: &impl AsRef<FencingToken>) -> Result<Release, LeaseError> {
        finish(crate::leases::release(self, grant.as_ref()))
    }

    fn inspect(&mut self, key: &str) -> Result<Option<LeaseState>, LeaseError> {
        finish(crate::leases::inspect(self, key))
    }

    fn renew_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> Result<Vec<KeyRenewal>, LeaseError> {
        finish(crate::many::renew_many(
            self,
            crate::many::split_grants(grants),
            ttl,
        ))
    }

    fn release_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        finish(crate::many::release_many(
            self,
            crate::many::split_grants(grants),
        ))
    }

    fn join_group(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> Result<GroupJoin, LeaseError> {
        finish(crate::groups::join_group(
            self,
            crate::many::split_grants(grants),
            ttl,
        ))
    }

    fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> Result<GroupRenewal, LeaseError> {
        finish(crate::groups::renew_group(self, group, owner, ttl))
    }

    fn admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> Result<(), GuardError> {
        finish(crate::guards::admit(self, resource, grant.as_ref()))
    }

    fn check_held(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> Result<DateTime<Utc>, GuardError> {
        finish(crate::guards::check_held(self, grant.as_ref()))
    }

    fn admit_held(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> Result<DateTime<Utc>, GuardError> {
        finish(crate::guards::admit_held(self, resource, grant.as_ref()))
    }

    fn renew_and_admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> Result<DateTime<Utc>, GuardError> {
        finish(crate::guards::renew_and_admit(
            self,
            resource,
            grant.as_ref(),
            ttl,
        ))
    }

    fn fence(
        &mut self,
        resource: &str,
        lease_key: &str,
        up_to: Epoch,
    ) -> Result<Epoch, GuardError> {
        finish(crate::guards::fence(self, resource, lease_key, up_to))
    }

    fn inspect_guard(&mut self, resource: &str) -> Result<Option<GuardRecord>, GuardError> {
        finish(crate::guards::inspect_guard(self, resource))
    }

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
        crate::guards::run_fenced(self, resource, grant.as_ref(), check, work)
    }

    fn bind_namespace(&mut self, prefix: &str, role: &str) -> Result<(), LeaseError> {
        finish(crate::operator::bind_namespace(self, prefix, role))
    }

    fn unbind_namespace(&mut self, prefix: &str) -> Result<bool, LeaseError> {
        finish(crate::operator::unbind_namespace(self, prefix))
    }

    fn list_namespaces(&mut self) -> Result<Vec<NamespaceRule>, LeaseError> {
        finish(crate::operator::list_namespaces(self))
    }

    fn force_release(&mut self, key: &str) -> Result<Option<Epoch>, LeaseError> {
        finish(crate::operator::force_release(self, key))
    }

    fn force_release_epoch(
        &mut self,
        key: &str,
        epoch: Epoch,
    ) -> Result<ForcedRelease, LeaseError> {
        finish(crate::operator::force_release_epoch(self, key, epoch))
    }

    fn generation(&mut self) -> Result<Generation, LeaseError> {
        finish(crate::operator::generation(self))
    }

    fn raise_generation(&mut self, generation: i64) -> Result<i64, LeaseError> {
        finish(crate::operator::raise_generation(self, generation))
    }

    fn prune(&mut self, options: &PruneOptions) -> Result<PruneReport, LeaseError> {
        finish(crate::prune::prune(self, options))
    }

    fn list_leases(&mut self, filter: &ListFilter) -> Result<Listing, LeaseError> {
        finish(crate::listing::list_leases(self, filter))
    }
}

/// Each call checks a connection out of the client's pool for that call.
impl Leases for LeaseClient {
    fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Acquisition, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::leases::acquire(conn, key, owner, ttl))
        })
    }

    fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::leases::acquire_waiting(conn, key, owner, ttl, wait))
        })
    }

    fn renew(
        &mut self,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> Result<Renewal, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::leases::renew(conn, grant.as_ref(), ttl))
        })
    }

    fn release(&mut self, grant: &impl AsRef<FencingToken>) -> Result<Release, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::leases::release(conn, grant.as_ref()))
        })
    }

    fn inspect(&mut self, key: &str) -> Result<Option<LeaseState>, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| finish(crate::leases::inspect(conn, key)))
    }

    fn renew_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> Result<Vec<KeyRenewal>, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::many::renew_many(
                conn,
                crate::many::split_grants(grants),
                ttl,
            ))
        })
    }

    fn release_many(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::many::release_many(
                conn,
                crate::many::split_grants(grants),
            ))
        })
    }

    fn join_group(
        &mut self,
        grants: &[impl AsRef<FencingToken>],
        ttl: Duration,
    ) -> Result<GroupJoin, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::groups::join_group(
                conn,
                crate::many::split_grants(grants),
                ttl,
            ))
        })
    }

    fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> Result<GroupRenewal, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::groups::renew_group(conn, group, owner, ttl))
        })
    }

    fn admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> Result<(), GuardError> {
        let token = grant.as_ref();
        crate::pool::with_guard_conn(&self.pool, |conn| {
            finish(crate::guards::admit(conn, resource, token))
        })
    }

    fn check_held(
        &mut self,
        grant: &impl AsRef<FencingToken>,
    ) -> Result<DateTime<Utc>, GuardError> {
        let token = grant.as_ref();
        crate::pool::with_guard_conn(&self.pool, |conn| {
            finish(crate::guards::check_held(conn, token))
        })
    }

    fn admit_held(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
    ) -> Result<DateTime<Utc>, GuardError> {
        let token = grant.as_ref();
        crate::pool::with_guard_conn(&self.pool, |conn| {
            finish(crate::guards::admit_held(conn, resource, token))
        })
    }

    fn renew_and_admit(
        &mut self,
        resource: &str,
        grant: &impl AsRef<FencingToken>,
        ttl: Duration,
    ) -> Result<DateTime<Utc>, GuardError> {
        let token = grant.as_ref();
        crate::pool::with_guard_conn(&self.pool, |conn| {
            finish(crate::guards::renew_and_admit(conn, resource, token, ttl))
        })
    }

    fn fence(
        &mut self,
        resource: &str,
        lease_key: &str,
        up_to: Epoch,
    ) -> Result<Epoch, GuardError> {
        crate::pool::with_guard_conn(&self.pool, |conn| {
            finish(crate::guards::fence(conn, resource, lease_key, up_to))
        })
    }

    fn inspect_guard(&mut self, resource: &str) -> Result<Option<GuardRecord>, GuardError> {
        crate::pool::with_guard_conn(&self.pool, |conn| {
            finish(crate::guards::inspect_guard(conn, resource))
        })
    }

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
        crate::client::run_fenced_pooled(&self.pool, resource, grant.as_ref(), check, work)
    }

    fn bind_namespace(&mut self, prefix: &str, role: &str) -> Result<(), LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::operator::bind_namespace(conn, prefix, role))
        })
    }

    fn unbind_namespace(&mut self, prefix: &str) -> Result<bool, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::operator::unbind_namespace(conn, prefix))
        })
    }

    fn list_namespaces(&mut self) -> Result<Vec<NamespaceRule>, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::operator::list_namespaces(conn))
        })
    }

    fn force_release(&mut self, key: &str) -> Result<Option<Epoch>, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::operator::force_release(conn, key))
        })
    }

    fn force_release_epoch(
        &mut self,
        key: &str,
        epoch: Epoch,
    ) -> Result<ForcedRelease, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::operator::force_release_epoch(conn, key, epoch))
        })
    }

    fn generation(&mut self) -> Result<Generation, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| finish(crate::operator::generation(conn)))
    }

    fn raise_generation(&mut self, generation: i64) -> Result<i64, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::operator::raise_generation(conn, generation))
        })
    }

    fn prune(&mut self, options: &PruneOptions) -> Result<PruneReport, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::prune::prune(conn, options))
        })
    }

    fn list_leases(&mut self, filter: &ListFilter) -> Result<Listing, LeaseError> {
        crate::pool::with_conn(&self.pool, |conn| {
            finish(crate::listing::list_leases(conn, filter))
        })
    }
}
