//! `leasehold table protect | protect-rows | unprotect | ls`: a table's owner
//! fences it, so that the database refuses every write whose transaction did
//! not present the live grant of its key (docs/guide/guards.md, "Fenced
//! tables").

use clap::Subcommand;
use diesel::PgConnection;
use leasehold::admin::Operator;
use leasehold::error::LeaseError;
use leasehold::guard::TableFence;

use crate::connect::Needs;
use crate::context::Context;
use crate::failure::{report, CliError};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::output::Printer;
use crate::table;

/// A table's owner: fence a table by a lease key, so the database refuses
/// writes from any transaction that did not present the key's live grant
/// (SELECT lease.present(key, owner, epoch)).
#[derive(Debug, Subcommand)]
#[command(after_help = SEE_EXIT_CODES)]
pub enum Action {
    /// Fence the whole TABLE by KEY (again with the same KEY completes the
    /// fence; another fence needs `unprotect` first).
    #[command(after_help = SEE_EXIT_CODES)]
    Protect {
        /// The table, as SQL names it (schema.table).
        table: String,
        /// The lease key whose live grant every write must present.
        key: String,
    },
    /// Fence each row of TABLE by PREFIX followed by its COLUMNS' values
    /// joined by '/', every value but the last with '%' written %25 and '/'
    /// written %2F (again with the same fence completes it; another fence
    /// needs `unprotect` first).
    #[command(after_help = SEE_EXIT_CODES)]
    ProtectRows {
        /// The table, as SQL names it (schema.table).
        table: String,
        /// The prefix of every row's key, e.g. tenant/ (may be empty).
        prefix: String,
        /// The key columns, in order.
        #[arg(required = true)]
        columns: Vec<String>,
    },
    /// Remove TABLE's fence.
    #[command(after_help = SEE_EXIT_CODES)]
    Unprotect {
        /// The table, as SQL names it (schema.table).
        table: String,
    },
    /// List the fenced tables and what fences each.
    #[command(after_help = SEE_EXIT_CODES)]
    Ls,
}

/// `leasehold table ...`.
pub fn run(action: Action, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    let out = ctx.out;
    match action {
        Action::Protect { table, key } => {
            conn.protect_table(&table, &key).map_err(failure)?;
            let text = format!(
                "fenced table {table} by key {key:?}: every write must present its live grant"
            );
            let json = Json::Object(vec![("table", Json::str(&table)), ("key", Json::str(&key))]);
            Ok(out.emit(&text, &json)?)
        }
        Action::ProtectRows {
            table,
            prefix,
            columns,
        } => {
            let names: Vec<&str> = columns.iter().map(String::as_str).collect();
            conn.protect_rows(&table, &prefix, &names)
                .map_err(failure)?;
            let text = format!(
                "fenced each row of {table} by key {prefix:?} + {}: every write must present the live grant of each row's key",
                columns.join(" + '/' + ")
            );
            let json = Json::Object(vec![
                ("table", Json::str(&table)),
                ("key_prefix", Json::str(&prefix)),
                (
                    "key_columns",
                    Json::Array(columns.iter().map(Json::str).collect()),
                ),
            ]);
            Ok(out.emit(&text, &json)?)
        }
        Action::Unprotect { table } => {
            let removed = conn.unprotect_table(&table).map_err(failure)?;
            let text = if removed {
                format!("removed the fence of table {table}")
            } else {
                format!("table {table} had no fence; nothing changed")
            };
            let json = Json::Object(vec![
                ("table", Json::str(&table)),
                ("removed", Json::Bool(removed)),
            ]);
            Ok(out.emit(&text, &json)?)
        }
        Action::Ls => list(conn, out),
    }
}

fn list(conn: &mut PgConnection, out: Printer) -> Result<(), CliError> {
    let fenced = conn.fenced_tables().map_err(failure)?;
    let describe = |fence: &TableFence| match fence {
        TableFence::Table { key } => ("table".to_owned(), key.clone()),
        TableFence::Rows {
            key_prefix,
            key_columns,
        } => (
            "rows".to_owned(),
            format!("{key_prefix}<{}>", key_columns.join("/")),
        ),
        other => ("other".to_owned(), format!("{other:?}")),
    };
    let text = if fenced.is_empty() {
        "no fenced tables".to_owned()
    } else {
        let rows: Vec<Vec<String>> = fenced
            .iter()
            .map(|f| {
                let (kind, key) = describe(&f.fence);
                vec![f.table.clone(), kind, key]
            })
            .collect();
        table::render(&["TABLE", "FENCE", "KEY"], &rows)
    };
    let json = Json::Object(vec![(
        "tables",
        Json::Array(
            fenced
                .iter()
                .map(|f| {
                    let (kind, key) = describe(&f.fence);
                    Json::Object(vec![
                        ("table", Json::str(&f.table)),
                        ("fence", Json::str(&kind)),
                        ("key", Json::str(&key)),
                    ])
                })
                .collect(),
        ),
    )]);
    Ok(out.emit(&text, &json)?)
}

fn failure(error: LeaseError) -> CliError {
    if error.violations().is_empty() {
        CliError::Database(report(&error))
    } else {
        CliError::InvalidInput(error.violations().join("; "))
    }
}
