//! `ls` and `watch`: every key with its holder, epoch and remaining time.
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

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::PgConnection;
use leasehold::admin::{KeyState, ListFilter, ListOrder, ListedLease};
use leasehold::LeaseError;

use crate::args::{ListArgs, SortBy};
use crate::duration;
use crate::failure::{report, CliError};
use crate::json::Json;
use crate::output::Printer;
use crate::table;
use leasehold::admin::Operator;

/// One key as listed.
pub(crate) type Row = ListedLease;

/// What is compared between refreshes to mark a changed row.
type Fingerprint = (KeyState, Option<String>, i64);

/// The library's filter for `list`.
pub(crate) fn filter(list: &ListArgs) -> ListFilter {
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
pub(crate) fn load(
    conn: &mut PgConnection,
    filter: &ListFilter,
) -> Result<(Vec<Row>, Option<DateTime<Utc>>), CliError> {
    let listing = conn.list_leases(filter).map_err(failure)?;
    let now = (!listing.leases.is_empty()).then_some(listing.read_at);
    Ok((listing.leases, now))
}

/// The command's error for a failed listing.
pub(crate) fn failure(error: LeaseError) -> CliError {
    match error {
        LeaseError::ListNotPermitted { role } => CliError::NoListPrivilege { role },
        LeaseError::InvalidInput { violations } => CliError::InvalidInput(violations.join("; ")),
        other => CliError::Database(format!(
            "could not list lease.leases: {}; check the connection and that leasehold is installed",
            report(&other)
        )),
    }
}

/// `leasehold ls [PREFIX] [--state S] [--owner O] [--sort K] [--limit N]`.
pub fn ls(conn: &mut PgConnection, out: Printer, list: &ListArgs) -> Result<(), CliError> {
    let (rows, now) = load(conn, &filter(list))?;
    let text = if rows.is_empty() {
        no_keys(list)
    } else {
        table::render(&HEADER[1..], &rows.iter().map(cells).collect::<Vec<_>>())
    };
    let json = Json::Object(vec![
        ("now", Json::time(now)),
        ("leases", Json::Array(rows.iter().map(row_json).collect())),
    ]);
    Ok(out.emit(&text, &json)?)
}

/// `leasehold watch [PREFIX] [--interval D] [--count N]`.
pub fn watch(
    conn: &mut PgConnection,
    out: Printer,
    list: &ListArgs,
    interval: Duration,
    count: Option<u64>,
) -> Result<(), CliError> {
    let filter = filter(list);
    let clear = !out.is_json() && std::io::stdout().is_terminal();
    let mut previous: Option<HashMap<String, Fingerprint>> = None;
    let mut refresh: u64 = 0;
    loop {
        refresh += 1;
        let (rows, now) = load(conn, &filter)?;
        let current: HashMap<String, Fingerprint> = rows
            .iter()
            .map(|row| (row.key.clone(), fingerprint(row)))
            .collect();
        let changed: Vec<&Row> = match &previous {
            None => Vec::new(),
            Some(before) => rows
                .iter()
                .filter(|row| before.get(&row.key) != current.get(&row.key))
                .collect(),
        };
        let mut text = String::new();
        if clear {
            text.push_str("\x1b[2J\x1b[H");
        }
        text.push_str(&format!(
            "refresh {refresh} at {} (server time), every {}; Ctrl-C to stop\n",
            now.map_or_else(|| "-".to_owned(), |t| t.to_string()),
            duration::format(interval)
        ));
        if rows.is_empty() {
            text.push_str(&no_keys(list));
            text.push('\n');
        } else {
            let lines: Vec<Vec<String>> = rows
                .iter()
                .map(|row| {
                    // Always one character wide, so columns stay put
                    // from one refresh to the next.
                    let mark = if changed.iter().any(|c| c.key == row.key) {
                        "*"
                    } else {
                        " "
                    };
                    std::iter::once(mark.to_owned()).chain(cells(row)).collect()
                })
                .collect();
            text.push_str(&table::render(&HEADER, &lines));
        }
        let json = Json::Object(vec![
            (
                "refresh",
                Json::Int(i64::try_from(refresh).unwrap_or(i64::MAX)),
            ),
            ("now", Json::time(now)),
            (
                "changed",
                Json::Array(changed.iter().map(|row| Json::str(&row.key)).collect()),
            ),
            ("leases", Json::Array(rows.iter().map(row_json).collect())),
        ]);
        out.emit(&text, &json)?;
        if count.is_some_and(|limit| refresh >= limit) {
            return Ok(());
        }
        previous = Some(current);
        std::thread::sleep(interval);
    }
}

/// Columns of `watch`; `ls` drops the first (the change mark).
const HEADER: [&str; 7] = [
    "",
    "KEY",
    "STATE",
    "HOLDER",
    "EPOCH",
    "EXPIRES_AT",
    "REMAINING",
];

fn no_keys(list: &ListArgs) -> String {
    let filtered = !list.state.is_empty() || list.owner.is_some();
    match list.prefix() {
        "" if filtered => "no lease keys match the filters".to_owned(),
        "" => "no lease keys yet".to_owned(),
        prefix if filtered => format!("no lease keys start with {prefix:?} and match the filters"),
        prefix => format!("no lease keys start with {prefix:?}"),
    }
}

fn fingerprint(row: &Row) -> Fingerprint {
    (row.state, row.owner.clone(), row.epoch.get())
}

/// Milliseconds left (held), or since expiry (negative, lapsed), rounded
/// down as `ls` has always shown them.
fn remaining_ms(row: &Row) -> Option<i64> {
    row.remaining
        .and_then(|remaining| remaining.num_microseconds())
        .map(|micros| micros.div_euclid(1000))
}

fn cells(row: &Row) -> Vec<String> {
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

pub(crate) fn row_json(row: &Row) -> Json {
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
