//! Electing a leader with a lease: the candidates campaign for one key, the
//! one granted it leads until it resigns or loses it, and every write it
//! fences carries its term's token, so a deposed leader's late write is
//! refused. Written over the waiter and the keeper; the async face's
//! `aio::Election` is the same over theirs.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::cancel::CancelToken;
use super::keeper::{Keeper, LeaseLoss};
use super::worker::{run_while_held, WorkContext, WorkOutcome};
use crate::client::LeaseClient;
use crate::error::{ErrorKind, LeaseError};
use crate::lease::epoch::Epoch;
use crate::lease::outcome::{LeaseState, Release};
use crate::wait::{LeaseWaiter, Wait};
use crate::Leases;

/// The accessors both faces' `Leadership` share, written once.
macro_rules! leadership_accessors {
    () => {
        /// The term's fencing token: present it with every write.
        pub fn token(&self) -> &crate::lease::token::FencingToken {
            self.keeper.token()
        }

        /// Whether this candidate still leads, safely; one atomic load and a clock read.
        pub fn is_leading(&self) -> bool {
            self.keeper.is_valid()
        }

        /// Until when it leads for sure (client monotonic clock).
        pub fn safe_until(&self) -> std::time::Instant {
            self.keeper.safe_until()
        }

        /// Why the term ended, if it did.
        pub fn loss(&self) -> Option<crate::hold::LeaseLoss> {
            self.keeper.loss()
        }
    };
}
#[cfg(feature = "async")]
pub(crate) use leadership_accessors;

/// Who leads an election now, as the server's row says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leading candidate.
    pub candidate: String,
    /// Its term: the epoch of its grant, which its fenced writes carry.
    pub epoch: Epoch,
    /// When its grant lapses unless renewed (server clock).
    pub expires_at: DateTime<Utc>,
}

/// The leader of `state`, if the key is held now.
pub(crate) fn leader_of(state: Option<LeaseState>) -> Option<Leader> {
    match state? {
        LeaseState::Held {
            owner,
            epoch,
            expires_at,
        } => Some(Leader {
            candidate: owner,
            epoch,
            expires_at,
        }),
        LeaseState::Lapsed { .. } | LeaseState::Free { .. } => None,
    }
}

/// Whether a campaign that was granted but could not start keeping its
/// grant campaigns on: the database was not reached, or the grant lapsed
/// before its first renew.
pub(crate) fn campaigns_on(error: &LeaseError) -> bool {
    error.is_connection_error() || error.kind() == ErrorKind::Fenced
}

/// What is left of `wait` at `now`, for the next round of a campaign.
pub(crate) fn left_of(wait: Wait, started: Instant) -> Wait {
    match wait {
        Wait::AtMost(limit) => Wait::AtMost(limit.saturating_sub(started.elapsed())),
        Wait::UntilCancelled => Wait::UntilCancelled,
    }
}

/// A candidate in the election of one lease key, on a pooled client.
///
/// ```no_run
/// # fn demo(client: &leasehold::LeaseClient) -> Result<(), leasehold::LeaseError> {
/// use std::time::Duration;
/// use leasehold::hold::{CancelToken, Election};
/// let election = Election::new(client, "scheduler", "replica-1", Duration::from_secs(10));
/// let shutdown = CancelToken::new();
/// let leadership = election.campaign_cancellable(leasehold::wait::Wait::UntilCancelled, &shutdown)?;
/// let outcome = leadership.lead(&shutdown, |term| {
///     while term.sleep(Duration::from_secs(1)).is_ok() { /* schedule, fencing with term.token() */ }
///     Ok::<_, leasehold::hold::StopReason>(())
/// });
/// # let _ = outcome; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    client: LeaseClient,
    waiter: LeaseWaiter,
    name: String,
    candidate: String,
    ttl: Duration,
}

impl Election {
    /// The election of key `name`, for `candidate`, whose terms are renewed
    /// grants of `ttl`: a leader that stops renewing is replaced once its
    /// grant lapses.
    pub fn new(client: &LeaseClient, name: &str, candidate: &str, ttl: Duration) -> Election {
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
    pub fn leader(&self) -> Result<Option<Leader>, LeaseError> {
        Ok(leader_of(self.client.clone().inspect(&self.name)?))
    }

    /// Waits, as `wait` says, until this candidate leads, and keeps its
    /// term. A database that goes away and comes back meanwhile costs
    /// nothing but time.
    pub fn campaign(&self, wait: impl Into<Wait>) -> Result<Leadership, LeaseError> {
        self.campaign_cancellable(wait, &CancelToken::new())
    }

    /// [`campaign`](Self::campaign), answering `ErrorKind::Cancelled` once
    /// `cancel` is cancelled.
    pub fn campaign_cancellable(
        &self,
        wait: impl Into<Wait>,
        cancel: &CancelToken,
    ) -> Result<Leadership, LeaseError> {
        let (wait, started) = (wait.into(), Instant::now());
        loop {
            let grant = self.waiter.acquire_cancellable(
                &self.name,
                &self.candidate,
                self.ttl,
                left_of(wait, started),
                cancel,
            )?;
            match Keeper::start(&self.client, grant) {
                Ok(keeper) => return Ok(Leadership { keeper }),
                Err(error) if campaigns_on(&error) => continue,
                Err(error) => return Err(error),
            }
        }
    }
}

/// A term as leader: its token fences the leader's writes, and it ends at
/// [`resign`](Self::resign), at the end of [`lead`](Self::lead), or when
/// the grant is lost (see [`Keeper`], which keeps it).
#[derive(Debug)]
pub struct Leadership {
    keeper: Keeper,
}

impl Leadership {
    leadership_accessors!();

    /// Blocks until the term is lost or `timeout` passes; returns the loss.
    pub fn wait_for_loss(&self, timeout: Duration) -> Option<LeaseLoss> {
        self.keeper.wait_for_loss(timeout)
    }

    /// Runs the leader's `work`, told to stop (and its
    /// [`sleep`](WorkContext::sleep) woken) when the term is lost or
    /// `cancel` fires; then resigns.
    pub fn lead<T, E>(
        self,
        cancel: &CancelToken,
        work: impl FnOnce(&WorkContext<'_>) -> Result<T, E>,
    ) -> WorkOutcome<T, E> {
        run_while_held(self.keeper, cancel, work)
    }

    /// Ends the term now, releasing the key so another candidate leads at
    /// once; within the keeper's stop bound.
    pub fn resign(self) -> Result<Release, LeaseError> {
        self.keeper.stop()
    }
}
