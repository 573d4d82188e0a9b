//! [`AsyncLeaseClient`] over deadpool, discarding connections found dead or
//! read-only as the sync pool does. Deadpool rather than bb8: `Object::take`
//! discards at once, a checkout spawns no task, and there is no reaper to configure.

use crate::error::Repr;
use std::time::Duration;

use diesel::connection::CacheSize;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::{AsyncConnection, AsyncPgConnection};

use crate::error::LeaseError;
use crate::pool::PreparedStatements;

/// Every lease operation over a pool of async connections; clones share it.
/// A multi-host URL reaches the primary after a failover, as [`crate::LeaseClient`] does.
#[derive(Clone)]
pub struct AsyncLeaseClient {
    pub(super) pool: Pool<AsyncPgConnection>,
    /// The listener URL of waiters built from this client (one shared session per URL).
    pub(super) listen_url: std::sync::Arc<str>,
}

impl std::fmt::Debug for AsyncLeaseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLeaseClient")
            .field("pool_status", &self.pool.status())
            .finish()
    }
}

impl AsyncLeaseClient {
    /// The one way to configure a client, as [`crate::LeaseClient::builder`].
    pub fn builder(database_url: &str) -> AsyncLeaseClientBuilder {
        AsyncLeaseClientBuilder {
            database_url: database_url.to_owned(),
            max_size: DEFAULT_MAX_SIZE,
            prepared: PreparedStatements::Cached,
            checkout_timeout: DEFAULT_CHECKOUT_TIMEOUT,
            connect_at_once: true,
            listen_url: None,
        }
    }

    /// `AsyncLeaseClient::builder(database_url).max_size(max_size).build()`.
    pub async fn connect(database_url: &str, max_size: u32) -> Result<Self, LeaseError> {
        Self::builder(database_url).max_size(max_size).build().await
    }

    /// The underlying pool, for the caller's own queries and transactions.
    pub fn pool(&self) -> &Pool<AsyncPgConnection> {
        &self.pool
    }
}

/// Pool size unless set otherwise (the sync client's default).
const DEFAULT_MAX_SIZE: u32 = 10;

/// Checkout wait unless set otherwise (the sync client's default).
const DEFAULT_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(30);

/// Configures an [`AsyncLeaseClient`] ([`AsyncLeaseClient::builder`]).
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct AsyncLeaseClientBuilder {
    database_url: String,
    max_size: u32,
    prepared: PreparedStatements,
    checkout_timeout: Duration,
    connect_at_once: bool,
    listen_url: Option<String>,
}

impl AsyncLeaseClientBuilder {
    /// At most this many connections (0 is raised to 1).
    pub fn max_size(mut self, max_size: u32) -> Self {
        self.max_size = max_size;
        self
    }

    /// Whether statements are prepared per connection, as for [`crate::LeaseClient`].
    pub fn prepared_statements(mut self, prepared: PreparedStatements) -> Self {
        self.prepared = prepared;
        self
    }

    /// How long a call waits for a pooled connection, and a new one to connect,
    /// before [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) (default 30 s).
    pub fn checkout_timeout(mut self, timeout: Duration) -> Self {
        self.checkout_timeout = timeout;
        self
    }

    /// Builds without connecting, for a process that may start before its database.
    pub fn connect_lazily(mut self) -> Self {
        self.connect_at_once = false;
        self
    }

    /// Where waiters listen, as [`crate::LeaseClientBuilder::listen_url`].
    pub fn listen_url(mut self, listen_url: &str) -> Self {
        self.listen_url = Some(listen_url.to_owned());
        self
    }

    /// Builds the pool, opening one connection first unless lazy; every attempt is
    /// bounded by `connect_timeout` as libpq bounds the sync client's ([`super::connect()`]).
    pub async fn build(self) -> Result<AsyncLeaseClient, LeaseError> {
        let url = self.database_url.clone();
        let uncached = self.prepared == PreparedStatements::Uncached;
        if self.connect_at_once {
            drop(super::connect(&url).await?);
        }
        let mut config = ManagerConfig::<AsyncPgConnection>::default();
        // No round trip before each call: a dead connection is discarded by `settle`.
        config.recycling_method = diesel_async::pooled_connection::RecyclingMethod::Fast;
        config.custom_setup = Box::new(move |url| {
            let url = url.to_owned();
            Box::pin(async move {
                let mut conn = super::connect::connect_for_pool(&url).await?;
                if uncached {
                    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
                }
                Ok(conn)
            })
        });
        let manager = AsyncDieselConnectionManager::new_with_config(url, config);
        let pool = Pool::builder(manager)
            .max_size(usize::try_from(self.max_size.max(1)).unwrap_or(usize::MAX))
            .wait_timeout(Some(self.checkout_timeout))
            .create_timeout(Some(self.checkout_timeout))
            .recycle_timeout(Some(self.checkout_timeout))
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .map_err(|error| {
                LeaseError::from(Repr::InvalidInput {
                    violations: vec![format!("the connection pool cannot be built: {error}")],
                })
            })?;
        let listen_url = self.listen_url.unwrap_or(self.database_url);
        Ok(AsyncLeaseClient {
            pool,
            listen_url: listen_url.into(),
        })
    }
}
