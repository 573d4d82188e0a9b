//! One-line queries for assertions: a boolean, a column of text lines, a
//! quoted literal, and a wait for a lock waiter. Each panics with the
//! statement when it fails.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Bool, Text};

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    flag: bool,
}

/// Runs a query returning one boolean column named `flag`, one row.
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

/// `text` as an SQL string literal.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Waits until some backend of database `db` waits on a lock (observable in
/// pg_stat_activity), i.e. a competitor is really blocked.
pub fn wait_for_lock_waiter(conn: &mut PgConnection, db: &str) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = {} AND wait_event_type = 'Lock') AS flag",
        quote(db)
    );
    for _ in 0..2_000 {
        if query_bool(conn, &sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no backend ever waited on a lock in {db}");
}
