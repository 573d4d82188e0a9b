//! A heartbeat that keeps one grant alive and says, cheaply and on the
//! client's own clock, until when the holder may safely act on it.
//!
//! # The deadline
//!
//! Expiry is decided by the server's clock alone, and the client's wall
//! clock may be anywhere, so the keeper never compares the two. It records
//! the client's monotonic [`Instant`] just *before* sending each renew. A
//! successful renew set the server's expiry to (server time when it ran) +
//! ttl, and the renew ran after it was sent, so the lease is held at least
//! until `sent + ttl` as long as both clocks advance at the same rate. The
//! keeper's [`Keeper::safe_until`] is `sent + ttl - margin`; the margin
//! covers clock rate differences (NTP slewing is at most 0.05 %) and the time
//! the holder needs to notice and stop. Default margin: ttl / 10.
//!
//! Only a `renew` gives such a bound: an acquire by an owner that already
//! holds the key returns the old expiry, so [`Keeper::start`] renews once,
//! synchronously, before it returns.
//!
//! # Loss
//!
//! The keeper reports loss once, and for good, when a renew answers anything
//! but `ok` ([`LeaseLoss::Refused`]), or when `safe_until` passes without a
//! successful renew, e.g. while the database is unreachable
//! ([`LeaseLoss::DeadlinePassed`]). The second is detected by a separate
//! monitor thread, so a renew stuck on a dead connection cannot delay it.
//! [`Keeper::is_valid`] (one atomic load and a clock read) is false from
//! the same instant.
//!
//! # Renewing
//!
//! A renew is sent every `renew_every` (default ttl / 3) after the previous
//! successful one was sent. Failed renews (connection errors, or a server
//! that is read-only during a failover) are retried every `retry_every`
//! (default ttl / 30) with a connection from the pool (r2d2 replaces
//! the connections those failures discard; with a multi-host URL and
//! `target_session_attrs=read-write` the replacement reaches the new
//! primary), until they succeed or the deadline passes. [`Keeper::stop`]
//! and drop release the lease.
//!
//! # Never cancelled
//!
//! Neither the deadline nor [`Keeper::stop`] interrupts a renew in flight:
//! a renew whose commit waits for a synchronous standby has committed
//! locally, and a cancel would make PostgreSQL report it done although a
//! failover may lose it. The monitor thread declares the loss without
//! touching the renew, and `stop` waits for it (its release waits behind
//! the renew's row lock anyway).
//!
//! ```no_run
//! # fn demo(client: &leasehold::LeaseClient, lease: leasehold::Lease) -> Result<(), Box<dyn std::error::Error>> {
//! let keeper = leasehold::Keeper::start(client, lease)?; // renews for lease.ttl()
//! while keeper.is_valid() {
//!     // ... one step of work, presenting keeper.token() to guards ...
//!     # break;
//! }
//! keeper.stop()?; // releases
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::schedule::{lock, spawn, Schedule};
use crate::client::LeaseClient;
use crate::error::LeaseError;
use crate::lease;
use crate::lease::outcome::{Lease, Refusal, Release, Renewal};
use crate::lease::token::FencingToken;
use crate::pool::{with_conn, PgPool};
use crate::sql::execute::finish;

/// Why a keeper's lease is lost.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LeaseLoss {
    /// A renew answered not_owner, lapsed or epoch_mismatch.
    Refused(Refusal),
    /// `safe_until` passed without a successful renew (database unreachable
    /// or too slow). The server may still hold the grant for a little
    /// longer, but the holder can no longer be sure.
    DeadlinePassed {
        /// The error of the last failed renew, if any.
        last_error: Option<Arc<LeaseError>>,
    },
}

impl LeaseLoss {
    /// The `reason` label of the loss in telemetry.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            LeaseLoss::Refused(why) => why.as_reason(),
            LeaseLoss::DeadlinePassed { .. } => "deadline_passed",
        }
    }
}

impl std::fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseLoss::Refused(why) => write!(f, "renew refused: {why}"),
            LeaseLoss::DeadlinePassed { last_error: None } => {
                f.write_str("no successful renew before the safe deadline")
            }
            LeaseLoss::DeadlinePassed {
                last_error: Some(_),
            } => f.write_str("no successful renew before the safe deadline (renews failed)"),
        }
    }
}

/// What a keeper reports to [`KeeperBuilder::on_event`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum KeeperEvent {
    /// A renew succeeded.
    Renewed {
        /// When the renew was sent (client monotonic clock).
        sent_at: Instant,
        /// The server's new expiry (server clock; for display only).
        expires_at: DateTime<Utc>,
        /// The new deadline: `sent_at + ttl - margin`.
        safe_until: Instant,
    },
    /// A renew failed; it is retried until the deadline.
    RenewFailed {
        /// What went wrong (shared: the same error is kept as the loss's
        /// `last_error` should the deadline pass).
        error: Arc<LeaseError>,
    },
    /// The lease is lost; reported once, then the keeper renews no more.
    Lost(LeaseLoss),
}

type EventHandler = Box<dyn Fn(&KeeperEvent) + Send + Sync>;

/// Configures a [`Keeper`]; see [`Keeper::builder`].
#[must_use = "a builder does nothing until start() is called"]
pub struct KeeperBuilder {
    pool: PgPool,
    lease: Lease,
    ttl: Duration,
    renew_every: Option<Duration>,
    retry_every: Option<Duration>,
    margin: Option<Duration>,
    on_event: Option<EventHandler>,
}

impl std::fmt::Debug for KeeperBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeeperBuilder")
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("renew_every", &self.renew_every)
            .field("retry_every", &self.retry_every)
            .field("margin", &self.margin)
            .finish()
    }
}

impl KeeperBuilder {
    /// The ttl each renew asks for (default: the lease's own
    /// [`Lease::ttl`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Time between renews (default ttl / 3). Must be shorter than
    /// ttl - margin, or the lease would lapse between renews.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Time between retries of a failed renew (default ttl / 30).
    pub fn retry_every(mut self, every: Duration) -> Self {
        self.retry_every = Some(every);
        self
    }

    /// How much earlier than `sent + ttl` the deadline lies (default
    /// ttl / 10). Must be shorter than the ttl.
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// Called (on a keeper thread) for every renew, failed renew, and the
    /// loss. Keep it short; it may call the keeper's methods.
    pub fn on_event(mut self, handler: impl Fn(&KeeperEvent) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Box::new(handler));
        self
    }

    /// Validates, renews once (establishing the first deadline) and starts
    /// the background threads.
    pub fn start(self) -> Result<Keeper, LeaseError> {
        let Schedule {
            ttl,
            margin,
            renew_every,
            retry_every,
        } = Schedule::resolve(self.ttl, self.margin, self.renew_every, self.retry_every)?;
        let base = Instant::now();
        let shared = Arc::new(Shared {
            lease: self.lease,
            pool: self.pool,
            ttl,
            margin,
            renew_every,
            retry_every,
            base,
            valid_until: AtomicU64::new(0),
            state: Mutex::new(State {
                safe_until: base,
                last_sent: base,
                expires_at: None,
                loss: None,
                last_error: None,
                stopping: false,
            }),
            changed: Condvar::new(),
            on_event: self.on_event,
        });
        // The first deadline comes from a renew sent now.
        match shared.renew_once() {
            Ok(RenewResult::Renewed(event)) => shared.emit(&event),
            Ok(RenewResult::Ignored) => {}
            Ok(RenewResult::Refused(reason)) => {
                return Err(LeaseError::LeaseNotHeld {
                    key: shared.lease.key().to_owned(),
                    owner: shared.lease.owner().to_owned(),
                    epoch: shared.lease.epoch(),
                    reason,
                })
            }
            Err(error) => return Err(error),
        }
        let renewer = {
            let shared = shared.clone();
            spawn("leasehold-keeper", move || shared.renew_loop())?
        };
        let monitor = {
            let shared = shared.clone();
            spawn("leasehold-keeper-deadline", move || shared.monitor_loop())?
        };
        Ok(Keeper {
            shared,
            threads: vec![renewer, monitor],
        })
    }
}

/// Keeps one grant alive in the background; see the module docs.
pub struct Keeper {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("token", self.shared.lease.token())
            .field("valid", &self.is_valid())
            .field("loss", &self.loss())
            .finish()
    }
}

struct Shared {
    pool: PgPool,
    lease: Lease,
    ttl: Duration,
    margin: Duration,
    renew_every: Duration,
    retry_every: Duration,
    /// Origin of `valid_until`.
    base: Instant,
    /// Nanoseconds after `base` until which the lease is safe; 0 once lost
    /// or stopped. Read without a lock by `is_valid`.
    valid_until: AtomicU64,
    state: Mutex<State>,
    changed: Condvar,
    on_event: Option<EventHandler>,
}

struct State {
    safe_until: Instant,
    last_sent: Instant,
    expires_at: Option<DateTime<Utc>>,
    loss: Option<LeaseLoss>,
    last_error: Option<Arc<LeaseError>>,
    stopping: bool,
}

enum RenewResult {
    Renewed(KeeperEvent),
    Refused(Refusal),
    /// Succeeded after the keeper gave up or began stopping: ignored, loss
    /// is final.
    Ignored,
}

impl Shared {
    fn emit(&self, event: &KeeperEvent) {
        if let Some(handler) = &self.on_event {
            handler(event);
        }
    }

    fn nanos_since_base(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Sends one renew and records a success.
    fn renew_once(&self) -> Result<RenewResult, LeaseError> {
        let sent_at = Instant::now();
        let lease = &self.lease;
        let renewal = with_conn(&self.pool, |conn| {
            finish(lease::renew(conn, lease.token(), self.ttl))
        })?;
        match renewal {
            Renewal::Renewed { expires_at } => {
                let mut state = lock(&self.state);
                if state.loss.is_some() || state.stopping {
                    return Ok(RenewResult::Ignored);
                }
                let safe_until =
                    super::schedule::safe_until(sent_at, self.ttl, self.margin, state.safe_until);
                state.safe_until = safe_until;
                state.last_sent = sent_at;
                state.expires_at = Some(expires_at);
                state.last_error = None;
                self.valid_until
                    .store(self.nanos_since_base(safe_until), Ordering::SeqCst);
                self.changed.notify_all();
                Ok(RenewResult::Renewed(KeeperEvent::Renewed {
                    sent_at,
                    expires_at,
                    safe_until,
                }))
            }
            Renewal::Refused(reason) => Ok(RenewResult::Refused(reason)),
        }
    }

    /// Records the loss (first one wins) and reports it.
    fn declare_lost(&self, loss: LeaseLoss) {
        {
            let mut state = lock(&self.state);
            if state.loss.is_some() || state.stopping {
                return;
            }
            state.loss = Some(loss.clone());
            self.valid_until.store(0, Ordering::SeqCst);
            self.changed.notify_all();
        }
        crate::telemetry::lease_lost(&self.lease, loss.reason(), &loss);
        self.emit(&KeeperEvent::Lost(loss));
    }

    fn renew_loop(&self) {
        let mut next = lock(&self.state).last_sent + self.renew_every;
        loop {
            {
                let mut state = lock(&self.state);
                loop {
                    if state.stopping || state.loss.is_some() {
                        return;
                    }
                    let now = Instant::now();
                    if now >= next {
                        break;
                    }
                    state = self
                        .changed
                        .wait_timeout(state, next - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
            match self.renew_once() {
                Ok(RenewResult::Renewed(event)) => {
                    self.emit(&event);
                    next = lock(&self.state).last_sent + self.renew_every;
                }
                Ok(RenewResult::Refused(reason)) => {
                    self.declare_lost(LeaseLoss::Refused(reason));
                    return;
                }
                Ok(RenewResult::Ignored) => return,
                Err(error) => {
                    let error = Arc::new(error);
                    lock(&self.state).last_error = Some(error.clone());
                    self.emit(&KeeperEvent::RenewFailed { error });
                    next = Instant::now() + self.retry_every;
                }
            }
        }
    }

    /// Declares the loss when the deadline passes without a renew, however
    /// long a renew call may hang.
    fn monitor_loop(&self) {
        let mut state = lock(&self.state);
        loop {
            if state.stopping || state.loss.is_some() {
                return;
            }
            let now = Instant::now();
            if now >= state.safe_until {
                let last_error = state.last_error.clone();
                drop(state);
                self.declare_lost(LeaseLoss::DeadlinePassed { last_error });
                return;
            }
            let left = state.safe_until - now;
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Stops the threads (they exit at their next wake-up) and releases the
    /// lease unless a renew already said it is gone.
    fn stop_and_release(&self) -> Result<Release, LeaseError> {
        let refused = {
            let mut state = lock(&self.state);
            state.stopping = true;
            self.valid_until.store(0, Ordering::SeqCst);
            self.changed.notify_all();
            match &state.loss {
                Some(LeaseLoss::Refused(reason)) => Some(*reason),
                _ => None,
            }
        };
        if let Some(reason) = refused {
            return Ok(Release::Refused(reason));
        }
        let lease = &self.lease;
        // After a failover, pooled connections may still reach the old
        // primary, now read-only. A release refused there changed nothing
        // and discarded its connection, so it is sent again; after at most
        // the pool's size of such refusals a new connection reaches the
        // writable server (a multi-host URL with target_session_attrs).
        let mut attempts = super::schedule::release_attempts(
            usize::try_from(self.pool.max_size()).unwrap_or(usize::MAX),
        );
        loop {
            let answer = with_conn(&self.pool, |conn| {
                finish(lease::release(conn, lease.token()))
            });
            attempts = attempts.saturating_sub(1);
            match answer {
                Err(LeaseError::ReadOnlyServer { .. }) if attempts > 0 => continue,
                answer => return answer,
            }
        }
    }
}

impl Keeper {
    /// Starts keeping `lease` alive with the default settings, renewing it
    /// for its own [`Lease::ttl`], on `client`'s pool; renews once before
    /// returning.
    pub fn start(client: &LeaseClient, lease: Lease) -> Result<Keeper, LeaseError> {
        Self::builder(client, lease).start()
    }

    /// A builder to change intervals, margin, or observe events.
    ///
    /// ```no_run
    /// # fn demo(client: &leasehold::LeaseClient, lease: leasehold::Lease) -> Result<(), leasehold::error::LeaseError> {
    /// use std::time::Duration;
    /// let keeper = leasehold::Keeper::builder(client, lease)
    ///     .ttl(Duration::from_secs(9))
    ///     .renew_every(Duration::from_secs(2))
    ///     .margin(Duration::from_secs(1))
    ///     .on_event(|event| eprintln!("{event:?}"))
    ///     .start()?;
    /// # drop(keeper); Ok(()) }
    /// ```
    pub fn builder(client: &LeaseClient, lease: Lease) -> KeeperBuilder {
        KeeperBuilder {
            pool: client.pool().clone(),
            ttl: lease.ttl(),
            lease,
            renew_every: None,
            retry_every: None,
            margin: None,
            on_event: None,
        }
    }

    /// The fencing token of the kept grant, for guards.
    pub fn token(&self) -> &FencingToken {
        self.shared.lease.token()
    }

    /// The kept grant as acquired.
    pub fn lease(&self) -> &Lease {
        &self.shared.lease
    }

    /// The ttl each renew asks for.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The margin subtracted from `sent + ttl`.
    pub fn margin(&self) -> Duration {
        self.shared.margin
    }

    /// Until when the holder may act on the lease: the last successful
    /// renew's send instant + ttl - margin (client monotonic clock).
    pub fn safe_until(&self) -> Instant {
        lock(&self.shared.state).safe_until
    }

    /// The server's expiry after the last successful renew (server clock,
    /// for display; decide with [`Keeper::is_valid`]).
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        lock(&self.shared.state).expires_at
    }

    /// Whether the lease is safe to act on right now: not lost, not
    /// stopped, and before `safe_until`. One atomic load and a clock read.
    pub fn is_valid(&self) -> bool {
        let until = self.shared.valid_until.load(Ordering::SeqCst);
        until != 0 && self.shared.nanos_since_base(Instant::now()) < until
    }

    /// Why the lease is lost, if it is (including a deadline that passed
    /// and is about to be reported).
    pub fn loss(&self) -> Option<LeaseLoss> {
        let state = lock(&self.shared.state);
        if let Some(loss) = &state.loss {
            return Some(loss.clone());
        }
        (!state.stopping && Instant::now() >= state.safe_until).then(|| LeaseLoss::DeadlinePassed {
            last_error: state.last_error.clone(),
        })
    }

    /// Blocks until the lease is lost or `timeout` passes; returns the loss.
    pub fn wait_for_loss(&self, timeout: Duration) -> Option<LeaseLoss> {
        let until = Instant::now() + timeout;
        let mut state = lock(&self.shared.state);
        loop {
            if let Some(loss) = &state.loss {
                return Some(loss.clone());
            }
            let now = Instant::now();
            if now >= until || state.stopping {
                return None;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Stops renewing, waits for the keeper's threads, and releases the
    /// lease. Returns what the release answered ([`Release::Refused`] when the
    /// lease was already lost). A release that a read-only server refused
    /// (a pooled connection still on a demoted primary) is sent again on
    /// another connection, at most the pool's size of times.
    pub fn stop(mut self) -> Result<Release, LeaseError> {
        let released = self.shared.stop_and_release();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        released
    }

    /// Stops renewing and keeps the grant: nothing is released, and the
    /// grant lapses at the expiry of the last renew unless the caller
    /// renews or releases it. Returns the lease, for that call.
    ///
    /// For "hold at least": a scheduled job that finished early keeps
    /// others out until a minimum time has passed since it began, by
    /// renewing the returned lease once with the time that is left (a renew
    /// counts its ttl from the call, so that also shortens a longer grant)
    /// instead of releasing it. `leasehold run --hold-at-least` does that.
    pub fn stop_renewing(mut self) -> Lease {
        {
            let mut state = lock(&self.shared.state);
            state.stopping = true;
            self.shared.valid_until.store(0, Ordering::SeqCst);
            self.shared.changed.notify_all();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.shared.lease.clone()
    }
}

impl Drop for Keeper {
    /// Stops renewing and releases (best effort; errors are ignored and the
    /// lease then lapses at its expiry). Does not wait for a renew that is
    /// in flight.
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = self.shared.stop_and_release();
        }
    }
}
