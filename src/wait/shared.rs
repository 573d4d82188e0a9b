//! The state the listener's handles (`listener.rs`) and its thread (`session.rs`)
//! share, so neither imports the other's internals.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::slot::Slot;

/// How often a listener whose notifications were not delivered tries a new session.
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
    /// How many sessions were established so far.
    pub sessions: u64,
    /// The last connection or query error, if any.
    pub last_error: Option<String>,
    /// How the waiters of this process are woken right now.
    pub wake_mode: WakeMode,
    /// Keys waited for whose waiters poll (all of them while disconnected).
    pub polled_keys: usize,
    /// Registrations the server refused since the listener started.
    pub failed_registrations: u64,
    /// Release notifications that woke a key's waiters or watches.
    pub notification_wakeups: u64,
    /// Release notifications that matched no key (other processes', late, or forged).
    pub unmatched_notifications: u64,
}

/// How waiters are woken (see [`ListenerStatus::wake_mode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WakeMode {
    /// Every key waited for is registered: releases wake by notification.
    Notifications,
    /// Some or all waiters poll every [`crate::wait::LeaseWaiterBuilder::fallback_poll`]
    /// (and still wake at the holder's expiry): slower, a query per poll.
    Polling(PollingReason),
}

/// Why waiters poll instead of being notified (see [`WakeMode::Polling`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PollingReason {
    /// The listener session is down ([`ListenerStatus::last_error`]); it reconnects.
    Disconnected,
    /// A release was in flight at each registration attempt; the listener keeps retrying.
    RegistrationBusy,
    /// The session holds [`crate::wait::WAITER_LIMIT`] registrations already.
    WaiterLimit,
    /// The key's namespace is bound to another role (`lease_namespace_denied`).
    NamespaceDenied,
    /// Notifications do not reach the session (a transaction-mode pooler, see
    /// [`crate::wait::LeaseWaiter::ensure_listening`]); retried every [`UNDELIVERED_RETRY`].
    NotificationsNotDelivered,
    /// The server refused the registration otherwise (e.g. `EXECUTE` revoked).
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
    /// Live [`Watch`](super::listener::Watch) guards for the key.
    pub(super) refs: usize,
    pub(super) slot: Arc<Slot>,
    pub(super) registration: Registration,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) keys: HashMap<String, KeyEntry>,
    /// Keys whose registration must be (re)considered by the thread.
    pub(super) dirty: HashSet<String>,
    /// The release watches' queues; a dropped watch's entry goes at the next delivery.
    pub(super) subscriptions: Vec<Weak<Subscription>>,
    pub(super) status: Status,
    pub(super) shutdown: bool,
}

/// What a release watch is told ([`super::ReleaseEvent`] is its public form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Delivery {
    /// A release notification carried this key's digest.
    Released(String),
    /// A grant notification carried this key's digest (told only to
    /// subscriptions that asked for grants).
    Granted(String),
    /// The session was lost or (re)established.
    Resync,
}

/// One release watch's queue, filled by the listener under the state's lock
/// (lock order: state, then subscription).
#[derive(Default)]
pub(super) struct Subscription {
    pub(super) state: Mutex<SubscriptionState>,
    pub(super) changed: Condvar,
    /// Where async watches wait instead of the condvar; every delivery notifies both.
    #[cfg(feature = "async")]
    pub(super) tasks: tokio::sync::Notify,
}

#[derive(Default)]
pub(super) struct SubscriptionState {
    /// The keys whose releases this watch is told of.
    pub(super) keys: HashSet<String>,
    /// Whether it is told of grants too.
    pub(super) grants: bool,
    /// Undelivered events, oldest first, each key and the resync at most once.
    pub(super) queue: VecDeque<Delivery>,
    /// The keys queued now.
    pub(super) queued: HashSet<String>,
    /// A resync is queued now.
    pub(super) resync_queued: bool,
}

impl Subscription {
    pub(super) fn deliver(&self, delivery: &Delivery) {
        let mut state = lock(&self.state);
        match delivery {
            Delivery::Granted(_) if !state.grants => return,
            Delivery::Released(key) | Delivery::Granted(key) => {
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

    /// The oldest undelivered event, from a task.
    #[cfg(feature = "async")]
    pub(super) async fn next_async(&self) -> Delivery {
        loop {
            let notified = self.tasks.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the queue is read, so a delivery in between is not missed.
            notified.as_mut().enable();
            if let Some(delivery) = self.next(Some(Instant::now())) {
                return delivery;
            }
            notified.await;
        }
    }

    /// The oldest undelivered event, waiting until `until` (`None`: forever).
    pub(super) fn next(&self, until: Option<Instant>) -> Option<Delivery> {
        let mut state = lock(&self.state);
        loop {
            if let Some(delivery) = state.queue.pop_front() {
                match &delivery {
                    Delivery::Released(key) | Delivery::Granted(key) => {
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
    /// The most recent refusal's reason, reported while some key is refused.
    pub(super) last_refusal: Option<PollingReason>,
}

impl State {
    pub(super) fn set_registration(&mut self, key: &str, registration: Registration) {
        if let Some(entry) = self.keys.get_mut(key) {
            entry.registration = registration;
        }
    }

    /// Tells the watches of `delivery` (for a release or grant, those watching the key).
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

    /// Whether `key` is registered in a listening session: a release from now on notifies.
    pub(super) fn armed(&self, key: &str) -> bool {
        self.status.connected
            && self
                .keys
                .get(key)
                .is_some_and(|entry| entry.registration == Registration::Registered)
    }

    /// Whether `key` is registered or refused in a session that is up.
    pub(super) fn settled(&self, key: &str) -> bool {
        self.status.connected
            && self.keys.get(key).is_some_and(|entry| {
                matches!(
                    entry.registration,
                    Registration::Registered | Registration::Refused(_)
                )
            })
    }

    pub(super) fn public_status(&self) -> ListenerStatus {
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
    /// Write end of the thread's wake-up socket pair (`None`: no thread either).
    pub(super) wake_tx: Mutex<Option<UnixStream>>,
}

impl Shared {
    pub(super) fn poke(&self) {
        // A full buffer already guarantees a wake-up; other errors mean the thread is gone.
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
