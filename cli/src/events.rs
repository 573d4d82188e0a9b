//! `watch --events`: what happens to the watched keys, one line per event,
//! as it happens, instead of a table per refresh.
//!
//! Two sources, because neither sees everything:
//!
//! - **Wake-ups** come from the release notifications waiters get (`LISTEN
//!   lease_released`). A release notifies only when some session registered
//!   interest in the key (`lease._waiter_watch`, granted to PUBLIC), so the
//!   watch registers every watched key from its own listener session (up
//!   to [`leasehold::wait::WAITER_LIMIT`]); each release of such a key then costs
//!   one notification more, which every listener of the database receives.
//!   The payload is the key's digest, never its name: the watch maps it
//!   back through the digests of the keys it listed, so a digest of a key
//!   outside the watched set is ignored.
//! - **Losses and grants** come from comparing one listing of the keys with
//!   the next, on the server's clock (every `--interval`, and at once after
//!   a wake-up): a grant that lapsed, was released, or was replaced by a
//!   grant of another epoch; a new grant. A renewal (same grant, later
//!   expiry) is not an event. Changes that come and go between two
//!   listings (acquire and release within one interval) are seen only as
//!   their net effect, plus the wake-up if the key was registered.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{Nullable, Text};
use diesel::PgConnection;

use crate::args::{ListArgs, SortBy};
use crate::connect;
use crate::failure::CliError;
use crate::json::Json;
use crate::listing::{self, Row};
use crate::output::Printer;

/// How often the listener session is checked for notifications: diesel
/// only reads them when asked, so this bounds a wake-up's delay.
const NOTIFICATION_TICK: Duration = Duration::from_millis(20);

/// One thing that happened to a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// A release notification for the key arrived: waiters were woken.
    Wake { key: String },
    /// A new grant (the key was free, lapsed-and-taken, or new).
    Acquired { row: Row },
    /// The grant's ttl passed without a renewal.
    Lapsed { row: Row },
    /// The grant ended by a release or a forced release: the key is free.
    Released { previous: Row, row: Row },
    /// The grant was replaced by a grant of another epoch (a takeover of a
    /// lapsed grant, or a release and a new acquire between two listings).
    TakenOver { previous: Row, row: Row },
    /// The key's row is gone (pruned).
    Removed { previous: Row },
}

impl Event {
    fn kind(&self) -> &'static str {
        match self {
            Event::Wake { .. } => "wake",
            Event::Acquired { .. } => "acquired",
            Event::Lapsed { .. } => "lapsed",
            Event::Released { .. } => "released",
            Event::TakenOver { .. } => "taken_over",
            Event::Removed { .. } => "removed",
        }
    }

    /// Whether a holder lost its grant: what an operator watches for.
    fn is_loss(&self) -> bool {
        matches!(
            self,
            Event::Lapsed { .. } | Event::Released { .. } | Event::TakenOver { .. }
        )
    }

    fn key(&self) -> &str {
        match self {
            Event::Wake { key } => key,
            Event::Acquired { row } | Event::Lapsed { row } => &row.key,
            Event::Released { row, .. } | Event::TakenOver { row, .. } => &row.key,
            Event::Removed { previous } => &previous.key,
        }
    }

    fn describe(&self) -> String {
        match self {
            Event::Wake { .. } => "release notification: waiters for the key were woken".to_owned(),
            Event::Acquired { row } => format!(
                "granted to {} at epoch {}",
                row.owner.as_deref().unwrap_or("-"),
                row.epoch
            ),
            Event::Lapsed { row } => format!(
                "grant of {} at epoch {} lapsed (ttl passed without a renewal)",
                row.owner.as_deref().unwrap_or("-"),
                row.epoch
            ),
            Event::Released { previous, row } => format!(
                "grant of {} at epoch {} ended (released); counter {}",
                previous.owner.as_deref().unwrap_or("-"),
                previous.epoch,
                row.epoch
            ),
            Event::TakenOver { previous, row } => format!(
                "grant of {} at epoch {} lost to {} at epoch {}",
                previous.owner.as_deref().unwrap_or("-"),
                previous.epoch,
                row.owner.as_deref().unwrap_or("-"),
                row.epoch
            ),
            Event::Removed { previous } => {
                format!("row removed (last epoch {})", previous.epoch)
            }
        }
    }

    fn to_json(&self, at: DateTime<Utc>) -> Json {
        let mut fields = vec![
            ("event", Json::str(self.kind())),
            ("at", Json::time(Some(at))),
            ("key", Json::str(self.key())),
            ("loss", Json::Bool(self.is_loss())),
        ];
        let (previous, current) = match self {
            Event::Wake { .. } => (None, None),
            Event::Acquired { row } | Event::Lapsed { row } => (None, Some(row)),
            Event::Released { previous, row } | Event::TakenOver { previous, row } => {
                (Some(previous), Some(row))
            }
            Event::Removed { previous } => (Some(previous), None),
        };
        if let Some(row) = current {
            fields.push(("state", Json::str(&row.state)));
            fields.push(("owner", Json::opt_str(row.owner.as_deref())));
            fields.push(("epoch", Json::Int(row.epoch)));
            fields.push(("expires_at", Json::time(row.expires_at)));
        }
        if let Some(row) = previous {
            fields.push(("previous_owner", Json::opt_str(row.owner.as_deref())));
            fields.push(("previous_epoch", Json::Int(row.epoch)));
        }
        Json::Object(fields)
    }
}

/// The event that turns `previous` into `current` for one key, if any.
fn transition(previous: Option<&Row>, current: Option<&Row>) -> Option<Event> {
    match (previous, current) {
        (None, Some(row)) if row.state != "free" => Some(Event::Acquired { row: row.clone() }),
        (None, _) => None,
        (Some(previous), None) => Some(Event::Removed {
            previous: previous.clone(),
        }),
        (Some(previous), Some(row)) => {
            let had_grant = previous.state != "free";
            match (had_grant, row.state.as_str()) {
                (false, "free") => None,
                (false, _) => Some(Event::Acquired { row: row.clone() }),
                (true, "free") => Some(Event::Released {
                    previous: previous.clone(),
                    row: row.clone(),
                }),
                (true, _) if row.epoch != previous.epoch => Some(Event::TakenOver {
                    previous: previous.clone(),
                    row: row.clone(),
                }),
                (true, "lapsed") if previous.state == "held" => {
                    Some(Event::Lapsed { row: row.clone() })
                }
                _ => None,
            }
        }
    }
}

#[derive(QueryableByName)]
struct Registration {
    #[diesel(sql_type = Nullable<Text>)]
    digest: Option<String>,
}

/// The listener session and what it registered.
struct Listener {
    conn: PgConnection,
    /// Keys whose releases notify this session.
    armed: HashSet<String>,
    /// Keys the server refused to register (another role's namespace, the
    /// session's cap): not tried again.
    refused: HashSet<String>,
}

impl Listener {
    fn open(url: &str) -> Result<Listener, CliError> {
        let mut conn = connect::establish(url)?;
        conn.batch_execute("LISTEN lease_released; SELECT lease._waiter_reset();")
            .map_err(|error| {
                CliError::Database(format!(
                    "could not listen for release notifications: {error}; check that the role may LISTEN and run lease._waiter_reset()"
                ))
            })?;
        Ok(Listener {
            conn,
            armed: HashSet::new(),
            refused: HashSet::new(),
        })
    }

    /// Registers every listed key not registered yet, up to the cap. A key
    /// whose release is in flight (NULL) is tried again next time.
    fn arm(&mut self, rows: &[Row]) {
        for row in rows {
            if self.armed.len() >= leasehold::wait::WAITER_LIMIT {
                return;
            }
            if self.armed.contains(&row.key) || self.refused.contains(&row.key) {
                continue;
            }
            match diesel::sql_query("SELECT lease._waiter_watch($1) AS digest")
                .bind::<Text, _>(&row.key)
                .get_result::<Registration>(&mut self.conn)
            {
                Ok(Registration { digest: Some(_) }) => {
                    self.armed.insert(row.key.clone());
                }
                Ok(Registration { digest: None }) => {}
                Err(error) => {
                    eprintln!(
                        "note: no wake-ups for {:?}: the server refused to register it ({error})",
                        row.key
                    );
                    self.refused.insert(row.key.clone());
                }
            }
        }
    }

    /// The digests of the release notifications that arrived.
    fn released_digests(&mut self) -> Result<Vec<String>, CliError> {
        let mut digests = Vec::new();
        for notification in self.conn.notifications_iter() {
            let notification = notification.map_err(|error| {
                CliError::Database(format!(
                    "the listener session failed: {error}; run the watch again"
                ))
            })?;
            if notification.channel == "lease_released" {
                digests.push(notification.payload);
            }
        }
        Ok(digests)
    }

    /// Drops this session's registrations (best effort: rows of a session
    /// that is gone are pruned by the next listener's reset anyway).
    fn close(mut self) {
        let _ = self.conn.batch_execute("SELECT lease._waiter_reset()");
    }
}

/// `leasehold watch --events`.
pub fn watch_events(
    conn: &mut PgConnection,
    url: &str,
    out: Printer,
    list: &ListArgs,
    interval: Duration,
    count: Option<u64>,
) -> Result<(), CliError> {
    listing::check_privilege(conn)?;
    // The watched set is every key under the prefix: a key that moves out
    // of a state or owner filter has not gone away. `--owner` filters the
    // events instead (clap refuses --state, --sort and --limit here).
    let watched = ListArgs {
        positional_prefix: None,
        prefix: Some(list.prefix().to_owned()),
        state: Vec::new(),
        owner: None,
        sort: SortBy::Key,
        limit: None,
    };
    let owner = list.owner.as_deref();
    let mut listener = Listener::open(url)?;
    let (rows, now) = listing::load(conn, &watched)?;
    listener.arm(&rows);
    let mut known: HashMap<String, Row> =
        rows.into_iter().map(|row| (row.key.clone(), row)).collect();
    let started = now.unwrap_or_else(Utc::now);
    out.emit(
        &format!(
            "watching {} keys ({} registered for release wake-ups) from {started} (server time); Ctrl-C to stop",
            known.len(),
            listener.armed.len()
        ),
        &Json::Object(vec![
            ("event", Json::str("watching")),
            ("at", Json::time(Some(started))),
            (
                "keys",
                Json::Int(i64::try_from(known.len()).unwrap_or(i64::MAX)),
            ),
            (
                "armed",
                Json::Int(i64::try_from(listener.armed.len()).unwrap_or(i64::MAX)),
            ),
        ]),
    )?;
    let mut emitted: u64 = 0;
    let mut next_listing = Instant::now() + interval;
    let outcome: Result<(), CliError> = 'watch: loop {
        let digests = listener.released_digests()?;
        let woke = !digests.is_empty();
        for digest in digests {
            // Keys outside the watched set are someone else's business.
            let Some(row) = known.values().find(|row| row.digest == digest) else {
                continue;
            };
            if owner.is_some() && row.owner.as_deref() != owner {
                continue;
            }
            let key = row.key.clone();
            if let Err(error) = emit(out, &Event::Wake { key }, Utc::now()) {
                break 'watch Err(error);
            }
            emitted += 1;
            if count.is_some_and(|limit| emitted >= limit) {
                break 'watch Ok(());
            }
        }
        if woke || Instant::now() >= next_listing {
            next_listing = Instant::now() + interval;
            let (rows, now) = listing::load(conn, &watched)?;
            listener.arm(&rows);
            let at = now.unwrap_or_else(Utc::now);
            let current: HashMap<String, Row> =
                rows.into_iter().map(|row| (row.key.clone(), row)).collect();
            let mut keys: Vec<&String> = known.keys().chain(current.keys()).collect();
            keys.sort();
            keys.dedup();
            let mut done = false;
            for key in keys {
                let (before, after) = (known.get(key), current.get(key));
                let concerns_owner = owner.is_none()
                    || [before, after]
                        .iter()
                        .flatten()
                        .any(|row| row.owner.as_deref() == owner);
                if !concerns_owner {
                    continue;
                }
                if let Some(event) = transition(before, after) {
                    emit(out, &event, at)?;
                    emitted += 1;
                    if count.is_some_and(|limit| emitted >= limit) {
                        done = true;
                        break;
                    }
                }
            }
            known = current;
            if done {
                break Ok(());
            }
        }
        std::thread::sleep(NOTIFICATION_TICK.min(interval));
    };
    listener.close();
    outcome
}

fn emit(out: Printer, event: &Event, at: DateTime<Utc>) -> Result<(), CliError> {
    let text = format!(
        "{}  {:<10}  {}  {}",
        at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        event.kind(),
        event.key(),
        event.describe()
    );
    Ok(out.emit(&text, &event.to_json(at))?)
}
