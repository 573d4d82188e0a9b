//! Fenced tables: the database refuses a write to a protected table unless
//! its transaction presented a current token of the table's key,
//! whatever client sends the write.
//!
//! The calls: `Fencing::present` in the writing
//! transaction (and `Fencing::run_fenced`, which
//! presents its token), and the owner's
//! `Operator::protect_table`, `protect_rows`, `unprotect_table` and
//! `fenced_tables`.

use crate::error::{LeaseError, Operation};
use crate::lease::token::FencingToken;
use crate::sql::execute::{get_result, Execute};
use crate::sql::input;
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};

impl Operation {
    /// `lease.protect_table`, `lease.protect_rows` or `lease.unprotect_table`: a table's owner changes its fence.
    pub const PROTECT_TABLE: Operation = Operation::writes("protect_table");
    /// `lease.fenced_tables`: the fenced tables of the database.
    pub const FENCED_TABLES: Operation = Operation::reads("fenced_tables");
}

crate::sql::calls::cacheable_query! {
    /// `lease.present(key, owner, epoch)`, its void answer read as text.
    PresentCall { key: &'a str => Text, owner: &'a str => Text, epoch: i64 => BigInt }
    row = Text;
    rust = String;
    |call, out| {
        out.push_sql("SELECT lease.present(");
        out.push_bind_param::<Text, _>(&call.key)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&call.owner)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&call.epoch)?;
        out.push_sql(")::text");
        Ok(())
    }
}

crate::sql::calls::cacheable_query! {
    /// `lease.protect_table(table, key)`; the table's name resolved as
    /// `regclass` resolves it (the session's search_path).
    ProtectTableCall { table: &'a str => Text, key: &'a str => Text }
    row = Text;
    rust = String;
    |call, out| {
        out.push_sql("SELECT lease.protect_table(");
        out.push_bind_param::<Text, _>(&call.table)?;
        out.push_sql("::regclass, ");
        out.push_bind_param::<Text, _>(&call.key)?;
        out.push_sql(")::text");
        Ok(())
    }
}

crate::sql::calls::cacheable_query! {
    /// `lease.protect_rows(table, key_prefix, key_columns)`.
    ProtectRowsCall { table: &'a str => Text, key_prefix: &'a str => Text, key_columns: Vec<&'a str> => Array<Text> }
    row = Text;
    rust = String;
    |call, out| {
        out.push_sql("SELECT lease.protect_rows(");
        out.push_bind_param::<Text, _>(&call.table)?;
        out.push_sql("::regclass, ");
        out.push_bind_param::<Text, _>(&call.key_prefix)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(&call.key_columns)?;
        out.push_sql(")::text");
        Ok(())
    }
}

crate::sql::calls::cacheable_query! {
    /// `lease.unprotect_table(table)`: whether the table had a fence.
    UnprotectTableCall { table: &'a str => Text }
    row = Bool;
    rust = bool;
    |call, out| {
        out.push_sql("SELECT lease.unprotect_table(");
        out.push_bind_param::<Text, _>(&call.table)?;
        out.push_sql("::regclass)");
        Ok(())
    }
}

crate::sql::calls::lease_call! {
    /// `lease.fenced_tables()`: (table, kind, key, key_prefix, key_columns).
    FencedTablesCall {}
    sql = "SELECT fenced_table, kind, key, key_prefix, key_columns FROM lease.fenced_tables";
    row = (Text, Text, Nullable<Text>, Nullable<Text>, Nullable<Array<Text>>);
    rust = (String, String, Option<String>, Option<String>, Option<Vec<String>>);
}

/// A table's fence, as `Operator::fenced_tables`
/// reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedTable {
    /// The table, schema-qualified where the search path needs it.
    pub table: String,
    /// What fences it.
    pub fence: TableFence,
}

/// What fences a table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TableFence {
    /// One key fences every write.
    Table {
        /// The lease key.
        key: String,
    },
    /// Each row is fenced by `key_prefix` followed by its key columns'
    /// values joined by `/`, every value but the last with `%` written
    /// `%25` and `/` written `%2F`.
    Rows {
        /// The prefix of every row's key (may be empty).
        key_prefix: String,
        /// The columns a row's key is made of, in order.
        key_columns: Vec<String>,
    },
}

fn map_error(
    operation: Operation,
    autocommit: bool,
) -> impl FnOnce(diesel::result::Error) -> LeaseError {
    move |error| {
        LeaseError::from_fence(&error, operation)
            .unwrap_or_else(|| LeaseError::from_keyless(operation, error, autocommit))
    }
}

fn check_text(field: &str, value: &str) -> Result<(), LeaseError> {
    input::text(field, value).map_err(LeaseError::invalid)
}

/// The connection's `Fencing::present`: its documentation is there.
pub(crate) async fn present(
    conn: &mut impl Execute,
    token: &FencingToken,
) -> Result<(), LeaseError> {
    let autocommit = conn.in_autocommit();
    get_result(
        conn,
        PresentCall {
            key: token.key(),
            owner: token.owner(),
            epoch: token.epoch().get(),
            _borrow: std::marker::PhantomData,
        },
    )
    .await
    .map(drop)
    .map_err(map_error(Operation::PRESENT, autocommit))
}

/// The connection's `Operator::protect_table`: its documentation is there.
pub(crate) async fn protect_table(
    conn: &mut impl Execute,
    table: &str,
    key: &str,
) -> Result<(), LeaseError> {
    check_text("table", table)?;
    check_text("key", key)?;
    let autocommit = conn.in_autocommit();
    get_result(
        conn,
        ProtectTableCall {
            table,
            key,
            _borrow: std::marker::PhantomData,
        },
    )
    .await
    .map(drop)
    .map_err(map_error(Operation::PROTECT_TABLE, autocommit))
}

/// The connection's `Operator::protect_rows`: its documentation is there.
pub(crate) async fn protect_rows(
    conn: &mut impl Execute,
    table: &str,
    key_prefix: &str,
    key_columns: &[&str],
) -> Result<(), LeaseError> {
    check_text("table", table)?;
    check_text("key_prefix", key_prefix)?;
    for column in key_columns {
        check_text("key_columns", column)?;
    }
    let autocommit = conn.in_autocommit();
    get_result(
        conn,
        ProtectRowsCall {
            table,
            key_prefix,
            key_columns: key_columns.to_vec(),
            _borrow: std::marker::PhantomData,
        },
    )
    .await
    .map(drop)
    .map_err(map_error(Operation::PROTECT_TABLE, autocommit))
}

/// The connection's `Operator::unprotect_table`: its documentation is there.
pub(crate) async fn unprotect_table(
    conn: &mut impl Execute,
    table: &str,
) -> Result<bool, LeaseError> {
    check_text("table", table)?;
    let autocommit = conn.in_autocommit();
    get_result(
        conn,
        UnprotectTableCall {
            table,
            _borrow: std::marker::PhantomData,
        },
    )
    .await
    .map_err(map_error(Operation::PROTECT_TABLE, autocommit))
}

/// The connection's `Operator::fenced_tables`: its documentation is there.
pub(crate) async fn fenced_tables(conn: &mut impl Execute) -> Result<Vec<FencedTable>, LeaseError> {
    let autocommit = conn.in_autocommit();
    let rows = conn
        .load(FencedTablesCall {
            _borrow: std::marker::PhantomData,
        })
        .await
        .map_err(map_error(Operation::FENCED_TABLES, autocommit))?;
    Ok(rows
        .into_iter()
        .map(|(table, kind, key, key_prefix, key_columns)| FencedTable {
            table,
            fence: if kind == "table" {
                TableFence::Table {
                    key: key.unwrap_or_default(),
                }
            } else {
                TableFence::Rows {
                    key_prefix: key_prefix.unwrap_or_default(),
                    key_columns: key_columns.unwrap_or_default(),
                }
            },
        })
        .collect())
}
