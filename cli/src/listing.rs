//! `ls` and `watch`: every key with its holder, epoch and remaining time.
//!
//! Decision: the library's API has no "list" on purpose (`lease.leases` is
//! closed to callers, who only see their own keys through `inspect`). An
//! operator listing everything is a different audience, so these commands
//! read `lease.leases` directly, which works for a superuser or the role
//! that installed leasehold (the table's owner), and say plainly when the
//! connected role lacks the privilege instead of adding a SQL function that
//! would open the table to every caller. Read-only: one SELECT per refresh.
//!
//! State and remaining time come from the *server* clock in the same
//! statement, like every lease decision, so a row shows `lapsed` exactly
//! when `acquire` would grant the key to someone else.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text, Timestamptz};
use diesel::PgConnection;

use crate::args::{ListArgs, SortBy};
use crate::duration;
use crate::failure::CliError;
use crate::json::Json;
use crate::output::Printer;
use crate::table;

/// One key as listed.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub(crate) struct Row {
    #[diesel(sql_type = Text)]
    pub(crate) key: String,
    /// Hex SHA-256 of the key: the payload of its release notifications.
    #[diesel(sql_type = Text)]
    pub(crate) digest: String,
    /// `held`, `lapsed` or `free`.
    #[diesel(sql_type = Text)]
    pub(crate) state: String,
    /// The holder, or the lapsed grant's owner; NULL when free.
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) owner: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) epoch: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// Milliseconds left (held), or since expiry (negative, lapsed).
    #[diesel(sql_type = Nullable<BigInt>)]
    remaining_ms: Option<i64>,
    #[diesel(sql_type = Timestamptz)]
    pub(crate) now: DateTime<Utc>,
}

/// What is compared between refreshes to mark a changed row.
type Fingerprint = (String, Option<String>, i64);

const LIST_SQL: &str = "\
WITH clock AS (SELECT clock_timestamp() AS now),
listed AS (
SELECT l.key,
       encode(l.key_hash, 'hex') AS digest,
       CASE WHEN l.owner IS NULL THEN 'free'
            WHEN x.expires_at > c.now THEN 'held'
            ELSE 'lapsed' END AS state,
       l.owner,
       l.epoch,
       x.expires_at,
       floor(extract(epoch FROM (x.expires_at - c.now)) * 1000)::bigint AS remaining_ms,
       c.now
  FROM lease.leases AS l CROSS JOIN clock AS c
  -- A grant in a heartbeat group is live until the later of its own
  -- expiry and its group's.
  LEFT JOIN lease.groups AS g ON g.id = l.group_id
  CROSS JOIN LATERAL (SELECT GREATEST(l.expires_at, g.expires_at) AS expires_at) AS x
 WHERE left(l.key, length($1)) = $1
   AND ($2::text IS NULL OR l.owner = $2))
SELECT * FROM listed
 WHERE cardinality($3::text[]) = 0 OR state = ANY ($3::text[])
 ORDER BY CASE WHEN $4 = 'expires' THEN expires_at END ASC NULLS LAST,
          CASE WHEN $4 = 'epoch' THEN epoch END DESC,
          key
 LIMIT $5";

#[derive(QueryableByName)]
struct Privilege {
    #[diesel(sql_type = Bool)]
    allowed: bool,
    #[diesel(sql_type = Text)]
    role: String,
}

/// Fails with [`CliError::NoListPrivilege`] unless the role may read the
/// lease table.
pub(crate) fn check_privilege(conn: &mut PgConnection) -> Result<(), CliError> {
    let privilege = diesel::sql_query(
        "SELECT has_table_privilege('lease.leases', 'SELECT') \
                AND has_table_privilege('lease.groups', 'SELECT') AS allowed, \
                current_user::text AS role",
    )
    .get_result::<Privilege>(conn)
    .map_err(|error| database("check the privilege on lease.leases", &error))?;
    if privilege.allowed {
        Ok(())
    } else {
        Err(CliError::NoListPrivilege {
            role: privilege.role,
        })
    }
}

fn database(what: &str, error: &diesel::result::Error) -> CliError {
    CliError::Database(format!(
        "could not {what}: {error}; check the connection and that leasehold is installed"
    ))
}

/// One read of the keys `list` selects, in its order, and the server's
/// clock (`None` when no key matched).
pub(crate) fn load(
    conn: &mut PgConnection,
    list: &ListArgs,
) -> Result<(Vec<Row>, Option<DateTime<Utc>>), CliError> {
    let states: Vec<&str> = list.state.iter().map(|state| state.as_str()).collect();
    let sort = match list.sort {
        SortBy::Key => "key",
        SortBy::Expires => "expires",
        SortBy::Epoch => "epoch",
    };
    let rows = diesel::sql_query(LIST_SQL)
        .bind::<Text, _>(list.prefix())
        .bind::<Nullable<Text>, _>(list.owner.as_deref())
        .bind::<Array<Text>, _>(states)
        .bind::<Text, _>(sort)
        .bind::<Nullable<BigInt>, _>(list.limit)
        .load::<Row>(conn)
        .map_err(|error| database("list lease.leases", &error))?;
    let now = rows.first().map(|row| row.now);
    Ok((rows, now))
}

/// `leasehold ls [PREFIX] [--state S] [--owner O] [--sort K] [--limit N]`.
pub fn ls(conn: &mut PgConnection, out: Printer, list: &ListArgs) -> Result<(), CliError> {
    check_privilege(conn)?;
    let (rows, now) = load(conn, list)?;
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
    check_privilege(conn)?;
    let clear = !out.is_json() && std::io::stdout().is_terminal();
    let mut previous: Option<HashMap<String, Fingerprint>> = None;
    let mut refresh: u64 = 0;
    loop {
        refresh += 1;
        let (rows, now) = load(conn, list)?;
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
    (row.state.clone(), row.owner.clone(), row.epoch)
}

fn cells(row: &Row) -> Vec<String> {
    let holder = match (row.state.as_str(), &row.owner) {
        ("held", Some(owner)) => owner.clone(),
        ("lapsed", Some(owner)) => format!("({owner})"),
        _ => "-".to_owned(),
    };
    let remaining = match (row.state.as_str(), row.remaining_ms) {
        ("held", Some(ms)) => duration::format(millis(ms)),
        ("lapsed", Some(ms)) => format!("lapsed {} ago", duration::format(millis(-ms))),
        _ => "-".to_owned(),
    };
    vec![
        row.key.clone(),
        row.state.clone(),
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
        ("state", Json::str(&row.state)),
        ("owner", Json::opt_str(row.owner.as_deref())),
        ("epoch", Json::Int(row.epoch)),
        ("expires_at", Json::time(row.expires_at)),
        (
            "remaining_ms",
            Json::int(row.remaining_ms.filter(|_| row.state == "held")),
        ),
    ])
}
