//! The guide page `docs/guide/async-clients.md` as this crate's
//! documentation, so that every Rust block of it is a doc-test: compiled,
//! and run against a real PostgreSQL server by `cargo test -p
//! leasehold-example-async-clients`.
//!
//! The blocks' hidden lines (`# ` in the page) get their database from
//! [`database`]: a server, a database of their own and leasehold installed,
//! what an operator does once before an application connects.
#![doc = include_str!("../../../docs/guide/async-clients.md")]

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use leasehold_local::{DatabaseServer, LocalPostgres};

/// A database with leasehold installed, for one doc-test; dropped (with the
/// server, when one was started for it) when the test ends.
#[doc(hidden)]
#[derive(Debug)]
pub struct Database {
    url: String,
    /// The server `DATABASE_URL` names and the database made on it for this
    /// test, to drop afterwards; `None` for a throwaway server.
    made_on: Option<(String, String)>,
    /// Kept alive while the test runs; dropping it stops the server.
    _server: DatabaseServer,
}

impl Database {
    /// The URL the page's clients connect with: over TCP for a throwaway
    /// server (both clients take `postgres://user@127.0.0.1:port/db`).
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if let Some((admin_url, name)) = &self.made_on {
            if let Ok(mut admin) = PgConnection::establish(admin_url) {
                let _ =
                    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

/// A database with leasehold installed: on the server `DATABASE_URL` names
/// (a database of this process's own, dropped afterwards, so doc-tests
/// running at once never share keys), or else on a throwaway server.
///
/// Panics when no server can be had: it is test setup.
#[doc(hidden)]
pub fn database() -> Database {
    let server =
        DatabaseServer::from_env_or_start(LocalPostgres::builder().durable(false).tcp(true))
            .unwrap_or_else(|error| panic!("a PostgreSQL server for the doc-test: {error}"));
    let (url, made_on) = match server.local() {
        Some(local) => {
            let url = local
                .tcp_url_for("postgres")
                .expect("the throwaway server was started with TCP");
            (url, None)
        }
        None => {
            let name = format!("leasehold_async_clients_{}", std::process::id());
            let admin_url = server.url();
            let mut admin = PgConnection::establish(&admin_url)
                .unwrap_or_else(|error| panic!("connect to DATABASE_URL: {error}"));
            // One statement each: neither may run in a transaction block.
            for statement in [
                format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                format!("CREATE DATABASE {name}"),
            ] {
                admin
                    .batch_execute(&statement)
                    .unwrap_or_else(|error| panic!("{statement}: {error}"));
            }
            (server.url_for(&name), Some((admin_url, name)))
        }
    };
    let mut owner = PgConnection::establish(&url)
        .unwrap_or_else(|error| panic!("connect to the doc-test's database: {error}"));
    leasehold::install(&mut owner).unwrap_or_else(|error| panic!("install leasehold: {error}"));
    Database {
        url,
        made_on,
        _server: server,
    }
}
