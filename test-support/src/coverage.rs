//! Which of leasehold's SQL functions each test calls, for the SQL mutation
//! runner (test-support/mutation/README.md).
//!
//! Why: a mutant changes one function, and only a test that calls it can
//! notice. Knowing each test's functions lets the runner run those tests
//! alone, seconds instead of the whole suite's minutes per mutant.
//!
//! How: when [`COVERAGE_ENV`] names a directory, the throwaway server counts
//! function calls (`track_functions = all`), and each test database, just
//! before it is dropped, appends the `lease` functions its sessions called
//! (`pg_stat_user_functions`) to `<dir>/<test name>`. The test name is the
//! name libtest gives the test's thread. Unset, nothing of this runs.

use std::io::Write;
use std::time::{Duration, Instant};

use diesel::prelude::*;

use crate::server::TestServer;

/// The environment variable naming the directory the records go to.
pub const COVERAGE_ENV: &str = "LEASEHOLD_TEST_FUNCTION_COVERAGE";

/// The directory [`COVERAGE_ENV`] names, when it is set and not empty.
pub(crate) fn directory() -> Option<std::path::PathBuf> {
    std::env::var_os(COVERAGE_ENV)
        .filter(|dir| !dir.is_empty())
        .map(Into::into)
}

/// Appends the `lease` functions called in `database` to this test's
/// record. Call it before the database is dropped.
///
/// A backend writes its function counts to the shared statistics when its
/// session ends, so this first waits (up to five seconds) until no other
/// session is connected to the database; when one is still there after
/// that, the test is marked as calling everything. Best effort: a record
/// that cannot be written is left out, and the runner then treats the test
/// as calling every function.
pub(crate) fn record(server: &TestServer, database: &str) {
    let Some(dir) = directory() else {
        return;
    };
    let Some(test) = std::thread::current().name().map(str::to_owned) else {
        return;
    };
    if test == "main" {
        return;
    }
    let Ok(mut conn) = PgConnection::establish(&server.url_for(database)) else {
        return;
    };
    let counting = lines(
        &mut conn,
        "SELECT current_setting('track_functions') AS line",
    );
    if counting.first().map(String::as_str) != Some("all") {
        // A server that does not count calls (another than the throwaway
        // one): nothing here says what the test called.
        append(&dir, &test, "# a server that does not count calls\n*\n");
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut alone = false;
    while !alone && Instant::now() < deadline {
        let others = lines(
            &mut conn,
            "SELECT count(*)::text AS line FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        );
        alone = others.first().map(String::as_str) == Some("0");
        if !alone {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if !alone {
        // A session still open has not written its counts: the record
        // would be short, so the test is marked as calling everything.
        append(&dir, &test, "# sessions still open after 5 s\n*\n");
        return;
    }
    let functions = lines(
        &mut conn,
        "SELECT DISTINCT schemaname || '.' || funcname AS line FROM pg_stat_user_functions \
         WHERE schemaname = 'lease' ORDER BY 1",
    );
    let mut text = format!("# database {database}\n");
    for function in functions {
        text.push_str(&function);
        text.push('\n');
    }
    append(&dir, &test, &text);
}

/// Marks this test as calling every function: it installed leasehold on a
/// server of its own (a replicated pair, the nemesis run), whose calls are
/// not counted, so the runner must run it against every mutant.
pub(crate) fn record_everything() {
    let (Some(dir), Some(test)) = (
        directory(),
        std::thread::current().name().map(str::to_owned),
    ) else {
        return;
    };
    append(&dir, &test, "# installed on a server of its own\n*\n");
}

/// Appends `text` to the record of `test` in `dir`; best effort.
fn append(dir: &std::path::Path, test: &str, text: &str) {
    let _ = std::fs::create_dir_all(dir);
    let path = dir.join(test.replace(['/', '\\'], "_"));
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = file.write_all(text.as_bytes());
    }
}

/// One text column named `line`.
#[derive(QueryableByName)]
struct Line {
    #[diesel(sql_type = diesel::sql_types::Text)]
    line: String,
}

/// The `line` column of `sql`'s rows; none when it fails. Never panics: it
/// runs while a test database is dropped, perhaps while a test panics.
fn lines(conn: &mut PgConnection, sql: &str) -> Vec<String> {
    diesel::sql_query(sql)
        .load::<Line>(conn)
        .map(|rows| rows.into_iter().map(|row| row.line).collect())
        .unwrap_or_default()
}
