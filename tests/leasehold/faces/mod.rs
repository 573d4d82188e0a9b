//! The behaviour suite written once and run against both faces of the
//! API: the sync [`leasehold::Leases`] on a `PgConnection` and the async
//! [`leasehold::aio::AsyncLeases`] on an `AsyncPgConnection` (feature
//! `async`).
//!
//! A case (in `cases.rs`) is an `async fn` generic over [`Face`], a small
//! harness that forwards each call to one face; [`both_faces!`] makes one
//! `#[test]` per case per face (`faces::sync_face::<case>`,
//! `faces::async_face::<case>`), so a failure names the case and the face.
//! The sync face's calls block inside the async harness: each test runs on
//! a runtime of its own with two workers, so a case that spawns a blocked
//! call (a waiter) still has a thread left for its own steps.

mod cases;

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use leasehold::admin::Operator;
use leasehold::aio::AsyncFencing;
use leasehold::aio::AsyncLeases;
use leasehold::aio::AsyncOperator;
use leasehold::batch::{GroupId, GroupJoin, GroupRenewal, KeyRelease, KeyRenewal};
use leasehold::error::LeaseError;
use leasehold::guard::FencedError;
use leasehold::guard::Fencing;
use leasehold::guard::{Check, GuardRecord};
use leasehold::hold::{KeeperEvent, LeaseLoss};
use leasehold::{
    Acquisition, Epoch, FencingToken, Lease, LeaseClient, LeaseState, Leases, Release, Renewal,
};

/// One face of the API, on a connection of its own to the test's
/// database. Every method is the face's method of the same name.
pub trait Face: Send + Sized + 'static {
    /// The face's name, in failure messages.
    const NAME: &'static str;
    fn open(url: &str) -> impl std::future::Future<Output = Self> + Send;
    fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl std::future::Future<Output = Result<Acquisition, LeaseError>> + Send;
    fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> impl std::future::Future<Output = Result<Lease, LeaseError>> + Send;
    fn renew(
        &mut self,
        grant: &FencingToken,
        ttl: Duration,
    ) -> impl std::future::Future<Output = Result<Renewal, LeaseError>> + Send;
    fn release(
        &mut self,
        grant: &FencingToken,
    ) -> impl std::future::Future<Output = Result<Release, LeaseError>> + Send;
    fn inspect(
        &mut self,
        key: &str,
    ) -> impl std::future::Future<Output = Result<Option<LeaseState>, LeaseError>> + Send;
    fn renew_many(
        &mut self,
        grants: &[FencingToken],
        ttl: Duration,
    ) -> impl std::future::Future<Output = Result<Vec<KeyRenewal>, LeaseError>> + Send;
    fn release_many(
        &mut self,
        grants: &[FencingToken],
    ) -> impl std::future::Future<Output = Result<Vec<KeyRelease>, LeaseError>> + Send;
    fn join_group(
        &mut self,
        grants: &[FencingToken],
        ttl: Duration,
    ) -> impl std::future::Future<Output = Result<GroupJoin, LeaseError>> + Send;
    fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> impl std::future::Future<Output = Result<GroupRenewal, LeaseError>> + Send;
    fn admit(
        &mut self,
        resource: &str,
        grant: &FencingToken,
    ) -> impl std::future::Future<Output = Result<(), LeaseError>> + Send;
    fn check_held(
        &mut self,
        grant: &FencingToken,
    ) -> impl std::future::Future<Output = Result<chrono::DateTime<chrono::Utc>, LeaseError>> + Send;
    fn admit_held(
        &mut self,
        resource: &str,
        grant: &FencingToken,
    ) -> impl std::future::Future<Output = Result<chrono::DateTime<chrono::Utc>, LeaseError>> + Send;
    fn renew_and_admit(
        &mut self,
        resource: &str,
        grant: &FencingToken,
        ttl: Duration,
    ) -> impl std::future::Future<Output = Result<chrono::DateTime<chrono::Utc>, LeaseError>> + Send;
    fn fence(
        &mut self,
        resource: &str,
        key: &str,
        up_to: Epoch,
    ) -> impl std::future::Future<Output = Result<Epoch, LeaseError>> + Send;
    fn inspect_guard(
        &mut self,
        resource: &str,
    ) -> impl std::future::Future<Output = Result<Option<GuardRecord>, LeaseError>> + Send;
    fn force_release(
        &mut self,
        key: &str,
    ) -> impl std::future::Future<Output = Result<Option<Epoch>, LeaseError>> + Send;
    /// `run_fenced` whose work runs `sql`, failing when `fail_work` says so.
    fn run_fenced_sql(
        &mut self,
        resource: &str,
        grant: &FencingToken,
        check: Check,
        sql: &str,
        fail_work: bool,
    ) -> impl std::future::Future<Output = Result<(), FencedError<diesel::result::Error>>> + Send;
    /// Opens a transaction through the face's diesel transaction manager
    /// (so the library sees it, as it sees the caller's own).
    fn begin(&mut self) -> impl std::future::Future<Output = ()> + Send;
    fn commit(&mut self) -> impl std::future::Future<Output = ()> + Send;
    fn rollback(&mut self) -> impl std::future::Future<Output = ()> + Send;
    /// Runs statements of the test's own.
    fn exec(&mut self, sql: &str) -> impl std::future::Future<Output = QueryResult<()>> + Send;
    /// The backend's pid.
    fn pid(&mut self) -> impl std::future::Future<Output = i32> + Send;

    /// The face's keeper of one grant: `Keeper` or `aio::Keeper`, on a
    /// client of its own to `url`.
    type Kept: Send + Sync + 'static;
    fn keep(
        url: &str,
        lease: Lease,
        renew_every: Duration,
    ) -> impl std::future::Future<Output = Self::Kept> + Send;
    fn kept_expires_at(kept: &Self::Kept) -> Option<chrono::DateTime<chrono::Utc>>;
    fn kept_is_valid(kept: &Self::Kept) -> bool;
    fn kept_loss(kept: &Self::Kept) -> Option<LeaseLoss>;
    /// The keeper's ttl and margin.
    fn kept_schedule(kept: &Self::Kept) -> (Duration, Duration);
    /// Every event its `on_event` handler was given so far, in order.
    fn kept_events(kept: &Self::Kept) -> Vec<KeeperEvent>;
    /// The keeper's `wait_for_loss` (the sync face's blocks a worker thread).
    fn kept_wait_for_loss(
        kept: &Self::Kept,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Option<LeaseLoss>> + Send;
    fn stop_keeping(
        kept: Self::Kept,
    ) -> impl std::future::Future<Output = Result<Release, LeaseError>> + Send;

    /// The face's waiter, `wait::LeaseWaiter` or `aio::LeaseWaiter`, on a
    /// client of its own to `url`, its listener up, and no timed
    /// re-check (only a notification wakes it in a test's time).
    type Waiter: Clone + Send + Sync + 'static;
    fn waiter(url: &str) -> impl std::future::Future<Output = Self::Waiter> + Send;
    /// The waiter's acquire, as a future a test may spawn (the sync face's
    /// blocking call runs on tokio's blocking pool).
    fn wait_for(
        waiter: Self::Waiter,
        key: &'static str,
        owner: &'static str,
        ttl: Duration,
        wait: Duration,
    ) -> impl std::future::Future<Output = Result<Lease, LeaseError>> + Send + 'static;
    fn armed_waiters(waiter: &Self::Waiter, key: &str) -> usize;
}

/// A face's keeper and the events its `on_event` handler sent.
pub struct Kept<K> {
    keeper: K,
    seen: std::sync::Mutex<std::sync::mpsc::Receiver<KeeperEvent>>,
    events: std::sync::Mutex<Vec<KeeperEvent>>,
}

impl<K> Kept<K> {
    fn new(keeper: K, seen: std::sync::mpsc::Receiver<KeeperEvent>) -> Self {
        Kept {
            keeper,
            seen: std::sync::Mutex::new(seen),
            events: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Every event so far, in the order the keeper gave them.
    fn events(&self) -> Vec<KeeperEvent> {
        let mut events = self.events.lock().unwrap();
        events.extend(self.seen.lock().unwrap().try_iter());
        events.clone()
    }
}

/// How long a test waits for a listener or a wake-up that should come at
/// once.
const SOON: Duration = Duration::from_secs(30);
/// A re-check interval no test outlives.
const NEVER: Duration = Duration::from_secs(3_600);

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pid: i32,
}

const PID: &str = "SELECT pg_backend_pid() AS pid";

/// The sync face: [`Leases`] on a `PgConnection`.
pub struct SyncFace(PgConnection);

impl Face for SyncFace {
    const NAME: &'static str = "sync";
    async fn open(url: &str) -> Self {
        SyncFace(PgConnection::establish(url).expect("connect"))
    }
    async fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Acquisition, LeaseError> {
        self.0.acquire(key, owner, ttl)
    }
    async fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LeaseError> {
        self.0.acquire_waiting(key, owner, ttl, wait)
    }
    async fn renew(&mut self, grant: &FencingToken, ttl: Duration) -> Result<Renewal, LeaseError> {
        self.0.renew(grant, ttl)
    }
    async fn release(&mut self, grant: &FencingToken) -> Result<Release, LeaseError> {
        self.0.release(grant)
    }
    async fn inspect(&mut self, key: &str) -> Result<Option<LeaseState>, LeaseError> {
        self.0.inspect(key)
    }
    async fn renew_many(
        &mut self,
        grants: &[FencingToken],
        ttl: Duration,
    ) -> Result<Vec<KeyRenewal>, LeaseError> {
        self.0.renew_many(grants, ttl)
    }
    async fn release_many(
        &mut self,
        grants: &[FencingToken],
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        self.0.release_many(grants)
    }
    async fn join_group(
        &mut self,
        grants: &[FencingToken],
        ttl: Duration,
    ) -> Result<GroupJoin, LeaseError> {
        self.0.join_group(grants, ttl)
    }
    async fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> Result<GroupRenewal, LeaseError> {
        self.0.renew_group(group, owner, ttl)
    }
    async fn admit(&mut self, resource: &str, grant: &FencingToken) -> Result<(), LeaseError> {
        self.0.admit(resource, grant, Check::Token).map(drop)
    }
    async fn check_held(
        &mut self,
        grant: &FencingToken,
    ) -> Result<chrono::DateTime<chrono::Utc>, LeaseError> {
        self.0.check_held(grant)
    }
    async fn admit_held(
        &mut self,
        resource: &str,
        grant: &FencingToken,
    ) -> Result<chrono::DateTime<chrono::Utc>, LeaseError> {
        self.0
            .admit(resource, grant, Check::LeaseHeld)
            .map(read_expiry)
    }
    async fn renew_and_admit(
        &mut self,
        resource: &str,
        grant: &FencingToken,
        ttl: Duration,
    ) -> Result<chrono::DateTime<chrono::Utc>, LeaseError> {
        self.0
            .admit(resource, grant, Check::RenewAndAdmit(ttl))
            .map(read_expiry)
    }
    async fn fence(
        &mut self,
        resource: &str,
        key: &str,
        up_to: Epoch,
    ) -> Result<Epoch, LeaseError> {
        self.0.fence(resource, key, up_to)
    }
    async fn inspect_guard(&mut self, resource: &str) -> Result<Option<GuardRecord>, LeaseError> {
        self.0.inspect_guard(resource)
    }
    async fn force_release(&mut self, key: &str) -> Result<Option<Epoch>, LeaseError> {
        self.0.force_release(key)
    }
    async fn run_fenced_sql(
        &mut self,
        resource: &str,
        grant: &FencingToken,
        check: Check,
        sql: &str,
        fail_work: bool,
    ) -> Result<(), FencedError<diesel::result::Error>> {
        self.0.run_fenced(resource, grant, check, |conn| {
            conn.batch_execute(sql)?;
            if fail_work {
                return Err(diesel::result::Error::RollbackTransaction);
            }
            Ok(())
        })
    }
    async fn begin(&mut self) {
        use diesel::connection::{AnsiTransactionManager, TransactionManager};
        AnsiTransactionManager::begin_transaction(&mut self.0).expect("begin");
    }
    async fn commit(&mut self) {
        use diesel::connection::{AnsiTransactionManager, TransactionManager};
        AnsiTransactionManager::commit_transaction(&mut self.0).expect("commit");
    }
    async fn rollback(&mut self) {
        use diesel::connection::{AnsiTransactionManager, TransactionManager};
        AnsiTransactionManager::rollback_transaction(&mut self.0).expect("rollback");
    }
    async fn exec(&mut self, sql: &str) -> QueryResult<()> {
        self.0.batch_execute(sql)
    }
    async fn pid(&mut self) -> i32 {
        diesel::sql_query(PID)
            .get_result::<Pid>(&mut self.0)
            .expect("pid")
            .pid
    }

    type Kept = Kept<leasehold::Keeper>;
    async fn keep(url: &str, lease: Lease, renew_every: Duration) -> Self::Kept {
        let client = LeaseClient::connect(url, 2).expect("a client");
        let (events, seen) = std::sync::mpsc::channel();
        let keeper = tokio::task::spawn_blocking(move || {
            leasehold::Keeper::builder(&client, lease)
                .renew_every(renew_every)
                .on_event(move |event| drop(events.send(event.clone())))
                .start()
        })
        .await
        .expect("the keeper's start")
        .expect("a keeper");
        Kept::new(keeper, seen)
    }
    fn kept_expires_at(kept: &Self::Kept) -> Option<chrono::DateTime<chrono::Utc>> {
        kept.keeper.expires_at()
    }
    fn kept_is_valid(kept: &Self::Kept) -> bool {
        kept.keeper.is_valid()
    }
    fn kept_loss(kept: &Self::Kept) -> Option<LeaseLoss> {
        kept.keeper.loss()
    }
    fn kept_schedule(kept: &Self::Kept) -> (Duration, Duration) {
        (kept.keeper.ttl(), kept.keeper.margin())
    }
    fn kept_events(kept: &Self::Kept) -> Vec<KeeperEvent> {
        kept.events()
    }
    async fn kept_wait_for_loss(kept: &Self::Kept, timeout: Duration) -> Option<LeaseLoss> {
        tokio::task::block_in_place(|| kept.keeper.wait_for_loss(timeout))
    }
    async fn stop_keeping(kept: Self::Kept) -> Result<Release, LeaseError> {
        tokio::task::spawn_blocking(move || kept.keeper.stop())
            .await
            .expect("the keeper's stop")
    }

    type Waiter = leasehold::wait::LeaseWaiter;
    async fn waiter(url: &str) -> Self::Waiter {
        let client = LeaseClient::connect(url, 4).expect("a client");
        tokio::task::spawn_blocking(move || {
            let waiter = leasehold::wait::LeaseWaiter::builder(&client)
                .recheck_every(NEVER)
                .build();
            assert!(waiter.wait_until_listening(SOON), "listener never up");
            waiter
        })
        .await
        .expect("the waiter")
    }
    async fn wait_for(
        waiter: Self::Waiter,
        key: &'static str,
        owner: &'static str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LeaseError> {
        tokio::task::spawn_blocking(move || waiter.acquire(key, owner, ttl, wait))
            .await
            .expect("the blocking wait")
    }
    fn armed_waiters(waiter: &Self::Waiter, key: &str) -> usize {
        waiter.armed_waiters(key)
    }
}

/// The async face: [`AsyncLeases`] on an `AsyncPgConnection`.
pub struct AsyncFace(AsyncPgConnection);

impl Face for AsyncFace {
    const NAME: &'static str = "async";
    async fn open(url: &str) -> Self {
        AsyncFace(AsyncPgConnection::establish(url).await.expect("connect"))
    }
    async fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Acquisition, LeaseError> {
        self.0.acquire(key, owner, ttl).await
    }
    async fn acquire_waiting(
        &mut self,
        key: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LeaseError> {
        self.0.acquire_waiting(key, owner, ttl, wait).await
    }
    async fn renew(&mut self, grant: &FencingToken, ttl: Duration) -> Result<Renewal, LeaseError> {
        self.0.renew(grant, ttl).await
    }
    async fn release(&mut self, grant: &FencingToken) -> Result<Release, LeaseError> {
        self.0.release(grant).await
    }
    async fn inspect(&mut self, key: &str) -> Result<Option<LeaseState>, LeaseError> {
        self.0.inspect(key).await
    }
    async fn renew_many(
        &mut self,
        grants: &[FencingToken],
        ttl: Duration,
    ) -> Result<Vec<KeyRenewal>, LeaseError> {
        self.0.renew_many(grants, ttl).await
    }
    async fn release_many(
        &mut self,
        grants: &[FencingToken],
    ) -> Result<Vec<KeyRelease>, LeaseError> {
        self.0.release_many(grants).await
    }
    async fn join_group(
        &mut self,
        grants: &[FencingToken],
        ttl: Duration,
    ) -> Result<GroupJoin, LeaseError> {
        self.0.join_group(grants, ttl).await
    }
    async fn renew_group(
        &mut self,
        group: GroupId,
        owner: &str,
        ttl: Duration,
    ) -> Result<GroupRenewal, LeaseError> {
        self.0.renew_group(group, owner, ttl).await
    }
    async fn admit(&mut self, resource: &str, grant: &FencingToken) -> Result<(), LeaseError> {
        self.0.admit(resource, grant, Check::Token).await.map(drop)
    }
    async fn check_held(
        &mut self,
        grant: &FencingToken,
    ) -> Result<chrono::DateTime<chrono::Utc>, LeaseError> {
        self.0.check_held(grant).await
    }
    async fn admit_held(
        &mut self,
        resource: &str,
        grant: &FencingToken,
    ) -> Result<chrono::DateTime<chrono::Utc>, LeaseError> {
        self.0
            .admit(resource, grant, Check::LeaseHeld)
            .await
            .map(read_expiry)
    }
    async fn renew_and_admit(
        &mut self,
        resource: &str,
        grant: &FencingToken,
        ttl: Duration,
    ) -> Result<chrono::DateTime<chrono::Utc>, LeaseError> {
        self.0
            .admit(resource, grant, Check::RenewAndAdmit(ttl))
            .await
            .map(read_expiry)
    }
    async fn fence(
        &mut self,
        resource: &str,
        key: &str,
        up_to: Epoch,
    ) -> Result<Epoch, LeaseError> {
        self.0.fence(resource, key, up_to).await
    }
    async fn inspect_guard(&mut self, resource: &str) -> Result<Option<GuardRecord>, LeaseError> {
        self.0.inspect_guard(resource).await
    }
    async fn force_release(&mut self, key: &str) -> Result<Option<Epoch>, LeaseError> {
        self.0.force_release(key).await
    }
    async fn run_fenced_sql(
        &mut self,
        resource: &str,
        grant: &FencingToken,
        check: Check,
        sql: &str,
        fail_work: bool,
    ) -> Result<(), FencedError<diesel::result::Error>> {
        self.0
            .run_fenced(
                resource,
                grant,
                check,
                async move |conn: &mut AsyncPgConnection| {
                    conn.batch_execute(sql).await?;
                    if fail_work {
                        return Err(diesel::result::Error::RollbackTransaction);
                    }
                    Ok(())
                },
            )
            .await
    }
    async fn begin(&mut self) {
        use diesel_async::{AnsiTransactionManager, TransactionManager};
        AnsiTransactionManager::begin_transaction(&mut self.0)
            .await
            .expect("begin");
    }
    async fn commit(&mut self) {
        use diesel_async::{AnsiTransactionManager, TransactionManager};
        AnsiTransactionManager::commit_transaction(&mut self.0)
            .await
            .expect("commit");
    }
    async fn rollback(&mut self) {
        use diesel_async::{AnsiTransactionManager, TransactionManager};
        AnsiTransactionManager::rollback_transaction(&mut self.0)
            .await
            .expect("rollback");
    }
    async fn exec(&mut self, sql: &str) -> QueryResult<()> {
        self.0.batch_execute(sql).await
    }
    async fn pid(&mut self) -> i32 {
        diesel_async::RunQueryDsl::get_result::<Pid>(diesel::sql_query(PID), &mut self.0)
            .await
            .expect("pid")
            .pid
    }

    type Kept = Kept<leasehold::aio::Keeper>;
    async fn keep(url: &str, lease: Lease, renew_every: Duration) -> Self::Kept {
        let client = leasehold::aio::AsyncLeaseClient::connect(url, 2)
            .await
            .expect("a client");
        let (events, seen) = std::sync::mpsc::channel();
        let keeper = leasehold::aio::Keeper::builder(&client, lease)
            .renew_every(renew_every)
            .on_event(move |event| drop(events.send(event.clone())))
            .start()
            .await
            .expect("a keeper");
        Kept::new(keeper, seen)
    }
    fn kept_expires_at(kept: &Self::Kept) -> Option<chrono::DateTime<chrono::Utc>> {
        kept.keeper.expires_at()
    }
    fn kept_is_valid(kept: &Self::Kept) -> bool {
        kept.keeper.is_valid()
    }
    fn kept_loss(kept: &Self::Kept) -> Option<LeaseLoss> {
        kept.keeper.loss()
    }
    fn kept_schedule(kept: &Self::Kept) -> (Duration, Duration) {
        (kept.keeper.ttl(), kept.keeper.margin())
    }
    fn kept_events(kept: &Self::Kept) -> Vec<KeeperEvent> {
        kept.events()
    }
    async fn kept_wait_for_loss(kept: &Self::Kept, timeout: Duration) -> Option<LeaseLoss> {
        kept.keeper.wait_for_loss(timeout).await
    }
    async fn stop_keeping(kept: Self::Kept) -> Result<Release, LeaseError> {
        kept.keeper.stop().await
    }

    type Waiter = leasehold::aio::LeaseWaiter;
    async fn waiter(url: &str) -> Self::Waiter {
        let client = leasehold::aio::AsyncLeaseClient::connect(url, 4)
            .await
            .expect("a client");
        let waiter = leasehold::aio::LeaseWaiter::builder(&client)
            .recheck_every(NEVER)
            .build();
        assert!(waiter.wait_until_listening(SOON).await, "listener never up");
        waiter
    }
    async fn wait_for(
        waiter: Self::Waiter,
        key: &'static str,
        owner: &'static str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LeaseError> {
        waiter.acquire(key, owner, ttl, wait).await
    }
    fn armed_waiters(waiter: &Self::Waiter, key: &str) -> usize {
        waiter.armed_waiters(key)
    }
}

/// A runtime of the test's own, with two workers (see the module's
/// documentation).
pub use crate::aio_common::runtime;

/// One `#[test]` per case per face.
macro_rules! both_faces {
    ($($case:ident),* $(,)?) => {
        mod sync_face {
            $(
                #[test]
                fn $case() {
                    let db = leasehold_test_support::TestDb::new();
                    super::runtime().block_on(super::cases::$case::<super::SyncFace>(&db));
                }
            )*
        }
        mod async_face {
            $(
                #[test]
                fn $case() {
                    let db = leasehold_test_support::TestDb::new();
                    super::runtime().block_on(super::cases::$case::<super::AsyncFace>(&db));
                }
            )*
        }
    };
}

both_faces!(
    a_free_key_is_granted_and_another_owner_is_denied,
    renew_extends_keeps_the_epoch_and_refuses_strangers,
    release_frees_the_key_and_moves_the_counter,
    epochs_only_rise_across_grants,
    a_renew_of_an_older_epoch_is_an_epoch_mismatch,
    a_lapsed_grant_is_refused_and_taken_over_with_a_higher_epoch,
    bad_input_is_a_typed_error_and_changes_nothing,
    a_grant_commits_with_the_callers_transaction,
    a_rolled_back_grant_never_happened,
    acquire_waiting_gets_the_key_when_it_is_released,
    acquire_waiting_times_out_and_changes_nothing,
    batch_calls_answer_per_key_in_order,
    batch_calls_refuse_mixed_owners_and_answer_nothing_for_nothing,
    a_group_heartbeat_keeps_its_members_and_refuses_strangers,
    g1_g3_an_admission_raises_the_record_and_an_equal_epoch_is_admitted_again,
    g2_a_stale_epoch_is_refused_and_its_write_is_rolled_back,
    g3_a_write_the_callers_code_rolls_back_does_not_raise_the_record,
    g4_writers_of_one_resource_serialise_at_the_guard,
    g5_a_token_of_another_key_is_refused,
    g6_a_checked_write_needs_the_lease_held_now,
    g6_a_checked_write_holds_off_a_takeover_until_it_commits,
    g7_an_epoch_never_granted_fences_nothing,
    g2_a_superseded_holder_is_refused_before_its_successor_writes,
    a_fence_refuses_through_its_epoch,
    a_session_lost_mid_call_is_outcome_unknown_and_changes_nothing,
    a_keeper_renews_its_grant_until_stopped_and_stop_releases,
    a_keeper_reports_a_forced_release_as_its_loss,
    a_keeper_reports_its_renews_and_loss_as_events_and_to_wait_for_loss,
    a_waiter_is_granted_the_key_its_holder_releases,
    a_bounded_wait_times_out_and_leaves_nothing_armed,
);

/// The expiry an admission that reads the lease answers (`Check::LeaseHeld`,
/// `Check::RenewAndAdmit`): always there.
fn read_expiry(expiry: Option<chrono::DateTime<chrono::Utc>>) -> chrono::DateTime<chrono::Utc> {
    expiry.expect("an admission that reads the lease answers its expiry")
}
