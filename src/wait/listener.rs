//! The per-process listener that turns `lease.release` notifications into waiter
//! wake-ups: one thread and libpq session per URL registers every waited-for key in
//! `lease.waiters` and maps the notified digests (never key names: every listener
//! receives them) back to keys, moving each key's [`Slot`]. Keys not armed in the
//! current session are polled, and [`ListenerStatus`] says why ([`WakeMode`]); a
//! session whose delivery check fails (a transaction-mode pooler) reports
//! [`PollingReason::NotificationsNotDelivered`]. docs/guide/waiting-and-keeping.md
//! has the rules; `session.rs` runs the thread, `slot.rs` is what waiters block on.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::session::run;
use super::shared::*;
use super::slot::Slot;

/// A handle on the process's listener for one URL; the thread stops with the last.
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
        // Without a wake-up channel or thread, waiters poll and the status says why.
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

    /// Registers interest in `key`; the first watch asks the thread to register it.
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

    /// The one wait on the listener's state: re-evaluates `decide` on each status change.
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

    /// Blocks until the session is up (`Ok`), a delivery check failed, or `timeout`
    /// passes (`Err` with the status).
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

    /// Waiters of `key` asleep after an armed attempt.
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

    /// A new release watch's queue, told of releases and resyncs from now on.
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

    /// Blocks until every key is registered or refused, or `timeout`; answers how many are armed.
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
