//! [`Election`] for tasks: the sync [`crate::hold::Election`]'s rules over
//! the async waiter and keeper; a term's loss is also a future, and who
//! leads is a `Stream` of changes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::client::AsyncLeaseClient;
use super::keeper::Keeper;
use super::waiter::LeaseWaiter;
use super::worker::{run_while_held, WorkContext};
use super::AsyncLeases;
use crate::error::LeaseError;
use crate::hold::election::{
    campaigns_on, election_basics, leader_of, leadership_accessors, left_of, look, Look, Observer,
};
use crate::hold::{Leader, LeaderChange, LeaseLoss, WorkOutcome};
use crate::lease::outcome::Release;
use crate::pool::{checkout_async, settle_async};
use crate::wait::changes::KeyChanges;
use crate::wait::Wait;

/// A candidate in the election of one lease key, on an async pooled client.
///
/// ```no_run
/// # async fn demo(client: &leasehold::aio::AsyncLeaseClient) -> Result<(), leasehold::LeaseError> {
/// use std::time::Duration;
/// let election = leasehold::aio::Election::new(client, "scheduler", "replica-1", Duration::from_secs(10));
/// let leadership = election.campaign(leasehold::wait::Wait::UntilCancelled).await?;
/// let outcome = leadership.lead(std::future::pending(), async |term| {
///     while term.sleep(Duration::from_secs(1)).await.is_ok() { /* schedule, fencing with term.token() */ }
///     Ok::<_, leasehold::hold::StopReason>(())
/// }).await;
/// # let _ = outcome; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    client: AsyncLeaseClient,
    waiter: LeaseWaiter,
    name: String,
    candidate: String,
    ttl: Duration,
}

impl Election {
    election_basics!(AsyncLeaseClient);

    /// Who leads now, `None` while nobody does.
    pub async fn leader(&self) -> Result<Option<Leader>, LeaseError> {
        Ok(leader_of(self.client.clone().inspect(&self.name).await?))
    }

    /// Watches who leads, as the sync [`crate::hold::Election::observe`]:
    /// the state now first, then one change per grant, release or lapse,
    /// woken by notifications. Errors as there.
    pub async fn observe(&self) -> Result<LeaderWatch, LeaseError> {
        let mut looker = Looker {
            client: self.client.clone(),
            name: self.name.clone(),
            changes: self.waiter.key_changes(&self.name),
            observer: Observer::new(self.waiter.intervals()),
        };
        let first = looker.look().await;
        match first {
            Err(error) if !error.is_connection_error() => Err(error),
            first => {
                let armed = looker.changes.armed();
                let pending = looker.observer.looked(first, armed);
                Ok(LeaderWatch {
                    looker: Some(Box::new(looker)),
                    next: None,
                    pending,
                    leader: None,
                })
            }
        }
    }

    /// Resolves, as `wait` says, once this candidate leads, keeping its
    /// term; a database that goes away and comes back costs nothing but time.
    pub async fn campaign(&self, wait: impl Into<Wait>) -> Result<Leadership, LeaseError> {
        self.campaign_cancellable(wait, std::future::pending())
            .await
    }

    /// [`campaign`](Self::campaign), answering `ErrorKind::Cancelled` once
    /// `cancel` resolves.
    pub async fn campaign_cancellable(
        &self,
        wait: impl Into<Wait>,
        cancel: impl Future<Output = ()> + Send,
    ) -> Result<Leadership, LeaseError> {
        let (wait, started) = (wait.into(), Instant::now());
        let mut cancel = std::pin::pin!(cancel);
        loop {
            let grant = self
                .waiter
                .acquire_cancellable(
                    &self.name,
                    &self.candidate,
                    self.ttl,
                    left_of(wait, started),
                    cancel.as_mut(),
                )
                .await?;
            match Keeper::start(&self.client, grant).await {
                Ok(keeper) => return Ok(Leadership { keeper }),
                Err(error) if campaigns_on(&error) => continue,
                Err(error) => return Err(error),
            }
        }
    }
}

/// A term as leader, as the sync [`crate::hold::Leadership`]; its loss is
/// also a future ([`lost`](Self::lost)).
#[derive(Debug)]
pub struct Leadership {
    keeper: Keeper,
}

impl Leadership {
    leadership_accessors!();

    /// Resolves when the term is lost or `timeout` passes, with the loss.
    pub async fn wait_for_loss(&self, timeout: Duration) -> Option<LeaseLoss> {
        self.keeper.wait_for_loss(timeout).await
    }

    /// Resolves with the term's loss, for `select!`; `None` once resigned.
    pub fn lost(&self) -> impl Future<Output = Option<LeaseLoss>> + Send + 'static {
        self.keeper.lost()
    }

    /// Runs the leader's `work`, told to stop (and its sleep woken) when the
    /// term is lost or `cancel` resolves; then resigns.
    pub async fn lead<T, E>(
        self,
        cancel: impl Future<Output = ()>,
        work: impl AsyncFnOnce(WorkContext) -> Result<T, E>,
    ) -> WorkOutcome<T, E> {
        run_while_held(self.keeper, cancel, work).await
    }

    /// Ends the term now, releasing the key so another candidate leads at
    /// once; within the keeper's stop bound.
    pub async fn resign(self) -> Result<Release, LeaseError> {
        self.keeper.stop().await
    }
}

/// What a [`LeaderWatch`] looks with; moved into the future of the next
/// change while one is awaited, so an awaited change survives a dropped
/// `recv`.
struct Looker {
    client: AsyncLeaseClient,
    name: String,
    changes: KeyChanges,
    observer: Observer,
}

/// The future of a watch's next change, handing the looker back.
type NextChange = Pin<Box<dyn Future<Output = (Box<Looker>, LeaderChange)> + Send>>;

impl Looker {
    async fn look(&self) -> Result<Look, LeaseError> {
        let mut conn = checkout_async(&self.client.pool).await?;
        let looked = look(&mut *conn, &self.name).await;
        settle_async(conn, &looked);
        looked
    }

    /// Looks when due, sleeps until announced or due, until a change shows.
    async fn next_change(mut self: Box<Self>) -> (Box<Self>, LeaderChange) {
        loop {
            if Instant::now() >= self.observer.look_at() {
                let looked = self.look().await;
                let armed = self.changes.armed();
                if let Some(change) = self.observer.looked(looked, armed) {
                    return (self, change);
                }
                continue;
            }
            let due = tokio::time::Instant::from_std(self.observer.look_at());
            tokio::select! {
                () = self.changes.announced() => self.observer.announced(),
                () = tokio::time::sleep_until(due) => {}
            }
        }
    }
}

/// Who leads an election, as it changes ([`Election::observe`]): a
/// `Stream` that never ends, and [`recv`](Self::recv) for one change.
///
/// ```no_run
/// # async fn demo(election: &leasehold::aio::Election) -> Result<(), leasehold::LeaseError> {
/// let mut watch = election.observe().await?;
/// loop {
///     match watch.recv().await {
///         leasehold::hold::LeaderChange::Elected(leader) => println!("{} leads", leader.candidate),
///         other => println!("nobody leads: {other:?}"),
///     }
/// }
/// # }
/// ```
pub struct LeaderWatch {
    looker: Option<Box<Looker>>,
    next: Option<NextChange>,
    pending: Option<LeaderChange>,
    leader: Option<Leader>,
}

impl std::fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("leader", &self.leader)
            .field("awaiting", &self.next.is_some())
            .finish()
    }
}

impl LeaderWatch {
    /// Who led as of the last change returned.
    pub fn leader(&self) -> Option<&Leader> {
        self.leader.as_ref()
    }

    /// The next change; cancel-safe (a change is taken only when the
    /// future resolves).
    pub async fn recv(&mut self) -> LeaderChange {
        std::future::poll_fn(|cx| self.poll_change(cx)).await
    }

    /// The next change, waiting up to `timeout`.
    pub async fn recv_timeout(&mut self, timeout: Duration) -> Option<LeaderChange> {
        tokio::time::timeout(timeout, self.recv()).await.ok()
    }

    fn poll_change(&mut self, cx: &mut Context<'_>) -> Poll<LeaderChange> {
        let change = match self.pending.take() {
            Some(change) => change,
            None => {
                if self.next.is_none() {
                    match self.looker.take() {
                        Some(looker) => self.next = Some(Box::pin(looker.next_change())),
                        None => return Poll::Pending,
                    }
                }
                let Some(next) = self.next.as_mut() else {
                    return Poll::Pending;
                };
                let Poll::Ready((looker, change)) = next.as_mut().poll(cx) else {
                    return Poll::Pending;
                };
                self.next = None;
                self.looker = Some(looker);
                change
            }
        };
        self.leader = change.leader().cloned();
        Poll::Ready(change)
    }
}

/// Every change as it comes; never ends.
impl futures_core::Stream for LeaderWatch {
    type Item = LeaderChange;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LeaderChange>> {
        self.get_mut().poll_change(cx).map(Some)
    }
}
