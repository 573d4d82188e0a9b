//! The server `DATABASE_URL` names, or a throwaway one when it names none.

use crate::builder::LocalPostgresBuilder;
use crate::error::LocalServerError;
use crate::server::LocalPostgres;
use crate::url::url_with_database;

/// The environment variable naming an existing server to use instead of
/// starting a throwaway one.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";

/// The PostgreSQL server a test, example or benchmark runs against.
///
/// Such programs should run on a machine with nothing configured and
/// against a real deployment alike: they take the server `DATABASE_URL`
/// names when it is set, and start a throwaway [`LocalPostgres`] otherwise.
/// This type makes that choice once, so each program does not repeat it.
#[derive(Debug)]
pub enum DatabaseServer {
    /// `DATABASE_URL` was set and not empty: its URL, as given.
    External(String),
    /// `DATABASE_URL` was unset or empty: a server started for this
    /// process, stopped and removed when this value is dropped. Boxed, as
    /// the handle is ten times the size of a URL.
    Local(Box<LocalPostgres>),
}

impl DatabaseServer {
    /// The server `DATABASE_URL` names, or else one started from `builder`
    /// (which is not used when `DATABASE_URL` is set).
    pub fn from_env_or_start(builder: LocalPostgresBuilder) -> Result<Self, LocalServerError> {
        match std::env::var(DATABASE_URL_ENV) {
            Ok(url) if !url.is_empty() => Ok(DatabaseServer::External(url)),
            _ => builder
                .start()
                .map(|server| DatabaseServer::Local(Box::new(server))),
        }
    }

    /// The URL to connect to: `DATABASE_URL` itself, or the throwaway
    /// server's `postgres` database ([`LocalPostgres::url`]).
    pub fn url(&self) -> String {
        match self {
            DatabaseServer::External(url) => url.clone(),
            DatabaseServer::Local(server) => server.url(),
        }
    }

    /// The URL of another database on the same server, for programs that
    /// create databases of their own: `DATABASE_URL` with its database name
    /// replaced (user, host, port and parameters kept), or
    /// [`LocalPostgres::url_for`].
    pub fn url_for(&self, database: &str) -> String {
        match self {
            DatabaseServer::External(url) => url_with_database(url, database),
            DatabaseServer::Local(server) => server.url_for(database),
        }
    }

    /// The throwaway server, when one was started (for programs that stop,
    /// crash or inspect it); `None` for `DATABASE_URL`'s.
    pub fn local(&self) -> Option<&LocalPostgres> {
        match self {
            DatabaseServer::External(_) => None,
            DatabaseServer::Local(server) => Some(server.as_ref()),
        }
    }
}
