//! One-line queries for assertions: a boolean, a column of text lines, a
//! quoted literal. Each panics with the statement when it fails.

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
