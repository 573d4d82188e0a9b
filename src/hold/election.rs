//! Electing a leader with a lease: the candidates campaign for one key, the
//! one granted it leads until it resigns or loses it, and every write it
//! fences carries its term's token, so a deposed leader's late write is
//! refused. Anyone may observe who leads: grants and releases of the key
//! are notified, a lapse is looked for at the leader's expiry. Written over
//! the waiter and the keeper; the async face's `aio::Election` is the same
//! over theirs.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::cancel::CancelToken;
use super::keeper::{Keeper, LeaseLoss};
use super::worker::{run_while_held, WorkContext, WorkOutcome};
use crate::client::LeaseClient;
use crate::error::{ErrorKind, LeaseError};
use crate::lease::epoch::Epoch;
use crate::lease::outcome::{LeaseState, Release};
use crate::pool::with_conn;
use crate::sql::execute::{finish, Execute};
use crate::wait::changes::KeyChanges;
use crate::wait::{holder_remaining, LeaseWaiter, Wait, EXPIRY_SLACK};
use crate::Leases;

/// The constructor and accessors both faces' `Election` share, written
/// once; `$client` is the face's pooled client (its `LeaseWaiter` is the
/// one in scope).
macro_rules! election_basics {
    ($client:ty) => {
        /// The election of key `name`, for `candidate`, whose terms are renewed
        /// grants of `ttl`: a leader that stops renewing is replaced once its
        /// grant lapses.
        pub fn new(client: &$client, name: &str, candidate: &str, ttl: Duration) -> Election {
            Election {
                client: client.clone(),
                waiter: LeaseWaiter::new(client),
                name: name.to_owned(),
                candidate: candidate.to_owned(),
                ttl,
            }
        }

        /// Campaigns and observes through `waiter` (its listener and poll
        /// settings) instead of a default waiter on the same client.
        pub fn with_waiter(mut self, waiter: &LeaseWaiter) -> Election {
            self.waiter = waiter.clone();
            self
        }

        /// The key elected for.
        pub fn name(&self) -> &str {
            &self.name
        }

        /// This candidate.
        pub fn candidate(&self) -> &str {
            &self.candidate
        }
    };
}
#[cfg(feature = "async")]
pub(crate) use election_basics;

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

/// A change of who leads an election, as an observer
/// ([`Election::observe`]) sees it. Each is the key's state at one look:
/// changes quicker than a look (a term granted and released in between)
/// are seen as the state they leave behind.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderChange {
    /// A term began (or, as a watch's first event, is under way): this
    /// candidate leads. The candidate's own campaign returning is its
    /// "started leading"; everyone else learns it here.
    Elected(Leader),
    /// The leader's term lapsed unrenewed (it stopped or lost the
    /// database): nobody leads until the next grant.
    Lapsed {
        /// The candidate whose term lapsed.
        candidate: String,
        /// That term.
        epoch: Epoch,
    },
    /// The leader resigned, or an operator ended its term: nobody leads
    /// until the next grant.
    Released {
        /// The election's fencing counter: every term up to it is over.
        epoch: Epoch,
    },
}

impl LeaderChange {
    /// The change from `seen` to `now`, if the term or its state differs.
    fn between(seen: Option<&LeaseState>, now: Option<&LeaseState>) -> Option<LeaderChange> {
        use LeaseState::{Free, Held, Lapsed};
        let now = now?;
        let same = match (seen, now) {
            (
                Some(Held { owner, epoch, .. }),
                Held {
                    owner: o, epoch: e, ..
                },
            )
            | (
                Some(Lapsed { owner, epoch, .. }),
                Lapsed {
                    owner: o, epoch: e, ..
                },
            ) => owner == o && epoch == e,
            (Some(Free { epoch, .. }), Free { epoch: e, .. }) => epoch == e,
            _ => false,
        };
        (!same).then(|| match now.clone() {
            Held {
                owner,
                epoch,
                expires_at,
            } => LeaderChange::Elected(Leader {
                candidate: owner,
                epoch,
                expires_at,
            }),
            Lapsed { owner, epoch, .. } => LeaderChange::Lapsed {
                candidate: owner,
                epoch,
            },
            Free { epoch, .. } => LeaderChange::Released { epoch },
        })
    }

    /// Who leads after this change.
    pub fn leader(&self) -> Option<&Leader> {
        match self {
            LeaderChange::Elected(leader) => Some(leader),
            LeaderChange::Lapsed { .. } | LeaderChange::Released { .. } => None,
        }
    }
}

/// One look at an election's key: its state, and the holder's time left on
/// the server's clock.
pub(crate) struct Look {
    state: Option<LeaseState>,
    remaining: Option<Duration>,
}

/// Looks at `key` on either face's connection.
pub(crate) async fn look(conn: &mut impl Execute, key: &str) -> Result<Look, LeaseError> {
    let state = crate::lease::inspect(conn, key).await?;
    let remaining = match state {
        Some(LeaseState::Held { .. }) => holder_remaining(conn, key).await?,
        _ => None,
    };
    Ok(Look { state, remaining })
}

/// What an observer has seen and when it looks again: the rules both
/// faces' `LeaderWatch` follow, free of any runtime. It looks when a grant
/// or release is announced, at the leader's expiry (a lapse is announced by
/// nobody), and otherwise every re-check (every fallback poll while the
/// key is not armed, or after a failed look).
#[derive(Debug)]
pub(crate) struct Observer {
    seen: Option<LeaseState>,
    look_at: Instant,
    fallback_poll: Duration,
    recheck_every: Duration,
}

impl Observer {
    /// An observer that looks at once, re-checking as `(fallback_poll, recheck_every)` say.
    pub(crate) fn new((fallback_poll, recheck_every): (Duration, Duration)) -> Self {
        Observer {
            seen: None,
            look_at: Instant::now(),
            fallback_poll,
            recheck_every,
        }
    }

    /// When the next look is due.
    pub(crate) fn look_at(&self) -> Instant {
        self.look_at
    }

    /// A change was announced: look now.
    pub(crate) fn announced(&mut self) {
        self.look_at = Instant::now();
    }

    /// Takes in a look (`armed`: the key's changes are announced): the change
    /// it shows, if any, and when to look next. A failed look changes nothing
    /// seen and is tried again after the fallback poll.
    pub(crate) fn looked(
        &mut self,
        looked: Result<Look, LeaseError>,
        armed: bool,
    ) -> Option<LeaderChange> {
        let now = Instant::now();
        let Ok(look) = looked else {
            self.look_at = now + self.fallback_poll;
            return None;
        };
        let poll = if armed {
            self.recheck_every
        } else {
            self.fallback_poll
        };
        self.look_at = now
            + look
                .remaining
                .map_or(poll, |left| poll.min(left.saturating_add(EXPIRY_SLACK)));
        let change = LeaderChange::between(self.seen.as_ref(), look.state.as_ref());
        self.seen = look.state;
        change
    }
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
    election_basics!(LeaseClient);

    /// Who leads now, `None` while nobody does.
    pub fn leader(&self) -> Result<Option<Leader>, LeaseError> {
        Ok(leader_of(self.client.clone().inspect(&self.name)?))
    }

    /// Watches who leads, from now on: its first event is the state now,
    /// then one per change, woken by the notifications of grants and
    /// releases (and a look at each leader's expiry, for lapses), not by
    /// polling. A bad name or one the namespace rules refuse is an error
    /// here; later failed looks (a database gone) are retried quietly.
    pub fn observe(&self) -> Result<LeaderWatch, LeaseError> {
        let mut watch = LeaderWatch {
            client: self.client.clone(),
            name: self.name.clone(),
            changes: self.waiter.key_changes(&self.name),
            observer: Observer::new(self.waiter.intervals()),
            leader: None,
            pending: None,
        };
        let first = watch.look();
        match first {
            Err(error) if !error.is_connection_error() => Err(error),
            first => {
                watch.pending = watch.observer.looked(first, watch.changes.armed());
                Ok(watch)
            }
        }
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

/// Who leads an election, as it changes ([`Election::observe`]): an
/// iterator that blocks for the next change and never ends.
///
/// ```no_run
/// # fn demo(election: &leasehold::hold::Election) -> Result<(), leasehold::LeaseError> {
/// use leasehold::hold::LeaderChange;
/// for change in election.observe()? {
///     match change {
///         LeaderChange::Elected(leader) => println!("{} leads, term {}", leader.candidate, leader.epoch),
///         other => println!("nobody leads: {other:?}"),
///     }
/// }
/// # Ok(()) }
/// ```
pub struct LeaderWatch {
    client: LeaseClient,
    name: String,
    changes: KeyChanges,
    observer: Observer,
    leader: Option<Leader>,
    pending: Option<LeaderChange>,
}

impl std::fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("name", &self.name)
            .field("leader", &self.leader)
            .field("armed", &self.changes.armed())
            .finish()
    }
}

impl LeaderWatch {
    fn look(&self) -> Result<Look, LeaseError> {
        with_conn(self.client.pool(), |conn| finish(look(conn, &self.name)))
    }

    /// Who led as of the last change returned.
    pub fn leader(&self) -> Option<&Leader> {
        self.leader.as_ref()
    }

    /// The next change, waiting up to `timeout` (a look at the database in
    /// progress may run past it by up to the pool's checkout timeout).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Option<LeaderChange> {
        let until = Instant::now().checked_add(timeout);
        loop {
            if let Some(change) = self.pending.take() {
                self.leader = change.leader().cloned();
                return Some(change);
            }
            if Instant::now() >= self.observer.look_at() {
                let looked = self.look();
                self.pending = self.observer.looked(looked, self.changes.armed());
                continue;
            }
            let wake = until.map_or(self.observer.look_at(), |until| {
                until.min(self.observer.look_at())
            });
            if until.is_some_and(|until| Instant::now() >= until) {
                return None;
            }
            if self.changes.wait(wake) {
                self.observer.announced();
            }
        }
    }

    /// The next change, waiting as long as it takes.
    pub fn recv(&mut self) -> LeaderChange {
        loop {
            if let Some(change) = self.recv_timeout(Duration::from_secs(3600)) {
                return change;
            }
        }
    }
}

/// Every change as it comes: blocks until the next one, and never ends.
impl Iterator for LeaderWatch {
    type Item = LeaderChange;

    fn next(&mut self) -> Option<LeaderChange> {
        Some(self.recv())
    }
}
