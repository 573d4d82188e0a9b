//! Holding and waiting as tasks (feature `async`): `aio::Keeper` renews as
//! two tokio tasks and reports the loss through a future, `aio::LeaseWaiter`
//! parks tasks on the per-URL listener shared with the sync waiters. Every
//! test synchronises on state it can observe (the server's rows, the
//! listener's armed count), never on a sleep. What both faces' keepers
//! and waiters do alike (renew until stopped, a loss, a wake-up by
//! notification, a bounded wait) is in the dual suite (`faces`); here is
//! what only tasks have: the loss as a future, a drop, many tasks on one
//! listener, a cancellation future.

use std::time::Duration;

use crate::aio_common::{client, eventually, runtime};
use leasehold::aio::AsyncOperator;
use leasehold::aio::{AsyncLeases, Keeper, KeeperSet, LeaseWaiter};
use leasehold::error::ErrorKind;
use leasehold::hold::LeaseLoss;
use leasehold::wait::Wait;
use leasehold::{LeaseState, Leases, Refusal, Release};
use leasehold_test_support::{query_bool, TestDb};

const TTL: Duration = Duration::from_secs(30);
/// Long enough that nothing in a test lapses by itself.
const BOUND: Duration = Duration::from_secs(60);

#[test]
fn a_refused_renew_resolves_the_loss_future_a_task_selects_on() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let lease = client
            .acquire("k", "a", TTL)
            .await
            .unwrap()
            .granted()
            .unwrap();
        let keeper = Keeper::builder(&client, lease)
            .renew_every(Duration::from_millis(100))
            .start()
            .await
            .unwrap();
        let lost = keeper.lost();
        client.force_release("k").await.unwrap();
        let work = std::future::pending::<()>();
        let loss = tokio::select! {
            loss = lost => loss,
            () = work => unreachable!(),
            () = tokio::time::sleep(BOUND) => panic!("the loss was never reported"),
        };
        assert!(
            matches!(loss, Some(LeaseLoss::Refused(Refusal::ForceReleased))),
            "{loss:?}"
        );
        assert!(!keeper.is_valid());
        assert!(matches!(
            keeper.loss(),
            Some(LeaseLoss::Refused(Refusal::ForceReleased))
        ));
        assert_eq!(
            keeper.stop().await.unwrap(),
            Release::Refused(Refusal::ForceReleased)
        );
    });
}

/// A renew that hangs (its row locked by another transaction) does not
/// delay the loss: the deadline monitor declares it, without cancelling
/// the renew, which `stop` then waits for.
#[test]
fn the_deadline_passes_while_a_renew_hangs_and_is_not_cancelled() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let lease = client
            .acquire("k", "a", Duration::from_secs(2))
            .await
            .unwrap()
            .granted()
            .unwrap();
        let keeper = Keeper::builder(&client, lease)
            .renew_every(Duration::from_millis(300))
            .margin(Duration::from_millis(200))
            .start()
            .await
            .unwrap();
        let mut blocker = db.conn();
        diesel::connection::SimpleConnection::batch_execute(
            &mut blocker,
            "BEGIN; SELECT 1 FROM lease.leases WHERE key = 'k' FOR UPDATE",
        )
        .unwrap();
        let loss = tokio::time::timeout(BOUND, keeper.lost())
            .await
            .expect("a loss in time");
        assert!(
            matches!(loss, Some(LeaseLoss::DeadlinePassed { .. })),
            "{loss:?}"
        );
        // The renew still waits on the lock: it was not cancelled.
        let mut admin = db.conn();
        assert!(query_bool(
            &mut admin,
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE '%lease.renew%') AS flag"
        ));
        diesel::connection::SimpleConnection::batch_execute(&mut blocker, "ROLLBACK").unwrap();
        // The loss is final; stop releases what the server still holds.
        assert_eq!(keeper.stop().await.unwrap(), Release::Released);
    });
}

#[test]
fn dropping_an_async_keeper_releases_the_lease() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let lease = client
            .acquire("k", "a", TTL)
            .await
            .unwrap()
            .granted()
            .unwrap();
        let keeper = Keeper::start(&client, lease).await.unwrap();
        drop(keeper);
        let mut conn = db.conn();
        eventually("the release after the drop", || {
            matches!(conn.inspect("k").unwrap(), Some(LeaseState::Free { .. }))
        })
        .await;
    });
}

/// An async keeper set keeps its keys with one heartbeat call, reports a
/// key lost on its own through that key's future, keeps the others, and
/// its stop answers per key.
#[test]
fn an_async_keeper_set_loses_one_key_on_its_own_and_keeps_the_rest() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let mut leases = Vec::new();
        for key in ["k0", "k1", "k2"] {
            leases.push(
                client
                    .acquire(key, "w", Duration::from_secs(3))
                    .await
                    .unwrap()
                    .granted()
                    .unwrap(),
            );
        }
        let set = KeeperSet::builder(&client, leases)
            .renew_every(Duration::from_millis(200))
            .start()
            .await
            .unwrap();
        assert_eq!(set.kept_keys(), ["k0", "k1", "k2"]);
        let lost = set.lost("k1");
        assert!(set.lost("nobody").await.is_none());
        assert!(
            set.wait_for_loss("k1", Duration::from_millis(50))
                .await
                .is_none(),
            "lost while held"
        );
        client.force_release("k1").await.unwrap();
        assert!(matches!(
            set.wait_for_loss("k1", BOUND).await,
            Some(LeaseLoss::Refused(Refusal::ForceReleased))
        ));
        let loss = tokio::time::timeout(BOUND, lost)
            .await
            .expect("reported in time");
        assert!(
            matches!(loss, Some(LeaseLoss::Refused(Refusal::ForceReleased))),
            "{loss:?}"
        );
        assert_eq!(set.kept_keys(), ["k0", "k2"]);
        assert!(set.is_valid("k0") && !set.is_valid("k1"));
        assert_eq!(set.losses_after(0).await.len(), 1);
        // The kept keys outlive their own 3 s ttl through the heartbeats.
        let first = set.safe_until();
        eventually("a heartbeat after the loss", || set.safe_until() > first).await;
        let released: Vec<(String, Release)> = set
            .stop()
            .await
            .unwrap()
            .into_iter()
            .map(|answer| (answer.key, answer.release))
            .collect();
        assert_eq!(
            released,
            [
                ("k0".to_owned(), Release::Released),
                ("k1".to_owned(), Release::Refused(Refusal::ForceReleased)),
                ("k2".to_owned(), Release::Released)
            ]
        );
    });
}

/// The async waiter says whether its listener delivers, as the sync one
/// does, and names the client its attempts run on.
#[test]
fn an_async_waiter_ensures_its_listener_delivers() {
    let db = TestDb::new();
    runtime().block_on(async {
        let client = client(&db).await;
        let waiter = LeaseWaiter::new(&client);
        waiter.ensure_listening(BOUND).await.unwrap();
        assert!(waiter.listener_status().connected);
        // Its client reaches the same database: a grant through it is seen here.
        let lease = waiter
            .client()
            .clone()
            .acquire("k", "a", TTL)
            .await
            .unwrap()
            .granted()
            .unwrap();
        let mut client = client;
        assert!(matches!(
            client.inspect("k").await.unwrap(),
            Some(LeaseState::Held { epoch, .. }) if epoch == lease.epoch()
        ));
    });
}

/// Many waiting tasks share the one listener session of the URL and add
/// no thread each; every one is granted its key once released.
#[test]
fn many_waiting_tasks_share_one_listener_session_and_no_threads() {
    const TASKS: usize = 200;
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let mut held = Vec::new();
        for n in 0..TASKS {
            held.push(client.acquire(&format!("k{n}"), "a", BOUND * 10).await.unwrap().granted().unwrap());
        }
        let waiter = LeaseWaiter::builder(&client).recheck_every(Duration::from_secs(600)).build();
        assert!(waiter.wait_until_listening(BOUND).await);
        let threads_before = threads();
        let tasks: Vec<_> = (0..TASKS)
            .map(|n| {
                let waiter = waiter.clone();
                tokio::spawn(async move { waiter.acquire(&format!("k{n}"), "b", TTL, Wait::UntilCancelled).await })
            })
            .collect();
        eventually("every task parked, armed", || (0..TASKS).all(|n| waiter.armed_waiters(&format!("k{n}")) == 1)).await;
        // Other tests run beside this one (two at a time): a bound far below one
        // thread per task, far above what they start.
        assert!(threads() < threads_before + TASKS / 4, "{} threads before, {} now", threads_before, threads());
        let mut admin = db.conn();
        assert!(query_bool(
            &mut admin,
            &format!(
                "SELECT count(*) = 1 AS flag FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = '{}'",
                leasehold::wait::LISTENER_APPLICATION_NAME
            )
        ));
        let released = client.release_many(&held).await.unwrap();
        assert!(released.iter().all(|k| k.release == Release::Released));
        for task in tasks {
            let lease = tokio::time::timeout(BOUND, task).await.expect("woken in time").unwrap().unwrap();
            assert_eq!(lease.owner(), "b");
        }
    });
}

/// A cancelled wait ends with `Cancelled` between attempts and leaves no
/// armed waiter behind; a bounded one ends with `TimedOut`.
#[test]
fn a_wait_ends_when_cancelled_or_timed_out_and_leaves_nothing_armed() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        client
            .acquire("k", "a", BOUND * 10)
            .await
            .unwrap()
            .granted()
            .unwrap();
        let waiter = LeaseWaiter::builder(&client)
            .recheck_every(Duration::from_secs(600))
            .build();
        assert!(waiter.wait_until_listening(BOUND).await);
        let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
        let task = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                waiter
                    .acquire_cancellable("k", "b", TTL, Wait::UntilCancelled, async {
                        let _ = cancelled.await;
                    })
                    .await
            })
        };
        eventually("the waiter parked, armed", || {
            waiter.armed_waiters("k") == 1
        })
        .await;
        cancel.send(()).unwrap();
        match tokio::time::timeout(BOUND, task)
            .await
            .expect("ended in time")
            .unwrap()
        {
            Err(error) if error.kind() == ErrorKind::Cancelled => {
                assert_eq!(error.key(), Some("k"))
            }
            other => panic!("expected Cancelled, got {other:?}"),
        }
        assert_eq!(waiter.armed_waiters("k"), 0);
        match waiter
            .acquire("k", "b", TTL, Duration::from_millis(300))
            .await
        {
            Err(error) if error.kind() == ErrorKind::TimedOut => assert_eq!(error.key(), Some("k")),
            other => panic!("expected TimedOut, got {other:?}"),
        }
        assert_eq!(waiter.armed_waiters("k"), 0);
    });
}

/// The process's thread count (Linux).
fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}
