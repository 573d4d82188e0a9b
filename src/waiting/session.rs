//! The listener's thread and its database session: connect, register the
//! keys waited for, LISTEN, and turn notifications and losses of the session
//! into wake-ups of the waiters.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::listener::{lock, Shared, LISTENER_APPLICATION_NAME};
use super::slot::Slot;
use crate::libpq::{wait_readable, Notification, PqConn};
use crate::sql::calls::listener as statements;
use crate::sql::names::RELEASE_CHANNEL;

/// How often an idle session is probed with a trivial statement.
const IDLE_PROBE: Duration = Duration::from_secs(10);
/// Reconnect back-off bounds.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Retry bounds for a registration that met an in-flight writer.
const BUSY_RETRY_MIN: Duration = Duration::from_millis(1);
const BUSY_RETRY_MAX: Duration = Duration::from_millis(100);

/// The thread: (re)connect, serve, and on loss let every waiter re-check.
pub(super) fn run(shared: &Arc<Shared>, mut wake_rx: UnixStream) {
    let mut backoff = Duration::ZERO;
    loop {
        if lock(&shared.state).shutdown {
            return;
        }
        let error = match Session::open(shared) {
            Ok(mut session) => {
                backoff = Duration::ZERO;
                match session.serve(shared, &mut wake_rx) {
                    Ok(()) => return,
                    Err(error) => error,
                }
            }
            Err(error) => error,
        };
        {
            let mut state = lock(&shared.state);
            state.status.connected = false;
            state.status.backend_pid = None;
            state.status.last_error = Some(error);
            shared.status_changed.notify_all();
        }
        // Whatever was registered went with the session: waiters re-check
        // now and poll until the next session is up.
        shared.bump_all(Some(false));
        if wait_readable(&[wake_rx.as_raw_fd()], Some(backoff)).is_err() {
            return;
        }
        drain(&mut wake_rx);
        backoff = (backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
    }
}

fn drain(stream: &mut UnixStream) {
    let mut buf = [0u8; 64];
    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
}

/// One database session of the listener.
struct Session {
    conn: PqConn,
    /// Keys registered in this session.
    registered: HashSet<String>,
    /// Keys whose registration met an in-flight writer: retry at the time
    /// given, with the back-off after it.
    busy: HashMap<String, (Instant, Duration)>,
}

impl Session {
    /// Connects, prunes stale registrations, registers every key waited
    /// for, then listens; marks the listener connected and lets every
    /// waiter re-check (a release may have passed unnoticed meanwhile).
    fn open(shared: &Arc<Shared>) -> Result<Session, String> {
        let conn = PqConn::connect(&shared.url, LISTENER_APPLICATION_NAME)?;
        let mut session = Session {
            conn,
            registered: HashSet::new(),
            busy: HashMap::new(),
        };
        // Never wait long on a lock: the listener serves every waiter.
        session
            .conn
            .query("SET lock_timeout = '5s'", &[])
            .map_err(|e| format!("listener setup failed: {e}"))?;
        session.conn.query(statements::RESET, &[]).map_err(|e| {
            format!("listener setup failed: {e}; has leasehold::install run on this database?")
        })?;
        {
            let mut state = lock(&shared.state);
            let keys: Vec<String> = state
                .keys
                .iter()
                .filter(|(_, e)| e.refs > 0)
                .map(|(k, _)| k.clone())
                .collect();
            state.dirty.extend(keys);
        }
        session.reconcile(shared, false)?;
        session
            .conn
            .query(&format!("LISTEN {RELEASE_CHANNEL}"), &[])
            .map_err(|e| format!("LISTEN failed: {e}"))?;
        {
            let mut state = lock(&shared.state);
            state.status.connected = true;
            state.status.backend_pid = Some(session.conn.backend_pid());
            state.status.sessions += 1;
            shared.status_changed.notify_all();
        }
        // Slots of cleanly registered keys become armed.
        let slots: Vec<(String, Arc<Slot>)> = lock(&shared.state)
            .keys
            .iter()
            .map(|(k, e)| (k.clone(), e.slot.clone()))
            .collect();
        for (key, slot) in slots {
            let clean = session.registered.contains(&key) && !session.busy.contains_key(&key);
            slot.bump(Some(clean));
        }
        Ok(session)
    }

    /// Serves until shutdown (`Ok`) or loss of the session (`Err`).
    fn serve(&mut self, shared: &Arc<Shared>, wake_rx: &mut UnixStream) -> Result<(), String> {
        let socket = self.conn.socket();
        if socket < 0 {
            return Err("the listener session has no socket".to_owned());
        }
        loop {
            // Registrations first: notifications that arrive while their
            // statements run are buffered by libpq, invisible to poll(2),
            // and must be taken right after.
            self.reconcile(shared, true)?;
            let notifications = self.conn.take_notifications();
            dispatch(shared, &notifications);
            if lock(&shared.state).shutdown {
                // Withdraw this session's registrations so releases stop
                // notifying for us; failure only leaves rows to prune.
                let _ = self.conn.query(statements::RESET, &[]);
                return Ok(());
            }
            let now = Instant::now();
            let next_busy = self.busy.values().map(|(at, _)| *at).min();
            let timeout = match next_busy {
                Some(at) => at.saturating_duration_since(now),
                None => IDLE_PROBE,
            };
            let ready = wait_readable(&[socket, wake_rx.as_raw_fd()], Some(timeout))?;
            let socket_ready = ready.first().copied().unwrap_or(false);
            let wake_ready = ready.get(1).copied().unwrap_or(false);
            if socket_ready {
                self.conn
                    .consume_input()
                    .map_err(|e| format!("listener connection lost: {e}"))?;
            }
            if wake_ready {
                drain(wake_rx);
            }
            if !socket_ready && !wake_ready {
                if self.busy.is_empty() {
                    self.conn
                        .query(statements::PROBE, &[])
                        .map_err(|e| format!("listener connection lost: {e}"))?;
                } else {
                    let due: Vec<String> = self
                        .busy
                        .iter()
                        .filter(|(_, (at, _))| *at <= Instant::now())
                        .map(|(k, _)| k.clone())
                        .collect();
                    lock(&shared.state).dirty.extend(due);
                }
            }
        }
    }

    /// Brings the registrations of dirty keys in line with the waiters:
    /// watch keys waited for, unwatch keys nobody waits for any more.
    /// `bump` wakes a key's waiters when its registration completes cleanly.
    fn reconcile(&mut self, shared: &Arc<Shared>, bump: bool) -> Result<(), String> {
        let work: Vec<(String, bool)> = {
            let mut state = lock(&shared.state);
            let dirty: Vec<String> = state.dirty.drain().collect();
            dirty
                .into_iter()
                .map(|key| {
                    let wanted = state.keys.get(&key).is_some_and(|e| e.refs > 0);
                    (key, wanted)
                })
                .collect()
        };
        for (key, wanted) in work {
            if wanted {
                let rows = self
                    .conn
                    .query(statements::WATCH, &[&key])
                    .map_err(|e| format!("registering a waiter failed: {e}"))?;
                let clean = rows
                    .first()
                    .and_then(|r| r.first())
                    .is_some_and(|v| v.as_deref() == Some("true"));
                self.registered.insert(key.clone());
                if clean {
                    self.busy.remove(&key);
                    if bump {
                        if let Some(slot) = shared.slot_of(&key) {
                            slot.bump(Some(true));
                        }
                    }
                } else {
                    let backoff = self
                        .busy
                        .get(&key)
                        .map_or(BUSY_RETRY_MIN, |(_, b)| (*b * 2).min(BUSY_RETRY_MAX));
                    self.busy.insert(key, (Instant::now() + backoff, backoff));
                }
            } else {
                self.busy.remove(&key);
                if self.registered.remove(&key) {
                    self.conn
                        .query(statements::UNWATCH, &[&key])
                        .map_err(|e| format!("withdrawing a waiter failed: {e}"))?;
                }
                let mut state = lock(&shared.state);
                if state.keys.get(&key).is_some_and(|e| e.refs == 0) {
                    state.keys.remove(&key);
                }
            }
        }
        Ok(())
    }
}

/// Wakes the waiters of the keys named in `notifications`.
fn dispatch(shared: &Shared, notifications: &[Notification]) {
    for notification in notifications {
        if notification.channel != RELEASE_CHANNEL {
            continue;
        }
        if notification.payload.is_empty() {
            shared.bump_all(None);
        } else if let Some(slot) = shared.slot_of(&notification.payload) {
            slot.bump(None);
        }
    }
}
