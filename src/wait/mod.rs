//! Blocking acquire without holding a transaction or a connection: a
//! [`LeaseWaiter`] tries once, registers the key with the process's shared
//! listener, and sleeps until a release notification, the holder's expiry, the
//! deadline, cancellation or a re-check; missed notifications fall back to polling
//! ([`ListenerStatus::wake_mode`]). Each attempt is an ordinary autocommitted
//! `lease.acquire`, so a forged notification costs one attempt and nothing is
//! queued (no fairness).
//!
//! ```no_run
//! # fn demo(client: &leasehold::LeaseClient) -> Result<(), leasehold::LeaseError> {
//! use std::time::Duration;
//! use leasehold::wait::{LeaseWaiter, Wait};
//! let waiter = LeaseWaiter::new(client);
//! let lease = waiter.acquire("job-42", "worker-a1", Duration::from_secs(30), Wait::AtMost(Duration::from_secs(5)))?;
//! # let _ = lease; Ok(()) }
//! ```

use crate::error::Repr;
use diesel::sql_types::{Bool, Double, Nullable, Text};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::LeaseClient;
use crate::error::{ErrorKind, LeaseError, Operation};
use crate::hold::cancel::{CancelToken, Wake};
use crate::lease;
use crate::lease::outcome::{Acquisition, Lease};
use crate::pool::{with_conn_within, PgPool};
use crate::sql::execute::{finish, Execute};
use crate::telemetry;

pub(crate) mod changes;
pub(crate) mod listener;
mod releases;
mod session;
pub(crate) mod shared;
pub(crate) mod slot;

use listener::Listener;
pub use releases::{ReleaseEvent, ReleaseWatch};
pub use shared::{
    ListenerStatus, PollingReason, WakeMode, LISTENER_APPLICATION_NAME, UNDELIVERED_RETRY,
};
use slot::Woken;

crate::sql::calls::lease_call! {
    /// `lease.inspect(key)` plus the holder's remaining seconds on the server's
    /// clock, so a waiter can sleep until expiry without comparing clocks.
    RemainingCall { key: &'a str => Text }
    sql = "SELECT held, EXTRACT(epoch FROM expires_at - clock_timestamp())::float8 FROM lease.inspect";
    row = (Bool, Nullable<Double>);
    rust = (bool, Option<f64>);
}

/// Default [`LeaseWaiterBuilder::fallback_poll`].
pub const DEFAULT_FALLBACK_POLL: Duration = Duration::from_millis(100);
/// Default [`LeaseWaiterBuilder::recheck_every`].
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(5);
/// How many keys one listener session may register (the server's
/// `lease._waiter_limit()`); more are polled ([`PollingReason::WaiterLimit`]).
pub const WAITER_LIMIT: usize = 10_000;
/// The least an attempt of a bounded wait may wait for a pooled connection
/// (the time to open one), even when the wait has less left.
pub const ATTEMPT_CHECKOUT_FLOOR: Duration = Duration::from_secs(1);
/// Added to a holder's remaining time so the retry lands after the expiry.
pub(crate) const EXPIRY_SLACK: Duration = Duration::from_micros(300);

/// How long a blocking acquire may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wait {
    /// Give up with [`ErrorKind::TimedOut`] after this long (zero: one
    /// attempt). With the database down, each attempt waits for a pooled
    /// connection at most what is left (at least [`ATTEMPT_CHECKOUT_FLOOR`]).
    AtMost(Duration),
    /// Wait until granted or cancelled through a [`CancelToken`].
    UntilCancelled,
}

impl From<Duration> for Wait {
    fn from(wait: Duration) -> Self {
        Wait::AtMost(wait)
    }
}

/// A waiter's acquire, as telemetry counts it.
impl telemetry::Outcome for Result<Lease, LeaseError> {
    fn outcome(&self) -> &'static str {
        match self {
            Ok(_) => "granted",
            Err(error) if error.kind() == ErrorKind::TimedOut => "timed_out",
            Err(error) if error.kind() == ErrorKind::Cancelled => "cancelled",
            Err(_) => "error",
        }
    }
    fn epoch(&self) -> Option<i64> {
        self.as_ref().ok().map(|lease| lease.epoch().get())
    }
}

/// Blocking acquire that waits on release notifications instead of polling.
/// Clones (and all waiters of the process for a URL) share one listener session.
#[derive(Clone)]
pub struct LeaseWaiter {
    client: LeaseClient,
    pool: PgPool,
    listener: Arc<Listener>,
    fallback_poll: Duration,
    recheck_every: Duration,
}

/// The setters both faces' waiter builders share, written once.
macro_rules! waiter_setters {
    () => {
        /// Poll interval while the listener is disconnected (default 100 ms).
        pub fn fallback_poll(mut self, every: std::time::Duration) -> Self {
            self.fallback_poll = every;
            self
        }

        /// Safety-net re-check interval while the listener is connected (default 5 s),
        /// should both the notification and the expiry wake-up fail to come.
        pub fn recheck_every(mut self, every: std::time::Duration) -> Self {
            self.recheck_every = every;
            self
        }
    };
}
#[cfg(feature = "async")]
pub(crate) use waiter_setters;

/// The listener accessors both faces' waiters share, written once.
macro_rules! waiter_accessors {
    () => {
        /// Change notifications of `key` on this waiter's listener, for an observer.
        pub(crate) fn key_changes(&self, key: &str) -> crate::wait::changes::KeyChanges {
            crate::wait::changes::KeyChanges::start(self.listener.clone(), key)
        }

        /// The fallback poll and the safety-net re-check, for an observer.
        pub(crate) fn intervals(&self) -> (std::time::Duration, std::time::Duration) {
            (self.fallback_poll, self.recheck_every)
        }

        /// The shared listener's state.
        pub fn listener_status(&self) -> crate::wait::ListenerStatus {
            self.listener.status()
        }

        /// How many waiters of this process are blocked on `key`, armed; for tests and monitoring.
        pub fn armed_waiters(&self, key: &str) -> usize {
            self.listener.armed_waiters(key)
        }
    };
}
#[cfg(feature = "async")]
pub(crate) use waiter_accessors;

/// Both faces' `ensure_listening`: blocks until `listener` delivers, or says why not.
pub(crate) fn ensure_listening(listener: &Listener, timeout: Duration) -> Result<(), LeaseError> {
    listener.wait_delivering(timeout).map_err(|status| {
        LeaseError::from(Repr::NotListening {
            wake_mode: format!("{:?}", status.wake_mode),
            last_error: status.last_error.clone(),
        })
    })
}

/// Both faces' `LeaseWaiter` print as this.
pub(crate) fn debug_waiter(
    f: &mut std::fmt::Formatter<'_>,
    listener: &Listener,
    fallback_poll: Duration,
    recheck_every: Duration,
) -> std::fmt::Result {
    f.debug_struct("LeaseWaiter")
        .field("listener", &listener.status())
        .field("fallback_poll", &fallback_poll)
        .field("recheck_every", &recheck_every)
        .finish()
}

impl std::fmt::Debug for LeaseWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_waiter(f, &self.listener, self.fallback_poll, self.recheck_every)
    }
}

/// Configures a [`LeaseWaiter`].
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct LeaseWaiterBuilder {
    client: LeaseClient,
    fallback_poll: Duration,
    recheck_every: Duration,
}

impl LeaseWaiterBuilder {
    waiter_setters!();

    /// Builds the waiter (the listener connects in the background); zero intervals become 1 ms.
    pub fn build(self) -> LeaseWaiter {
        let floor = Duration::from_millis(1);
        LeaseWaiter {
            listener: Listener::for_url(self.client.listen_url()),
            pool: self.client.pool().clone(),
            client: self.client,
            fallback_poll: self.fallback_poll.max(floor),
            recheck_every: self.recheck_every.max(floor),
        }
    }
}

impl LeaseWaiter {
    /// A waiter on `client`'s pool whose listener session goes to the client's
    /// [`listen_url`](crate::LeaseClientBuilder::listen_url).
    pub fn new(client: &LeaseClient) -> Self {
        Self::builder(client).build()
    }

    /// A builder with non-default intervals.
    pub fn builder(client: &LeaseClient) -> LeaseWaiterBuilder {
        LeaseWaiterBuilder {
            client: client.clone(),
            fallback_poll: DEFAULT_FALLBACK_POLL,
            recheck_every: DEFAULT_RECHECK,
        }
    }

    /// The client attempts run on (also what a [`crate::Keeper`] is built from).
    pub fn client(&self) -> &LeaseClient {
        &self.client
    }

    waiter_accessors!();

    /// Blocks until the listener is up or `timeout` passes; for start-up checks
    /// (waiting works without it, by polling).
    pub fn wait_until_listening(&self, timeout: Duration) -> bool {
        self.listener.wait_connected(timeout)
    }

    /// [`LeaseWaiter::wait_until_listening`] with the reason: fails as soon as the
    /// session fails its delivery check (a transaction-mode pooler), which takes up
    /// to ten seconds, so give more than that.
    pub fn ensure_listening(&self, timeout: Duration) -> Result<(), LeaseError> {
        ensure_listening(&self.listener, timeout)
    }

    /// Watches `keys` (up to [`WAITER_LIMIT`]) for releases without acquiring them,
    /// through this waiter's listener: [`ReleaseEvent::Released`] per release,
    /// [`ReleaseEvent::Resync`] when some may have been missed. Call
    /// [`ReleaseWatch::wait_armed`] before reading the keys' state.
    ///
    /// ```no_run
    /// # fn demo(waiter: &leasehold::wait::LeaseWaiter) -> Result<(), leasehold::LeaseError> {
    /// let watch = waiter.watch_releases(["job-1", "job-2"])?;
    /// watch.wait_armed(std::time::Duration::from_secs(15)); // then read the keys' state
    /// for event in watch { println!("{event:?}") }
    /// # Ok(()) }
    /// ```
    pub fn watch_releases<I, K>(&self, keys: I) -> Result<ReleaseWatch, LeaseError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        ReleaseWatch::start(self.listener.clone(), keys)
    }

    /// Acquires `key` for `owner` for `ttl`, waiting as `wait` says; to be able to
    /// stop [`Wait::UntilCancelled`], use [`LeaseWaiter::acquire_cancellable`].
    pub fn acquire(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: impl Into<Wait>,
    ) -> Result<Lease, LeaseError> {
        let wait = wait.into();
        finish(telemetry::wait(key, owner, async {
            self.acquire_inner(key, owner, ttl, wait, None)
        }))
    }

    /// [`LeaseWaiter::acquire`] answering [`ErrorKind::Cancelled`] as soon as
    /// `cancel` is cancelled from any thread.
    /// ```no_run
    /// # fn demo(waiter: leasehold::wait::LeaseWaiter, cancel: leasehold::hold::CancelToken) {
    /// let ttl = std::time::Duration::from_secs(30);
    /// let result = waiter.acquire_cancellable("job-42", "w1", ttl, leasehold::wait::Wait::UntilCancelled, &cancel);
    /// # let _ = result; }
    /// ```
    pub fn acquire_cancellable(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: impl Into<Wait>,
        cancel: &CancelToken,
    ) -> Result<Lease, LeaseError> {
        let wait = wait.into();
        finish(telemetry::wait(key, owner, async {
            self.acquire_inner(key, owner, ttl, wait, Some(cancel))
        }))
    }

    fn acquire_inner(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Wait,
        cancel: Option<&CancelToken>,
    ) -> Result<Lease, LeaseError> {
        let mut rounds = Rounds::new(key, wait, self.fallback_poll, self.recheck_every);
        let cancelled = || cancel.is_some_and(CancelToken::is_cancelled);
        if cancelled() {
            return Err(rounds.cancelled());
        }
        // Fast path: a free key costs one round trip and no registration. A
        // database not reached is tried again in the rounds, until the bound.
        match self.attempt(key, owner, ttl, rounds.checkout_bound()) {
            Ok(Acquisition::Granted(lease)) => return Ok(lease),
            Ok(Acquisition::Denied) => {}
            Err(error) if error.is_connection_error() => {}
            Err(error) => return Err(error),
        }
        let watch = self.listener.watch(key);
        let slot = watch.slot().clone();
        let waker: Arc<dyn Wake> = slot.clone();
        let _registration = cancel.map(|c| c.register(Arc::downgrade(&waker)));
        loop {
            if cancelled() {
                return Err(rounds.cancelled());
            }
            let seen = slot.seq();
            let step = self.attempt_and_inspect(key, owner, ttl, rounds.checkout_bound());
            match rounds.after(step, || slot.is_armed(seen)) {
                Round::Granted(lease) => return Ok(lease),
                Round::Failed(error) => return Err(error),
                Round::Again => continue,
                Round::Sleep(wake_at) => {
                    let woken = slot.wait(seen, wake_at, cancel);
                    telemetry::waiter_woke(woken.cause());
                    if woken == Woken::Cancelled {
                        return Err(rounds.cancelled());
                    }
                }
            }
        }
    }

    fn attempt(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        bound: Option<Duration>,
    ) -> Result<Acquisition, LeaseError> {
        with_conn_within(&self.pool, bound, |conn| {
            finish(lease::acquire(conn, key, owner, ttl))
        })
    }

    /// One attempt; when denied, the holder's remaining time on the server's clock.
    fn attempt_and_inspect(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        bound: Option<Duration>,
    ) -> Result<Step, LeaseError> {
        with_conn_within(&self.pool, bound, |conn| {
            finish(attempt_step(conn, key, owner, ttl))
        })
    }
}

/// One attempt of either face's waiter; when denied, the holder's remaining time.
pub(crate) async fn attempt_step(
    conn: &mut impl Execute,
    key: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Step, LeaseError> {
    if let Acquisition::Granted(lease) = lease::acquire(conn, key, owner, ttl).await? {
        return Ok(Step::Granted(lease));
    }
    Ok(match holder_remaining(conn, key).await? {
        Some(remaining) => Step::Held { remaining },
        None => Step::Unowned,
    })
}

/// How long the holder of `key` has left on the server's clock; `None` when
/// nobody holds it.
pub(crate) async fn holder_remaining(
    conn: &mut impl Execute,
    key: &str,
) -> Result<Option<Duration>, LeaseError> {
    let row = conn
        .load(RemainingCall {
            key,
            _borrow: std::marker::PhantomData,
        })
        .await
        .map_err(|error| {
            LeaseError::from_diesel(Operation::INSPECT, error, key, Duration::ZERO, true)
        })?
        .into_iter()
        .next();
    Ok(match row {
        Some((true, Some(seconds))) if seconds > 0.0 => {
            Some(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
        }
        _ => None,
    })
}

/// The waiting rules between attempts, shared by both faces' waiters.
pub(crate) struct Rounds<'k> {
    key: &'k str,
    started: Instant,
    deadline: Option<Instant>,
    /// Consecutive "free a moment ago, yet denied" rounds, bounded so a flipping key cannot spin.
    immediate_retries: u32,
    /// The last attempt's connection error, the answer if the wait ends before the database is back.
    unreached: Option<LeaseError>,
    fallback_poll: Duration,
    recheck_every: Duration,
}

/// What a waiter does after an attempt ([`Rounds::after`]).
pub(crate) enum Round {
    /// The attempt was granted.
    Granted(Lease),
    /// Try again at once.
    Again,
    /// Sleep until the key's slot moves or this instant passes.
    Sleep(Instant),
    /// Give up with this error.
    Failed(LeaseError),
}

impl<'k> Rounds<'k> {
    /// The rules of one wait for `key`, starting now.
    pub(crate) fn new(
        key: &'k str,
        wait: Wait,
        fallback_poll: Duration,
        recheck_every: Duration,
    ) -> Self {
        let started = Instant::now();
        Rounds {
            key,
            started,
            deadline: match wait {
                Wait::AtMost(limit) => Some(started + limit),
                Wait::UntilCancelled => None,
            },
            immediate_retries: 0,
            unreached: None,
            fallback_poll,
            recheck_every,
        }
    }

    /// How long an attempt may wait for a pooled connection: what is left
    /// of the wait, but at least [`ATTEMPT_CHECKOUT_FLOOR`], so the last
    /// attempt can still connect; without a deadline, the pool's own timeout.
    pub(crate) fn checkout_bound(&self) -> Option<Duration> {
        self.deadline.map(|deadline| {
            deadline
                .saturating_duration_since(Instant::now())
                .max(ATTEMPT_CHECKOUT_FLOOR)
        })
    }

    /// The error of a wait cancelled now.
    pub(crate) fn cancelled(&self) -> LeaseError {
        LeaseError::from(Repr::Cancelled {
            operation: Operation::ACQUIRE,
            key: self.key.to_owned(),
        })
    }

    /// What to do after an attempt that found `step`; `armed`: it followed the key's
    /// registration in the current session, so a release will notify.
    pub(crate) fn after(
        &mut self,
        step: Result<Step, LeaseError>,
        armed: impl FnOnce() -> bool,
    ) -> Round {
        let holder_left = match step {
            Ok(Step::Granted(lease)) => return Round::Granted(lease),
            Ok(Step::Held { remaining }) => Some(remaining),
            Ok(Step::Unowned) => Some(Duration::ZERO),
            // The database is not reached: try again until the wait's bound.
            Err(error) if error.is_connection_error() => {
                self.unreached = Some(error);
                None
            }
            Err(error) => return Round::Failed(error),
        };
        if holder_left.is_some() {
            self.unreached = None;
        }
        let now = Instant::now();
        if self.deadline.is_some_and(|d| now >= d) {
            if let Some(error) = self.unreached.take() {
                return Round::Failed(error);
            }
            return Round::Failed(LeaseError::from(Repr::TimedOut {
                operation: Operation::ACQUIRE,
                key: self.key.to_owned(),
                waited: self.started.elapsed(),
            }));
        }
        if holder_left == Some(Duration::ZERO) && self.immediate_retries < 3 {
            // Free or lapsed a moment ago: try again at once.
            self.immediate_retries += 1;
            return Round::Again;
        }
        self.immediate_retries = 0;
        // Only an armed key is woken by its release; any other waiter polls.
        let poll = if holder_left.is_some() && armed() {
            self.recheck_every
        } else {
            self.fallback_poll
        };
        let mut wake_at = now + poll;
        if let Some(remaining) = holder_left {
            wake_at = wake_at.min(now + remaining + EXPIRY_SLACK);
        }
        if let Some(deadline) = self.deadline {
            wake_at = wake_at.min(deadline);
        }
        Round::Sleep(wake_at)
    }
}

/// What one attempt of a waiter found.
pub(crate) enum Step {
    Granted(Lease),
    Held { remaining: Duration },
    Unowned,
}
