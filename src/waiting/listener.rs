//! The per-process listener that turns `lease.release` notifications into
//! wake-ups of blocked waiters.
//!
//! One background thread per database URL owns one dedicated session
//! (`crate::libpq::PqConn`) that runs `LISTEN lease_released` and registers,
//! in `lease.waiters`, every key some waiter of this process waits for (one
//! row per key, however many waiters share it). A release notifies only
//! when a registration for its key exists, and the payload is the key's
//! digest (hex SHA-256), never its name: every session that listens on the
//! channel receives it. The server answers each registration with that
//! digest, and the session maps digests back to the keys it registered, so
//! the client never computes a digest itself (it could not differ from the
//! trigger's, and needs no hashing crate).
//!
//! Waiters block on a per-key [`Slot`]: a sequence number that moves whenever
//! the waiter should look at the key again, plus a condvar. It moves when
//!
//! - a notification carries the key's digest (a forged one only costs a
//!   re-check: the attempt is an ordinary `lease.acquire`);
//! - the key's registration completed (a release that raced with the
//!   registration is then visible to the next attempt, see
//!   `lease._waiter_watch`);
//! - the session was lost or re-established: notifications may have been
//!   missed, so every waiter re-checks.
//!
//! A waiter relies on notifications only while its key is *armed*
//! (registered in the current session before its last attempt); otherwise
//! it polls every `fallback_poll`. Keys are not armed while the session is
//! down, while a registration keeps meeting a release in flight, and when
//! the server refused the registration (the session's registration cap,
//! a key namespace of another role, `EXECUTE` on `lease._waiter_watch`
//! revoked, ...). A refused key is not retried while it has waiters, so a
//! permanent refusal costs one call per wait, not a loop. [`ListenerStatus`]
//! says which of these applies ([`WakeMode`]) and counts refusals and
//! notification wake-ups, so a degraded listener is visible.
//!
//! Each session first checks that notifications reach it: a notification
//! sent from a second, short-lived session must arrive. Through a
//! transaction-mode pooler it never does (`LISTEN` ran on a server session
//! that went back to the pool), and the listener reports
//! [`PollingReason::NotificationsNotDelivered`] instead of waiting for
//! notifications that cannot come.
//!
//! The thread sleeps in `poll(2)` on the session's socket and on a wake-up
//! socket pair that waiters write to when they need a registration, so it
//! reacts within microseconds and spends no CPU while idle. An idle session
//! is probed every few seconds so a silently dead connection is noticed.
//!
//! A [`ReleaseWatch`](super::ReleaseWatch) (`releases.rs`) watches keys
//! through the same registrations, as a waiter does, and gets its wake-ups
//! as a queue of events instead of a slot: the key of each release
//! notification of a key it watches, and a resync whenever the session was
//! lost or (re)established, since notifications may have been missed then.
//!
//! This module keeps the shared state (keys, slots, release watches,
//! status); `session.rs` runs the thread and its database session;
//! `slot.rs` is what waiters block on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::session::run;
use super::slot::Slot;

/// How often a listener whose notifications were not delivered (see
/// [`PollingReason::NotificationsNotDelivered`]) tries a new session.
pub const UNDELIVERED_RETRY: Duration = Duration::from_secs(30);

/// `application_name` of listener sessions, to find them in pg_stat_activity.
pub const LISTENER_APPLICATION_NAME: &str = "leasehold listener";

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the listener is doing, for monitoring and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerStatus {
    /// The session is up and listening.
    pub connected: bool,
    /// The session's server process id while connected.
    pub backend_pid: Option<i32>,
    /// How many sessions were established so far (1 after the first
    /// connect; more after reconnects).
    pub sessions: u64,
    /// The last connection or query error, if any.
    pub last_error: Option<String>,
    /// How the waiters of this process are woken right now.
    pub wake_mode: WakeMode,
    /// Keys waited for whose waiters poll instead of being notified (all of
    /// them while disconnected).
    pub polled_keys: usize,
    /// Registrations the server refused since the listener started (each
    /// one left a key polled for the rest of its waits).
    pub failed_registrations: u64,
    /// Release notifications that carried the digest of a key waited for
    /// or watched ([`crate::wait::LeaseWaiter::watch_releases`]), and so
    /// woke that key's waiters and watches.
    pub notification_wakeups: u64,
    /// Notifications on the release channel that matched no key waited for
    /// (releases other processes wait for, late ones, or forged ones).
    pub unmatched_notifications: u64,
}

/// How waiters are woken (see [`ListenerStatus::wake_mode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WakeMode {
    /// Every key waited for is registered (or none is waited for): a
    /// release wakes its waiters by notification.
    Notifications,
    /// Some or all waiters poll every
    /// [`crate::wait::LeaseWaiterBuilder::fallback_poll`] (and still wake at the
    /// holder's expiry). Waiting works; it is slower and costs a query per
    /// poll.
    Polling(PollingReason),
}

/// Why waiters poll instead of being notified (see [`WakeMode::Polling`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PollingReason {
    /// The listener session is down (see [`ListenerStatus::last_error`]);
    /// it reconnects on its own.
    Disconnected,
    /// A release of the key was in flight at each registration attempt
    /// (or a session holds the key's advisory lock); the listener keeps
    /// retrying.
    RegistrationBusy,
    /// The listener session holds [`crate::wait::WAITER_LIMIT`] registrations
    /// already (SQLSTATE 22023, constraint `lease_waiter_limit`).
    WaiterLimit,
    /// The key's namespace is bound to a role the application's role is
    /// not a member of (SQLSTATE 42501, constraint `lease_namespace_denied`);
    /// the waiter's own acquire is refused as well.
    NamespaceDenied,
    /// The listener's session does not receive notifications: a
    /// notification sent from another session at its start never arrived
    /// (see [`crate::wait::LeaseWaiter::ensure_listening`]). This is what a
    /// listen URL through a transaction-mode pooler (PgBouncer
    /// `pool_mode = transaction`) does: `LISTEN` appears to succeed, but
    /// the server session that ran it goes back to the pool. Give the
    /// waiter a direct or session-mode URL to listen on; the listener
    /// retries every [`UNDELIVERED_RETRY`] meanwhile.
    NotificationsNotDelivered,
    /// The server refused the registration otherwise, for example because
    /// `EXECUTE` on `lease._waiter_watch` was revoked from the role.
    RegistrationFailed {
        /// The error's SQLSTATE.
        sqlstate: String,
        /// The server's message.
        message: String,
    },
}

/// Where a key's registration stands in the current session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Registration {
    /// Not registered yet: the thread is on it.
    Pending,
    /// Registered: a release of the key notifies.
    Registered,
    /// The last attempt met a release in flight; retried with back-off.
    Busy,
    /// The server refused it; polled while the key has waiters.
    Refused(PollingReason),
}

pub(super) struct KeyEntry {
    /// Live [`Watch`] guards for the key.
    pub(super) refs: usize,
    pub(super) slot: Arc<Slot>,
    pub(super) registration: Registration,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) keys: HashMap<String, KeyEntry>,
    /// Keys whose registration must be (re)considered by the thread.
    pub(super) dirty: HashSet<String>,
    /// The queues of the release watches; a dropped watch's entry goes at
    /// the next delivery.
    pub(super) subscriptions: Vec<Weak<Subscription>>,
    pub(super) status: Status,
    pub(super) shutdown: bool,
}

/// What a release watch is told (see [`super::ReleaseEvent`], its public
/// form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Delivery {
    /// A release notification carried this key's digest.
    Released(String),
    /// The session was lost or (re)established.
    Resync,
}

/// The queue of one release watch, filled by the listener's thread (under
/// the state's lock: the lock order is state, then subscription) and
/// emptied by the watch.
#[derive(Default)]
pub(super) struct Subscription {
    pub(super) state: Mutex<SubscriptionState>,
    pub(super) changed: Condvar,
    /// The async face's watches wait here instead of on the condvar: every
    /// delivery notifies both.
    #[cfg(feature = "async")]
    pub(super) tasks: tokio::sync::Notify,
}

#[derive(Default)]
pub(super) struct SubscriptionState {
    /// The keys whose releases this watch is told of.
    pub(super) keys: HashSet<String>,
    /// Undelivered events, oldest first. A key is queued at most once (a
    /// key released twice before the watch reads it is one event), and so
    /// is a resync, so the queue never holds more than the keys and one.
    pub(super) queue: VecDeque<Delivery>,
    /// The keys queued now.
    pub(super) queued: HashSet<String>,
    /// A resync is queued now.
    pub(super) resync_queued: bool,
}

impl Subscription {
    fn deliver(&self, delivery: &Delivery) {
        let mut state = lock(&self.state);
        match delivery {
            Delivery::Released(key) => {
                if !state.keys.contains(key) || !state.queued.insert(key.clone()) {
                    return;
                }
            }
            Delivery::Resync => {
                if state.resync_queued {
                    return;
                }
                state.resync_queued = true;
            }
        }
        state.queue.push_back(delivery.clone());
        self.changed.notify_all();
        #[cfg(feature = "async")]
        self.tasks.notify_waiters();
    }

    /// The oldest undelivered event, waiting for one as long as it takes,
    /// from a task.
    #[cfg(feature = "async")]
    pub(super) async fn next_async(&self) -> Delivery {
        loop {
            let notified = self.tasks.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the queue is read, so a delivery in
            // between is not missed.
            notified.as_mut().enable();
            if let Some(delivery) = self.next(Some(Instant::now())) {
                return delivery;
            }
            notified.await;
        }
    }

    /// The oldest undelivered event, waiting for one until `until` (`None`:
    /// as long as it takes); `None` when none came in time.
    pub(super) fn next(&self, until: Option<Instant>) -> Option<Delivery> {
        let mut state = lock(&self.state);
        loop {
            if let Some(delivery) = state.queue.pop_front() {
                match &delivery {
                    Delivery::Released(key) => {
                        state.queued.remove(key);
                    }
                    Delivery::Resync => state.resync_queued = false,
                }
                return Some(delivery);
            }
            state = match until {
                None => self
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(until) => {
                    let now = Instant::now();
                    if now >= until {
                        return None;
                    }
                    self.changed
                        .wait_timeout(state, until - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

#[derive(Default)]
pub(super) struct Status {
    pub(super) connected: bool,
    pub(super) backend_pid: Option<i32>,
    pub(super) sessions: u64,
    pub(super) last_error: Option<String>,
    /// The last session failed its delivery check (cleared when one is up).
    pub(super) undelivered: bool,
    pub(super) failed_registrations: u64,
    pub(super) notification_wakeups: u64,
    pub(super) unmatched_notifications: u64,
    /// The reason of the most recent refusal, reported while some key is
    /// refused.
    pub(super) last_refusal: Option<PollingReason>,
}

impl State {
    pub(super) fn set_registration(&mut self, key: &str, registration: Registration) {
        if let Some(entry) = self.keys.get_mut(key) {
            entry.registration = registration;
        }
    }

    /// Tells every release watch of `delivery` (only those watching the
    /// key, for a release).
    pub(super) fn deliver(&mut self, delivery: &Delivery) {
        self.subscriptions
            .retain(|subscription| match subscription.upgrade() {
                Some(subscription) => {
                    subscription.deliver(delivery);
                    true
                }
                None => false,
            });
    }

    /// Whether `key` is registered in a session that is up and listening:
    /// a release of it committed from now on notifies.
    fn armed(&self, key: &str) -> bool {
        self.status.connected
            && self
                .keys
                .get(key)
                .is_some_and(|entry| entry.registration == Registration::Registered)
    }

    /// Whether `key`'s registration is done one way or the other in a
    /// session that is up: registered, or refused by the server.
    fn settled(&self, key: &str) -> bool {
        self.status.connected
            && self.keys.get(key).is_some_and(|entry| {
                matches!(
                    entry.registration,
                    Registration::Registered | Registration::Refused(_)
                )
            })
    }

    fn public_status(&self) -> ListenerStatus {
        let waited = self.keys.values().filter(|e| e.refs > 0);
        let (mut refused, mut busy, mut total) = (0usize, 0usize, 0usize);
        for entry in waited {
            total += 1;
            match entry.registration {
                Registration::Refused(_) => refused += 1,
                Registration::Busy => busy += 1,
                Registration::Pending | Registration::Registered => {}
            }
        }
        let (wake_mode, polled_keys) = if !self.status.connected {
            let reason = if self.status.undelivered {
                PollingReason::NotificationsNotDelivered
            } else {
                PollingReason::Disconnected
            };
            (WakeMode::Polling(reason), total)
        } else if refused > 0 {
            let reason = self.status.last_refusal.clone().unwrap_or_else(|| {
                PollingReason::RegistrationFailed {
                    sqlstate: String::new(),
                    message: "refused".to_owned(),
                }
            });
            (WakeMode::Polling(reason), refused + busy)
        } else if busy > 0 {
            (WakeMode::Polling(PollingReason::RegistrationBusy), busy)
        } else {
            (WakeMode::Notifications, 0)
        };
        ListenerStatus {
            connected: self.status.connected,
            backend_pid: self.status.backend_pid,
            sessions: self.status.sessions,
            last_error: self.status.last_error.clone(),
            wake_mode,
            polled_keys,
            failed_registrations: self.status.failed_registrations,
            notification_wakeups: self.status.notification_wakeups,
            unmatched_notifications: self.status.unmatched_notifications,
        }
    }
}

pub(super) struct Shared {
    pub(super) url: String,
    pub(super) state: Mutex<State>,
    pub(super) status_changed: Condvar,
    /// Write end of the thread's wake-up socket pair (`None` when it could
    /// not be created: then there is no thread either).
    wake_tx: Mutex<Option<UnixStream>>,
}

impl Shared {
    pub(super) fn poke(&self) {
        // A full buffer already guarantees a wake-up; other errors mean the
        // thread is gone, which shutdown handles.
        if let Some(tx) = lock(&self.wake_tx).as_mut() {
            let _ = tx.write(&[1]);
        }
    }

    pub(super) fn bump_all(&self, armed: Option<bool>) {
        let slots: Vec<Arc<Slot>> = lock(&self.state)
            .keys
            .values()
            .map(|e| e.slot.clone())
            .collect();
        for slot in slots {
            slot.bump(armed);
        }
    }

    pub(super) fn slot_of(&self, key: &str) -> Option<Arc<Slot>> {
        lock(&self.state).keys.get(key).map(|e| e.slot.clone())
    }
}

/// A handle on the process's listener for one database URL. The thread
/// stops when the last handle drops.
pub(crate) struct Listener {
    shared: Arc<Shared>,
}

/// Interest in one key's releases; withdrawn on drop.
pub(crate) struct Watch {
    shared: Arc<Shared>,
    key: String,
    slot: Arc<Slot>,
}

impl Watch {
    pub(crate) fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let poke = {
            let mut state = lock(&self.shared.state);
            let last = match state.keys.get_mut(&self.key) {
                Some(entry) => {
                    entry.refs = entry.refs.saturating_sub(1);
                    entry.refs == 0
                }
                None => false,
            };
            if last {
                state.dirty.insert(self.key.clone());
            }
            last
        };
        if poke {
            self.shared.poke();
        }
    }
}

impl Listener {
    /// The listener of this process for `url`, started on first use.
    pub(crate) fn for_url(url: &str) -> Arc<Listener> {
        static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<Listener>>>> = OnceLock::new();
        let registry = REGISTRY.get_or_init(Default::default);
        let mut listeners = lock(registry);
        listeners.retain(|_, l| l.strong_count() > 0);
        if let Some(listener) = listeners.get(url).and_then(Weak::upgrade) {
            return listener;
        }
        let listener = Arc::new(Listener::start(url));
        listeners.insert(url.to_owned(), Arc::downgrade(&listener));
        listener
    }

    fn start(url: &str) -> Listener {
        let pair = UnixStream::pair().and_then(|(tx, rx)| {
            tx.set_nonblocking(true)?;
            rx.set_nonblocking(true)?;
            Ok((tx, rx))
        });
        let (tx, rx, error) = match pair {
            Ok((tx, rx)) => (Some(tx), Some(rx), None),
            Err(error) => (
                None,
                None,
                Some(format!(
                    "cannot create the listener's wake-up socket: {error}"
                )),
            ),
        };
        let shared = Arc::new(Shared {
            url: url.to_owned(),
            state: Mutex::new(State::default()),
            status_changed: Condvar::new(),
            wake_tx: Mutex::new(tx),
        });
        lock(&shared.state).status.last_error = error;
        // Without a wake-up channel or a thread, waiters run in fallback
        // polling and the status says why.
        if let Some(rx) = rx {
            let for_thread = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("leasehold-listener".to_owned())
                .spawn(move || run(&for_thread, rx));
            if let Err(error) = spawned {
                lock(&shared.state).status.last_error =
                    Some(format!("cannot start the listener thread: {error}"));
            }
        }
        Listener { shared }
    }

    /// Registers interest in `key`; the first watch of a key asks the
    /// thread to register it in the database.
    pub(crate) fn watch(&self, key: &str) -> Watch {
        let (slot, first) = {
            let mut state = lock(&self.shared.state);
            let entry = state
                .keys
                .entry(key.to_owned())
                .or_insert_with(|| KeyEntry {
                    refs: 0,
                    slot: Arc::new(Slot::default()),
                    registration: Registration::Pending,
                });
            entry.refs += 1;
            let first = entry.refs == 1;
            let slot = entry.slot.clone();
            if first {
                state.dirty.insert(key.to_owned());
            }
            (slot, first)
        };
        if first {
            self.shared.poke();
        }
        Watch {
            shared: self.shared.clone(),
            key: key.to_owned(),
            slot,
        }
    }

    /// The listener's state.
    pub(crate) fn status(&self) -> ListenerStatus {
        lock(&self.shared.state).public_status()
    }

    /// Blocks until the session is up or `timeout` passes.
    pub(crate) fn wait_connected(&self, timeout: Duration) -> bool {
        self.wait_for_status(timeout, |state, timed_out| {
            if state.status.connected {
                Some(true)
            } else {
                timed_out.then_some(false)
            }
        })
    }

    /// The one wait on the listener's state: re-evaluates `decide` (given
    /// the state and whether `timeout` has passed) each time the session's
    /// status changes, until it answers.
    fn wait_for_status<T>(
        &self,
        timeout: Duration,
        mut decide: impl FnMut(&State, bool) -> Option<T>,
    ) -> T {
        let until = Instant::now() + timeout;
        let mut state = lock(&self.shared.state);
        loop {
            let now = Instant::now();
            if let Some(answer) = decide(&state, now >= until) {
                return answer;
            }
            state = self
                .shared
                .status_changed
                .wait_timeout(state, until.saturating_duration_since(now))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Blocks until the session is up (`Ok`), the last session attempt
    /// failed its delivery check, or `timeout` passes (`Err` with the
    /// status then).
    pub(crate) fn wait_delivering(&self, timeout: Duration) -> Result<(), Box<ListenerStatus>> {
        self.wait_for_status(timeout, |state, timed_out| {
            if state.status.connected {
                Some(Ok(()))
            } else if timed_out || state.status.undelivered {
                Some(Err(Box::new(state.public_status())))
            } else {
                None
            }
        })
    }

    /// Waiters of `key` blocked after an attempt that followed the key's
    /// completed registration and not woken since (a release will wake
    /// them by notification).
    pub(crate) fn armed_waiters(&self, key: &str) -> usize {
        self.shared
            .slot_of(key)
            .map_or(0, |slot| slot.armed_sleepers())
    }

    /// The shared state, for unit tests that deliver by hand.
    #[cfg(test)]
    pub(super) fn shared_state_for_tests(&self) -> &Mutex<State> {
        &self.shared.state
    }

    /// A new release watch's queue, told of releases and resyncs from now
    /// on.
    pub(super) fn subscribe(&self) -> Arc<Subscription> {
        let subscription = Arc::new(Subscription::default());
        lock(&self.shared.state)
            .subscriptions
            .push(Arc::downgrade(&subscription));
        subscription
    }

    /// How many of `keys` are armed: registered in a session that is up.
    pub(crate) fn armed<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> usize {
        let state = lock(&self.shared.state);
        keys.into_iter().filter(|key| state.armed(key)).count()
    }

    /// Blocks until every one of `keys` is registered or refused in a
    /// session that is up, or `timeout` passes; answers how many are armed
    /// then.
    pub(crate) fn wait_settled(&self, keys: &[&str], timeout: Duration) -> usize {
        self.wait_for_status(timeout, |state, timed_out| {
            (timed_out || keys.iter().all(|key| state.settled(key)))
                .then(|| keys.iter().filter(|key| state.armed(key)).count())
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.poke();
    }
}
