//! A heartbeat that keeps a whole set of one owner's grants alive with one
//! call and one row write per beat ([`crate::Leases::renew_group`]), and reports
//! each lost key on its own.
//!
//! It is the [`Keeper`](super::Keeper) for a worker that holds many keys
//! (partitions, shards, tenants): the same deadline rule, the same loss
//! rules and the same threads, but one round trip per heartbeat for all
//! keys instead of one per key. The keys are joined to a heartbeat group
//! ([`crate::Leases::join_group`]), whose one row each beat extends; a beat that
//! answers the group lapsed, or holding fewer members than the set keeps,
//! joins the kept keys again, which renews each and answers per key.
//!
//! # Per key and for the set
//!
//! - A key whose renew answers anything but `ok` is lost on its own
//!   ([`LeaseLoss::Refused`], reported in [`KeeperSetEvent::Lost`] with its
//!   key); the others stay kept, and the next heartbeat no longer sends it.
//! - The deadline is the set's: every heartbeat renews all kept keys, so
//!   they share `safe_until = sent + ttl - margin` of the last successful
//!   heartbeat. When it passes without one (database unreachable), every
//!   kept key is lost with [`LeaseLoss::DeadlinePassed`], each reported.
//!
//! [`KeeperSet::stop`] and drop release the kept keys in one call
//! ([`crate::Leases::release_many`]).
//!
//! ```no_run
//! # fn demo(client: &leasehold::LeaseClient, leases: Vec<leasehold::Lease>) -> Result<(), Box<dyn std::error::Error>> {
//! let keepers = leasehold::hold::KeeperSet::start(client, leases)?; // one renew_group per heartbeat
//! while keepers.is_valid("shard-1") {
//!     // ... one step of work on shard-1, presenting keepers.token("shard-1") to guards ...
//!     # break;
//! }
//! for (key, loss) in keepers.losses() {
//!     eprintln!("lost {key}: {loss}");
//! }
//! keepers.stop()?; // releases what is still kept
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::keeper::LeaseLoss;
use super::schedule::{lock, spawn, Schedule};
use crate::batch::groups::{self, GroupId, GroupRenewal};
use crate::batch::many::{self, MAX_KEYS_PER_CALL};
use crate::client::LeaseClient;
use crate::error::LeaseError;
use crate::lease::epoch::Epoch;
use crate::lease::outcome::{KeyRelease, Lease, Refusal, Release, Renewal};
use crate::lease::token::FencingToken;
use crate::pool::{with_conn, PgPool};
use crate::sql::execute::finish;

/// What a [`KeeperSet`] reports to [`KeeperSetBuilder::on_event`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum KeeperSetEvent {
    /// A heartbeat renewed the kept keys (those it refused are reported
    /// as [`KeeperSetEvent::Lost`] right after).
    Renewed {
        /// When the heartbeat was sent (client monotonic clock).
        sent_at: Instant,
        /// How many keys it renewed.
        renewed: usize,
        /// The new deadline of the kept keys: `sent_at + ttl - margin`.
        safe_until: Instant,
    },
    /// A heartbeat failed as a whole; it is retried until the deadline.
    RenewFailed {
        /// What went wrong.
        error: Arc<LeaseError>,
    },
    /// One key is lost; reported once per key, then it is renewed no more.
    Lost {
        /// The lost key.
        key: String,
        /// Why.
        loss: LeaseLoss,
    },
}

pub(crate) type EventHandler = Box<dyn Fn(&KeeperSetEvent) + Send + Sync>;

/// Configures a [`KeeperSet`]; see [`KeeperSet::builder`].
#[must_use = "a builder does nothing until start() is called"]
pub struct KeeperSetBuilder {
    pool: PgPool,
    settings: SetSettings,
}

impl std::fmt::Debug for KeeperSetBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.settings.fmt(f)
    }
}

impl std::fmt::Debug for SetSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeeperSetBuilder")
            .field("keys", &self.leases.len())
            .field("ttl", &self.ttl)
            .field("renew_every", &self.renew_every)
            .field("retry_every", &self.retry_every)
            .field("margin", &self.margin)
            .finish()
    }
}

impl KeeperSetBuilder {
    /// The ttl each heartbeat asks for (default: the shortest
    /// [`Lease::ttl`] of the set, so every key is renewed at least as often
    /// as its own ttl needs).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = Some(ttl);
        self
    }

    /// Time between heartbeats (default ttl / 3). Must be shorter than
    /// ttl - margin.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.settings.renew_every = Some(every);
        self
    }

    /// Time between retries of a failed heartbeat (default ttl / 30).
    pub fn retry_every(mut self, every: Duration) -> Self {
        self.settings.retry_every = Some(every);
        self
    }

    /// How much earlier than `sent + ttl` the deadline lies (default
    /// ttl / 10). Must be shorter than the ttl.
    pub fn margin(mut self, margin: Duration) -> Self {
        self.settings.margin = Some(margin);
        self
    }

    /// Called (on a keeper thread) for every heartbeat, failed heartbeat,
    /// and each lost key. Keep it short; it may call the set's methods.
    pub fn on_event(mut self, handler: impl Fn(&KeeperSetEvent) + Send + Sync + 'static) -> Self {
        self.settings.on_event = Some(Box::new(handler));
        self
    }

    /// Validates, sends the first heartbeat (establishing the first
    /// deadline) and starts the background threads.
    ///
    /// The leases must be one owner's, of distinct keys, between 1 and
    /// [`MAX_KEYS_PER_CALL`] of them ([`LeaseError::InvalidInput`]
    /// otherwise). A key the first heartbeat finds already lost is reported
    /// as lost (and kept no more), like any later loss; only when every key
    /// is refused does `start` fail, with [`LeaseError::LeaseNotHeld`] for the
    /// first of them.
    pub fn start(self) -> Result<KeeperSet, LeaseError> {
        let shared = self.settings.into_shared(Calls::Blocking(self.pool))?;
        // The first deadline comes from a heartbeat sent now.
        finish(shared.first_heartbeat())?;
        let renewer = {
            let shared = shared.clone();
            spawn("leasehold-keeper-set", move || shared.renew_loop())?
        };
        let monitor = {
            let shared = shared.clone();
            spawn("leasehold-keeper-set-deadline", move || {
                shared.monitor_loop()
            })?
        };
        Ok(KeeperSet {
            shared,
            threads: vec![renewer, monitor],
        })
    }
}

/// What a keeper set is built from, either face's: the leases and the
/// schedule's settings.
pub(crate) struct SetSettings {
    pub(crate) leases: Vec<Lease>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) retry_every: Option<Duration>,
    pub(crate) margin: Option<Duration>,
    pub(crate) on_event: Option<EventHandler>,
}

impl SetSettings {
    /// No settings yet for `leases`.
    pub(crate) fn new(leases: Vec<Lease>) -> Self {
        SetSettings {
            leases,
            ttl: None,
            renew_every: None,
            retry_every: None,
            margin: None,
            on_event: None,
        }
    }

    /// Checks the leases and the schedule ([`KeeperSetBuilder::start`]
    /// says what they must be) and makes the set's shared state, whose
    /// calls run on `calls`.
    pub(crate) fn into_shared(self, calls: Calls) -> Result<Arc<Shared>, LeaseError> {
        let invalid = |reason: String| {
            Err(LeaseError::InvalidInput {
                violations: vec![reason],
            })
        };
        let Some(first) = self.leases.first() else {
            return invalid("a keeper set needs at least one lease".into());
        };
        if self.leases.len() > MAX_KEYS_PER_CALL {
            return invalid(format!(
                "a keeper set keeps at most {MAX_KEYS_PER_CALL} leases (one join_group call), not {}",
                self.leases.len()
            ));
        }
        let owner = first.owner().to_owned();
        if let Some(other) = self.leases.iter().find(|lease| lease.owner() != owner) {
            return invalid(format!(
                "every lease of a keeper set must have one owner: {:?} is owned by {:?}, not {owner:?}",
                other.key(),
                other.owner()
            ));
        }
        let mut index = HashMap::with_capacity(self.leases.len());
        for (position, lease) in self.leases.iter().enumerate() {
            if index.insert(lease.key().to_owned(), position).is_some() {
                return invalid(format!(
                    "key {:?} appears twice in the keeper set",
                    lease.key()
                ));
            }
        }
        let ttl = self
            .ttl
            .unwrap_or_else(|| self.leases.iter().map(Lease::ttl).min().unwrap_or_default());
        let Schedule {
            ttl,
            margin,
            renew_every,
            retry_every,
        } = Schedule::resolve(ttl, self.margin, self.renew_every, self.retry_every)?;
        let base = Instant::now();
        Ok(Arc::new(Shared {
            members: self
                .leases
                .into_iter()
                .map(|lease| Member {
                    lease,
                    kept: AtomicBool::new(true),
                })
                .collect(),
            index,
            owner,
            calls,
            ttl,
            margin,
            renew_every,
            retry_every,
            base,
            valid_until: AtomicU64::new(0),
            state: Mutex::new(State {
                safe_until: base,
                last_sent: base,
                losses: Vec::new(),
                last_error: None,
                stopping: false,
                group: None,
            }),
            changed: Condvar::new(),
            #[cfg(feature = "async")]
            tasks: tokio::sync::Notify::new(),
            on_event: self.on_event,
        }))
    }
}

/// Keeps a set of one owner's grants alive in the background, one call per
/// heartbeat; see the module docs.
pub struct KeeperSet {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for KeeperSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeeperSet")
            .field("owner", &self.shared.owner)
            .field("keys", &self.shared.members.len())
            .field("kept", &self.shared.kept_positions().len())
            .finish()
    }
}

/// One kept grant.
struct Member {
    lease: Lease,
    /// False once the key is lost (or the set stopped). Read without a lock
    /// by `is_valid`.
    kept: AtomicBool,
}

/// Where a set's calls run: the sync face's pool (the set's threads block
/// on them) or, for the async face's set, its pool of async connections.
/// The heartbeat and the release are written once over it.
pub(crate) enum Calls {
    /// A [`LeaseClient`]'s pool.
    Blocking(PgPool),
    /// An `aio::AsyncLeaseClient`.
    #[cfg(feature = "async")]
    Tasks(crate::aio::AsyncLeaseClient),
}

impl Calls {
    async fn renew_group(
        &self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> Result<GroupRenewal, LeaseError> {
        match self {
            Calls::Blocking(pool) => with_conn(pool, |conn| {
                finish(groups::renew_group(conn, group, owner, ttl))
            }),
            #[cfg(feature = "async")]
            Calls::Tasks(client) => {
                let mut conn = client.checkout().await?;
                let answer = groups::renew_group(&mut *conn, group, owner, ttl).await;
                crate::aio::settle(conn, &answer);
                answer
            }
        }
    }

    async fn join_group(
        &self,
        grants: &[&Lease],
        ttl: Duration,
    ) -> Result<crate::batch::groups::GroupJoin, LeaseError> {
        match self {
            Calls::Blocking(pool) => with_conn(pool, |conn| {
                finish(groups::join_group(conn, many::split_grants(grants), ttl))
            }),
            #[cfg(feature = "async")]
            Calls::Tasks(client) => {
                let split = many::split_grants(grants);
                let mut conn = client.checkout().await?;
                let answer = groups::join_group(&mut *conn, split, ttl).await;
                crate::aio::settle(conn, &answer);
                answer
            }
        }
    }

    async fn release_many(&self, grants: &[&Lease]) -> Result<Vec<KeyRelease>, LeaseError> {
        match self {
            Calls::Blocking(pool) => with_conn(pool, |conn| {
                finish(many::release_many(conn, many::split_grants(grants)))
            }),
            #[cfg(feature = "async")]
            Calls::Tasks(client) => {
                let split = many::split_grants(grants);
                let mut conn = client.checkout().await?;
                let answer = many::release_many(&mut *conn, split).await;
                crate::aio::settle(conn, &answer);
                answer
            }
        }
    }
}

/// The read-only accessors both faces' `KeeperSet` share: each reads the
/// set's shared state (`self.shared`), so they are written once here.
macro_rules! set_accessors {
    () => {
        /// The owner of every lease in the set.
        pub fn owner(&self) -> &str {
            self.shared.owner()
        }

        /// The ttl each heartbeat asks for.
        pub fn ttl(&self) -> Duration {
            self.shared.ttl()
        }

        /// The grant of `key` as acquired, if `key` is in the set.
        pub fn lease(&self, key: &str) -> Option<&Lease> {
            self.shared.lease(key)
        }

        /// The fencing token of `key`'s grant, if `key` is in the set.
        pub fn token(&self, key: &str) -> Option<&FencingToken> {
            self.shared.token(key)
        }

        /// Whether `key` is safe to act on right now: in the set, not lost, not
        /// stopped, and before the set's `safe_until`. Two atomic loads and a
        /// clock read.
        pub fn is_valid(&self, key: &str) -> bool {
            self.shared.is_valid(key)
        }

        /// The keys still kept, in the order the leases were given.
        pub fn kept_keys(&self) -> Vec<String> {
            self.shared.kept_keys()
        }

        /// Until when the kept keys may be acted on: the last successful
        /// heartbeat's send instant + ttl - margin (client monotonic clock).
        pub fn safe_until(&self) -> Instant {
            self.shared.safe_until()
        }

        /// Why `key` is lost, if it is.
        pub fn loss(&self, key: &str) -> Option<LeaseLoss> {
            self.shared.loss(key)
        }

        /// Every lost key with its loss, in the order they were lost.
        pub fn losses(&self) -> Vec<(String, LeaseLoss)> {
            self.shared.losses()
        }
    };
}
pub(crate) use set_accessors;

pub(crate) struct Shared {
    members: Vec<Member>,
    /// Key -> position in `members`.
    index: HashMap<String, usize>,
    owner: String,
    calls: Calls,
    ttl: Duration,
    margin: Duration,
    renew_every: Duration,
    retry_every: Duration,
    /// Origin of `valid_until`.
    base: Instant,
    /// Nanoseconds after `base` until which the kept keys are safe; 0 once
    /// stopped or all lost.
    valid_until: AtomicU64,
    state: Mutex<State>,
    changed: Condvar,
    /// The async face's set waits here instead of on the condvar; every
    /// change notifies both ([`Shared::notify`]).
    #[cfg(feature = "async")]
    tasks: tokio::sync::Notify,
    on_event: Option<EventHandler>,
}

struct State {
    safe_until: Instant,
    last_sent: Instant,
    /// Every lost key with its loss, in the order they were lost.
    losses: Vec<(String, LeaseLoss)>,
    last_error: Option<Arc<LeaseError>>,
    stopping: bool,
    /// The heartbeat group of the kept keys and how many members it had
    /// when they joined; `None` until the first join, and again whenever a
    /// heartbeat of the group did not renew every kept key.
    group: Option<(GroupId, usize)>,
}

/// What one heartbeat did.
pub(crate) enum Beat {
    /// The events to report (renewed, then each refused key).
    Done(Vec<KeeperSetEvent>),
    /// Nothing left to keep, or the set is stopping or lost: stop beating.
    Over,
}

impl Shared {
    /// Wakes whoever waits for the state: the sync set's threads and
    /// callers, the async set's tasks.
    fn notify(&self) {
        self.changed.notify_all();
        #[cfg(feature = "async")]
        self.tasks.notify_waiters();
    }

    pub(crate) fn emit(&self, event: &KeeperSetEvent) {
        if let Some(handler) = &self.on_event {
            handler(event);
        }
    }

    fn nanos_since_base(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn kept_positions(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&position| self.members[position].kept.load(Ordering::SeqCst))
            .collect()
    }

    /// Marks one key lost (the first loss of a key wins) and returns the
    /// event to report, if it was still kept. Called with the state locked.
    fn lose(&self, state: &mut State, position: usize, loss: LeaseLoss) -> Option<KeeperSetEvent> {
        let member = &self.members[position];
        if !member.kept.swap(false, Ordering::SeqCst) {
            return None;
        }
        crate::telemetry::lease_lost(&member.lease, loss.reason(), &loss);
        let key = member.lease.key().to_owned();
        state.losses.push((key.clone(), loss.clone()));
        self.notify();
        Some(KeeperSetEvent::Lost { key, loss })
    }

    /// Sends one heartbeat for the kept keys and records its answers: a
    /// renew_group while the group still holds every kept key, otherwise a
    /// join_group, which renews each kept key, reports each refused one,
    /// and puts the renewed ones into a new group. On error nothing is
    /// recorded here; the caller decides.
    pub(crate) async fn heartbeat_once(&self) -> Result<Beat, LeaseError> {
        let positions = self.kept_positions();
        if positions.is_empty() {
            return Ok(Beat::Over);
        }
        let group = lock(&self.state).group;
        if let Some((group, joined)) = group {
            if joined == positions.len() {
                let sent_at = Instant::now();
                let answer = self.calls.renew_group(group, &self.owner, self.ttl).await?;
                let mut state = lock(&self.state);
                if state.stopping {
                    return Ok(Beat::Over);
                }
                match answer {
                    // Every member is still in the group: all renewed. A key
                    // lost while the call was in flight stays lost.
                    GroupRenewal::Renewed { members, .. } if members == joined => {
                        let renewed = self.kept_positions().len();
                        return Ok(Beat::Done(self.renewed(
                            &mut state,
                            sent_at,
                            renewed,
                            Vec::new(),
                        )));
                    }
                    // Some member left, or the group lapsed: renew key by key.
                    _ => state.group = None,
                }
            }
        }
        let grants: Vec<&Lease> = positions
            .iter()
            .map(|&position| &self.members[position].lease)
            .collect();
        let sent_at = Instant::now();
        let joined = self.calls.join_group(&grants, self.ttl).await?;
        let mut state = lock(&self.state);
        if state.stopping {
            return Ok(Beat::Over);
        }
        state.group = joined.group.map(|group| (group, joined.renewed()));
        let mut events = Vec::new();
        let mut renewed = 0;
        // The answers come in the order sent (join_group checks it). A key
        // lost while the call was in flight (its deadline passed) stays
        // lost: a late renewal is ignored, the loss is final.
        for (&position, answer) in positions.iter().zip(joined.keys) {
            match answer.renewal {
                Renewal::Renewed { .. } => {
                    if self.members[position].kept.load(Ordering::SeqCst) {
                        renewed += 1;
                    }
                }
                Renewal::Refused(reason) => {
                    events.extend(self.lose(&mut state, position, LeaseLoss::Refused(reason)));
                }
            }
        }
        Ok(Beat::Done(
            self.renewed(&mut state, sent_at, renewed, events),
        ))
    }

    /// Records a heartbeat sent at `sent_at` that renewed `renewed` kept
    /// keys, and returns the events to report: `Renewed` first, then
    /// `lost`. Called with the state locked.
    fn renewed(
        &self,
        state: &mut State,
        sent_at: Instant,
        renewed: usize,
        mut events: Vec<KeeperSetEvent>,
    ) -> Vec<KeeperSetEvent> {
        if renewed == 0 {
            self.valid_until.store(0, Ordering::SeqCst);
            return events;
        }
        let safe_until =
            super::schedule::safe_until(sent_at, self.ttl, self.margin, state.safe_until);
        state.safe_until = safe_until;
        state.last_sent = sent_at;
        state.last_error = None;
        self.valid_until
            .store(self.nanos_since_base(safe_until), Ordering::SeqCst);
        self.notify();
        events.insert(
            0,
            KeeperSetEvent::Renewed {
                sent_at,
                renewed,
                safe_until,
            },
        );
        events
    }

    /// The first heartbeat, from either face's `start`: establishes the
    /// first deadline and reports its events; fails the start on an error,
    /// or with [`LeaseError::LeaseNotHeld`] (for the first key refused) when
    /// every key was refused.
    pub(crate) async fn first_heartbeat(&self) -> Result<(), LeaseError> {
        let events = self.heartbeat().await?;
        if self.kept_positions().is_empty() {
            let (key, reason) = lock(&self.state)
                .losses
                .iter()
                .find_map(|(key, loss)| match loss {
                    LeaseLoss::Refused(reason) => Some((key.clone(), *reason)),
                    LeaseLoss::DeadlinePassed { .. } => None,
                })
                .unwrap_or_else(|| (String::new(), Refusal::NeverHeld));
            let epoch = self
                .index
                .get(&key)
                .map_or(Epoch::from(1), |&at| self.members[at].lease.epoch());
            return Err(LeaseError::LeaseNotHeld {
                key,
                owner: self.owner.clone(),
                epoch,
                reason,
            });
        }
        for event in &events {
            self.emit(event);
        }
        Ok(())
    }

    /// The first heartbeat, from `start`: an error fails the start.
    async fn heartbeat(&self) -> Result<Vec<KeeperSetEvent>, LeaseError> {
        match self.heartbeat_once().await? {
            Beat::Done(events) => Ok(events),
            Beat::Over => Ok(Vec::new()),
        }
    }

    /// Declares every kept key lost because the deadline passed.
    pub(crate) fn lose_all(&self, last_error: Option<Arc<LeaseError>>) {
        let events: Vec<KeeperSetEvent> = {
            let mut state = lock(&self.state);
            if state.stopping {
                return;
            }
            self.valid_until.store(0, Ordering::SeqCst);
            (0..self.members.len())
                .filter_map(|position| {
                    self.lose(
                        &mut state,
                        position,
                        LeaseLoss::DeadlinePassed {
                            last_error: last_error.clone(),
                        },
                    )
                })
                .collect()
        };
        for event in &events {
            self.emit(event);
        }
    }

    /// The owner of every lease in the set.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// The ttl each heartbeat asks for.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The grant of `key` as acquired, if `key` is in the set.
    pub(crate) fn lease(&self, key: &str) -> Option<&Lease> {
        let position = *self.index.get(key)?;
        Some(&self.members[position].lease)
    }

    /// The fencing token of `key`'s grant, if `key` is in the set.
    pub(crate) fn token(&self, key: &str) -> Option<&FencingToken> {
        let position = *self.index.get(key)?;
        Some(self.members[position].lease.token())
    }

    /// Whether `key` is in the set, kept, and before the set's deadline.
    pub(crate) fn is_valid(&self, key: &str) -> bool {
        let Some(&position) = self.index.get(key) else {
            return false;
        };
        let until = self.valid_until.load(Ordering::SeqCst);
        self.members[position].kept.load(Ordering::SeqCst)
            && until != 0
            && self.nanos_since_base(Instant::now()) < until
    }

    /// The keys still kept, in the order the leases were given.
    pub(crate) fn kept_keys(&self) -> Vec<String> {
        self.kept_positions()
            .into_iter()
            .map(|position| self.members[position].lease.key().to_owned())
            .collect()
    }

    /// The set's deadline.
    pub(crate) fn safe_until(&self) -> Instant {
        lock(&self.state).safe_until
    }

    /// Why `key` is lost, if it is.
    pub(crate) fn loss(&self, key: &str) -> Option<LeaseLoss> {
        lock(&self.state)
            .losses
            .iter()
            .find(|(lost, _)| lost == key)
            .map(|(_, loss)| loss.clone())
    }

    /// Every lost key with its loss, in the order they were lost.
    pub(crate) fn losses(&self) -> Vec<(String, LeaseLoss)> {
        lock(&self.state).losses.clone()
    }

    /// Resolves when more than `seen` keys are lost, or the set stops;
    /// answers every loss so far (the async face's `wait_for_losses`).
    #[cfg(feature = "async")]
    pub(crate) async fn losses_after(&self, seen: usize) -> Vec<(String, LeaseLoss)> {
        loop {
            let mut notified = std::pin::pin!(self.tasks.notified());
            // Registered before the state is read, so a change in between
            // is not missed.
            notified.as_mut().enable();
            {
                let state = lock(&self.state);
                if state.losses.len() > seen || state.stopping {
                    return state.losses.clone();
                }
            }
            notified.await;
        }
    }

    /// Resolves when `key` is lost, with its loss; `None` when the set
    /// stopped first or `key` is not in it.
    #[cfg(feature = "async")]
    pub(crate) async fn key_lost(&self, key: &str) -> Option<LeaseLoss> {
        self.index.get(key)?;
        loop {
            let mut notified = std::pin::pin!(self.tasks.notified());
            notified.as_mut().enable();
            {
                let state = lock(&self.state);
                if let Some((_, loss)) = state.losses.iter().find(|(lost, _)| lost == key) {
                    return Some(loss.clone());
                }
                if state.stopping {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// The sync set's renewing loop as a task: the same heartbeats, the
    /// same events, waiting on the tokio side of [`Shared::notify`].
    #[cfg(feature = "async")]
    pub(crate) async fn renew_task(self: Arc<Self>) {
        let mut next = self.next_beat();
        loop {
            loop {
                let mut notified = std::pin::pin!(self.tasks.notified());
                notified.as_mut().enable();
                if self.over(&lock(&self.state)) {
                    return;
                }
                if Instant::now() >= next {
                    break;
                }
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(next.into()) => {}
                }
            }
            match self.heartbeat_once().await {
                Ok(Beat::Done(events)) => {
                    for event in &events {
                        self.emit(event);
                    }
                    next = self.next_beat();
                }
                Ok(Beat::Over) => return,
                Err(error) => {
                    let error = Arc::new(error);
                    lock(&self.state).last_error = Some(error.clone());
                    self.emit(&KeeperSetEvent::RenewFailed { error });
                    next = Instant::now() + self.retry_every;
                }
            }
        }
    }

    /// When the next heartbeat is due: `renew_every` after the last
    /// successful one was sent.
    #[cfg(feature = "async")]
    fn next_beat(&self) -> Instant {
        lock(&self.state).last_sent + self.renew_every
    }

    /// The sync set's deadline monitor as a task: loses every kept key
    /// when the deadline passes without a heartbeat, however long one may
    /// hang (it is never cancelled).
    #[cfg(feature = "async")]
    pub(crate) async fn monitor_task(self: Arc<Self>) {
        loop {
            let mut notified = std::pin::pin!(self.tasks.notified());
            notified.as_mut().enable();
            let (safe_until, last_error) = {
                let state = lock(&self.state);
                if self.over(&state) {
                    return;
                }
                (state.safe_until, state.last_error.clone())
            };
            if Instant::now() >= safe_until {
                self.lose_all(last_error);
                return;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(safe_until.into()) => {}
            }
        }
    }

    fn over(&self, state: &State) -> bool {
        state.stopping || self.kept_positions().is_empty()
    }

    fn renew_loop(&self) {
        let mut next = lock(&self.state).last_sent + self.renew_every;
        loop {
            {
                let mut state = lock(&self.state);
                loop {
                    if self.over(&state) {
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
            match finish(self.heartbeat_once()) {
                Ok(Beat::Done(events)) => {
                    for event in &events {
                        self.emit(event);
                    }
                    next = lock(&self.state).last_sent + self.renew_every;
                }
                Ok(Beat::Over) => return,
                Err(error) => {
                    let error = Arc::new(error);
                    lock(&self.state).last_error = Some(error.clone());
                    self.emit(&KeeperSetEvent::RenewFailed { error });
                    next = Instant::now() + self.retry_every;
                }
            }
        }
    }

    /// Declares every kept key lost when the deadline passes without a
    /// heartbeat, however long a heartbeat call may hang.
    fn monitor_loop(&self) {
        let mut state = lock(&self.state);
        loop {
            if self.over(&state) {
                return;
            }
            let now = Instant::now();
            if now >= state.safe_until {
                let last_error = state.last_error.clone();
                drop(state);
                self.lose_all(last_error);
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

    /// Stops the threads and releases every key not refused, in one call.
    /// Answers per key, in the order the leases were given: a key a
    /// heartbeat refused answers that refusal without a call.
    fn stop_and_release(&self) -> Result<Vec<KeyRelease>, LeaseError> {
        let refused = self.begin_stop();
        finish(self.release_kept(refused))
    }

    /// Marks the set stopping (its loops end at their next wake-up) and
    /// answers the keys a heartbeat refused, with their refusals.
    pub(crate) fn begin_stop(&self) -> HashMap<String, Refusal> {
        {
            let mut state = lock(&self.state);
            state.stopping = true;
            self.valid_until.store(0, Ordering::SeqCst);
            for member in &self.members {
                member.kept.store(false, Ordering::SeqCst);
            }
            self.notify();
            state
                .losses
                .iter()
                .filter_map(|(key, loss)| match loss {
                    LeaseLoss::Refused(reason) => Some((key.clone(), *reason)),
                    LeaseLoss::DeadlinePassed { .. } => None,
                })
                .collect()
        }
    }

    /// Releases every key not `refused` in one call. Answers per key, in
    /// the order the leases were given: a key a heartbeat refused answers
    /// that refusal without a call.
    pub(crate) async fn release_kept(
        &self,
        refused: HashMap<String, Refusal>,
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        let to_release: Vec<&Lease> = self
            .members
            .iter()
            .filter(|member| !refused.contains_key(member.lease.key()))
            .map(|member| &member.lease)
            .collect();
        let mut released: HashMap<String, Release> = if to_release.is_empty() {
            HashMap::new()
        } else {
            self.calls
                .release_many(&to_release)
                .await?
                .into_iter()
                .map(|answer| (answer.key, answer.release))
                .collect()
        };
        Ok(self
            .members
            .iter()
            .map(|member| {
                let key = member.lease.key().to_owned();
                let release = match refused.get(&key) {
                    Some(reason) => Release::Refused(*reason),
                    None => released
                        .remove(&key)
                        .unwrap_or(Release::Refused(Refusal::NeverHeld)),
                };
                KeyRelease { key, release }
            })
            .collect())
    }
}

impl KeeperSet {
    /// Starts keeping `leases` (one owner's, distinct keys) alive with the
    /// default settings, on `client`'s pool; sends the first heartbeat
    /// before returning.
    pub fn start(client: &LeaseClient, leases: Vec<Lease>) -> Result<KeeperSet, LeaseError> {
        Self::builder(client, leases).start()
    }

    /// A builder to change the ttl, intervals, margin, or observe events.
    pub fn builder(client: &LeaseClient, leases: Vec<Lease>) -> KeeperSetBuilder {
        KeeperSetBuilder {
            pool: client.pool().clone(),
            settings: SetSettings::new(leases),
        }
    }

    set_accessors!();

    /// Blocks until more than `seen` keys are lost, or `timeout` passes;
    /// returns every loss so far. Pass the length of the last answer to
    /// wait for the next loss.
    pub fn wait_for_losses(&self, seen: usize, timeout: Duration) -> Vec<(String, LeaseLoss)> {
        let until = Instant::now() + timeout;
        let mut state = lock(&self.shared.state);
        loop {
            let now = Instant::now();
            if state.losses.len() > seen || now >= until || state.stopping {
                return state.losses.clone();
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Stops renewing, waits for the set's threads, and releases every key
    /// not refused in one call. Answers per key, in the order the leases
    /// were given ([`Release::Refused`] for a key already lost).
    pub fn stop(mut self) -> Result<Vec<KeyRelease>, LeaseError> {
        let released = self.shared.stop_and_release();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        released
    }
}

impl Drop for KeeperSet {
    /// Stops renewing and releases (best effort; errors are ignored and the
    /// leases then lapse at their expiry). Does not wait for a heartbeat in
    /// flight.
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = self.shared.stop_and_release();
        }
    }
}
