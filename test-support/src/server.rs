//! One PostgreSQL server per test binary: the one `DATABASE_URL` names, or a
//! throwaway local one started on first use.

use std::sync::{Mutex, OnceLock};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold_local::{DatabaseServer, LocalPostgres, DATABASE_URL_ENV};

use crate::sql::query_lines;

/// The PostgreSQL major version the throwaway servers must run, when set
/// (`.ci/pg-matrix` sets it next to `LEASEHOLD_PG_BIN`), so that a version
/// matrix run cannot pass on another version's binaries.
pub const EXPECT_MAJOR_ENV: &str = "LEASEHOLD_EXPECT_PG_MAJOR";

/// The version of the server at `url` (`server_version`, e.g. `17.10`);
/// panics when [`EXPECT_MAJOR_ENV`] names another major.
pub fn check_expected_major(url: &str) -> String {
    let mut conn =
        PgConnection::establish(url).unwrap_or_else(|error| panic!("connect to {url}: {error}"));
    let lines = query_lines(
        &mut conn,
        "SELECT (current_setting('server_version_num')::int / 10000)::text \
                || ' ' || current_setting('server_version') AS line",
    );
    let line = lines.first().map(String::as_str).unwrap_or_default();
    let (major, version) = line.split_once(' ').unwrap_or((line, line));
    if let Ok(expected) = std::env::var(EXPECT_MAJOR_ENV) {
        if !expected.is_empty() {
            assert_eq!(
                major, expected,
                "{EXPECT_MAJOR_ENV}={expected}, but the test server is PostgreSQL {version}"
            );
        }
    }
    version.to_owned()
}

/// The server a test binary's databases live on.
///
/// Obtained through [`TestServer::from_env`] or [`TestServer::local`], which
/// start it once per process and keep it in a `static` (the local server's
/// watchdog removes it when the process exits).
#[derive(Debug)]
pub struct TestServer {
    server: DatabaseServer,
    /// The database with leasehold installed that [`crate::TestDb::new`]
    /// copies, created on first use.
    pub(crate) template: OnceLock<String>,
    /// Serialises `CREATE DATABASE`: copying a template needs it free of
    /// other copiers' connections.
    pub(crate) create: Mutex<()>,
}

impl TestServer {
    /// The server `DATABASE_URL` names when it is set and not empty (its
    /// role needs CREATEDB, and CREATEROLE for tests that create roles),
    /// otherwise the same throwaway server as [`TestServer::local`].
    pub fn from_env() -> &'static TestServer {
        static EXTERNAL: OnceLock<TestServer> = OnceLock::new();
        match std::env::var(DATABASE_URL_ENV) {
            Ok(url) if !url.is_empty() => {
                EXTERNAL.get_or_init(|| TestServer::on(DatabaseServer::External(url)))
            }
            _ => TestServer::local(),
        }
    }

    /// A throwaway local server, whatever `DATABASE_URL` says: for tests
    /// whose subject must not be pointed at another server by accident.
    /// Not durable (fsync off: the tests prove semantics, not durability),
    /// with room for 200 connections (concurrency tests open many).
    pub fn local() -> &'static TestServer {
        static LOCAL: OnceLock<TestServer> = OnceLock::new();
        LOCAL.get_or_init(|| {
            let mut builder = LocalPostgres::builder()
                .durable(false)
                .setting("max_connections", "200");
            if crate::coverage::directory().is_some() {
                // Counts each function's calls, for the mutation runner.
                builder = builder.setting("track_functions", "all");
            }
            let server = builder
                .start()
                .unwrap_or_else(|error| panic!("cannot start the test server: {error}"));
            check_expected_major(&server.url());
            TestServer::on(DatabaseServer::Local(Box::new(server)))
        })
    }

    /// A second throwaway local server, durable as production runs
    /// (`fsync`, `synchronous_commit` and `full_page_writes` on), for tests
    /// whose subject is those settings (`leasehold doctor` reports them).
    /// Slower commits than [`TestServer::local`]; use it only for that.
    pub fn durable_local() -> &'static TestServer {
        static DURABLE: OnceLock<TestServer> = OnceLock::new();
        DURABLE.get_or_init(|| {
            let server = LocalPostgres::builder()
                .durable(true)
                .setting("max_connections", "50")
                .start()
                .unwrap_or_else(|error| panic!("cannot start the durable test server: {error}"));
            check_expected_major(&server.url());
            TestServer::on(DatabaseServer::Local(Box::new(server)))
        })
    }

    fn on(server: DatabaseServer) -> TestServer {
        TestServer {
            server,
            template: OnceLock::new(),
            create: Mutex::new(()),
        }
    }

    /// The throwaway local server, when this is one (not `DATABASE_URL`'s).
    pub fn local_postgres(&self) -> Option<&LocalPostgres> {
        self.server.local()
    }

    /// The URL of the administrative database (`postgres` on a local
    /// server, `DATABASE_URL` itself on an external one).
    pub fn admin_url(&self) -> String {
        self.server.url()
    }

    /// The URL of `database` on this server, as the admin user.
    pub fn url_for(&self, database: &str) -> String {
        self.server.url_for(database)
    }

    /// Runs `sql` (one or more statements) in the administrative database.
    pub fn admin_exec(&self, sql: &str) {
        let mut conn = PgConnection::establish(&self.admin_url())
            .unwrap_or_else(|error| panic!("connect to the admin database: {error}"));
        conn.batch_execute(sql)
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }
}
