//! The listener's thread and session: connect, register, LISTEN, and turn
//! notifications and session losses into waiter wake-ups.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::{
    lock, Delivery, PollingReason, Registration, Shared, LISTENER_APPLICATION_NAME,
    UNDELIVERED_RETRY,
};
use super::slot::Slot;
use crate::libpq::{wait_readable, Notification, PqConn, PqError};
use crate::sql::calls::listener as statements;
use crate::sql::names::{GRANT_CHANNEL, NAMESPACE_DENIED, RELEASE_CHANNEL, WAITER_LIMIT};
use crate::telemetry;

/// How often an idle session is probed with a trivial statement.
const IDLE_PROBE: Duration = Duration::from_secs(10);
/// Reconnect back-off bounds.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Why a session was refused or left: its server accepts only reads.
const READ_ONLY: &str = "the listener's server is read-only (a standby, or a primary being demoted); reconnecting to find a writable one";
/// SQLSTATE read_only_sql_transaction: the server, not the key, refused.
const READ_ONLY_SQLSTATE: &str = "25006";
/// How long the delivery check waits; it only bounds a notification that never comes.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The delivery check's sender's `application_name`, so listener session counts stay exact.
const DELIVERY_CHECK_APPLICATION_NAME: &str = "leasehold listener check";
/// Why a session was left: notifications do not reach it.
const UNDELIVERED: &str = "LISTEN appeared to succeed, but a notification sent from another session never reached the listener's session: its URL goes through a connection pooler in transaction mode (PgBouncer pool_mode=transaction), which hands the server session that ran LISTEN to other clients; give LeaseWaiter a direct or session-mode URL to listen on. Waiters poll meanwhile";
/// Distinguishes the delivery checks of one process.
static DELIVERY_CHECKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
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
        let mut undelivered = false;
        let error = match Session::open(shared) {
            Ok(mut session) => {
                backoff = Duration::ZERO;
                match telemetry::listener_ended(session.serve(shared, &mut wake_rx)) {
                    Ok(()) => return,
                    Err(error) => error,
                }
            }
            Err(OpenError::Undelivered) => {
                undelivered = true;
                UNDELIVERED.to_owned()
            }
            Err(OpenError::Other(error)) => error,
        };
        {
            let mut state = lock(&shared.state);
            let was_up = state.status.connected;
            state.status.connected = false;
            state.status.backend_pid = None;
            state.status.last_error = Some(error);
            state.status.undelivered = undelivered;
            // Registrations went with the session; refused keys get one retry in the next.
            for entry in state.keys.values_mut() {
                entry.registration = Registration::Pending;
            }
            // Release watches re-read: releases may pass unnoticed until a session is up.
            // Told once, when a session that was up is lost.
            if was_up {
                state.deliver(&Delivery::Resync);
            }
            shared.status_changed.notify_all();
        }
        // Waiters re-check now and poll until the next session is up.
        shared.bump_all(Some(false));
        if undelivered {
            // A misconfiguration, not an outage: retrying at once would repeat the check.
            let until = Instant::now() + UNDELIVERED_RETRY;
            loop {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                if wait_readable(&[wake_rx.as_raw_fd()], Some(until - now)).is_err() {
                    return;
                }
                drain(&mut wake_rx);
                if lock(&shared.state).shutdown {
                    return;
                }
            }
            continue;
        }
        if wait_readable(&[wake_rx.as_raw_fd()], Some(backoff)).is_err() {
            return;
        }
        drain(&mut wake_rx);
        backoff = (backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
    }
}

/// Why a session could not be opened.
enum OpenError {
    /// Notifications do not reach the session (a transaction-mode pooler).
    Undelivered,
    /// Anything else, as text for [`super::ListenerStatus::last_error`].
    Other(String),
}

impl From<String> for OpenError {
    fn from(error: String) -> Self {
        OpenError::Other(error)
    }
}

fn drain(stream: &mut UnixStream) {
    let mut buf = [0u8; 64];
    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
}

/// One database session of the listener.
struct Session {
    conn: PqConn,
    /// Keys registered in this session, with their digests (hex).
    registered: HashMap<String, String>,
    /// The keys of `registered` by digest: notifications carry the digest only.
    by_digest: HashMap<String, String>,
    /// Keys whose registration met an in-flight writer: retry time and back-off.
    busy: HashMap<String, (Instant, Duration)>,
}

impl Session {
    /// Connects, prunes stale registrations, registers, listens; then every waiter
    /// re-checks (a release may have passed unnoticed).
    fn open(shared: &Arc<Shared>) -> Result<Session, OpenError> {
        let conn = PqConn::connect(&shared.url, LISTENER_APPLICATION_NAME)?;
        // A read-only server refuses registrations and commits no releases: leave it, and
        // the retry connects anew (target_session_attrs=read-write avoids it).
        if conn.server_read_only() {
            return Err(READ_ONLY.to_owned().into());
        }
        let mut session = Session {
            conn,
            registered: HashMap::new(),
            by_digest: HashMap::new(),
            busy: HashMap::new(),
        };
        // Never wait long on a lock: the listener serves every waiter.
        session
            .conn
            .query("SET lock_timeout = '5s'", &[])
            .map_err(|e| format!("listener setup failed: {e}"))?;
        session.conn.query(statements::RESET, &[]).map_err(|e| {
            if e.sqlstate.as_deref() == Some(READ_ONLY_SQLSTATE) {
                return READ_ONLY.to_owned();
            }
            format!("listener setup failed: {e}; has leasehold::install run on this database?")
        })?;
        session.check_delivery(shared)?;
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
            .query(statements::LISTEN_RELEASES, &[])
            .and_then(|_| session.conn.query(statements::LISTEN_GRANTS, &[]))
            .map_err(|e| format!("LISTEN failed: {e}"))?;
        // Reported before anyone can see the status say so.
        telemetry::listener_up(session.conn.backend_pid());
        {
            let mut state = lock(&shared.state);
            state.status.undelivered = false;
            state.status.connected = true;
            state.status.backend_pid = Some(session.conn.backend_pid());
            state.status.sessions += 1;
            // A change may have passed unnoticed before LISTEN: watches re-read.
            state.deliver(&Delivery::Resync);
            shared.status_changed.notify_all();
        }
        // Slots of registered keys become armed.
        let slots: Vec<(Arc<Slot>, bool)> = lock(&shared.state)
            .keys
            .values()
            .map(|e| (e.slot.clone(), e.registration == Registration::Registered))
            .collect();
        for (slot, registered) in slots {
            slot.bump(Some(registered));
        }
        Ok(session)
    }

    /// Checks that notifications reach this session (LISTEN, NOTIFY from a second
    /// session, wait up to [`DELIVERY_TIMEOUT`]): through a transaction-mode pooler
    /// LISTEN ran on a server session that serves others, so it never does.
    fn check_delivery(&mut self, shared: &Shared) -> Result<(), OpenError> {
        let payload = format!(
            "{}-{}",
            std::process::id(),
            DELIVERY_CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        self.conn
            .query(statements::LISTEN_DELIVERY, &[])
            .map_err(|e| format!("LISTEN failed: {e}"))?;
        {
            let mut sender = PqConn::connect(&shared.url, DELIVERY_CHECK_APPLICATION_NAME)
                .map_err(|e| format!("the listener's delivery check could not connect: {e}"))?;
            sender
                .query(statements::SEND_DELIVERY, &[payload.as_str()])
                .map_err(|e| format!("the listener's delivery check could not notify: {e}"))?;
        }
        let socket = self.conn.socket();
        let deadline = Instant::now() + DELIVERY_TIMEOUT;
        loop {
            // Release notifications taken here are dropped: every waiter re-checks after.
            let arrived = self
                .conn
                .take_notifications()
                .iter()
                .any(|n| n.channel == statements::DELIVERY_CHANNEL && n.payload == payload);
            if arrived {
                break;
            }
            let now = Instant::now();
            if now >= deadline || socket < 0 {
                return Err(OpenError::Undelivered);
            }
            let ready = wait_readable(&[socket], Some(deadline - now))?;
            if ready.first().copied().unwrap_or(false) {
                self.conn
                    .consume_input()
                    .map_err(|e| format!("listener connection lost: {e}"))?;
            }
        }
        self.conn
            .query(statements::UNLISTEN_DELIVERY, &[])
            .map_err(|e| format!("UNLISTEN failed: {e}"))?;
        Ok(())
    }

    /// Serves until shutdown (`Ok`) or loss of the session (`Err`).
    fn serve(&mut self, shared: &Arc<Shared>, wake_rx: &mut UnixStream) -> Result<(), String> {
        let socket = self.conn.socket();
        if socket < 0 {
            return Err("the listener session has no socket".to_owned());
        }
        loop {
            // Registrations first: notifications arriving meanwhile are buffered by libpq,
            // invisible to poll(2), and must be taken right after.
            self.reconcile(shared, true)?;
            let notifications = self.conn.take_notifications();
            self.dispatch(shared, &notifications);
            if lock(&shared.state).shutdown {
                // Withdraw registrations so releases stop notifying us; failure leaves rows to prune.
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
                    // A server turned read-only commits no releases: leave it for the new primary.
                    // The probe is what makes an idle session report a reloaded setting.
                    if self.conn.server_read_only() {
                        return Err(READ_ONLY.to_owned());
                    }
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

    /// Brings dirty keys' registrations in line with the waiters; `bump` wakes a key's
    /// waiters when registered. `Err` only on a lost session: a refusal is the key's state.
    fn reconcile(&mut self, shared: &Arc<Shared>, bump: bool) -> Result<(), String> {
        let work: Vec<(String, bool)> = {
            let mut state = lock(&shared.state);
            let dirty: Vec<String> = state.dirty.drain().collect();
            dirty
                .into_iter()
                .map(|key| {
                    let wanted = state.keys.get(&key).is_some_and(|e| {
                        e.refs > 0 && !matches!(e.registration, Registration::Refused(_))
                    });
                    (key, wanted)
                })
                .collect()
        };
        for (key, wanted) in work {
            if wanted {
                if self.registered.contains_key(&key) {
                    // Still registered (its waiters left and came back meanwhile).
                    continue;
                }
                match self.conn.query(statements::WATCH, &[&key]) {
                    Ok(rows) => {
                        let digest = rows.into_iter().next().and_then(|r| r.into_iter().next());
                        match digest.flatten() {
                            Some(digest) => self.registered_now(shared, &key, digest, bump),
                            None => self.busy_now(shared, key),
                        }
                    }
                    Err(error) => {
                        let reason = refusal(&error, self.conn.is_ok())
                            .ok_or_else(|| format!("registering a waiter failed: {error}"))?;
                        self.busy.remove(&key);
                        let mut state = lock(&shared.state);
                        state.status.failed_registrations += 1;
                        state.status.last_refusal = Some(reason.clone());
                        state.set_registration(&key, Registration::Refused(reason));
                        shared.status_changed.notify_all();
                    }
                }
            } else {
                self.busy.remove(&key);
                if let Some(digest) = self.registered.remove(&key) {
                    self.by_digest.remove(&digest);
                    if let Err(error) = self.conn.query(statements::UNWATCH, &[&key]) {
                        // A refused withdrawal costs unneeded notifications until the next reset.
                        if refusal(&error, self.conn.is_ok()).is_none() {
                            return Err(format!("withdrawing a waiter failed: {error}"));
                        }
                    }
                }
                let mut state = lock(&shared.state);
                if state.keys.get(&key).is_some_and(|e| e.refs == 0) {
                    state.keys.remove(&key);
                }
            }
        }
        Ok(())
    }

    fn registered_now(&mut self, shared: &Arc<Shared>, key: &str, digest: String, bump: bool) {
        self.busy.remove(key);
        self.by_digest.insert(digest.clone(), key.to_owned());
        self.registered.insert(key.to_owned(), digest);
        let slot = {
            let mut state = lock(&shared.state);
            state.set_registration(key, Registration::Registered);
            shared.status_changed.notify_all();
            state.keys.get(key).map(|e| e.slot.clone())
        };
        if bump {
            if let Some(slot) = slot {
                slot.bump(Some(true));
            }
        }
    }

    fn busy_now(&mut self, shared: &Arc<Shared>, key: String) {
        let backoff = self
            .busy
            .get(&key)
            .map_or(BUSY_RETRY_MIN, |(_, b)| (*b * 2).min(BUSY_RETRY_MAX));
        lock(&shared.state).set_registration(&key, Registration::Busy);
        self.busy.insert(key, (Instant::now() + backoff, backoff));
    }

    /// Wakes the waiters and watches of the keys whose digests `notifications`
    /// carry: a release wakes both, a grant only the watches that asked for grants.
    fn dispatch(&self, shared: &Shared, notifications: &[Notification]) {
        for notification in notifications {
            let released = notification.channel == RELEASE_CHANNEL;
            if !released && notification.channel != GRANT_CHANNEL {
                continue;
            }
            let key = self.by_digest.get(&notification.payload);
            let mut state = lock(&shared.state);
            let slot = key.and_then(|key| state.keys.get(key).map(|e| e.slot.clone()));
            match (key, slot) {
                (Some(key), Some(_)) if !released => {
                    state.deliver(&Delivery::Granted(key.clone()));
                }
                (Some(key), Some(slot)) => {
                    state.status.notification_wakeups += 1;
                    state.deliver(&Delivery::Released(key.clone()));
                    drop(state);
                    slot.bump(None);
                }
                _ => state.status.unmatched_notifications += 1,
            }
        }
    }
}

/// Whether a failed registration was refused (and why), or the session was lost (`None`).
fn refusal(error: &PqError, connection_ok: bool) -> Option<PollingReason> {
    if error.sqlstate.is_none() && !connection_ok {
        return None;
    }
    // A read-only server refuses every key: treat the session as lost and reconnect.
    if error.sqlstate.as_deref() == Some(READ_ONLY_SQLSTATE) {
        return None;
    }
    let sqlstate = error.sqlstate.clone().unwrap_or_default();
    Some(match error.constraint.as_deref() {
        Some(WAITER_LIMIT) => PollingReason::WaiterLimit,
        Some(NAMESPACE_DENIED) => PollingReason::NamespaceDenied,
        _ => PollingReason::RegistrationFailed {
            sqlstate,
            message: error.message.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(sqlstate: Option<&str>, constraint: Option<&str>) -> PqError {
        PqError {
            message: "m".to_owned(),
            sqlstate: sqlstate.map(str::to_owned),
            constraint: constraint.map(str::to_owned),
        }
    }

    #[test]
    fn refusals_are_told_from_lost_sessions_and_classified() {
        assert_eq!(
            refusal(&error(Some("22023"), Some(WAITER_LIMIT)), true),
            Some(PollingReason::WaiterLimit)
        );
        assert_eq!(
            refusal(&error(Some("42501"), Some(NAMESPACE_DENIED)), true),
            Some(PollingReason::NamespaceDenied)
        );
        assert_eq!(
            refusal(&error(Some("42501"), None), true),
            Some(PollingReason::RegistrationFailed {
                sqlstate: "42501".to_owned(),
                message: "m".to_owned()
            })
        );
        // No answer on a dead connection: the session is lost, not the key refused.
        assert_eq!(refusal(&error(None, None), false), None);
        // A read-only server refuses every key: the session is left.
        assert_eq!(refusal(&error(Some("25006"), None), true), None);
    }
}
