//! A database of its own for each test, so tests run in parallel without
//! seeing each other's leases; dropped when the test ends.

use std::sync::atomic::{AtomicU32, Ordering};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

use crate::server::TestServer;

/// A database of its own for one test, dropped (`WITH (FORCE)`) afterwards.
#[derive(Debug)]
pub struct TestDb {
    /// The database's name, unique per process and test.
    pub name: String,
    /// Its URL, as the server's admin user.
    pub url: String,
    server: &'static TestServer,
}

impl TestDb {
    /// A database with leasehold installed, on [`TestServer::from_env`]
    /// (and `LEASEHOLD_TEST_SQL_PATCH` applied, see [`TestDb::installed_on`]).
    // Not `Default`: creating a database is a side effect, not a value.
    #[allow(clippy::new_without_default)]
    pub fn new() -> TestDb {
        TestDb::installed_on(TestServer::from_env())
    }

    /// A database without leasehold, on [`TestServer::from_env`].
    pub fn empty() -> TestDb {
        TestDb::empty_on(TestServer::from_env())
    }

    /// A database with leasehold installed on `server`: a copy of a template
    /// installed once per server, which is much faster than installing into
    /// every database. When `LEASEHOLD_TEST_SQL_PATCH` names a file, its SQL
    /// runs on the template right after the install (see
    /// [`apply_sql_patch`]; for the SQL mutation runner,
    /// test-support/mutation/README.md).
    pub fn installed_on(server: &'static TestServer) -> TestDb {
        let template = server.template.get_or_init(|| {
            let name = unique_name("leasehold_template");
            server.admin_exec(&format!("CREATE DATABASE {name}"));
            let mut conn = PgConnection::establish(&server.url_for(&name))
                .unwrap_or_else(|error| panic!("connect to template: {error}"));
            leasehold::install(&mut conn).unwrap_or_else(|error| panic!("install: {error}"));
            apply_sql_patch(&mut conn);
            name
        });
        TestDb::create(server, &format!("TEMPLATE {template}"))
    }

    /// A database without leasehold on `server`.
    pub fn empty_on(server: &'static TestServer) -> TestDb {
        TestDb::create(server, "")
    }

    fn create(server: &'static TestServer, options: &str) -> TestDb {
        let _serial = server.create.lock().unwrap_or_else(|p| p.into_inner());
        let name = unique_name("leasehold_test");
        server.admin_exec(&format!("CREATE DATABASE {name} {options}"));
        let url = server.url_for(&name);
        TestDb { name, url, server }
    }

    /// The server this database lives on.
    pub fn server(&self) -> &'static TestServer {
        self.server
    }

    /// A new connection to this database.
    pub fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url)
            .unwrap_or_else(|error| panic!("connect to {}: {error}", self.name))
    }

    /// A connection as another role (created by the test), replacing the
    /// URL's `postgres@` user part.
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
        crate::coverage::record(self.server, &self.name);
        if let Ok(mut conn) = PgConnection::establish(&self.server.admin_url()) {
            let _ = conn.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// The environment variable naming a file of SQL that [`apply_sql_patch`]
/// runs right after each install.
pub const SQL_PATCH_ENV: &str = "LEASEHOLD_TEST_SQL_PATCH";

/// Runs the SQL in the file [`SQL_PATCH_ENV`] names, when it is set and not
/// empty, on `conn`: the connection that just installed leasehold, so that
/// `CREATE OR REPLACE FUNCTION` runs as the functions' owner. Panics naming
/// the file when it cannot be read or its SQL fails.
///
/// Why: for the SQL mutation runner, test-support/mutation/README.md. A
/// mutant replaces one installed function after the install, so the test
/// binaries are built once rather than once per mutant (the migrations are
/// embedded at compile time). Unset, this does nothing.
pub fn apply_sql_patch(conn: &mut PgConnection) {
    let Some(path) = std::env::var_os(SQL_PATCH_ENV).filter(|path| !path.is_empty()) else {
        return;
    };
    let shown = std::path::Path::new(&path).display().to_string();
    let sql = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{SQL_PATCH_ENV}: cannot read {shown}: {error}"));
    conn.batch_execute(&sql)
        .unwrap_or_else(|error| panic!("{SQL_PATCH_ENV}: applying {shown} failed: {error}"));
}

/// `<prefix>_<pid>_<n>`: unique across the test binaries sharing a server.
fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}
