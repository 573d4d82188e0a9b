//! The per-process listener that turns `lease.release` notifications into
//! wake-ups of blocked waiters.
//!
//! One background thread per database URL owns one dedicated session
//! ([`crate::libpq::PqConn`]) that runs `LISTEN lease_released` and registers,
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
//! is probed every [`IDLE_PROBE`] so a silently dead connection is noticed.

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::cancel::{CancelToken, Wake};
use crate::libpq::{Notification, PqConn};

/// The channel `lease.release` notifies on.
pub(crate) const CHANNEL: &str = "lease_released";
/// `application_name` of listener sessions, to find them in pg_stat_activity.
pub const LISTENER_APPLICATION_NAME: &str = "leasehold listener";
/// How often an idle session is probed with `SELECT 1`.
const IDLE_PROBE: Duration = Duration::from_secs(10);
/// Reconnect back-off bounds.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Retry bounds for a registration that met an in-flight writer.
const BUSY_RETRY_MIN: Duration = Duration::from_millis(1);
const BUSY_RETRY_MAX: Duration = Duration::from_millis(100);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
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

/// Why [`Slot::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The sequence moved: look at the key again.
    Changed,
    /// The time limit passed.
    TimedOut,
    /// The cancel token fired.
    Cancelled,
}

#[derive(Default)]
struct SlotState {
    seq: u64,
    /// The `seq` value set when the key's registration last completed
    /// cleanly in the current session; `None` while not (yet) armed.
    armed_at: Option<u64>,
    /// Waiters blocked after an attempt that followed the armed
    /// registration: a release will wake them by notification.
    armed_sleepers: usize,
}

/// The per-key wake-up point waiters block on.
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    changed: Condvar,
}

impl Slot {
    /// The current sequence number; read it before an attempt, wait for it
    /// to move after.
    pub(crate) fn seq(&self) -> u64 {
        lock(&self.state).seq
    }

    fn bump(&self, armed: Option<bool>) {
        let mut state = lock(&self.state);
        state.seq += 1;
        match armed {
            Some(true) => state.armed_at = Some(state.seq),
            Some(false) => state.armed_at = None,
            None => {}
        }
        self.changed.notify_all();
    }

    /// Blocks until the sequence moves past `seen`, `until` passes, or
    /// `cancel` fires.
    pub(crate) fn wait(&self, seen: u64, until: Instant, cancel: Option<&CancelToken>) -> Woken {
        let mut state = lock(&self.state);
        let armed = state.armed_at.is_some_and(|at| seen >= at);
        if armed {
            state.armed_sleepers += 1;
        }
        let woken = loop {
            if cancel.is_some_and(CancelToken::is_cancelled) {
                break Woken::Cancelled;
            }
            if state.seq != seen {
                break Woken::Changed;
            }
            let now = Instant::now();
            if now >= until {
                break Woken::TimedOut;
            }
            state = self
                .changed
                .wait_timeout(state, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        if armed {
            state.armed_sleepers -= 1;
        }
        woken
    }
}

impl Wake for Slot {
    fn wake(&self) {
        let _state = lock(&self.state);
        self.changed.notify_all();
    }
}

struct KeyEntry {
    /// Live [`Watch`] guards for the key.
    refs: usize,
    slot: Arc<Slot>,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, KeyEntry>,
    /// Keys whose registration must be (re)considered by the thread.
    dirty: HashSet<String>,
    status: Status,
    shutdown: bool,
}

#[derive(Default)]
struct Status {
    connected: bool,
    backend_pid: Option<i32>,
    sessions: u64,
    last_error: Option<String>,
}

struct Shared {
    url: String,
    state: Mutex<State>,
    status_changed: Condvar,
    /// Write end of the thread's wake-up socket pair (`None` when it could
    /// not be created: then there is no thread either).
    wake_tx: Mutex<Option<UnixStream>>,
}

impl Shared {
    fn poke(&self) {
        // A full buffer already guarantees a wake-up; other errors mean the
        // thread is gone, which shutdown handles.
        if let Some(tx) = lock(&self.wake_tx).as_mut() {
            let _ = tx.write(&[1]);
        }
    }

    fn bump_all(&self, armed: Option<bool>) {
        let slots: Vec<Arc<Slot>> = lock(&self.state)
            .keys
            .values()
            .map(|e| e.slot.clone())
            .collect();
        for slot in slots {
            slot.bump(armed);
        }
    }

    fn slot_of(&self, key: &str) -> Option<Arc<Slot>> {
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
        self.shared.slot_of(key).map_or(0, |slot| {
            let state = lock(&slot.state);
            if state.armed_at.is_some() {
                state.armed_sleepers
            } else {
                0
            }
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.poke();
    }
}

/// The thread: (re)connect, serve, and on loss let every waiter re-check.
fn run(shared: &Arc<Shared>, mut wake_rx: UnixStream) {
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

/// Polls `fds` for readability; `Ok(readable flags)`.
fn wait_readable(fds: &[i32], timeout: Option<Duration>) -> Result<Vec<bool>, String> {
    let mut pollfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout_ms = timeout.map_or(-1, |t| {
        // Round up so a sub-millisecond timeout does not spin.
        let ms = t.as_micros().div_ceil(1000);
        libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
    });
    loop {
        // SAFETY: `pollfds` is a valid array of `pollfds.len()` entries.
        let n = unsafe {
            libc::poll(
                pollfds.as_mut_ptr(),
                pollfds.len() as libc::nfds_t,
                timeout_ms,
            )
        };
        if n >= 0 {
            return Ok(pollfds.iter().map(|p| p.revents != 0).collect());
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != ErrorKind::Interrupted {
            return Err(format!("poll failed: {error}"));
        }
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
        session
            .conn
            .query("SELECT lease._waiter_reset()", &[])
            .map_err(|e| {
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
            .query(&format!("LISTEN {CHANNEL}"), &[])
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
                let _ = self.conn.query("SELECT lease._waiter_reset()", &[]);
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
                        .query("SELECT 1", &[])
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
                    .query("SELECT lease._waiter_watch($1)::text", &[&key])
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
                        .query("SELECT lease._waiter_unwatch($1)", &[&key])
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
        if notification.channel != CHANNEL {
            continue;
        }
        if notification.payload.is_empty() {
            shared.bump_all(None);
        } else if let Some(slot) = shared.slot_of(&notification.payload) {
            slot.bump(None);
        }
    }
}
