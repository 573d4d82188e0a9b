//! The connection pool every pooled part of the library uses: its type,
//! its one construction, and running one call on a pooled connection while
//! discarding the connection when the call found it dead.
//!
//! r2d2 asks diesel whether a returned connection is broken, and diesel
//! answers from its transaction manager only: an autocommit connection
//! whose server session died (terminated backend, server restart) looks
//! healthy and would be handed out again and again, failing each time,
//! unless the pool tests connections on checkout (an extra round trip per
//! call, which the pool built here turns off). The waiter and the
//! keeper retry after such failures, so they mark the connection broken
//! first: r2d2 then drops it and the retry gets a fresh one.
//!
//! A connection to a server that turned read-only is discarded the same
//! way. After a failover the old primary may stay up read-only (demoted,
//! or fenced with `default_transaction_read_only`), and every pooled
//! connection to it would keep answering "read-only" until it aged out;
//! a fresh connection lets libpq choose the new primary from a multi-host
//! URL (`postgres://u@h1,h2/db?target_session_attrs=read-write`).

use diesel::connection::{AnsiTransactionManager, CacheSize, Connection, TransactionManager};
use diesel::pg::PgConnection;

use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool};

use crate::error::{CallError, LeaseError};

/// The pool type leasehold works with.
pub type PgPool = Pool<ConnectionManager<PgConnection>>;

/// Whether the library's statements are prepared once per connection and
/// cached (named prepared statements), or sent with their text every time.
///
/// [`PreparedStatements::Cached`] is the default and the right choice for a
/// direct connection or a session-mode pooler: after its first use on a
/// connection a call costs one `Bind`/`Execute` round trip and no parsing or
/// planning on the server.
///
/// [`PreparedStatements::Uncached`] is for a pooler in transaction mode
/// (PgBouncer `pool_mode = transaction` before 1.21, or with
/// `max_prepared_statements = 0`): there a named statement prepared in one
/// transaction is missing in the next, which may run on another server
/// session (or collides with the same name prepared there by another
/// client). Each call is then sent as one unnamed `Parse`/`Bind`/`Execute`
/// (libpq's `PQsendQueryParams`, still one round trip) and parsed and
/// planned every time. docs/guide/poolers.md, "Poolers", has the measured cost.
///
/// Calls on a caller's own connection ([`crate::Leases`] on a
/// `PgConnection`) use whatever that connection says: call
/// `conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled)`
/// on it (diesel's `Connection` method) for the uncached behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PreparedStatements {
    /// Prepare each statement once per connection (diesel's statement
    /// cache). Needs a server session per connection: direct, or a
    /// session-mode pooler.
    #[default]
    Cached,
    /// Never prepare named statements (diesel's cache disabled): works
    /// through a transaction-mode pooler, at the cost of parsing and
    /// planning every call.
    Uncached,
}

/// Applies [`PreparedStatements`] to every connection the pool opens.
#[derive(Debug, Clone, Copy)]
struct StatementCacheSetting(PreparedStatements);

impl CustomizeConnection<PgConnection, diesel::r2d2::Error> for StatementCacheSetting {
    fn on_acquire(&self, conn: &mut PgConnection) -> Result<(), diesel::r2d2::Error> {
        if self.0 == PreparedStatements::Uncached {
            conn.set_prepared_statement_cache_size(CacheSize::Disabled);
        }
        Ok(())
    }
}

/// How [`build`] makes a pool: [`crate::LeaseClient`]'s builder fills it.
#[derive(Debug, Clone)]
pub(crate) struct PoolSettings {
    pub(crate) max_size: u32,
    pub(crate) prepared: PreparedStatements,
    pub(crate) checkout_timeout: std::time::Duration,
    pub(crate) connect_at_once: bool,
}

/// A pool of connections to `database_url`, without r2d2's `SELECT 1` on
/// every checkout (a full round trip per operation): a connection found
/// dead by a call is discarded by [`with_conn`] instead, so only that call
/// fails and the next one gets a fresh connection.
///
/// Unless told to connect lazily, one connection is opened first, outside
/// the pool: a URL that cannot connect (a wrong password, a database that
/// does not exist) fails at once with libpq's message
/// ([`LeaseError::Connect`]), instead of the pool waiting its checkout
/// timeout for connections that never come and then saying only that none
/// is available. Every connection attempt is bounded by libpq's
/// `connect_timeout`: 5 seconds unless the URL (or `PGCONNECT_TIMEOUT`)
/// says otherwise, so an unreachable host fails in seconds instead of
/// after the operating system's TCP timeout.
pub(crate) fn build(database_url: &str, settings: &PoolSettings) -> Result<PgPool, LeaseError> {
    let database_url = &crate::libpq::with_connect_timeout(database_url);
    if settings.connect_at_once {
        drop(PgConnection::establish(database_url).map_err(LeaseError::connect)?);
    }
    let builder = Pool::builder()
        .max_size(settings.max_size.max(1))
        .test_on_check_out(false)
        .connection_timeout(settings.checkout_timeout)
        .connection_customizer(Box::new(StatementCacheSetting(settings.prepared)));
    let manager = ConnectionManager::<PgConnection>::new(database_url);
    Ok(if settings.connect_at_once {
        builder.build(manager)?
    } else {
        builder.build_unchecked(manager)
    })
}

/// Runs `call` on a connection from `pool`; when it fails in a way that
/// leaves the connection unfit ([`CallError::discards_connection`]: dead, on
/// a server that turned read-only, its prepared statements lost), the
/// connection is not returned to the pool.
pub(crate) fn with_conn<T, E: CallError>(
    pool: &PgPool,
    call: impl FnOnce(&mut PgConnection) -> Result<T, E>,
) -> Result<T, E> {
    let mut conn = pool.get().map_err(E::from_checkout)?;
    let result = call(&mut conn);
    if let Err(error) = &result {
        if error.discards_connection() {
            discard(&mut conn);
        }
    }
    result
}

/// Marks a pooled connection broken, so r2d2 drops it instead of handing it
/// out again.
pub(crate) fn discard(conn: &mut PgConnection) {
    <AnsiTransactionManager as TransactionManager<PgConnection>>::transaction_manager_status_mut(
        conn,
    )
    .set_in_error();
}
