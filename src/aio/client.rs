//! The async face's pooled client: [`AsyncLeaseClient`], its builder, and
//! running one call on a pooled connection while discarding a connection
//! the call found dead or read-only, as the sync pool does
//! (`crate::pool`).
//!
//! Why deadpool and not bb8: a connection is discarded by taking it out
//! of the pool (`Object::take`), at once and whatever its state, where
//! bb8 can only be told through the connection's own "broken" flag; a
//! checkout is one future on the caller's task, so a cancelled call
//! leaves no task behind (bb8 opens connections in tasks it spawns); and
//! it is diesel-async's first-listed pool, with no background reaper to
//! configure. Both bound a checkout; deadpool's `wait_timeout`,
//! `create_timeout` and `recycle_timeout` take the builder's checkout
//! timeout, and each connection it creates is bounded by the URL's
//! `connect_timeout` as well ([`super::connect`]).

use std::time::Duration;

use diesel::connection::CacheSize;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::{AsyncConnection, AsyncPgConnection};

use crate::error::CallError;
use crate::error::LeaseError;
use crate::pool::PreparedStatements;

/// Why no connection could be had from an [`AsyncLeaseClient`]'s pool:
/// deadpool's error, which names the connection error when there was one
/// ([`LeaseError::AsyncPool`]).
pub type PoolError = diesel_async::pooled_connection::deadpool::PoolError;

/// Every lease operation over a pool of async connections: the methods
/// of [`AsyncLeases`](super::AsyncLeases). Clone it for each task that
/// calls it (a clone shares the pool).
///
/// `database_url` is handed to tokio-postgres, which takes libpq's URL
/// and key-value forms, several hosts and `target_session_attrs=read-write`
/// included, so a client reaches the primary after a failover as the sync
/// [`crate::LeaseClient`] does: a connection found dead or on a server
/// that turned read-only is discarded, and the next call connects anew.
#[derive(Clone)]
pub struct AsyncLeaseClient {
    pub(super) pool: Pool<AsyncPgConnection>,
    /// Where waiters built from this client listen for release
    /// notifications: the one listener session of that URL, shared with
    /// every waiter of the process, sync or async.
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
    /// The one way to configure a client, as [`crate::LeaseClient::builder`]:
    /// the database URL, then the pool's size, statement caching, checkout
    /// timeout and whether to connect at once.
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

    /// A connection of the pool for one call (settle it after the call
    /// with [`settle`]).
    pub(crate) async fn checkout(&self) -> Result<Object<AsyncPgConnection>, PoolError> {
        checkout(&self.pool).await
    }

    /// The underlying pool, for the caller's own queries (and its own
    /// transactions, on which [`AsyncLeases`](super::AsyncLeases) runs too).
    pub fn pool(&self) -> &Pool<AsyncPgConnection> {
        &self.pool
    }
}

/// The pool's size unless [`AsyncLeaseClientBuilder::max_size`] says
/// otherwise (the sync client's default).
const DEFAULT_MAX_SIZE: u32 = 10;

/// How long a call waits for a pooled connection unless
/// [`AsyncLeaseClientBuilder::checkout_timeout`] says otherwise (the sync
/// client's default).
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
    /// At most this many connections (default 10; 0 is raised to 1). Each
    /// call holds one for its duration.
    pub fn max_size(mut self, max_size: u32) -> Self {
        self.max_size = max_size;
        self
    }

    /// Whether the library's statements are prepared and cached per
    /// connection ([`PreparedStatements::Cached`], the default) or sent with
    /// their text every time ([`PreparedStatements::Uncached`], for a
    /// transaction-mode pooler), as for [`crate::LeaseClient`].
    pub fn prepared_statements(mut self, prepared: PreparedStatements) -> Self {
        self.prepared = prepared;
        self
    }

    /// How long a call waits for a free pooled connection, and for a new
    /// one to connect, before it fails with [`LeaseError::AsyncPool`]
    /// (default 30 s). A checkout thus waits at most this long for a free
    /// slot, then, if it must connect, at most the URL's `connect_timeout`
    /// (per host; [`super::connect`]) capped by this again.
    pub fn checkout_timeout(mut self, timeout: Duration) -> Self {
        self.checkout_timeout = timeout;
        self
    }

    /// Builds without opening a connection: the pool connects when a call
    /// needs one. For a process that may start before its database; a
    /// wrong URL then shows at the first call.
    pub fn connect_lazily(mut self) -> Self {
        self.connect_at_once = false;
        self
    }

    /// Where waiters built from this client ([`super::LeaseWaiter`]) listen
    /// for release notifications; the database URL unless set. Behind a
    /// transaction-mode pooler it must reach a server session of its own,
    /// as for [`crate::LeaseClientBuilder::listen_url`].
    pub fn listen_url(mut self, listen_url: &str) -> Self {
        self.listen_url = Some(listen_url.to_owned());
        self
    }

    /// Builds the pool, opening one connection first (unless
    /// [`connect_lazily`](Self::connect_lazily)): a URL that cannot connect
    /// fails here with the driver's whole reason (the OS's, or the
    /// server's message) as [`LeaseError::Connect`].
    ///
    /// Every connection attempt, this one and each one the pool makes, is
    /// bounded by the URL's `connect_timeout` (else `PGCONNECT_TIMEOUT`,
    /// else 5 s; per host the URL lists) from the TCP connect to the
    /// session's first statements, as libpq bounds the sync client's; one
    /// that runs out fails with [`super::LeaseError::ConnectTimedOut`], naming
    /// the servers, the time and the setting ([`super::connect`]).
    pub async fn build(self) -> Result<AsyncLeaseClient, LeaseError> {
        let url = self.database_url.clone();
        let uncached = self.prepared == PreparedStatements::Uncached;
        if self.connect_at_once {
            drop(super::connect(&url).await?);
        }
        let mut config = ManagerConfig::<AsyncPgConnection>::default();
        // No round trip before each call: a call that finds its connection
        // dead discards it instead (`settle`), as the sync pool does.
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
            .map_err(|error| LeaseError::InvalidInput {
                violations: vec![format!("the connection pool cannot be built: {error}")],
            })?;
        let listen_url = self.listen_url.unwrap_or(self.database_url);
        Ok(AsyncLeaseClient {
            pool,
            listen_url: listen_url.into(),
        })
    }
}

/// A connection of `pool` for one call.
pub(super) async fn checkout(
    pool: &Pool<AsyncPgConnection>,
) -> Result<Object<AsyncPgConnection>, PoolError> {
    pool.get().await
}

/// Takes a connection out of its pool for good: it is closed, and the
/// pool opens a new one when a call needs it.
pub(super) fn discard(conn: Object<AsyncPgConnection>) {
    drop(Object::take(conn));
}

/// After a call: a connection the call's error names unfit (found dead,
/// on a server that turned read-only, its prepared statements gone) is
/// discarded, by the one rule of both faces
/// (`CallError::discards_connection`).
pub(crate) fn settle<T, E: CallError>(conn: Object<AsyncPgConnection>, result: &Result<T, E>) {
    if matches!(result, Err(error) if error.discards_connection()) {
        discard(conn);
    }
}
