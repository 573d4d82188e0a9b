//! The pool every pooled part of the library uses. Checkout does not test
//! connections (a round trip per call): a call that finds its connection dead
//! or read-only discards it, so the next gets a fresh one and, after a failover,
//! libpq picks the new primary from a multi-host URL with
//! `target_session_attrs=read-write`.

use diesel::connection::{AnsiTransactionManager, CacheSize, Connection, TransactionManager};
use diesel::pg::PgConnection;

use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool};

use crate::error::{LeaseError, Repr};
use crate::guard::database::FencedError;
pub(crate) use call::CallError;

/// The pool type leasehold works with.
pub type PgPool = Pool<ConnectionManager<PgConnection>>;

/// Whether statements are prepared and cached per connection (the default) or
/// sent with their text each call, for a transaction-mode pooler such as PgBouncer.
/// A caller's own `PgConnection` follows its own statement cache setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PreparedStatements {
    /// Prepared once per connection: needs a server session per connection.
    #[default]
    Cached,
    /// Never named: works through a transaction-mode pooler, parsing every call.
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

/// How [`build`] makes a pool: `LeaseClient`'s builder fills it.
#[derive(Debug, Clone)]
pub(crate) struct PoolSettings {
    pub(crate) max_size: u32,
    pub(crate) prepared: PreparedStatements,
    pub(crate) checkout_timeout: std::time::Duration,
    pub(crate) connect_at_once: bool,
}

/// A pool of connections to `database_url`. Unless lazy, one connection opens first,
/// so a bad URL fails at once with libpq's message ([`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable)).
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
        builder
            .build(manager)
            .map_err(|error| LeaseError::from_checkout(Box::new(error)))?
    } else {
        builder.build_unchecked(manager)
    })
}

/// Runs `call` on a pooled connection, discarded if [`CallError::discards_connection`].
pub(crate) fn with_conn<T, E: CallError>(
    pool: &PgPool,
    call: impl FnOnce(&mut PgConnection) -> Result<T, E>,
) -> Result<T, E> {
    with_conn_within(pool, None, call)
}

/// [`with_conn`], waiting for the connection at most `bound` (and never
/// longer than the pool's own checkout timeout), so a bounded wait stays
/// bounded while the database is down.
pub(crate) fn with_conn_within<T, E: CallError>(
    pool: &PgPool,
    bound: Option<std::time::Duration>,
    call: impl FnOnce(&mut PgConnection) -> Result<T, E>,
) -> Result<T, E> {
    let checkout = match bound {
        Some(bound) => pool.get_timeout(bound.min(pool.connection_timeout())),
        None => pool.get(),
    };
    let mut conn = checkout.map_err(|error| E::from_checkout(Box::new(error)))?;
    let result = call(&mut conn);
    if let Err(error) = &result {
        if error.discards_connection() {
            discard(&mut conn);
        }
    }
    result
}

/// Marks a pooled connection broken, so r2d2 drops it.
pub(crate) fn discard(conn: &mut PgConnection) {
    <AnsiTransactionManager as TransactionManager<PgConnection>>::transaction_manager_status_mut(
        conn,
    )
    .set_in_error();
}

/// A fenced transaction keeps its connection unless the server turned read-only.
impl<W> CallError for FencedError<W> {
    fn from_checkout(error: Box<dyn std::error::Error + Send + Sync>) -> Self {
        FencedError::Guard(LeaseError::from_checkout(error))
    }

    fn discards_connection(&self) -> bool {
        matches!(self, FencedError::Guard(error) if error.is_read_only_server())
    }
}

impl LeaseError {
    /// Whether the connection (not the request) failed, or reaches a read-only server:
    /// it leaves the pool, and the waiter and keeper retry on a new one.
    pub(crate) fn is_connection_error(&self) -> bool {
        match self.repr() {
            Repr::Pool { .. }
            | Repr::OutcomeUnknown { .. }
            | Repr::ReadOnlyServer { .. }
            | Repr::Connect { .. }
            | Repr::ConnectTimedOut { .. } => true,
            Repr::Database { source, .. } => crate::error::is_dead_connection(source),
            _ => false,
        }
    }
}

/// The one discard rule, private so only the faces' sealed traits name it.
mod call {
    /// A pooled call's error: how a failed checkout reads, and whether the connection must go.
    pub trait CallError {
        /// A checkout from a pool that failed.
        fn from_checkout(error: Box<dyn std::error::Error + Send + Sync>) -> Self;
        /// Whether the connection is dead, read-only or lost its prepared statements.
        fn discards_connection(&self) -> bool;
    }
}

impl CallError for LeaseError {
    fn from_checkout(source: Box<dyn std::error::Error + Send + Sync>) -> Self {
        LeaseError::pool(source)
    }

    fn discards_connection(&self) -> bool {
        self.is_connection_error() || matches!(self.repr(), Repr::PreparedStatementLost { .. })
    }
}

/// The async face's pool (feature `async`).
#[cfg(feature = "async")]
pub(crate) type AsyncPool =
    diesel_async::pooled_connection::deadpool::Pool<diesel_async::AsyncPgConnection>;

/// A connection checked out of an [`AsyncPool`].
#[cfg(feature = "async")]
pub(crate) type AsyncObject =
    diesel_async::pooled_connection::deadpool::Object<diesel_async::AsyncPgConnection>;

/// A connection of `pool` for one call.
#[cfg(feature = "async")]
pub(crate) async fn checkout_async(pool: &AsyncPool) -> Result<AsyncObject, LeaseError> {
    pool.get()
        .await
        .map_err(|error| LeaseError::from_checkout(Box::new(error)))
}

/// [`checkout_async`], waiting at most `bound` (and never longer than the
/// pool's own wait timeout), as [`with_conn_within`] does.
#[cfg(feature = "async")]
pub(crate) async fn checkout_async_within(
    pool: &AsyncPool,
    bound: Option<std::time::Duration>,
) -> Result<AsyncObject, LeaseError> {
    let Some(bound) = bound else {
        return checkout_async(pool).await;
    };
    let mut timeouts = pool.timeouts();
    timeouts.wait = Some(timeouts.wait.map_or(bound, |wait| wait.min(bound)));
    pool.timeout_get(&timeouts)
        .await
        .map_err(|error| LeaseError::from_checkout(Box::new(error)))
}

/// Takes a connection out of its pool for good; the pool opens a new one on demand.
#[cfg(feature = "async")]
fn discard_async(conn: AsyncObject) {
    drop(AsyncObject::take(conn));
}

/// Discards the connection if the call's error names it unfit (`CallError::discards_connection`).
#[cfg(feature = "async")]
pub(crate) fn settle_async<T, E: CallError>(conn: AsyncObject, result: &Result<T, E>) {
    if matches!(result, Err(error) if error.discards_connection()) {
        discard_async(conn);
    }
}
