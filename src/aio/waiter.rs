//! [`LeaseWaiter`] for tasks: parks on the key's slot through a `Notify` instead of
//! a thread, on the sync waiters' shared listener, with their attempt and rounds code.
//!
//! ```no_run
//! # async fn demo(client: &leasehold::aio::AsyncLeaseClient) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! let waiter = leasehold::aio::LeaseWaiter::new(client);
//! let lease = waiter.acquire("job-42", "worker-a1", Duration::from_secs(30), Duration::from_secs(60)).await?;
//! # let _ = lease; Ok(()) }
//! ```

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::AsyncPgConnection;
use tokio::sync::oneshot;

use super::client::AsyncLeaseClient;
use super::releases::ReleaseWatch;
use crate::error::LeaseError;
use crate::lease::outcome::{Acquisition, Lease};
use crate::pool::{checkout_async as checkout, checkout_async_within, settle_async as settle};
use crate::telemetry;
use crate::wait::listener::Listener;
use crate::wait::slot::Woken;
use crate::wait::{
    attempt_step, debug_waiter, waiter_accessors, waiter_setters, Round, Rounds, Step, Wait,
    DEFAULT_FALLBACK_POLL, DEFAULT_RECHECK,
};

/// Acquires keys woken by release notifications, as [`crate::wait::LeaseWaiter`], from tasks.
#[derive(Clone)]
pub struct LeaseWaiter {
    client: AsyncLeaseClient,
    listener: Arc<Listener>,
    fallback_poll: Duration,
    recheck_every: Duration,
}

impl std::fmt::Debug for LeaseWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_waiter(f, &self.listener, self.fallback_poll, self.recheck_every)
    }
}

/// Configures a [`LeaseWaiter`] ([`LeaseWaiter::builder`]).
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct LeaseWaiterBuilder {
    client: AsyncLeaseClient,
    fallback_poll: Duration,
    recheck_every: Duration,
}

impl LeaseWaiterBuilder {
    waiter_setters!();

    /// Builds the waiter (the listener connects in the background); zero intervals become 1 ms.
    pub fn build(self) -> LeaseWaiter {
        let floor = Duration::from_millis(1);
        LeaseWaiter {
            listener: Listener::for_url(&self.client.listen_url),
            client: self.client,
            fallback_poll: self.fallback_poll.max(floor),
            recheck_every: self.recheck_every.max(floor),
        }
    }
}

impl LeaseWaiter {
    /// A waiter on `client`'s pool and the shared listener of its listen URL.
    pub fn new(client: &AsyncLeaseClient) -> Self {
        Self::builder(client).build()
    }

    /// A builder with non-default intervals.
    pub fn builder(client: &AsyncLeaseClient) -> LeaseWaiterBuilder {
        LeaseWaiterBuilder {
            client: client.clone(),
            fallback_poll: DEFAULT_FALLBACK_POLL,
            recheck_every: DEFAULT_RECHECK,
        }
    }

    waiter_accessors!();

    /// The client attempts run on (also what a [`Keeper`](super::Keeper) is built from).
    pub fn client(&self) -> &AsyncLeaseClient {
        &self.client
    }

    /// [`wait_until_listening`](Self::wait_until_listening) with the reason: fails as
    /// soon as the session fails its delivery check (a transaction-mode pooler),
    /// which takes up to ten seconds, so give more than that. Waits on a
    /// blocking-pool thread.
    pub async fn ensure_listening(&self, timeout: Duration) -> Result<(), LeaseError> {
        let listener = self.listener.clone();
        tokio::task::spawn_blocking(move || crate::wait::ensure_listening(&listener, timeout))
            .await
            .unwrap_or_else(|error| {
                Err(LeaseError::from(crate::error::Repr::Spawn(
                    std::io::Error::other(error.to_string()),
                )))
            })
    }

    /// Resolves when the listener is up or after `timeout`; for start-up checks (waiting
    /// works without it, by polling). Waits on a blocking-pool thread.
    pub async fn wait_until_listening(&self, timeout: Duration) -> bool {
        let listener = self.listener.clone();
        tokio::task::spawn_blocking(move || listener.wait_connected(timeout))
            .await
            .unwrap_or(false)
    }

    /// Release events for `keys`, as [`crate::wait::LeaseWaiter::watch_releases`], awaitable.
    pub fn watch_releases<I, K>(&self, keys: I) -> Result<ReleaseWatch, LeaseError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        crate::wait::ReleaseWatch::start(self.listener.clone(), keys).map(ReleaseWatch::new)
    }

    /// Acquires `key` for `owner` for `ttl`, waiting as `wait` says. Dropping the
    /// future strands no grant: an attempt in flight finishes in its own task and
    /// releases what nobody took. For an answer, [`acquire_cancellable`](Self::acquire_cancellable).
    pub async fn acquire(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: impl Into<Wait>,
    ) -> Result<Lease, LeaseError> {
        let wait = wait.into();
        telemetry::wait(
            key,
            owner,
            self.acquire_inner(key, owner, ttl, wait, std::future::pending()),
        )
        .await
    }

    /// [`acquire`](Self::acquire) answering [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled) once `cancel`
    /// resolves, seen between attempts, so a granted attempt is answered.
    pub async fn acquire_cancellable(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: impl Into<Wait>,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<Lease, LeaseError> {
        let wait = wait.into();
        telemetry::wait(
            key,
            owner,
            self.acquire_inner(key, owner, ttl, wait, cancel),
        )
        .await
    }

    async fn acquire_inner(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Wait,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<Lease, LeaseError> {
        let mut cancel = pin!(cancel);
        let mut rounds = Rounds::new(key, wait, self.fallback_poll, self.recheck_every);
        if is_ready(cancel.as_mut()).await {
            return Err(rounds.cancelled());
        }
        // Fast path: a free key costs one round trip and no registration. A
        // database not reached is tried again in the rounds, until the bound.
        match self.attempt(key, owner, ttl, rounds.checkout_bound()).await {
            Ok(Some(lease)) => return Ok(lease),
            Ok(None) => {}
            Err(error) if error.is_connection_error() => {}
            Err(error) => return Err(error),
        }
        let watch = self.listener.watch(key);
        let slot = watch.slot().clone();
        loop {
            if is_ready(cancel.as_mut()).await {
                return Err(rounds.cancelled());
            }
            let seen = slot.seq();
            let step = self
                .attempt_and_inspect(key, owner, ttl, rounds.checkout_bound())
                .await;
            match rounds.after(step, || slot.is_armed(seen)) {
                Round::Granted(lease) => return Ok(lease),
                Round::Failed(error) => return Err(error),
                Round::Again => continue,
                Round::Sleep(wake_at) => {
                    let woken = tokio::select! {
                        woken = slot.wait_async(seen, wake_at) => woken,
                        () = cancel.as_mut() => Woken::Cancelled,
                    };
                    telemetry::waiter_woke(woken.cause());
                    if woken == Woken::Cancelled {
                        return Err(rounds.cancelled());
                    }
                }
            }
        }
    }

    /// The first attempt: a grant, or `None` for any other answer.
    async fn attempt(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        bound: Option<Duration>,
    ) -> Result<Option<Lease>, LeaseError> {
        let step = self.spawn_attempt(key, owner, ttl, false, bound).await?;
        Ok(match step {
            Step::Granted(lease) => Some(lease),
            Step::Held { .. } | Step::Unowned => None,
        })
    }

    async fn attempt_and_inspect(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        bound: Option<Duration>,
    ) -> Result<Step, LeaseError> {
        self.spawn_attempt(key, owner, ttl, true, bound).await
    }

    /// Runs one attempt in its own task, so a dropped waiting future strands no grant
    /// ([`Unclaimed`]).
    async fn spawn_attempt(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        inspect: bool,
        bound: Option<Duration>,
    ) -> Result<Step, LeaseError> {
        let pool = self.client.pool.clone();
        let (key, owner) = (key.to_owned(), owner.to_owned());
        let (answer, taken) = oneshot::channel();
        let task = tokio::spawn(async move {
            let step = async {
                let mut conn = checkout_async_within(&pool, bound).await?;
                let step = if inspect {
                    attempt_step(&mut *conn, &key, &owner, ttl).await
                } else {
                    crate::lease::acquire(&mut *conn, &key, &owner, ttl)
                        .await
                        .map(|acquisition| match acquisition {
                            Acquisition::Granted(lease) => Step::Granted(lease),
                            _ => Step::Unowned,
                        })
                };
                settle(conn, &step);
                step
            }
            .await;
            if let Err(Ok(Step::Granted(lease))) = answer.send(step) {
                release_unclaimed(pool, lease).await;
            }
        });
        let mut unclaimed = Unclaimed {
            taken,
            pool: self.client.pool.clone(),
        };
        match (&mut unclaimed.taken).await {
            Ok(step) => step,
            // No answer: a panic is the caller's (as on the sync face); else the runtime is shutting down.
            Err(_) => match task.await {
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                _ => Err(crate::pool::CallError::from_checkout(Box::new(
                    diesel_async::pooled_connection::deadpool::PoolError::Closed,
                ))),
            },
        }
    }
}

/// The waiting side of an attempt in flight: dropped unread, it closes the channel so
/// the task releases its grant, and releases one already answered.
struct Unclaimed {
    taken: oneshot::Receiver<Result<Step, LeaseError>>,
    pool: Pool<AsyncPgConnection>,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        self.taken.close();
        if let Ok(Ok(Step::Granted(lease))) = self.taken.try_recv() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                drop(runtime.spawn(release_unclaimed(self.pool.clone(), lease)));
            }
        }
    }
}

/// Releases a grant nobody holds, best effort (else it lapses at its ttl).
async fn release_unclaimed(pool: Pool<AsyncPgConnection>, lease: Lease) {
    if let Ok(mut conn) = checkout(&pool).await {
        let released = crate::lease::release(&mut *conn, lease.token()).await;
        settle(conn, &released);
    }
}

/// Whether `future` has resolved, polled once without waiting.
async fn is_ready<F: Future<Output = ()>>(future: std::pin::Pin<&mut F>) -> bool {
    let mut future = future;
    std::future::poll_fn(|context| Poll::Ready(future.as_mut().poll(context).is_ready())).await
}
