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
use crate::sql::calls::{
    FencedTablesCall, PresentCall, ProtectRowsCall, ProtectTableCall, UnprotectTableCall,
};
use crate::sql::execute::{get_result, Execute};
use crate::sql::input;

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
        LeaseError::from_fence(&error)
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
    .map_err(map_error(Operation::Present, autocommit))
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
    .map_err(map_error(Operation::ProtectTable, autocommit))
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
    .map_err(map_error(Operation::ProtectTable, autocommit))
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
    .map_err(map_error(Operation::ProtectTable, autocommit))
}

/// The connection's `Operator::fenced_tables`: its documentation is there.
pub(crate) async fn fenced_tables(conn: &mut impl Execute) -> Result<Vec<FencedTable>, LeaseError> {
    let autocommit = conn.in_autocommit();
    let rows = conn
        .load(FencedTablesCall {
            _borrow: std::marker::PhantomData,
        })
        .await
        .map_err(map_error(Operation::FencedTables, autocommit))?;
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
