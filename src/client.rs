//! [`LeaseClient`]: the sync operations over an r2d2 pool (src/api/), one
//! autocommitted checkout per call, for callers without a connection at hand.

use std::sync::Arc;
use std::time::Duration;

use crate::error::LeaseError;
use crate::pool::{self, PgPool, PoolSettings, PreparedStatements};

/// Every operation of `Leases`, `guard::Fencing` and `admin::Operator`
/// over a pool; clones share it. Survives a failover given a multi-host URL with
/// `target_session_attrs=read-write`.
#[derive(Clone)]
pub struct LeaseClient {
    pub(crate) pool: PgPool,
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
    /// The one way to configure a client.
    /// ```no_run
    /// # fn demo() -> Result<(), leasehold::LeaseError> {
    /// let client = leasehold::LeaseClient::builder("postgres://app@pgbouncer:6432/app")
    ///     .prepared_statements(leasehold::pool::PreparedStatements::Uncached).build()?;
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

    /// The common case: `builder(database_url).max_size(max_size).build()`.
    pub fn connect(database_url: &str, max_size: u32) -> Result<Self, LeaseError> {
        Self::builder(database_url).max_size(max_size).build()
    }

    /// The underlying pool, for the caller's own queries.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Where waiters built from this client listen.
    pub(crate) fn listen_url(&self) -> &str {
        &self.listen_url
    }
}

/// Pool size unless [`LeaseClientBuilder::max_size`] says otherwise.
const DEFAULT_MAX_SIZE: u32 = 10;

/// Checkout wait unless set otherwise (r2d2's own default).
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
    /// At most this many connections (0 is raised to 1).
    pub fn max_size(mut self, max_size: u32) -> Self {
        self.settings.max_size = max_size;
        self
    }

    /// Whether statements are prepared per connection or sent with their text.
    pub fn prepared_statements(mut self, prepared: PreparedStatements) -> Self {
        self.settings.prepared = prepared;
        self
    }

    /// How long a call waits for a pooled connection, and a new one to
    /// connect, before [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable)
    /// (default 30 s). A keeper's release waits less when its lease's safe
    /// deadline is nearer.
    pub fn checkout_timeout(mut self, timeout: Duration) -> Self {
        self.settings.checkout_timeout = timeout;
        self
    }

    /// Builds without connecting, for a process that may start before its database.
    pub fn connect_lazily(mut self) -> Self {
        self.settings.connect_at_once = false;
        self
    }

    /// Where waiters listen (default: the database URL); needs a server session of its own.
    pub fn listen_url(mut self, listen_url: &str) -> Self {
        self.listen_url = Some(listen_url.to_owned());
        self
    }

    /// Builds the pool, opening one connection first unless connecting lazily.
    pub fn build(self) -> Result<LeaseClient, LeaseError> {
        let pool = pool::build(&self.database_url, &self.settings)?;
        let listen_url = self.listen_url.unwrap_or(self.database_url);
        Ok(LeaseClient {
            pool,
            listen_url: listen_url.into(),
        })
    }
}
