//! [`Keeper`] as tokio tasks: the sync [`crate::Keeper`]'s rules from the same code
//! (`hold::schedule`, `lease::renew`), its renewer and monitor as tasks woken by a
//! `watch`, the loss as a future to `select!` on. Nothing cancels a renew in flight.
//!
//! ```no_run
//! # async fn demo(client: &leasehold::aio::AsyncLeaseClient, lease: leasehold::Lease) -> Result<(), Box<dyn std::error::Error>> {
//! let keeper = leasehold::aio::Keeper::start(client, lease).await?;
//! tokio::select! { loss = keeper.lost() => eprintln!("lost: {loss:?}"), () = async { /* work */ } => {} }
//! keeper.stop().await?;
//! # Ok(()) }
//! ```

use crate::error::{Operation, Repr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::client::{checkout, settle, AsyncLeaseClient};
use crate::error::LeaseError;
use crate::hold::schedule::{self, Schedule};
use crate::hold::LeaseLoss;
use crate::lease::outcome::{Lease, Refusal, Release, Renewal};
use crate::lease::token::FencingToken;

/// What the keeper's tasks share, and what its receivers watch.
#[derive(Debug, Clone)]
struct State {
    safe_until: Instant,
    last_sent: Instant,
    expires_at: Option<DateTime<Utc>>,
    loss: Option<LeaseLoss>,
    last_error: Option<Arc<LeaseError>>,
    stopping: bool,
}

impl State {
    /// Whether the keeper's tasks are done: lost or stopping.
    fn ended(&self) -> bool {
        self.stopping || self.loss.is_some()
    }
}

/// Configures a [`Keeper`]; see [`Keeper::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until start() is called"]
pub struct KeeperBuilder {
    client: AsyncLeaseClient,
    lease: Lease,
    ttl: Duration,
    renew_every: Option<Duration>,
    retry_every: Option<Duration>,
    margin: Option<Duration>,
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

    /// Validates, renews once for the first deadline, spawns the two tasks.
    pub async fn start(self) -> Result<Keeper, LeaseError> {
        let schedule =
            Schedule::resolve(self.ttl, self.margin, self.renew_every, self.retry_every)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|error| {
            LeaseError::from(Repr::Spawn(std::io::Error::other(format!(
                "an async keeper runs on a tokio runtime: {error}"
            ))))
        })?;
        let base = Instant::now();
        let (state, _) = watch::channel(State {
            safe_until: base,
            last_sent: base,
            expires_at: None,
            loss: None,
            last_error: None,
            stopping: false,
        });
        let shared = Arc::new(Shared {
            lease: self.lease,
            client: self.client,
            schedule,
            base,
            valid_until: AtomicU64::new(0),
            state,
        });
        // The first deadline comes from a renew sent now.
        match shared.renew_once().await? {
            RenewResult::Renewed | RenewResult::Ignored => {}
            RenewResult::Refused(reason) => {
                return Err(LeaseError::from(Repr::LeaseNotHeld {
                    operation: Operation::Renew,
                    key: shared.lease.key().to_owned(),
                    owner: shared.lease.owner().to_owned(),
                    epoch: shared.lease.epoch(),
                    reason,
                }))
            }
        }
        let renewer = runtime.spawn(shared.clone().renew_loop());
        let monitor = runtime.spawn(shared.clone().monitor_loop());
        Ok(Keeper {
            shared,
            tasks: vec![renewer, monitor],
        })
    }
}

/// Keeps one grant alive with a renewer and a deadline monitor task, by the sync
/// [`crate::Keeper`]'s rules; [`Keeper::lost`] is the loss as a future. Dropping it
/// stops the tasks and releases from a task of its own, best effort.
pub struct Keeper {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
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

pub(super) struct Shared {
    client: AsyncLeaseClient,
    lease: Lease,
    schedule: Schedule,
    /// Origin of `valid_until`.
    base: Instant,
    /// Nanoseconds after `base` the lease is safe until; 0 once lost or stopped (lock-free).
    valid_until: AtomicU64,
    state: watch::Sender<State>,
}

enum RenewResult {
    Renewed,
    Refused(Refusal),
    /// Succeeded after the keeper gave up or began stopping: loss is final.
    Ignored,
}

impl Shared {
    /// See [`Keeper::is_valid`].
    pub(super) fn is_valid(&self) -> bool {
        let until = self.valid_until.load(Ordering::SeqCst);
        until != 0 && self.nanos_since_base(Instant::now()) < until
    }

    /// See [`Keeper::loss`].
    pub(super) fn loss(&self) -> Option<LeaseLoss> {
        let state = self.state.borrow();
        if let Some(loss) = &state.loss {
            return Some(loss.clone());
        }
        (!state.stopping && Instant::now() >= state.safe_until).then(|| LeaseLoss::DeadlinePassed {
            last_error: state.last_error.clone(),
        })
    }

    /// See [`Keeper::lost`].
    pub(super) fn lost(
        &self,
    ) -> impl std::future::Future<Output = Option<LeaseLoss>> + Send + 'static {
        let mut changes = self.state.subscribe();
        async move {
            let state = changes.wait_for(State::ended).await.ok()?;
            state.loss.clone()
        }
    }

    /// See [`Keeper::token`].
    pub(super) fn token(&self) -> &FencingToken {
        self.lease.token()
    }

    /// See [`Keeper::safe_until`].
    pub(super) fn safe_until(&self) -> Instant {
        self.state.borrow().safe_until
    }

    fn nanos_since_base(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Sends one renew and records a success.
    async fn renew_once(&self) -> Result<RenewResult, LeaseError> {
        let sent_at = Instant::now();
        let mut conn = checkout(&self.client.pool).await?;
        let renewal = crate::lease::renew(&mut *conn, self.lease.token(), self.schedule.ttl).await;
        settle(conn, &renewal);
        match renewal? {
            Renewal::Renewed { expires_at } => {
                let mut renewed = false;
                self.state.send_if_modified(|state| {
                    if state.ended() {
                        return false;
                    }
                    let safe_until = schedule::safe_until(
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
                    renewed = true;
                    true
                });
                Ok(if renewed {
                    RenewResult::Renewed
                } else {
                    RenewResult::Ignored
                })
            }
            Renewal::Refused(reason) => Ok(RenewResult::Refused(reason)),
        }
    }

    /// Records the loss (first one wins) and reports it.
    fn declare_lost(&self, loss: LeaseLoss) {
        let declared = self.state.send_if_modified(|state| {
            if state.ended() {
                return false;
            }
            state.loss = Some(loss.clone());
            self.valid_until.store(0, Ordering::SeqCst);
            true
        });
        if declared {
            crate::telemetry::lease_lost(&self.lease, loss.reason(), &loss);
        }
    }

    /// Renews every `renew_every`, retrying failures, until lost or stopped.
    async fn renew_loop(self: Arc<Self>) {
        let mut changes = self.state.subscribe();
        let mut next = changes.borrow().last_sent + self.schedule.renew_every;
        loop {
            loop {
                if changes.borrow_and_update().ended() {
                    return;
                }
                if Instant::now() >= next {
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(next.into()) => {}
                    changed = changes.changed() => if changed.is_err() { return },
                }
            }
            match self.renew_once().await {
                Ok(RenewResult::Renewed) => {
                    next = self.state.borrow().last_sent + self.schedule.renew_every;
                }
                Ok(RenewResult::Refused(reason)) => {
                    self.declare_lost(LeaseLoss::Refused(reason));
                    return;
                }
                Ok(RenewResult::Ignored) => return,
                Err(error) => {
                    let error = Arc::new(error);
                    self.state
                        .send_modify(|state| state.last_error = Some(error));
                    next = Instant::now() + self.schedule.retry_every;
                }
            }
        }
    }

    /// Declares the loss when the deadline passes, however long a renew hangs.
    async fn monitor_loop(self: Arc<Self>) {
        let mut changes = self.state.subscribe();
        loop {
            let (safe_until, last_error) = {
                let state = changes.borrow_and_update();
                if state.ended() {
                    return;
                }
                (state.safe_until, state.last_error.clone())
            };
            if Instant::now() >= safe_until {
                self.declare_lost(LeaseLoss::DeadlinePassed { last_error });
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(safe_until.into()) => {}
                changed = changes.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Marks the keeper stopping; the refusal if a renew already said the lease is gone.
    fn begin_stop(&self) -> Option<Refusal> {
        let mut refused = None;
        self.state.send_modify(|state| {
            state.stopping = true;
            self.valid_until.store(0, Ordering::SeqCst);
            if let Some(LeaseLoss::Refused(reason)) = &state.loss {
                refused = Some(*reason);
            }
        });
        refused
    }

    /// Releases, resending after a read-only refusal as the sync keeper does.
    async fn release(&self) -> Result<Release, LeaseError> {
        let mut attempts = schedule::release_attempts(self.client.pool.status().max_size);
        loop {
            let mut conn = checkout(&self.client.pool).await?;
            let answer = crate::lease::release(&mut *conn, self.lease.token()).await;
            settle(conn, &answer);
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
    pub async fn start(client: &AsyncLeaseClient, lease: Lease) -> Result<Keeper, LeaseError> {
        Self::builder(client, lease).start().await
    }

    /// A builder to change the intervals or the margin.
    pub fn builder(client: &AsyncLeaseClient, lease: Lease) -> KeeperBuilder {
        KeeperBuilder {
            client: client.clone(),
            ttl: lease.ttl(),
            lease,
            renew_every: None,
            retry_every: None,
            margin: None,
        }
    }

    /// The fencing token of the kept grant, for guards.
    pub fn token(&self) -> &FencingToken {
        self.shared.token()
    }

    /// The kept grant as acquired.
    pub fn lease(&self) -> &Lease {
        &self.shared.lease
    }

    /// Until when the holder may act: last renew's send + ttl - margin (monotonic).
    pub fn safe_until(&self) -> Instant {
        self.shared.safe_until()
    }

    /// The server's expiry after the last renew, for display.
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.shared.state.borrow().expires_at
    }

    /// Whether the lease is safe to act on right now; one atomic load and a clock read.
    pub fn is_valid(&self) -> bool {
        self.shared.is_valid()
    }

    /// Why the lease is lost, if it is (a passed deadline included).
    pub fn loss(&self) -> Option<LeaseLoss> {
        self.shared.loss()
    }

    /// Resolves with the loss, for `select!` beside the work; `None` once stopped
    /// without one. Cancel-safe.
    pub fn lost(&self) -> impl std::future::Future<Output = Option<LeaseLoss>> + Send + 'static {
        self.shared.lost()
    }

    /// The shared state, for `run_while_held`'s context, which must not borrow the keeper.
    pub(super) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Stops renewing, waits for the tasks and releases; [`Release::Refused`] if already lost.
    pub async fn stop(mut self) -> Result<Release, LeaseError> {
        let refused = self.shared.begin_stop();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        if let Some(reason) = refused {
            return Ok(Release::Refused(reason));
        }
        self.shared.release().await
    }

    /// Stops renewing and keeps the grant, which lapses unless the caller renews or releases it.
    pub async fn stop_renewing(mut self) -> Lease {
        self.shared.begin_stop();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        self.shared.lease.clone()
    }
}

impl Drop for Keeper {
    /// Stops the tasks and releases from a task of its own (best effort).
    fn drop(&mut self) {
        if self.tasks.is_empty() {
            return;
        }
        let refused = self.shared.begin_stop();
        let tasks: Vec<JoinHandle<()>> = self.tasks.drain(..).collect();
        let shared = self.shared.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn(async move {
                for task in tasks {
                    let _ = task.await;
                }
                if refused.is_none() {
                    let _ = shared.release().await;
                }
            }));
        }
    }
}
