//! A handle over an r2d2 pool, for callers without a connection at hand.
//!
//! Its operations are those of [`crate::Leases`] (src/api.rs): each checks
//! a connection out for exactly one call and autocommits, so nothing is
//! held between calls. Callers that need an operation inside their own
//! transaction call the same methods on their connection.

use std::sync::Arc;
use std::time::Duration;

use crate::error::LeaseError;
use crate::pool::{self, PgPool, PoolSettings, PreparedStatements};

/// Every operation over a connection pool: the methods of
/// [`crate::Leases`], [`crate::guard::Fencing`] and [`crate::admin::Operator`]. Clone it for each thread or task that calls it (a
/// clone shares the pool).
///
/// `database_url` may name several hosts, as libpq allows
/// (`postgres://u@h1:5432,h2:5432/app?target_session_attrs=read-write`):
/// each new connection goes to the first host that accepts it and is
/// writable. After a failover, a call on a connection to the old primary
/// fails once ([`LeaseError::OutcomeUnknown`] when the connection broke
/// mid-call, [`LeaseError::ReadOnlyServer`] when the old primary stayed up
/// read-only, or [`LeaseError::Database`] when it broke before the call
/// was sent) and the connection is discarded, so the next call reaches the
/// new primary. docs/guide/failover.md, "Clients across a failover", has the whole story.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use leasehold::Leases;
/// let mut client = leasehold::LeaseClient::connect("postgres://localhost/app", 4)?;
/// if let Some(lease) = client.acquire("job-42", "worker-a1", Duration::from_secs(30))?.granted() {
///     client.release(&lease)?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseClient {
    pub(crate) pool: PgPool,
    /// Where waiters built from this client open their listener session.
    listen_url: Arc<str>,
}

impl std::fmt::Debug for LeaseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseClient")
            .field("pool_state", &self.pool.state())
            .finish()
    }
}

impl LeaseClient {
    /// The one way to configure a client: the database URL, then the pool's
    /// size, statement caching, checkout timeout, whether to connect at
    /// once, and where waiters listen.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use leasehold::{pool::PreparedStatements, LeaseClient};
    /// // Through a transaction-mode pooler, with the waiters' listener on
    /// // the server itself (docs/guide/poolers.md).
    /// let client = LeaseClient::builder("postgres://app@pgbouncer:6432/app")
    ///     .max_size(8)
    ///     .prepared_statements(PreparedStatements::Uncached)
    ///     .listen_url("postgres://app@db:5432/app")
    ///     .build()?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn builder(database_url: &str) -> LeaseClientBuilder {
        LeaseClientBuilder {
            database_url: database_url.to_owned(),
            listen_url: None,
            settings: PoolSettings {
                max_size: DEFAULT_MAX_SIZE,
                prepared: PreparedStatements::Cached,
                checkout_timeout: DEFAULT_CHECKOUT_TIMEOUT,
                connect_at_once: true,
            },
        }
    }

    /// `LeaseClient::builder(database_url).max_size(max_size).build()`:
    /// the common case in one call.
    ///
    /// The pool skips r2d2's `SELECT 1` check on every checkout (a full
    /// round trip per operation); a connection found dead by a call is
    /// discarded instead of being returned to the pool, so only that call
    /// fails and the next one gets a fresh connection.
    ///
    /// One connection is opened first: a wrong password, user, host or
    /// database fails here with libpq's message ([`LeaseError::Connect`]).
    /// Every connection attempt gives up after libpq's `connect_timeout`,
    /// 5 seconds unless the URL sets one (`?connect_timeout=10`) or
    /// `PGCONNECT_TIMEOUT` is set.
    pub fn connect(database_url: &str, max_size: u32) -> Result<Self, LeaseError> {
        Self::builder(database_url).max_size(max_size).build()
    }

    /// The underlying pool, for the caller's own queries.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Where waiters built from this client listen for release
    /// notifications.
    pub(crate) fn listen_url(&self) -> &str {
        &self.listen_url
    }
}

/// The pool's size unless [`LeaseClientBuilder::max_size`] says otherwise.
const DEFAULT_MAX_SIZE: u32 = 10;

/// How long a call waits for a pooled connection unless
/// [`LeaseClientBuilder::checkout_timeout`] says otherwise (r2d2's own
/// default).
const DEFAULT_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(30);

/// Configures a [`LeaseClient`] ([`LeaseClient::builder`]).
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct LeaseClientBuilder {
    database_url: String,
    listen_url: Option<String>,
    settings: PoolSettings,
}

impl LeaseClientBuilder {
    /// At most this many connections (default 10; 0 is raised to 1). Each call holds one for its duration; a waiter holds
    /// one per attempt, a keeper one per renewal.
    pub fn max_size(mut self, max_size: u32) -> Self {
        self.settings.max_size = max_size;
        self
    }

    /// Whether the library's statements are prepared and cached per
    /// connection ([`PreparedStatements::Cached`], the default) or sent with
    /// their text every time ([`PreparedStatements::Uncached`], for a
    /// transaction-mode pooler).
    pub fn prepared_statements(mut self, prepared: PreparedStatements) -> Self {
        self.settings.prepared = prepared;
        self
    }

    /// How long a call waits for a free pooled connection before it fails
    /// with [`LeaseError::Pool`] (default 30 s).
    pub fn checkout_timeout(mut self, timeout: Duration) -> Self {
        self.settings.checkout_timeout = timeout;
        self
    }

    /// Builds without opening a connection: the pool connects when a call
    /// needs one. For a process that may start before its database (or
    /// during a failover); a wrong URL then shows at the first call.
    pub fn connect_lazily(mut self) -> Self {
        self.settings.connect_at_once = false;
        self
    }

    /// Where waiters built from this client ([`crate::wait::LeaseWaiter`])
    /// open their listener session; the database URL unless set. Behind a
    /// transaction-mode pooler it must reach a server session of its own:
    /// the server itself or a session-mode pooler.
    pub fn listen_url(mut self, listen_url: &str) -> Self {
        self.listen_url = Some(listen_url.to_owned());
        self
    }

    /// Builds the pool (opening one connection first, unless
    /// [`connect_lazily`](Self::connect_lazily)).
    pub fn build(self) -> Result<LeaseClient, LeaseError> {
        let pool = pool::build(&self.database_url, &self.settings)?;
        let listen_url = self.listen_url.unwrap_or(self.database_url);
        Ok(LeaseClient {
            pool,
            listen_url: listen_url.into(),
        })
    }
}
