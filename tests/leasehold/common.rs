//! Shared setup: one PostgreSQL server per test binary, a fresh database per
//! test.
//!
//! Without `DATABASE_URL` the server is a throwaway `LocalPostgres` (fsync
//! off: these tests prove semantics, not durability). With `DATABASE_URL`
//! the same tests run against that server; its role needs CREATEDB (and
//! CREATEROLE for the security tests).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{Bool, Text, Timestamptz};
use leasehold::local::LocalPostgres;

pub const TTL: Duration = Duration::from_secs(30);

/// A ttl for a grant that a test needs held for its next step or two, and
/// then lapsed (it waits for the lapse on the server's clock). Long enough
/// that a machine busy with other suites cannot let it run out between two
/// consecutive calls; short enough to wait for.
pub const STILL_HELD_NEXT_STEP: Duration = Duration::from_secs(2);

enum Server {
    Local(Box<LocalPostgres>),
    External(String),
}

impl Server {
    fn url_for(&self, database: &str) -> String {
        match self {
            Server::Local(server) => server.url_for(database),
            Server::External(url) => url_with_database(url, database),
        }
    }
}

/// Replaces the database name in a `postgres://` URL.
pub fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{}", &base[..path_start], database);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Server::External(url),
        _ => Server::Local(Box::new(
            LocalPostgres::builder()
                .durable(false)
                .setting("max_connections", "200")
                .start()
                .unwrap_or_else(|error| panic!("cannot start the test server: {error}")),
        )),
    })
}

/// The admin connection URL (database `postgres` on local servers).
pub fn admin_url() -> String {
    match server() {
        Server::Local(server) => server.url(),
        Server::External(url) => url.clone(),
    }
}

fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// A database of its own for one test, dropped afterwards.
pub struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    /// A database with leasehold installed (copied from a template that was
    /// installed once).
    pub fn new() -> TestDb {
        static TEMPLATE: OnceLock<String> = OnceLock::new();
        let template = TEMPLATE.get_or_init(|| {
            let name = unique_name("leasehold_template");
            admin_exec(&format!("CREATE DATABASE {name}"));
            let mut conn = PgConnection::establish(&server().url_for(&name))
                .unwrap_or_else(|error| panic!("connect to template: {error}"));
            leasehold::install(&mut conn).unwrap_or_else(|error| panic!("install: {error}"));
            name
        });
        Self::create(&format!("TEMPLATE {template}"))
    }

    /// A database without leasehold.
    pub fn empty() -> TestDb {
        Self::create("")
    }

    fn create(options: &str) -> TestDb {
        // Copying a template needs it free of other copiers' connections.
        static CREATE: Mutex<()> = Mutex::new(());
        let _serial = CREATE.lock().unwrap_or_else(|p| p.into_inner());
        let name = unique_name("leasehold_test");
        admin_exec(&format!("CREATE DATABASE {name} {options}"));
        let url = server().url_for(&name);
        TestDb { name, url }
    }

    pub fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url)
            .unwrap_or_else(|error| panic!("connect to {}: {error}", self.name))
    }

    /// A connection as another role (created by the test).
    pub fn conn_as(&self, role: &str) -> PgConnection {
        let url = self.url.replacen("postgres@", &format!("{role}@"), 1);
        assert_ne!(
            url, self.url,
            "test URL has no postgres@ user part to replace"
        );
        PgConnection::establish(&url).unwrap_or_else(|error| panic!("connect as {role}: {error}"))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut conn) = PgConnection::establish(&admin_url()) {
            let _ = conn.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

pub fn admin_exec(sql: &str) {
    let mut conn = PgConnection::establish(&admin_url())
        .unwrap_or_else(|error| panic!("connect to admin database: {error}"));
    conn.batch_execute(sql)
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

#[derive(QueryableByName)]
struct Now {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

pub fn server_now(conn: &mut PgConnection) -> DateTime<Utc> {
    diesel::sql_query("SELECT clock_timestamp() AS now")
        .get_result::<Now>(conn)
        .expect("server clock")
        .now
}

/// Blocks until the *server's* clock is past `instant`: expiry is decided by
/// the server clock alone, so that is the state to synchronise on.
pub fn wait_until_server_time_passes(conn: &mut PgConnection, instant: DateTime<Utc>) {
    for _ in 0..10_000 {
        let now = server_now(conn);
        if now > instant {
            return;
        }
        let remaining = (instant - now).to_std().unwrap_or_default();
        std::thread::sleep(remaining.min(Duration::from_millis(50)) + Duration::from_micros(100));
    }
    panic!("server clock never passed {instant}");
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    flag: bool,
}

pub fn query_bool(conn: &mut PgConnection, sql: &str) -> bool {
    diesel::sql_query(sql)
        .get_result::<Flag>(conn)
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
        .flag
}

#[derive(QueryableByName)]
struct Line {
    #[diesel(sql_type = Text)]
    line: String,
}

/// Runs a query returning one text column named `line`, all rows.
pub fn query_lines(conn: &mut PgConnection, sql: &str) -> Vec<String> {
    diesel::sql_query(sql)
        .load::<Line>(conn)
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
        .into_iter()
        .map(|l| l.line)
        .collect()
}

/// Waits until some backend of database `db` waits on a lock (observable in
/// pg_stat_activity), i.e. a competitor is really blocked.
pub fn wait_for_lock_waiter(conn: &mut PgConnection, db: &str) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = '{db}' AND wait_event_type = 'Lock') AS flag"
    );
    for _ in 0..2_000 {
        if query_bool(conn, &sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no backend ever waited on a lock in {db}");
}

pub fn granted(acquisition: leasehold::Acquisition) -> leasehold::Lease {
    match acquisition {
        leasehold::Acquisition::Granted(lease) => lease,
        leasehold::Acquisition::Denied => panic!("expected a grant, got a denial"),
    }
}

/// The raw row of a key, for checks that go below the API (superuser only).
pub fn raw_row(conn: &mut PgConnection, key: &str) -> Option<String> {
    query_lines(
        conn,
        &format!(
            "SELECT format('%s|%s|%s|%s', owner, epoch, expires_at IS NOT NULL, lapsed_owner) AS line \
             FROM lease.leases WHERE key = {}",
            quote(key)
        ),
    )
    .into_iter()
    .next()
}

pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The SQLSTATE a statement fails with, or "00000". Runs it through a
/// temporary plpgsql function because diesel does not expose SQLSTATE.
pub fn sqlstate_of(conn: &mut PgConnection, sql: &str) -> String {
    conn.batch_execute(
        "CREATE OR REPLACE FUNCTION pg_temp.sqlstate_of(statement text) RETURNS text
         LANGUAGE plpgsql AS $f$
         BEGIN
             EXECUTE statement;
             RETURN '00000';
         EXCEPTION WHEN OTHERS OR query_canceled THEN
             RETURN SQLSTATE;
         END $f$;",
    )
    .expect("create sqlstate_of");
    query_lines(
        conn,
        &format!("SELECT pg_temp.sqlstate_of({}) AS line", quote(sql)),
    )
    .remove(0)
}

/// A snapshot of the whole lease table, for "nothing changed" checks.
pub fn table_snapshot(conn: &mut PgConnection) -> Vec<String> {
    query_lines(
        conn,
        "SELECT format('%s|%s|%s|%s|%s', key, owner, epoch, expires_at, lapsed_owner) AS line \
         FROM lease.leases ORDER BY key",
    )
}
