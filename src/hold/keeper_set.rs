//! Many grants of one owner kept alive by one heartbeat group.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::heartbeat::{Calls, Heart, Loops, Pulse};
use super::keeper::{keeper_setters, LeaseLoss};
use super::schedule::{lock, Schedule};
use crate::batch::groups::{GroupId, GroupRenewal};
use crate::batch::many::MAX_KEYS_PER_CALL;
use crate::client::LeaseClient;
use crate::error::{LeaseError, Operation, Repr};
use crate::lease::epoch::Epoch;
use crate::lease::outcome::{KeyRelease, Lease, Refusal, Release, Renewal};
use crate::lease::token::FencingToken;
use crate::pool::PgPool;
use crate::sql::execute::finish;

/// What a [`KeeperSet`] reports to [`KeeperSetBuilder::on_event`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum KeeperSetEvent {
    /// A heartbeat renewed the kept keys (refused ones follow as [`KeeperSetEvent::Lost`]).
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
    keeper_setters!(KeeperSetEvent);

    /// Validates (one owner's distinct keys, 1 to [`MAX_KEYS_PER_CALL`]), sends the
    /// first heartbeat and starts the threads. Keys it finds lost are reported; only
    /// if all are refused does it fail ([`ErrorKind::Fenced`](crate::ErrorKind::Fenced)).
    pub fn start(self) -> Result<KeeperSet, LeaseError> {
        let (shared, loops) = finish(self.settings.start(Calls::Blocking(self.pool)))?;
        Ok(KeeperSet {
            shared,
            loops: Some(loops),
        })
    }
}

/// What a keeper set is built from, either face's.
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

    /// Checks the leases and schedule, sends the first heartbeat (the first
    /// deadline comes from it) and starts the loops where `calls` run: both
    /// faces' `start`.
    pub(crate) async fn start(self, calls: Calls) -> Result<(Arc<Shared>, Loops), LeaseError> {
        let shared = self.into_shared(calls)?;
        shared.first_heartbeat().await?;
        let loops = Loops::start(&shared, "leasehold-keeper-set")?;
        Ok((shared, loops))
    }

    /// Checks the leases and schedule and makes the shared state, calling on `calls`.
    fn into_shared(self, calls: Calls) -> Result<Arc<Shared>, LeaseError> {
        let invalid = |reason: String| {
            Err(LeaseError::from(Repr::InvalidInput {
                violations: vec![reason],
            }))
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
        let schedule = Schedule::resolve(ttl, self.margin, self.renew_every, self.retry_every)?;
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
            schedule,
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
            pulse: Pulse::new(),
            on_event: self.on_event,
        }))
    }
}

/// A heartbeat that keeps one owner's many grants (partitions, shards) alive with
/// one call and one row write per beat: the [`Keeper`](super::Keeper)'s rules over
/// a heartbeat group ([`crate::Leases::join_group`]), rejoined when it lapses or
/// loses members. A refused key is lost alone; the deadline is the set's, so when
/// it passes every kept key is lost. Stop and drop release in one call.
///
/// ```no_run
/// # fn demo(client: &leasehold::LeaseClient, leases: Vec<leasehold::Lease>) -> Result<(), Box<dyn std::error::Error>> {
/// let keepers = leasehold::hold::KeeperSet::start(client, leases)?;
/// if keepers.is_valid("shard-1") { /* work on shard-1 with keepers.token("shard-1") */ }
/// keepers.stop()?;
/// # Ok(()) }
/// ```
pub struct KeeperSet {
    shared: Arc<Shared>,
    /// `None` once stopped.
    loops: Option<Loops>,
}

impl std::fmt::Debug for KeeperSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

/// One kept grant.
struct Member {
    lease: Lease,
    /// False once the key is lost or the set stopped; read lock-free by `is_valid`.
    kept: AtomicBool,
}

/// The read-only accessors both faces' `KeeperSet` share, written once.
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

        /// Whether `key` is safe to act on right now: kept and before the set's deadline.
        pub fn is_valid(&self, key: &str) -> bool {
            self.shared.is_valid(key)
        }

        /// The keys still kept, in the order the leases were given.
        pub fn kept_keys(&self) -> Vec<String> {
            self.shared.kept_keys()
        }

        /// Until when the kept keys may be acted on: last heartbeat's send + ttl - margin.
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
#[cfg(feature = "async")]
pub(crate) use set_accessors;

pub(crate) struct Shared {
    members: Vec<Member>,
    /// Key -> position in `members`.
    index: HashMap<String, usize>,
    owner: String,
    calls: Calls,
    schedule: Schedule,
    /// Origin of `valid_until`.
    base: Instant,
    /// Nanoseconds after `base` the kept keys are safe until; 0 once stopped or all lost.
    valid_until: AtomicU64,
    state: Mutex<State>,
    pulse: Pulse,
    on_event: Option<EventHandler>,
}

struct State {
    safe_until: Instant,
    last_sent: Instant,
    /// Every lost key with its loss, in the order they were lost.
    losses: Vec<(String, LeaseLoss)>,
    last_error: Option<Arc<LeaseError>>,
    stopping: bool,
    /// The kept keys' group and its member count at joining; `None` until a join, and
    /// again when a heartbeat did not renew every kept key.
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
    /// Wakes the set's loops and every caller waiting on it.
    fn notify(&self) {
        self.pulse.notify();
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

    /// Marks a key lost (first loss wins); its event if it was kept. State locked.
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

    /// One heartbeat: renew_group while the group holds every kept key, else join_group
    /// (per key, refusals reported, a new group). Records nothing on error.
    pub(crate) async fn heartbeat_once(&self) -> Result<Beat, LeaseError> {
        let positions = self.kept_positions();
        if positions.is_empty() {
            return Ok(Beat::Over);
        }
        let group = lock(&self.state).group;
        if let Some((group, joined)) = group {
            if joined == positions.len() {
                let sent_at = Instant::now();
                let answer = self
                    .calls
                    .renew_group(group, &self.owner, self.schedule.ttl)
                    .await?;
                let mut state = lock(&self.state);
                if state.stopping {
                    return Ok(Beat::Over);
                }
                match answer {
                    // All members still in the group: all renewed. A key lost meanwhile stays lost.
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
        let joined = self.calls.join_group(&grants, self.schedule.ttl).await?;
        let mut state = lock(&self.state);
        if state.stopping {
            return Ok(Beat::Over);
        }
        state.group = joined.group.map(|group| (group, joined.renewed()));
        let mut events = Vec::new();
        let mut renewed = 0;
        // Answers come in the order sent (join_group checks it); a key lost meanwhile
        // stays lost: the loss is final.
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

    /// Records a heartbeat of `renewed` keys sent at `sent_at`: `Renewed`, then `lost`.
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
        let safe_until = super::schedule::safe_until(
            sent_at,
            self.schedule.ttl,
            self.schedule.margin,
            state.safe_until,
        );
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

    /// The first heartbeat, from either face's `start`: fails on error, or with
    /// [`ErrorKind::Fenced`](crate::ErrorKind::Fenced) when every key was refused.
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
            return Err(LeaseError::from(Repr::LeaseNotHeld {
                operation: Operation::RENEW,
                key,
                owner: self.owner.clone(),
                epoch,
                reason,
            }));
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
        self.schedule.ttl
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

    /// Every loss once more than `seen` keys are lost, the set stops, or `until` passes.
    pub(crate) async fn losses_within(
        &self,
        seen: usize,
        until: Option<Instant>,
    ) -> Vec<(String, LeaseLoss)> {
        loop {
            let changes = self.pulse.seen();
            {
                let state = lock(&self.state);
                if state.losses.len() > seen
                    || state.stopping
                    || until.is_some_and(|until| Instant::now() >= until)
                {
                    return state.losses.clone();
                }
            }
            self.pulse.wait(&self.calls, changes, until).await;
        }
    }

    /// `key`'s loss once there is one; `None` if the set stops first, at
    /// `until`, or at once for a key not in the set.
    pub(crate) async fn key_loss_within(
        &self,
        key: &str,
        until: Option<Instant>,
    ) -> Option<LeaseLoss> {
        self.index.get(key)?;
        loop {
            let changes = self.pulse.seen();
            {
                let state = lock(&self.state);
                if let Some((_, loss)) = state.losses.iter().find(|(lost, _)| lost == key) {
                    return Some(loss.clone());
                }
                if state.stopping || until.is_some_and(|until| Instant::now() >= until) {
                    return None;
                }
            }
            self.pulse.wait(&self.calls, changes, until).await;
        }
    }

    fn over(&self, state: &State) -> bool {
        state.stopping || self.kept_positions().is_empty()
    }

    /// Marks the set stopping; answers the keys a heartbeat refused.
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

    /// Releases the keys not `refused` in one call, for at most `stop_bound`;
    /// refused keys answer their refusal.
    pub(crate) async fn release_kept(
        &self,
        refused: HashMap<String, Refusal>,
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        let to_release: Vec<Lease> = self
            .members
            .iter()
            .filter(|member| !refused.contains_key(member.lease.key()))
            .map(|member| member.lease.clone())
            .collect();
        let mut released: HashMap<String, Release> = match to_release.first() {
            None => HashMap::new(),
            Some(first) => {
                let key = first.key().to_owned();
                self.calls
                    .within(
                        self.stop_bound(),
                        Operation::RELEASE_MANY,
                        &key,
                        |calls| async move {
                            let grants: Vec<&Lease> = to_release.iter().collect();
                            calls.release_many(&grants).await
                        },
                    )
                    .await?
                    .into_iter()
                    .map(|answer| (answer.key, answer.release))
                    .collect()
            }
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

/// Both faces' `KeeperSet` print as this.
impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeeperSet")
            .field("owner", &self.owner)
            .field("keys", &self.members.len())
            .field("kept", &self.kept_positions().len())
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
        self.over(&lock(&self.state))
    }

    fn last_sent(&self) -> Instant {
        lock(&self.state).last_sent
    }

    async fn beat(&self) -> Result<bool, LeaseError> {
        match self.heartbeat_once().await? {
            Beat::Done(events) => {
                for event in &events {
                    self.emit(event);
                }
                Ok(true)
            }
            Beat::Over => Ok(false),
        }
    }

    fn beat_failed(&self, error: Arc<LeaseError>) {
        lock(&self.state).last_error = Some(error.clone());
        self.emit(&KeeperSetEvent::RenewFailed { error });
    }

    fn deadline(&self) -> (Instant, Option<Arc<LeaseError>>) {
        let state = lock(&self.state);
        (state.safe_until, state.last_error.clone())
    }

    fn deadline_passed(&self, last_error: Option<Arc<LeaseError>>) {
        self.lose_all(last_error);
    }
}

impl KeeperSet {
    /// Keeps `leases` (one owner's, distinct keys) alive with the defaults; heartbeats once first.
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

    /// Blocks until `key` is lost or `timeout` passes; returns its loss.
    pub fn wait_for_loss(&self, key: &str, timeout: Duration) -> Option<LeaseLoss> {
        finish(
            self.shared
                .key_loss_within(key, Some(Instant::now() + timeout)),
        )
    }

    /// Blocks until more than `seen` keys are lost or `timeout`; returns all losses so far.
    pub fn wait_for_losses(&self, seen: usize, timeout: Duration) -> Vec<(String, LeaseLoss)> {
        finish(
            self.shared
                .losses_within(seen, Some(Instant::now() + timeout)),
        )
    }

    /// Stops, releases the unrefused keys in one call and waits for the
    /// threads; per key in order.
    /// Within the stop bound, whatever the database does (down, silent,
    /// refusing): until the safe deadline, or the margin once it has passed.
    /// A release not answered by then finishes on its own and this answers
    /// [`ErrorKind::TimedOut`](crate::ErrorKind::TimedOut); the leases lapse at its ttl.
    pub fn stop(mut self) -> Result<Vec<KeyRelease>, LeaseError> {
        let deadline = self.shared.stop_deadline();
        let refused = self.shared.begin_stop();
        let released = finish(self.shared.release_kept(refused));
        if let Some(loops) = self.loops.take() {
            finish(loops.join_until(deadline));
        }
        released
    }
}

impl Drop for KeeperSet {
    /// Stops renewing and releases, best effort, without waiting for a heartbeat.
    fn drop(&mut self) {
        release_on_drop(&self.shared, self.loops.take());
    }
}

/// Both faces' drop: stop, and release the keys no heartbeat refused.
pub(crate) fn release_on_drop(shared: &Arc<Shared>, loops: Option<Loops>) {
    let Some(loops) = loops else {
        return;
    };
    let refused = shared.begin_stop();
    let shared = shared.clone();
    loops.release_when_done(async move {
        let _ = shared.release_kept(refused).await;
    });
}
