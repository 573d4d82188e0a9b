use crate::admin::listing::{ListFilter, Listing};
use crate::admin::operator::{ForcedRelease, Generation, NamespaceRule};
use crate::admin::prune::{PruneOptions, PruneReport};
use crate::error::LeaseError;
use crate::guard::table::FencedTable;
use crate::lease::epoch::Epoch;
use crate::sql::execute::finish;

use super::sealed::{OnConnection, Token};

/// Operator actions, granted to nobody by default: the installing role runs them or
/// grants EXECUTE on each to an operator role.
///
/// ```no_run
/// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
/// use leasehold::admin::{ListFilter, Operator};
/// conn.bind_namespace("billing/", "billing_app")?;
/// let _ = conn.force_release_epoch("job-42", leasehold::Epoch::new(7))?;
/// let now = conn.generation()?;
/// conn.raise_generation(now.generation + 1)?;
/// let options = leasehold::admin::PruneOptions::new(std::time::Duration::from_secs(7 * 24 * 3600));
/// println!("{} keys pruned", conn.prune(&options)?.keys_pruned);
/// println!("{} listed", conn.list_leases(&ListFilter::new().prefix("job-"))?.leases.len());
/// # Ok(()) }
/// ```
pub trait Operator: OnConnection {
    /// Binds `prefix` to the role named `role` (as stored, unquoted): only its members may then use the names.
    fn bind_namespace(&mut self, prefix: &str, role: &str) -> Result<(), LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::bind_namespace(conn, prefix, role))
        })
    }

    /// Removes the rule for exactly `prefix`; answers whether there was one.
    fn unbind_namespace(&mut self, prefix: &str) -> Result<bool, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::unbind_namespace(conn, prefix))
        })
    }

    /// Every namespace rule, ordered by prefix.
    fn list_namespaces(&mut self) -> Result<Vec<NamespaceRule>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::list_namespaces(conn))
        })
    }

    /// Frees `key` whatever its state, as a release would; answers the counter to
    /// fence resources up to ([`crate::guard::Fencing::fence`]), `None` if never leased.
    fn force_release(&mut self, key: &str) -> Result<Option<Epoch>, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::force_release(conn, key))
        })
    }

    /// Ends exactly the grant (`key`, `epoch`), never a newer one the operator did
    /// not see ([`ForcedRelease::NewerGrant`]).
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

    /// The server's generation and timeline; read-only, works on a standby.
    fn generation(&mut self) -> Result<Generation, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::generation(conn))
        })
    }

    /// Raises the generation so every later epoch is at least `(generation << 40) + 1`,
    /// up to [`MAX_GENERATION`](crate::admin::MAX_GENERATION), for a server that a restore
    /// or a second promotion left on a generation another server already used.
    fn raise_generation(&mut self, generation: i64) -> Result<i64, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::operator::raise_generation(conn, generation))
        })
    }

    /// Prunes idle key rows and guard records, batch by batch, never letting an epoch be
    /// granted twice or a stale one admitted: call it outside a transaction so each
    /// batch commits alone.
    fn prune(&mut self, options: &PruneOptions) -> Result<PruneReport, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::prune::prune(conn, options))
        })
    }

    /// The keys `filter` selects with their states, on one reading of the server's
    /// clock (what `leasehold ls` shows); advisory, and needs SELECT on the tables.
    fn list_leases(&mut self, filter: &ListFilter) -> Result<Listing, LeaseError> {
        self.on_connection(Token, |conn| {
            finish(crate::admin::listing::list_leases(conn, filter))
        })
    }

    /// Fences the table `table` (a name as `::regclass` reads it) by `key`:
    /// from the commit on, every INSERT, UPDATE, DELETE, MERGE, COPY FROM
    /// and TRUNCATE of it is refused unless its transaction
    /// [presented](crate::guard::Fencing::present) the live grant of `key`.
    /// While it is fenced, the table cannot
    /// become a partition or an inheritance child, and its key columns keep
    /// their types. Protecting again with the same key completes the fence;
    /// another fence is [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) until
    /// [`unprotect_table`](Operator::unprotect_table) (in the same
    /// transaction, no write slips between). Only the table's owner (or a
    /// member of its owning role) may; anyone else gets
    /// [`ErrorKind::Forbidden`](crate::ErrorKind::Forbidden), and a key under a namespace the session
    /// may not act on is [`ErrorKind::Forbidden`](crate::ErrorKind::Forbidden). A partitioned table, a
    /// partition or an inheritance parent or child is [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput).
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
    /// the values of `key_columns` joined by `/` (`jobs/42`; every value but
    /// the last with `%` written `%25` and `/` written `%2F`), so writers of
    /// different keys do not wait for each other. A write needs the tokens
    /// of every key it touches (for an UPDATE, the rows' keys before and
    /// after), each row under the key its own values print as. Key columns
    /// must be integers, numeric, text, uuid, boolean or enums (their text
    /// is the same in every session). While a namespace rule shuts the
    /// session out, a `key_prefix` not under a rule of its own is
    /// [`ErrorKind::Forbidden`](crate::ErrorKind::Forbidden). Otherwise as
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
