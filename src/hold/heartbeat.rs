//! The heartbeat both faces run, written once: when to beat, when to retry, when
//! the deadline passes, and how a keeper waits for either. A keeper's state
//! implements [`Heart`]; its two loops are `async fn`s that a thread drives with
//! `finish` (each wait blocks in one poll) or a tokio task awaits. Only
//! [`Calls`] and [`Pulse::wait`] know which face they serve.

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::schedule::{lock, Schedule};
use crate::batch::groups::{self, GroupId, GroupJoin, GroupRenewal};
use crate::batch::many;
use crate::error::{LeaseError, Operation, Repr};
use crate::lease;
use crate::lease::outcome::{KeyRelease, Lease, Release, Renewal};
use crate::lease::token::FencingToken;
use crate::pool::{with_conn, PgPool};
use crate::sql::execute::finish;

/// Where a keeper's calls run: the sync face's pool, or the async face's.
#[derive(Clone)]
pub(crate) enum Calls {
    /// A `LeaseClient`'s pool; the keeper runs on threads.
    Blocking(PgPool),
    /// An `aio::AsyncLeaseClient`'s pool; the keeper runs as tokio tasks.
    #[cfg(feature = "async")]
    Tasks(crate::pool::AsyncPool),
}

/// Runs `$call` (an operation's future over `$conn`) on a connection of `$calls`.
macro_rules! on_connection {
    ($calls:expr, |$conn:ident| $call:expr) => {
        match $calls {
            Calls::Blocking(pool) => with_conn(pool, |$conn| finish($call)),
            #[cfg(feature = "async")]
            Calls::Tasks(pool) => {
                let mut checked_out = crate::pool::checkout_async(pool).await?;
                let $conn = &mut *checked_out;
                let answer = $call.await;
                crate::pool::settle_async(checked_out, &answer);
                answer
            }
        }
    };
}

impl Calls {
    /// `lease.renew` of one grant.
    pub(crate) async fn renew(
        &self,
        token: &FencingToken,
        ttl: std::time::Duration,
    ) -> Result<Renewal, LeaseError> {
        on_connection!(self, |conn| lease::renew(conn, token, ttl))
    }

    /// `lease.release` of one grant, resent after a read-only refusal: each
    /// refusal discards its connection, so within the pool's size one reaches
    /// the new primary.
    pub(crate) async fn release(&self, token: &FencingToken) -> Result<Release, LeaseError> {
        let mut attempts = super::schedule::release_attempts(self.pool_size());
        loop {
            let answer = on_connection!(self, |conn| lease::release(conn, token));
            attempts = attempts.saturating_sub(1);
            match answer {
                Err(error) if error.is_read_only_server() && attempts > 0 => continue,
                answer => return answer,
            }
        }
    }

    /// One heartbeat of a group.
    pub(crate) async fn renew_group(
        &self,
        group: GroupId,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<GroupRenewal, LeaseError> {
        on_connection!(self, |conn| groups::renew_group(conn, group, owner, ttl))
    }

    /// Renews `grants` into one new group.
    pub(crate) async fn join_group(
        &self,
        grants: &[&Lease],
        ttl: std::time::Duration,
    ) -> Result<GroupJoin, LeaseError> {
        let split = many::split_grants(grants);
        on_connection!(self, |conn| groups::join_group(conn, split, ttl))
    }

    /// Releases `grants` in one call.
    pub(crate) async fn release_many(
        &self,
        grants: &[&Lease],
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        let split = many::split_grants(grants);
        on_connection!(self, |conn| many::release_many(conn, split))
    }

    /// Runs `call` on a copy of these calls for at most `bound`: a keeper's
    /// stop must not outwait its lease. A call still running then is left to
    /// finish on its own thread or task, never cancelled (a release waiting
    /// on a synchronous standby has committed locally), and this answers
    /// `TimedOut` for `operation` of `key`.
    pub(crate) async fn within<T, F>(
        &self,
        bound: Duration,
        operation: Operation,
        key: &str,
        call: impl FnOnce(Calls) -> F + Send + 'static,
    ) -> Result<T, LeaseError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, LeaseError>> + Send + 'static,
    {
        let timed_out = || {
            LeaseError::from(Repr::TimedOut {
                operation,
                key: key.to_owned(),
                waited: bound,
            })
        };
        let calls = self.clone();
        match self {
            Calls::Blocking(_) => {
                let (answer, answered) = std::sync::mpsc::channel();
                super::schedule::spawn("leasehold-release", move || {
                    drop(answer.send(finish(call(calls))));
                })?;
                answered
                    .recv_timeout(bound)
                    .unwrap_or_else(|_| Err(timed_out()))
            }
            #[cfg(feature = "async")]
            Calls::Tasks(_) => {
                let task = tokio::spawn(call(calls));
                match tokio::time::timeout(bound, task).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(error)) if error.is_panic() => {
                        std::panic::resume_unwind(error.into_panic())
                    }
                    Ok(Err(_)) | Err(_) => Err(timed_out()),
                }
            }
        }
    }

    /// How many connections the pool may open.
    fn pool_size(&self) -> usize {
        match self {
            Calls::Blocking(pool) => usize::try_from(pool.max_size()).unwrap_or(usize::MAX),
            #[cfg(feature = "async")]
            Calls::Tasks(pool) => pool.status().max_size,
        }
    }
}

/// Tells a keeper's loops and its waiting callers that its state changed.
/// A waiter notes [`seen`](Self::seen) before it reads the state, so a change
/// in between ends its wait at once instead of being missed.
pub(crate) struct Pulse {
    version: Mutex<u64>,
    changed: Condvar,
    #[cfg(feature = "async")]
    tasks: tokio::sync::Notify,
}

impl Pulse {
    pub(crate) fn new() -> Self {
        Pulse {
            version: Mutex::new(0),
            changed: Condvar::new(),
            #[cfg(feature = "async")]
            tasks: tokio::sync::Notify::new(),
        }
    }

    /// The count of changes so far.
    pub(crate) fn seen(&self) -> u64 {
        *lock(&self.version)
    }

    /// Wakes every wait.
    pub(crate) fn notify(&self) {
        *lock(&self.version) += 1;
        self.changed.notify_all();
        #[cfg(feature = "async")]
        self.tasks.notify_waiters();
    }

    /// Until a change after `seen`, or `until` (`None`: no bound). The sync face
    /// blocks its thread here, so the future is ready after one poll.
    pub(crate) async fn wait(&self, calls: &Calls, seen: u64, until: Option<Instant>) {
        match calls {
            Calls::Blocking(_) => {
                let mut version = lock(&self.version);
                while *version == seen {
                    let left = match until {
                        Some(until) => match until.checked_duration_since(Instant::now()) {
                            Some(left) if !left.is_zero() => left,
                            _ => return,
                        },
                        None => std::time::Duration::from_secs(3600),
                    };
                    version = self
                        .changed
                        .wait_timeout(version, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
            }
            #[cfg(feature = "async")]
            Calls::Tasks(_) => {
                let mut notified = std::pin::pin!(self.tasks.notified());
                notified.as_mut().enable();
                if self.seen() != seen {
                    return;
                }
                match until {
                    Some(until) => tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(until.into()) => {}
                    },
                    None => notified.await,
                }
            }
        }
    }
}

/// A keeper's state as its two loops see it: one grant's ([`super::Keeper`]) or
/// a group's ([`super::KeeperSet`]).
pub(crate) trait Heart: Send + Sync + 'static {
    fn pulse(&self) -> &Pulse;
    fn calls(&self) -> &Calls;
    fn schedule(&self) -> &Schedule;
    /// Whether the loops are done: everything lost, or stopping.
    fn over(&self) -> bool;
    /// When the last successful beat was sent.
    fn last_sent(&self) -> Instant;
    /// One beat, its success recorded and reported; `Ok(false)`: nothing left to keep.
    fn beat(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send;
    /// Records and reports a failed beat; it is retried until the deadline.
    fn beat_failed(&self, error: Arc<LeaseError>);
    /// Until when the kept grants are safe, and the last beat's error.
    fn deadline(&self) -> (Instant, Option<Arc<LeaseError>>);
    /// Declares the kept grants lost: the deadline passed without a beat.
    fn deadline_passed(&self, last_error: Option<Arc<LeaseError>>);

    /// How long a stop may wait for its release: until the safe deadline,
    /// or the margin once it has passed. Past it the grants are lost
    /// anyway, and lapse on the server at their ttl.
    fn stop_bound(&self) -> Duration {
        self.deadline()
            .0
            .saturating_duration_since(Instant::now())
            .max(self.schedule().margin)
    }

    /// When a stop begun now must have returned.
    fn stop_deadline(&self) -> Instant {
        Instant::now() + self.stop_bound()
    }
}

/// Beats every `renew_every` after the last successful send, retrying a failed
/// beat every `retry_every`, until the heart is over. A beat is never cancelled:
/// one waiting on a synchronous standby has committed locally.
async fn beat_loop(heart: &impl Heart) {
    let mut next = heart.last_sent() + heart.schedule().renew_every;
    loop {
        loop {
            let seen = heart.pulse().seen();
            if heart.over() {
                return;
            }
            if Instant::now() >= next {
                break;
            }
            heart.pulse().wait(heart.calls(), seen, Some(next)).await;
        }
        match heart.beat().await {
            Ok(true) => next = heart.last_sent() + heart.schedule().renew_every,
            Ok(false) => return,
            Err(error) => {
                heart.beat_failed(Arc::new(error));
                next = Instant::now() + heart.schedule().retry_every;
            }
        }
    }
}

/// Declares the loss when the deadline passes, however long a beat hangs.
async fn deadline_loop(heart: &impl Heart) {
    loop {
        let seen = heart.pulse().seen();
        if heart.over() {
            return;
        }
        let (safe_until, last_error) = heart.deadline();
        if Instant::now() >= safe_until {
            heart.deadline_passed(last_error);
            return;
        }
        heart
            .pulse()
            .wait(heart.calls(), seen, Some(safe_until))
            .await;
    }
}

/// A keeper's two running loops: threads on the sync face, tasks on the async.
pub(crate) enum Loops {
    /// The threads, and a message from each as it ends (in a mutex only so
    /// the keeper stays `Sync`).
    Threads(
        Vec<std::thread::JoinHandle<()>>,
        Mutex<std::sync::mpsc::Receiver<()>>,
    ),
    #[cfg(feature = "async")]
    Tasks(Vec<tokio::task::JoinHandle<()>>),
}

impl Loops {
    /// Starts `heart`'s beat and deadline loops where its calls run; `name` names the threads.
    pub(crate) fn start<H: Heart>(heart: &Arc<H>, name: &str) -> Result<Loops, LeaseError> {
        match heart.calls() {
            Calls::Blocking(_) => {
                let (ended, ends) = std::sync::mpsc::channel();
                let (beating, beat_ended) = (heart.clone(), ended.clone());
                let (watching, watch_ended) = (heart.clone(), ended);
                Ok(Loops::Threads(
                    vec![
                        super::schedule::spawn(name, move || {
                            finish(beat_loop(&*beating));
                            let _ = beat_ended.send(());
                        })?,
                        super::schedule::spawn(&format!("{name}-deadline"), move || {
                            finish(deadline_loop(&*watching));
                            let _ = watch_ended.send(());
                        })?,
                    ],
                    Mutex::new(ends),
                ))
            }
            #[cfg(feature = "async")]
            Calls::Tasks(_) => {
                let runtime = tokio::runtime::Handle::try_current().map_err(|error| {
                    LeaseError::from(Repr::Spawn(std::io::Error::other(format!(
                        "an async {name} runs on a tokio runtime: {error}"
                    ))))
                })?;
                let beating = heart.clone();
                let watching = heart.clone();
                Ok(Loops::Tasks(vec![
                    runtime.spawn(async move { beat_loop(&*beating).await }),
                    runtime.spawn(async move { deadline_loop(&*watching).await }),
                ]))
            }
        }
    }

    /// Waits for the loops to end (they end once the heart is over), until
    /// `deadline`: a loop still in a call then (a beat the database does not
    /// answer) is left to end by itself when the call returns.
    pub(crate) async fn join_until(self, deadline: Instant) {
        match self {
            Loops::Threads(threads, ends) => {
                let ends = ends.into_inner().unwrap_or_else(PoisonError::into_inner);
                for _ in 0..threads.len() {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if ends.recv_timeout(left).is_err() {
                        return;
                    }
                }
                for thread in threads {
                    let _ = thread.join();
                }
            }
            #[cfg(feature = "async")]
            Loops::Tasks(tasks) => {
                for task in tasks {
                    if tokio::time::timeout_at(deadline.into(), task)
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    }

    /// Runs `release` without waiting for a beat in flight: at once on the
    /// sync face, from a task of its own on the async face. The loops end by
    /// themselves, the heart being over.
    pub(crate) fn release_when_done<F>(self, release: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match self {
            Loops::Threads(..) => finish(release),
            #[cfg(feature = "async")]
            Loops::Tasks(_) => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    drop(runtime.spawn(release));
                }
            }
        }
    }
}
