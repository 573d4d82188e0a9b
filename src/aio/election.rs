//! [`Election`] for tasks: the sync [`crate::hold::Election`]'s rules over
//! the async waiter and keeper; a term's loss is also a future.

use std::future::Future;
use std::time::{Duration, Instant};

use super::client::AsyncLeaseClient;
use super::keeper::Keeper;
use super::waiter::LeaseWaiter;
use super::worker::{run_while_held, WorkContext};
use super::AsyncLeases;
use crate::error::LeaseError;
use crate::hold::election::{campaigns_on, leader_of, leadership_accessors, left_of};
use crate::hold::{Leader, LeaseLoss, WorkOutcome};
use crate::lease::outcome::Release;
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
    /// The election of key `name`, for `candidate`, whose terms are renewed
    /// grants of `ttl`: a leader that stops renewing is replaced once its
    /// grant lapses.
    pub fn new(client: &AsyncLeaseClient, name: &str, candidate: &str, ttl: Duration) -> Election {
        Election {
            client: client.clone(),
            waiter: LeaseWaiter::new(client),
            name: name.to_owned(),
            candidate: candidate.to_owned(),
            ttl,
        }
    }

    /// The key elected for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This candidate.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// Who leads now, `None` while nobody does.
    pub async fn leader(&self) -> Result<Option<Leader>, LeaseError> {
        Ok(leader_of(self.client.clone().inspect(&self.name).await?))
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
