//! The per-process listener that turns `lease.release` notifications into
//! wake-ups of blocked waiters.
//!
//! One background thread per database URL owns one dedicated session
//! (`crate::libpq::PqConn`) that runs `LISTEN lease_released` and registers,
//! in `lease.waiters`, every key some waiter of this process waits for (one
//! row per key, however many waiters share it). `lease.release` notifies only
//! for registered keys, so releases nobody waits for cost no notification.
//!
//! Waiters block on a per-key [`Slot`]: a sequence number that moves whenever
//! the waiter should look at the key again, plus a condvar. It moves when
//!
//! - a notification names the key (or is the "every key" payload `''`);
//! - the key's registration completed cleanly (a release that raced with the
//!   registration is then visible to the next attempt, see
//!   `lease._waiter_watch`);
//! - the session was lost or re-established: notifications may have been
//!   missed, so every waiter re-checks, and while disconnected waiters poll
//!   on their own (the fallback).
//!
//! The thread sleeps in `poll(2)` on the session's socket and on a wake-up
//! socket pair that waiters write to when they need a registration, so it
//! reacts within microseconds and spends no CPU while idle. An idle session
//! is probed every few seconds so a silently dead connection is noticed.
//!
//! This module keeps the shared state (keys, slots, status); `session.rs`
//! runs the thread and its database session; `slot.rs` is what waiters
//! block on.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::session::run;
use super::slot::Slot;

/// `application_name` of listener sessions, to find them in pg_stat_activity.
pub const LISTENER_APPLICATION_NAME: &str = "leasehold listener";

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the listener is doing, for monitoring and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerStatus {
    /// The session is up, listening, and its registrations are in place.
    pub connected: bool,
    /// The session's server process id while connected.
    pub backend_pid: Option<i32>,
    /// How many sessions were established so far (1 after the first
    /// connect; more after reconnects).
    pub sessions: u64,
    /// The last connection or query error, if any.
    pub last_error: Option<String>,
}

pub(super) struct KeyEntry {
    /// Live [`Watch`] guards for the key.
    pub(super) refs: usize,
    pub(super) slot: Arc<Slot>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) keys: HashMap<String, KeyEntry>,
    /// Keys whose registration must be (re)considered by the thread.
    pub(super) dirty: HashSet<String>,
    pub(super) status: Status,
    pub(super) shutdown: bool,
}

#[derive(Default)]
pub(super) struct Status {
    pub(super) connected: bool,
    pub(super) backend_pid: Option<i32>,
    pub(super) sessions: u64,
    pub(super) last_error: Option<String>,
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

    /// Whether the session is up: waiters may then rely on notifications.
    pub(crate) fn is_connected(&self) -> bool {
        lock(&self.shared.state).status.connected
    }

    /// The listener's state.
    pub(crate) fn status(&self) -> ListenerStatus {
        let state = lock(&self.shared.state);
        ListenerStatus {
            connected: state.status.connected,
            backend_pid: state.status.backend_pid,
            sessions: state.status.sessions,
            last_error: state.status.last_error.clone(),
        }
    }

    /// Blocks until the session is up or `timeout` passes.
    pub(crate) fn wait_connected(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut state = lock(&self.shared.state);
        loop {
            if state.status.connected {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            state = self
                .shared
                .status_changed
                .wait_timeout(state, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waiters of `key` blocked after an attempt that followed the key's
    /// completed registration (they will be woken by a release).
    pub(crate) fn armed_waiters(&self, key: &str) -> usize {
        self.shared
            .slot_of(key)
            .map_or(0, |slot| slot.armed_sleepers())
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.poke();
    }
}
