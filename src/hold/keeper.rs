//! One grant kept alive by a renewer thread and a deadline monitor thread.

use crate::error::{Operation, Repr};
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
    /// `safe_until` passed without a successful renew; the server may still hold
    /// the grant, but the holder can no longer be sure.
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
        /// What went wrong (also the loss's `last_error` should the deadline pass).
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
    /// The ttl each renew asks for (default: the lease's [`Lease::ttl`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Time between renews (default ttl / 3); shorter than ttl - margin.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Time between retries of a failed renew (default ttl / 30).
    pub fn retry_every(mut self, every: Duration) -> Self {
        self.retry_every = Some(every);
        self
    }

    /// How much earlier than `sent + ttl` the deadline lies (default ttl / 10).
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// Called on a keeper thread for every renew, failure and the loss; keep it short.
    pub fn on_event(mut self, handler: impl Fn(&KeeperEvent) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Box::new(handler));
        self
    }

    /// Validates, renews once for the first deadline, starts the threads.
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
                return Err(LeaseError::from(Repr::LeaseNotHeld {
                    operation: Operation::Renew,
                    key: shared.lease.key().to_owned(),
                    owner: shared.lease.owner().to_owned(),
                    epoch: shared.lease.epoch(),
                    reason,
                }))
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

/// A heartbeat that keeps one grant alive and says, on the client's own clock,
/// until when the holder may act. It never compares clocks: it notes the
/// monotonic [`Instant`] *before* each renew, so the lease is held at least until
/// `sent + ttl`, and [`Keeper::safe_until`] is that less a margin (ttl / 10) for
/// clock rate drift and stopping. Only a renew gives that bound, so
/// [`Keeper::start`] renews once first. The loss is final: a refused renew, or the
/// deadline passing (seen by a monitor thread, so a hung renew cannot delay it).
/// Renews are never cancelled: one waiting on a synchronous standby has committed
/// locally, and a cancel would report it done though a failover may lose it.
///
/// ```no_run
/// # fn demo(client: &leasehold::LeaseClient, lease: leasehold::Lease) -> Result<(), Box<dyn std::error::Error>> {
/// let keeper = leasehold::Keeper::start(client, lease)?;
/// if keeper.is_valid() { /* one step, presenting keeper.token() to guards */ }
/// keeper.stop()?;
/// # Ok(()) }
/// ```
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
    /// Nanoseconds after `base` the lease is safe until; 0 once lost or stopped (lock-free).
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
    /// Succeeded after the keeper gave up or began stopping: loss is final.
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

    /// Declares the loss when the deadline passes, however long a renew hangs.
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

    /// Stops the threads and releases, unless a renew already said the lease is gone.
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
        // Pooled connections may still reach a demoted primary: a refused release is
        // resent, and within the pool's size a new connection reaches the writable server.
        let mut attempts = super::schedule::release_attempts(
            usize::try_from(self.pool.max_size()).unwrap_or(usize::MAX),
        );
        loop {
            let answer = with_conn(&self.pool, |conn| {
                finish(lease::release(conn, lease.token()))
            });
            attempts = attempts.saturating_sub(1);
            match answer {
                Err(error) if error.is_read_only_server() && attempts > 0 => continue,
                answer => return answer,
            }
        }
    }
}

impl Keeper {
    /// Keeps `lease` alive with the defaults on `client`'s pool; renews once first.
    pub fn start(client: &LeaseClient, lease: Lease) -> Result<Keeper, LeaseError> {
        Self::builder(client, lease).start()
    }

    /// A builder to change intervals, margin, or observe events.
    /// ```no_run
    /// # fn demo(client: &leasehold::LeaseClient, lease: leasehold::Lease) -> Result<(), leasehold::LeaseError> {
    /// let keeper = leasehold::Keeper::builder(client, lease).margin(std::time::Duration::from_secs(1)).start()?;
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

    /// Until when the holder may act: last renew's send + ttl - margin (monotonic).
    pub fn safe_until(&self) -> Instant {
        lock(&self.shared.state).safe_until
    }

    /// The server's expiry after the last renew, for display.
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        lock(&self.shared.state).expires_at
    }

    /// Whether the lease is safe to act on right now; one atomic load and a clock read.
    pub fn is_valid(&self) -> bool {
        let until = self.shared.valid_until.load(Ordering::SeqCst);
        until != 0 && self.shared.nanos_since_base(Instant::now()) < until
    }

    /// Why the lease is lost, if it is (a passed deadline included).
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

    /// Stops renewing, waits for the threads and releases ([`Release::Refused`] if
    /// already lost); a read-only refusal is resent on another connection.
    pub fn stop(mut self) -> Result<Release, LeaseError> {
        let released = self.shared.stop_and_release();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        released
    }

    /// Stops renewing and keeps the grant, which lapses unless the caller renews or
    /// releases it: for "hold at least" (`leasehold run --hold-at-least`).
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
    /// Stops renewing and releases, best effort, without waiting for a renew in flight.
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = self.shared.stop_and_release();
        }
    }
}
