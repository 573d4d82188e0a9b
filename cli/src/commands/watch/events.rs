//! `watch --events`: what happens to the watched keys, one line per event,
//! as it happens, instead of a table per refresh.
//!
//! Two sources, because neither sees everything:
//!
//! - **Wake-ups** come from the release notifications waiters get, through
//!   the library's release watch
//!   ([`leasehold::wait::LeaseWaiter::watch_releases`]) on the waiters'
//!   shared listener session. A release notifies only while some session
//!   registered interest in the key, so the watch registers every watched
//!   key (up to [`leasehold::wait::WAITER_LIMIT`]); each release of such a
//!   key then costs one notification more, which every listener of the
//!   database receives. The watch reports the key (the library maps the
//!   notification's digest back to it); a key outside the watched set is
//!   never reported. When the listener's session is lost or comes up, the
//!   watch says releases may have been missed, and the keys are listed
//!   again.
//! - **Losses and grants** come from comparing one listing of the keys with
//!   the next ([`leasehold::admin::Operator::list_leases`], on the server's clock),
//!   every `--interval`, and at once after a wake-up: a grant that lapsed,
//!   was released, or was replaced by a grant of another epoch; a new
//!   grant. A renewal (same grant, later expiry) is not an event. Changes
//!   that come and go between two listings (acquire and release within one
//!   interval) are seen only as their net effect, plus the wake-up if the
//!   key was registered.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::PgConnection;
use leasehold::admin::{KeyState, ListFilter};
use leasehold::wait::{LeaseWaiter, ReleaseEvent, ReleaseWatch, WAITER_LIMIT};
use leasehold::LeaseClient;

use crate::failure::CliError;
use crate::json::Json;
use crate::listing::{self, ListArgs, Row};
use crate::output::Printer;
use leasehold::admin::Operator;

/// How long the watch waits for the listener's session at its start: the
/// listener's delivery check takes up to ten seconds on a session that
/// does not deliver. Without it the watch runs on listings alone.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the watch waits at its start for its keys' registrations.
const ARM_TIMEOUT: Duration = Duration::from_secs(5);

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
            fields.push(("state", Json::str(row.state.as_str())));
            fields.push(("owner", Json::opt_str(row.owner.as_deref())));
            fields.push(("epoch", Json::Int(row.epoch.get())));
            fields.push(("expires_at", Json::time(row.expires_at)));
        }
        if let Some(row) = previous {
            fields.push(("previous_owner", Json::opt_str(row.owner.as_deref())));
            fields.push(("previous_epoch", Json::Int(row.epoch.into())));
        }
        Json::Object(fields)
    }
}

/// The event that turns `previous` into `current` for one key, if any.
fn transition(previous: Option<&Row>, current: Option<&Row>) -> Option<Event> {
    match (previous, current) {
        (None, Some(row)) if row.state != KeyState::Free => {
            Some(Event::Acquired { row: row.clone() })
        }
        (None, _) => None,
        (Some(previous), None) => Some(Event::Removed {
            previous: previous.clone(),
        }),
        (Some(previous), Some(row)) => {
            let had_grant = previous.state != KeyState::Free;
            match (had_grant, row.state) {
                (false, KeyState::Free) => None,
                (false, _) => Some(Event::Acquired { row: row.clone() }),
                (true, KeyState::Free) => Some(Event::Released {
                    previous: previous.clone(),
                    row: row.clone(),
                }),
                (true, _) if row.epoch != previous.epoch => Some(Event::TakenOver {
                    previous: previous.clone(),
                    row: row.clone(),
                }),
                (true, KeyState::Lapsed) if previous.state == KeyState::Held => {
                    Some(Event::Lapsed { row: row.clone() })
                }
                _ => None,
            }
        }
    }
}

/// The release wake-ups of the watched keys: a release watch on the
/// library's shared listener.
struct Wakeups {
    waiter: LeaseWaiter,
    watch: ReleaseWatch,
}

impl Wakeups {
    /// Starts the listener for `url` and a watch of no key yet. A listener
    /// that does not come up is noted on stderr: the watch then runs on
    /// listings alone (the listener keeps trying).
    fn open(url: &str) -> Result<Wakeups, CliError> {
        // Lazily: the waiter's attempts are never made here, so the pool
        // never needs a connection; the listener opens its own session.
        let client = LeaseClient::builder(url)
            .max_size(1)
            .connect_lazily()
            .build()
            .map_err(CliError::from)?;
        let waiter = LeaseWaiter::new(&client);
        if let Err(error) = waiter.ensure_listening(LISTEN_TIMEOUT) {
            eprintln!(
                "note: no release wake-ups for now ({error}); grants and losses still show at every listing"
            );
        }
        let watch = waiter
            .watch_releases(std::iter::empty::<&str>())
            .map_err(CliError::from)?;
        Ok(Wakeups { waiter, watch })
    }

    /// Watches every listed key not watched yet, up to the cap.
    fn arm(&mut self, rows: &[Row]) {
        for row in rows {
            if self.watch.len() >= WAITER_LIMIT {
                return;
            }
            if let Err(error) = self.watch.add(&row.key) {
                eprintln!("note: no wake-ups for {:?}: {error}", row.key);
            }
        }
    }

    /// Waits for the registrations to complete, drops what they announced
    /// meanwhile (the listing that follows shows it), and answers how many
    /// keys are registered; notes on stderr the keys that are not.
    fn settle(&mut self) -> usize {
        let armed = self.watch.wait_armed(ARM_TIMEOUT);
        while self.watch.try_recv().is_some() {}
        if armed < self.watch.len() {
            eprintln!(
                "note: {} of {} watched keys are not registered for release wake-ups (listener: {:?}); their changes show at the next listing",
                self.watch.len() - armed,
                self.watch.len(),
                self.waiter.listener_status().wake_mode
            );
        }
        armed
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
    // The watched set is every key under the prefix: a key that moves out
    // of a state or owner filter has not gone away. `--owner` filters the
    // events instead (clap refuses --state, --sort and --limit here).
    let watched = ListFilter::new().prefix(list.prefix());
    let owner = list.owner.as_deref();
    // The first listing names the keys to register (and says at once when
    // the role may not list); the second, once they are registered, is
    // what later listings are compared with, so that no release between
    // the two goes unseen.
    let first = conn.list_leases(&watched).map_err(listing::failure)?;
    let mut wakeups = Wakeups::open(url)?;
    wakeups.arm(&first.leases);
    let armed = wakeups.settle();
    let baseline = conn.list_leases(&watched).map_err(listing::failure)?;
    wakeups.arm(&baseline.leases);
    let mut known: HashMap<String, Row> = baseline
        .leases
        .into_iter()
        .map(|row| (row.key.clone(), row))
        .collect();
    let started = baseline.read_at;
    out.emit(
        &format!(
            "watching {} keys ({armed} registered for release wake-ups) from {started} (server time); Ctrl-C to stop",
            known.len(),
        ),
        &Json::Object(vec![
            ("event", Json::str("watching")),
            ("at", Json::time(Some(started))),
            (
                "keys",
                Json::Int(i64::try_from(known.len()).unwrap_or(i64::MAX)),
            ),
            ("armed", Json::Int(i64::try_from(armed).unwrap_or(i64::MAX))),
        ]),
    )?;
    let mut emitted: u64 = 0;
    let mut next_listing = Instant::now() + interval;
    loop {
        let wait = next_listing.saturating_duration_since(Instant::now());
        let mut events: Vec<ReleaseEvent> = wakeups.watch.recv_timeout(wait).into_iter().collect();
        events.extend(std::iter::from_fn(|| wakeups.watch.try_recv()));
        let woke = !events.is_empty();
        for event in events {
            // A resync only asks for the listing below.
            let ReleaseEvent::Released { key } = event else {
                continue;
            };
            // Keys outside the watched set are someone else's business.
            let Some(row) = known.get(&key) else {
                continue;
            };
            if owner.is_some() && row.owner.as_deref() != owner {
                continue;
            }
            emit(out, &Event::Wake { key }, Utc::now())?;
            emitted += 1;
            if count.is_some_and(|limit| emitted >= limit) {
                return Ok(());
            }
        }
        if woke || Instant::now() >= next_listing {
            next_listing = Instant::now() + interval;
            let listing = conn.list_leases(&watched).map_err(listing::failure)?;
            wakeups.arm(&listing.leases);
            let at = listing.read_at;
            let current: HashMap<String, Row> = listing
                .leases
                .into_iter()
                .map(|row| (row.key.clone(), row))
                .collect();
            let mut keys: Vec<&String> = known.keys().chain(current.keys()).collect();
            keys.sort();
            keys.dedup();
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
                        return Ok(());
                    }
                }
            }
            known = current;
        }
    }
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
