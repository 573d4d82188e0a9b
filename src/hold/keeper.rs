//! One grant kept alive: the state both faces share, and the sync face's
//! [`Keeper`], whose loops run on threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::heartbeat::{Calls, Heart, Loops, Pulse};
use super::schedule::{lock, Schedule};
use crate::client::LeaseClient;
use crate::error::{LeaseError, Operation, Repr};
use crate::lease::outcome::{Lease, Refusal, Release, Renewal};
use crate::lease::token::FencingToken;
use crate::pool::PgPool;
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

pub(crate) type EventHandler = Box<dyn Fn(&KeeperEvent) + Send + Sync>;

/// What a keeper of one grant is built from, either face's.
pub(crate) struct KeeperSettings {
    pub(crate) lease: Lease,
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) retry_every: Option<Duration>,
    pub(crate) margin: Option<Duration>,
    pub(crate) on_event: Option<EventHandler>,
}

impl std::fmt::Debug for KeeperSettings {
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

impl KeeperSettings {
    /// The defaults for `lease`: its own ttl.
    pub(crate) fn new(lease: Lease) -> Self {
        KeeperSettings {
            ttl: lease.ttl(),
            lease,
            renew_every: None,
            retry_every: None,
            margin: None,
            on_event: None,
        }
    }

    /// Checks the schedule, renews once for the first deadline and starts the
    /// loops where `calls` run: both faces' `start`.
    pub(crate) async fn start(self, calls: Calls) -> Result<(Arc<Shared>, Loops), LeaseError> {
        let schedule =
            Schedule::resolve(self.ttl, self.margin, self.renew_every, self.retry_every)?;
        let base = Instant::now();
        let shared = Arc::new(Shared {
            lease: self.lease,
            calls,
            schedule,
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
            pulse: Pulse::new(),
            on_event: self.on_event,
        });
        if let Some(reason) = shared.renew_once().await? {
            return Err(LeaseError::from(Repr::LeaseNotHeld {
                operation: Operation::RENEW,
                key: shared.lease.key().to_owned(),
                owner: shared.lease.owner().to_owned(),
                epoch: shared.lease.epoch(),
                reason,
            }));
        }
        let loops = Loops::start(&shared, "leasehold-keeper")?;
        Ok((shared, loops))
    }
}

/// The setters of every keeper builder (one grant or a set, either face), written once.
macro_rules! keeper_setters {
    ($event:ty) => {
        /// The ttl each renew asks for (default: the lease's [`Lease::ttl`](crate::Lease::ttl);
        /// for a set, the shortest of its leases').
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.settings.ttl = ttl.into();
            self
        }

        /// Time between renews (default ttl / 3); shorter than ttl - margin.
        pub fn renew_every(mut self, every: std::time::Duration) -> Self {
            self.settings.renew_every = Some(every);
            self
        }

        /// Time between retries of a failed renew (default ttl / 30).
        pub fn retry_every(mut self, every: std::time::Duration) -> Self {
            self.settings.retry_every = Some(every);
            self
        }

        /// How much earlier than `sent + ttl` the deadline lies (default ttl / 10).
        pub fn margin(mut self, margin: std::time::Duration) -> Self {
            self.settings.margin = Some(margin);
            self
        }

        /// Called for every renew, failure and the loss, on the keeper's thread
        /// or task; keep it short.
        pub fn on_event(mut self, handler: impl Fn(&$event) + Send + Sync + 'static) -> Self {
            self.settings.on_event = Some(Box::new(handler));
            self
        }
    };
}
pub(crate) use keeper_setters;

/// The read-only accessors both faces' `Keeper` share, written once.
macro_rules! keeper_accessors {
    () => {
        /// The fencing token of the kept grant, for guards.
        pub fn token(&self) -> &crate::lease::token::FencingToken {
            self.shared.token()
        }

        /// The kept grant as acquired.
        pub fn lease(&self) -> &crate::lease::outcome::Lease {
            self.shared.lease()
        }

        /// The ttl each renew asks for.
        pub fn ttl(&self) -> std::time::Duration {
            self.shared.schedule().ttl
        }

        /// The margin subtracted from `sent + ttl`.
        pub fn margin(&self) -> std::time::Duration {
            self.shared.schedule().margin
        }

        /// Until when the holder may act: last renew's send + ttl - margin (monotonic).
        pub fn safe_until(&self) -> std::time::Instant {
            self.shared.safe_until()
        }

        /// The server's expiry after the last renew, for display.
        pub fn expires_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
            self.shared.expires_at()
        }

        /// Whether the lease is safe to act on right now; one atomic load and a clock read.
        pub fn is_valid(&self) -> bool {
            self.shared.is_valid()
        }

        /// Why the lease is lost, if it is (a passed deadline included).
        pub fn loss(&self) -> Option<crate::hold::LeaseLoss> {
            self.shared.loss()
        }
    };
}
#[cfg(feature = "async")]
pub(crate) use keeper_accessors;

/// Configures a [`Keeper`]; see [`Keeper::builder`].
#[must_use = "a builder does nothing until start() is called"]
pub struct KeeperBuilder {
    pool: PgPool,
    settings: KeeperSettings,
}

impl std::fmt::Debug for KeeperBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.settings.fmt(f)
    }
}

impl KeeperBuilder {
    keeper_setters!(KeeperEvent);

    /// Validates, renews once for the first deadline, starts the threads.
    pub fn start(self) -> Result<Keeper, LeaseError> {
        let (shared, loops) = finish(self.settings.start(Calls::Blocking(self.pool)))?;
        Ok(Keeper {
            shared,
            loops: Some(loops),
        })
    }
}

/// The state of a keeper of one grant, shared by its loops and its face.
pub(crate) struct Shared {
    lease: Lease,
    calls: Calls,
    schedule: Schedule,
    /// Origin of `valid_until`.
    base: Instant,
    /// Nanoseconds after `base` the lease is safe until; 0 once lost or stopped (lock-free).
    valid_until: AtomicU64,
    state: Mutex<State>,
    pulse: Pulse,
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

impl State {
    fn ended(&self) -> bool {
        self.stopping || self.loss.is_some()
    }
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

    /// Sends one renew and records and reports a success; the refusal, if refused.
    async fn renew_once(&self) -> Result<Option<Refusal>, LeaseError> {
        let sent_at = Instant::now();
        let renewal = self
            .calls
            .renew(self.lease.token(), self.schedule.ttl)
            .await?;
        let expires_at = match renewal {
            Renewal::Renewed { expires_at } => expires_at,
            Renewal::Refused(reason) => return Ok(Some(reason)),
        };
        let safe_until = {
            let mut state = lock(&self.state);
            if state.ended() {
                // The loss is final, and a stopping keeper renews no more.
                return Ok(None);
            }
            let safe_until = super::schedule::safe_until(
                sent_at,
                self.schedule.ttl,
                self.schedule.margin,
                state.safe_until,
            );
            state.safe_until = safe_until;
            state.last_sent = sent_at;
            state.expires_at = Some(expires_at);
            state.last_error = None;
            self.valid_until
                .store(self.nanos_since_base(safe_until), Ordering::SeqCst);
            safe_until
        };
        self.pulse.notify();
        self.emit(&KeeperEvent::Renewed {
            sent_at,
            expires_at,
            safe_until,
        });
        Ok(None)
    }

    /// Records the loss (first one wins) and reports it.
    fn declare_lost(&self, loss: LeaseLoss) {
        {
            let mut state = lock(&self.state);
            if state.ended() {
                return;
            }
            state.loss = Some(loss.clone());
            self.valid_until.store(0, Ordering::SeqCst);
        }
        self.pulse.notify();
        crate::telemetry::lease_lost(&self.lease, loss.reason(), &loss);
        self.emit(&KeeperEvent::Lost(loss));
    }

    /// Marks the keeper stopping; the refusal if a renew already said the lease is gone.
    pub(crate) fn begin_stop(&self) -> Option<Refusal> {
        let refused = {
            let mut state = lock(&self.state);
            state.stopping = true;
            self.valid_until.store(0, Ordering::SeqCst);
            match &state.loss {
                Some(LeaseLoss::Refused(reason)) => Some(*reason),
                _ => None,
            }
        };
        self.pulse.notify();
        refused
    }

    /// Releases the grant unless a renew said it is gone ([`Release::Refused`]).
    pub(crate) async fn release(&self, refused: Option<Refusal>) -> Result<Release, LeaseError> {
        if let Some(reason) = refused {
            return Ok(Release::Refused(reason));
        }
        let token = self.lease.token().clone();
        self.calls
            .within(
                self.stop_bound(),
                Operation::RELEASE,
                self.lease.key(),
                |calls| async move { calls.release(&token).await },
            )
            .await
    }

    /// The loss, once there is one; `None` once stopped without one or at `until`.
    pub(crate) async fn loss_within(&self, until: Option<Instant>) -> Option<LeaseLoss> {
        loop {
            let seen = self.pulse.seen();
            {
                let state = lock(&self.state);
                if let Some(loss) = &state.loss {
                    return Some(loss.clone());
                }
                if state.stopping || until.is_some_and(|until| Instant::now() >= until) {
                    return None;
                }
            }
            self.pulse.wait(&self.calls, seen, until).await;
        }
    }

    pub(crate) fn token(&self) -> &FencingToken {
        self.lease.token()
    }

    pub(crate) fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    pub(crate) fn safe_until(&self) -> Instant {
        lock(&self.state).safe_until
    }

    pub(crate) fn expires_at(&self) -> Option<DateTime<Utc>> {
        lock(&self.state).expires_at
    }

    pub(crate) fn is_valid(&self) -> bool {
        let until = self.valid_until.load(Ordering::SeqCst);
        until != 0 && self.nanos_since_base(Instant::now()) < until
    }

    pub(crate) fn loss(&self) -> Option<LeaseLoss> {
        let state = lock(&self.state);
        if let Some(loss) = &state.loss {
            return Some(loss.clone());
        }
        (!state.stopping && Instant::now() >= state.safe_until).then(|| LeaseLoss::DeadlinePassed {
            last_error: state.last_error.clone(),
        })
    }
}

/// A cancellation wakes whatever waits on the keeper's pulse (a work's sleep).
impl super::cancel::Wake for Shared {
    fn wake(&self) {
        self.pulse.notify();
    }
}

impl Shared {
    /// Until `duration` passes, or the work must stop (the lease lost, its
    /// safe deadline passed, or `cancelled`): both faces' `WorkContext::sleep`.
    pub(crate) async fn sleep_while_held(
        self: &Arc<Self>,
        duration: Duration,
        cancel: Option<&super::cancel::CancelToken>,
        stop_reason: impl Fn() -> Option<super::worker::StopReason>,
    ) -> Result<(), super::worker::StopReason> {
        let until = Instant::now() + duration;
        let waker: Arc<dyn super::cancel::Wake> = self.clone();
        let _registration = cancel.map(|cancel| cancel.register(Arc::downgrade(&waker)));
        loop {
            let seen = self.pulse.seen();
            if let Some(reason) = stop_reason() {
                return Err(reason);
            }
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            // The safe deadline ends the sleep even before the monitor says so.
            let wake_at = until.min(self.safe_until().max(now));
            self.pulse.wait(&self.calls, seen, Some(wake_at)).await;
        }
    }
}

/// Both faces' `Keeper` print as this.
impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("token", self.token())
            .field("valid", &self.is_valid())
            .field("loss", &self.loss())
            .finish()
    }
}

impl Heart for Shared {
    fn pulse(&self) -> &Pulse {
        &self.pulse
    }

    fn calls(&self) -> &Calls {
        &self.calls
    }

    fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    fn over(&self) -> bool {
        lock(&self.state).ended()
    }

    fn last_sent(&self) -> Instant {
        lock(&self.state).last_sent
    }

    async fn beat(&self) -> Result<bool, LeaseError> {
        match self.renew_once().await? {
            Some(reason) => {
                self.declare_lost(LeaseLoss::Refused(reason));
                Ok(false)
            }
            None => Ok(!self.over()),
        }
    }

    fn beat_failed(&self, error: Arc<LeaseError>) {
        lock(&self.state).last_error = Some(error.clone());
        self.emit(&KeeperEvent::RenewFailed { error });
    }

    fn deadline(&self) -> (Instant, Option<Arc<LeaseError>>) {
        let state = lock(&self.state);
        (state.safe_until, state.last_error.clone())
    }

    fn deadline_passed(&self, last_error: Option<Arc<LeaseError>>) {
        self.declare_lost(LeaseLoss::DeadlinePassed { last_error });
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
    /// `None` once stopped.
    loops: Option<Loops>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
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
            settings: KeeperSettings::new(lease),
        }
    }

    keeper_accessors!();

    /// The state the work's context reads.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Blocks until the lease is lost or `timeout` passes; returns the loss.
    pub fn wait_for_loss(&self, timeout: Duration) -> Option<LeaseLoss> {
        finish(self.shared.loss_within(Some(Instant::now() + timeout)))
    }

    /// Stops renewing, releases ([`Release::Refused`] if already lost; a
    /// read-only refusal is resent on another connection) and waits for the
    /// threads.
    /// Within the stop bound, whatever the database does (down, silent,
    /// refusing): until the safe deadline, or the margin once it has passed.
    /// A release not answered by then finishes on its own and this answers
    /// [`ErrorKind::TimedOut`](crate::ErrorKind::TimedOut); the lease lapses at its ttl.
    pub fn stop(mut self) -> Result<Release, LeaseError> {
        let deadline = self.shared.stop_deadline();
        let refused = self.shared.begin_stop();
        let released = finish(self.shared.release(refused));
        if let Some(loops) = self.loops.take() {
            finish(loops.join_until(deadline));
        }
        released
    }

    /// Stops renewing and keeps the grant, which lapses unless the caller renews or
    /// releases it: for "hold at least" (`leasehold run --hold-at-least`).
    pub fn stop_renewing(mut self) -> Lease {
        let deadline = self.shared.stop_deadline();
        self.shared.begin_stop();
        if let Some(loops) = self.loops.take() {
            finish(loops.join_until(deadline));
        }
        self.shared.lease().clone()
    }
}

impl Drop for Keeper {
    /// Stops renewing and releases, best effort, without waiting for a renew in flight.
    fn drop(&mut self) {
        release_on_drop(&self.shared, self.loops.take());
    }
}

/// Both faces' drop: stop, and release unless stopped already or lost by refusal.
pub(crate) fn release_on_drop(shared: &Arc<Shared>, loops: Option<Loops>) {
    let Some(loops) = loops else {
        return;
    };
    let refused = shared.begin_stop();
    let shared = shared.clone();
    loops.release_when_done(async move {
        let _ = shared.release(refused).await;
    });
}
