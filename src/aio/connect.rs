//! The async face's one way to open a connection: every connection it
//! makes (the client's first one at build, each one its pool opens, and
//! [`connect`] for a caller's own) goes through [`connect`], which bounds
//! the whole attempt by `connect_timeout` as libpq bounds the sync face's.
//!
//! Why not `AsyncPgConnection::establish` alone: tokio-postgres applies
//! `connect_timeout` to the TCP connect only, so a server that accepts the
//! connection and never answers (a stopped postmaster, a hung proxy) kept
//! the startup, authentication and first statements waiting for ever; and
//! diesel-async turns the driver's error into its first line ("error
//! connecting to server"), dropping the reason (`Connection refused`, the
//! server's FATAL). Here the driver connects, its error is kept as the
//! source, and diesel-async's session setup (its first statements) runs
//! inside the same bound.

use std::time::Duration;

use diesel_async::AsyncPgConnection;

use crate::libpq::{with_connect_timeout, ConnectBound};

/// Why [`connect`] (or an [`AsyncLeaseClient`](super::AsyncLeaseClient)'s
/// build, [`crate::LeaseError::AsyncConnect`]) could not open a connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The attempt did not complete within `connect_timeout`: the server
    /// accepted nothing, or accepted and never answered (a stopped or
    /// overloaded server, a proxy that hangs). Nothing was left open.
    #[error(
        "no connection to {servers} within {} s (the bound: {setting}, per host)",
        after.as_secs_f64()
    )]
    TimedOut {
        /// The server or servers the URL names, `host:port`, in order.
        servers: String,
        /// How long the attempt was allowed: `connect_timeout` times the
        /// number of hosts.
        after: Duration,
        /// Which `connect_timeout` bounded it and where it came from, e.g.
        /// `connect_timeout=2 from the URL`, `connect_timeout=5 by default`.
        setting: String,
    },
    /// The driver could not connect: refused, unreachable, a wrong
    /// password or database, an invalid URL. The message carries the
    /// whole reason, e.g. `error connecting to server: Connection refused
    /// (os error 111)`.
    #[error("{}", Chain(source))]
    Driver {
        /// tokio-postgres's error, whose source is the reason.
        #[source]
        source: tokio_postgres::Error,
    },
    /// Connected, but the session's first statements (diesel-async's
    /// settings of the session) failed.
    #[error("the new session could not be set up: {source}")]
    Setup {
        /// diesel-async's error.
        #[source]
        source: diesel::ConnectionError,
    },
}

/// An error and its sources, `: `-separated.
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {error}")?;
            source = error.source();
        }
        Ok(())
    }
}

/// Opens an `AsyncPgConnection` to `database_url` (libpq's URL or key-value
/// form, as tokio-postgres reads it), the whole attempt (TCP, startup,
/// authentication and the session's first statements) bounded by the
/// URL's `connect_timeout`: the URL's own, else `PGCONNECT_TIMEOUT`'s,
/// else 5 s; per host the URL lists, as libpq counts it; zero asks to
/// wait indefinitely, as it does for libpq. The sync face's rule, read by
/// the same code.
///
/// For [`AsyncLeases`](super::AsyncLeases) on a connection of the
/// caller's own, instead of `AsyncPgConnection::establish`, which bounds
/// only the TCP connect and reports a refusal without its reason.
pub async fn connect(database_url: &str) -> Result<AsyncPgConnection, ConnectError> {
    let bound = ConnectBound::of(database_url);
    let url = with_connect_timeout(database_url);
    let attempt = async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .map_err(|source| ConnectError::Driver { source })?;
        AsyncPgConnection::try_from_client_and_connection(client, connection)
            .await
            .map_err(|source| ConnectError::Setup { source })
    };
    let Some(total) = bound.total else {
        return attempt.await;
    };
    match tokio::time::timeout(total, attempt).await {
        Ok(result) => result,
        // Dropping the attempt closes its socket.
        Err(_elapsed) => Err(ConnectError::TimedOut {
            servers: bound.servers,
            after: total,
            setting: bound.setting,
        }),
    }
}

/// [`connect`] for the pool's manager, whose error type is diesel's: the
/// whole message, reason included, as its text.
pub(super) async fn connect_for_pool(
    database_url: &str,
) -> diesel::ConnectionResult<AsyncPgConnection> {
    connect(database_url).await.map_err(|error| match error {
        ConnectError::Setup { source } => source,
        other => diesel::ConnectionError::BadConnection(other.to_string()),
    })
}
