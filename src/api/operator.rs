//! [`Operator`]: the operator's calls.

use crate::admin::listing::{ListFilter, Listing};
use crate::admin::operator::{ForcedRelease, Generation, NamespaceRule};
use crate::admin::prune::{PruneOptions, PruneReport};
use crate::error::LeaseError;
use crate::guard::table::FencedTable;
use crate::lease::epoch::Epoch;
use crate::sql::execute::finish;

use super::sealed::{OnConnection, Token};

/// Operator actions: namespace rules, forced releases, the generation,
/// pruning and listing keys. Their SQL functions are granted to nobody by
/// default (docs/guide/security.md); [`generation`](Operator::generation)
/// and [`list_leases`](Operator::list_leases) only read.
pub trait Operator: OnConnection {
    /// Operator action: binds `prefix` to the existing role named `role` (the
    /// name as stored, not an SQL identifier: no quotes, case matters), or
    /// rebinds it. From the commit on, names governed by this prefix may be used
    /// only by members of `role`.
    ///
    /// Rules protect names, not rows: a key already held by a non-member stays
    /// held, but its holder can no longer renew, release or admit with it, so
    /// bind prefixes before applications use them (or [`Operator::force_release`] the
    /// keys concerned).
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::admin::Operator;
    /// conn.bind_namespace("billing/", "billing_app")?;
    /// # Ok(()) }
    /// ```
    fn bind_namespace(&mut self, prefix: &str, role: &str) -> Result<(), LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::bind_namespace(conn, prefix, role))
        })
    }

    /// Operator action: removes the rule for exactly `prefix`. Returns whether
    /// there was one. The names it governed fall to the next-longest bound
    /// prefix, or to no rule at all (every role may act).
    fn unbind_namespace(&mut self, prefix: &str) -> Result<bool, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::unbind_namespace(conn, prefix))
        })
    }

    /// Operator action: every namespace rule, ordered by prefix (byte order).
    fn list_namespaces(&mut self) -> Result<Vec<NamespaceRule>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::list_namespaces(conn))
        })
    }

    /// Operator action: frees `key` whatever its state. A held or lapsed grant
    /// ends as a release would end it: the counter moves on by one, so its
    /// epoch (and every lower one) is stale from then on, its holder's renew
    /// and release answer `not_owner`, and waiters for the key are woken.
    ///
    /// Returns the key's counter after the call, `None` for a key that was
    /// never leased (nothing is written). Every epoch at or below the counter
    /// is stale: fence resources up to it ([`crate::guard::Fencing::fence`]) so that even a
    /// writer that never heard of the forced release is refused by a
    /// token-checked guard. A key that was already free keeps its counter.
    ///
    /// Acts on every key, whatever the namespace rules say: only the grant of
    /// EXECUTE on `lease.force_release(text)` limits who may call it. A role
    /// without it gets [`LeaseError::Database`], whose source is PostgreSQL's
    /// "permission denied for function force_release".
    fn force_release(&mut self, key: &str) -> Result<Option<Epoch>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::force_release(conn, key))
        })
    }

    /// Operator action: ends exactly the grant (`key`, `epoch`), whoever holds
    /// it, held or lapsed, and never a newer one. Where [`Operator::force_release`] frees
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
    /// # use leasehold::admin::Operator;
    /// match conn.force_release_epoch("job-42", leasehold::Epoch::new(7))? {
    ///     leasehold::admin::ForcedRelease::Released { counter } => println!("fence up to {counter}"),
    ///     other => println!("nothing changed: {other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    fn force_release_epoch(
        &mut self,
        key: &str,
        epoch: Epoch,
    ) -> Result<ForcedRelease, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::force_release_epoch(
                conn, key, epoch,
            ))
        })
    }

    /// The server's current generation and timeline. Any role may ask; nothing
    /// is written, and it works on a standby.
    fn generation(&mut self) -> Result<Generation, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::generation(conn))
        })
    }

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
    /// # use leasehold::admin::Operator;
    /// let now = conn.generation()?;
    /// conn.raise_generation(now.generation + 1)?;
    /// # Ok(()) }
    /// ```
    fn raise_generation(&mut self, generation: i64) -> Result<i64, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::raise_generation(conn, generation))
        })
    }

    /// Operator action: prunes key rows, then guard records, idle for longer
    /// than `options.idle` (docs/SPECIFICATION.md §1.8), batch by batch.
    /// Call it on a connection outside any transaction of yours, so that every
    /// batch commits on its own and holds its locks for one batch only.
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::admin::Operator;
    /// use std::time::Duration;
    /// let options = leasehold::admin::PruneOptions::new(Duration::from_secs(7 * 24 * 3600));
    /// let report = conn.prune(&options)?;
    /// println!("removed {} keys and {} guard records", report.keys_pruned, report.guards_pruned);
    /// # Ok(()) }
    /// ```
    fn prune(&mut self, options: &PruneOptions) -> Result<PruneReport, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::prune::prune(conn, options))
        })
    }

    /// Operator view: the keys `filter` selects, each with its state (held,
    /// lapsed or free), holder, epoch and effective expiry, read in one
    /// statement on one reading of the server's clock, which the answer
    /// carries ([`Listing::read_at`](crate::admin::Listing::read_at)). What
    /// `leasehold ls` and `leasehold watch` show.
    ///
    /// A state is decided as every lease call decides it (a grant in a
    /// heartbeat group is held until the later of its own and its group's
    /// expiry), so a row shows lapsed exactly when `acquire` would grant the
    /// key to someone else. Advisory, as [`crate::Leases::inspect`] is: the
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
    /// # use leasehold::admin::Operator;
    /// use leasehold::admin::{KeyState, ListFilter, ListOrder};
    /// let filter = ListFilter::new().prefix("job-").state(KeyState::Lapsed).order(ListOrder::Expires);
    /// let listing = conn.list_leases(&filter)?;
    /// for lease in &listing.leases {
    ///     println!("{} lapsed at {:?}, held by {:?}", lease.key, lease.expires_at, lease.owner);
    /// }
    /// # Ok(()) }
    /// ```
    fn list_leases(&mut self, filter: &ListFilter) -> Result<Listing, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::listing::list_leases(conn, filter))
        })
    }

    /// Fences the table `table` (a name as `::regclass` reads it) by `key`:
    /// from the commit on, every INSERT, UPDATE, DELETE, MERGE, COPY FROM
    /// and TRUNCATE of it is refused unless its transaction
    /// [presented](crate::guard::Fencing::present) the live grant of `key`
    /// (docs/SPECIFICATION.md §2.1). Replaces any fence the table had. Only
    /// the table's owner (or a member of its owning role) may;
    /// anyone else gets [`LeaseError::TableNotOwned`]. A partitioned table, a
    /// partition or an inheritance parent or child is [`LeaseError::InvalidInput`].
    ///
    /// ```no_run
    /// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
    /// # use leasehold::admin::Operator;
    /// conn.protect_table("public.ledger", "ledger-writer")?;
    /// # Ok(()) }
    /// ```
    fn protect_table(&mut self, table: &str, key: &str) -> Result<(), LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::table::protect_table(conn, table, key))
        })
    }

    /// Fences each row of `table` by its own key: `key_prefix` followed by
    /// the values of `key_columns` joined by `/` (`jobs/42`), so writers of
    /// different keys do not wait for each other. A write needs the tokens
    /// of every key it touches (for an UPDATE, the rows' keys before and
    /// after). Key columns must be integers, numeric, text, uuid, boolean or
    /// enums (their text is the same in every session). Otherwise as
    /// [`protect_table`](Operator::protect_table).
    fn protect_rows(
        &mut self,
        table: &str,
        key_prefix: &str,
        key_columns: &[&str],
    ) -> Result<(), LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::table::protect_rows(
                conn,
                table,
                key_prefix,
                key_columns,
            ))
        })
    }

    /// Removes `table`'s fence; whether it had one. Only for its owner.
    fn unprotect_table(&mut self, table: &str) -> Result<bool, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::table::unprotect_table(conn, table))
        })
    }

    /// Every fenced table of the database and what fences it. Any role may
    /// ask: it reads the catalog.
    fn fenced_tables(&mut self) -> Result<Vec<FencedTable>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::guard::table::fenced_tables(conn))
        })
    }
}
