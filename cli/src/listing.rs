//! What `ls` and `watch` share: which keys they show (their arguments,
//! [`ListArgs`]), one read of them, and how a row looks in a table and in
//! JSON.
//!
//! The rows come from the library's listing
//! ([`leasehold::admin::Operator::list_leases`]), which reads `lease.leases` and
//! `lease.groups` (closed to callers by design, so it works for a
//! superuser, the role that installed leasehold, or a role granted SELECT
//! on both) and reports a role without the privilege by name, which these
//! commands then explain. Read-only: one listing per refresh. This module
//! keeps the presentation: tables, JSON, change marks.
//!
//! State and remaining time come from the *server* clock in the same
//! statement, like every lease decision, so a row shows `lapsed` exactly
//! when `acquire` would grant the key to someone else.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use diesel::PgConnection;
use leasehold::admin::{KeyState, ListFilter, ListOrder, ListedLease};
use leasehold::{ErrorKind, LeaseError};

use crate::duration;
use crate::failure::{report, CliError};
use crate::json::Json;
use leasehold::admin::Operator;

/// One key as listed.
pub type Row = ListedLease;

/// The library's filter for `list`.
pub fn filter(list: &ListArgs) -> ListFilter {
    let mut filter = ListFilter::new()
        .prefix(list.prefix())
        .order(match list.sort {
            SortBy::Key => ListOrder::Key,
            SortBy::Expires => ListOrder::Expires,
            SortBy::Epoch => ListOrder::Epoch,
        });
    filter.owner = list.owner.clone();
    filter.states = list.state.iter().map(|state| state.as_library()).collect();
    // clap accepts only 1 and above.
    filter.limit = list.limit.and_then(|limit| u64::try_from(limit).ok());
    filter
}

/// One read of the keys `filter` selects, in its order, and the server's
/// clock (`None` when no key matched: what `ls --json` has always shown).
pub fn load(
    conn: &mut PgConnection,
    filter: &ListFilter,
) -> Result<(Vec<Row>, Option<DateTime<Utc>>), CliError> {
    let listing = conn.list_leases(filter).map_err(failure)?;
    let now = (!listing.leases.is_empty()).then_some(listing.read_at);
    Ok((listing.leases, now))
}

/// The command's error for a failed listing.
pub fn failure(error: LeaseError) -> CliError {
    match (error.kind(), error.violations()) {
        (ErrorKind::Forbidden, _) => CliError::NoListPrivilege {
            role: error.role().unwrap_or_default().to_owned(),
        },
        (_, []) => CliError::Database(format!(
            "could not list lease.leases: {}; check the connection and that leasehold is installed",
            report(&error)
        )),
        (_, violations) => CliError::InvalidInput(violations.join("; ")),
    }
}

/// Columns of `watch`; `ls` drops the first (the change mark).
pub const HEADER: [&str; 7] = [
    "",
    "KEY",
    "STATE",
    "HOLDER",
    "EPOCH",
    "EXPIRES_AT",
    "REMAINING",
];

/// What `ls` and `watch` print when no key matches.
pub fn no_keys(list: &ListArgs) -> String {
    let filtered = !list.state.is_empty() || list.owner.is_some();
    match list.prefix() {
        "" if filtered => "no lease keys match the filters".to_owned(),
        "" => "no lease keys yet".to_owned(),
        prefix if filtered => format!("no lease keys start with {prefix:?} and match the filters"),
        prefix => format!("no lease keys start with {prefix:?}"),
    }
}

/// Milliseconds left (held), or since expiry (negative, lapsed), rounded
/// down as `ls` has always shown them.
fn remaining_ms(row: &Row) -> Option<i64> {
    row.remaining
        .and_then(|remaining| remaining.num_microseconds())
        .map(|micros| micros.div_euclid(1000))
}

/// A row's table cells, under [`HEADER`] without its first column.
pub fn cells(row: &Row) -> Vec<String> {
    let holder = match (row.state, &row.owner) {
        (KeyState::Held, Some(owner)) => owner.clone(),
        (KeyState::Lapsed, Some(owner)) => format!("({owner})"),
        _ => "-".to_owned(),
    };
    let remaining = match (row.state, remaining_ms(row)) {
        (KeyState::Held, Some(ms)) => duration::format(millis(ms)),
        (KeyState::Lapsed, Some(ms)) => format!("lapsed {} ago", duration::format(millis(-ms))),
        _ => "-".to_owned(),
    };
    vec![
        row.key.clone(),
        row.state.to_string(),
        holder,
        row.epoch.to_string(),
        row.expires_at
            .map_or_else(|| "-".to_owned(), |t| t.to_string()),
        remaining,
    ]
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A row as `ls --json` and `watch --json` show it.
pub fn row_json(row: &Row) -> Json {
    Json::Object(vec![
        ("key", Json::str(&row.key)),
        ("state", Json::str(row.state.as_str())),
        ("owner", Json::opt_str(row.owner.as_deref())),
        ("epoch", Json::Int(row.epoch.into())),
        ("expires_at", Json::time(row.expires_at)),
        (
            "remaining_ms",
            Json::int(remaining_ms(row).filter(|_| row.state == KeyState::Held)),
        ),
    ])
}

/// Which keys `ls` and `watch` show, and in which order.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only keys starting with this prefix (default: all keys); the same
    /// as --prefix.
    #[arg(value_name = "PREFIX", conflicts_with = "prefix")]
    pub positional_prefix: Option<String>,
    /// Only keys starting with this prefix.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Only keys in these states (comma-separated or repeated): held,
    /// lapsed (the grant expired; anyone may take the key), free (released).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub state: Vec<StateArg>,
    /// Only keys whose current or lapsed grant belongs to this owner
    /// (exact match).
    #[arg(long)]
    pub owner: Option<String>,
    /// Order of the rows: key (byte order), expires (soonest expiry first,
    /// free keys last) or epoch (highest first); ties by key.
    #[arg(long, value_enum, default_value_t = SortBy::Key)]
    pub sort: SortBy,
    /// Show at most this many rows (after filtering and sorting).
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub limit: Option<i64>,
}

impl ListArgs {
    /// The prefix, from either spelling ("" for all keys).
    pub fn prefix(&self) -> &str {
        self.prefix
            .as_deref()
            .or(self.positional_prefix.as_deref())
            .unwrap_or("")
    }
}

/// A key's state as `ls` shows it (decided on the server's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StateArg {
    /// A live grant.
    Held,
    /// A grant whose ttl passed: anyone may acquire the key.
    Lapsed,
    /// Released (or force-released): no grant.
    Free,
}

impl StateArg {
    /// The library's name for the state.
    pub fn as_library(self) -> KeyState {
        match self {
            StateArg::Held => KeyState::Held,
            StateArg::Lapsed => KeyState::Lapsed,
            StateArg::Free => KeyState::Free,
        }
    }
}

/// How `ls` orders its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// By key, byte order.
    Key,
    /// Soonest expiry first (lapsed ones, longest lapsed, before held
    /// ones); free keys last.
    Expires,
    /// Highest epoch first.
    Epoch,
}
