//! The async face's worker loop, release watch and dropped waits (feature
//! `async`): `aio::run_while_held` decides its outcome as the sync one
//! does and its context's `stopped()` resolves on a loss or a
//! cancellation; `aio::ReleaseWatch` delivers release events to a task; a
//! wait dropped while an attempt is in flight leaves no grant behind.
//! Every test synchronises on state it can observe (the server's rows and
//! sessions, the listener's armed keys), never on a sleep.

use std::time::Duration;

use crate::aio_common::{client, eventually, runtime};
use diesel::connection::SimpleConnection;
use leasehold::aio::AsyncOperator;
use leasehold::aio::{run_while_held, AsyncLeaseClient, AsyncLeases, Keeper, LeaseWaiter};
use leasehold::hold::{LeaseLoss, StopReason, WorkOutcome};
use leasehold::wait::{ReleaseEvent, Wait};
use leasehold::{Epoch, LeaseState, Leases, Refusal, Release};
use leasehold_test_support::{query_bool, TestDb};

const TTL: Duration = Duration::from_secs(30);
/// Long enough that nothing in a test lapses by itself.
const BOUND: Duration = Duration::from_secs(60);

/// A keeper of a fresh grant of `key`, renewing often.
async fn kept(client: &mut AsyncLeaseClient, key: &str) -> Keeper {
    let lease = client
        .acquire(key, "a", TTL)
        .await
        .unwrap()
        .granted()
        .unwrap();
    Keeper::builder(client, lease)
        .renew_every(Duration::from_millis(100))
        .start()
        .await
        .unwrap()
}

fn is_unowned(state: Option<LeaseState>) -> bool {
    matches!(state, Some(LeaseState::Free { .. }))
}

/// Work that finishes under a safe lease is `Finished`, sees the grant's
/// token, and the lease is released afterwards; work that fails is
/// `Failed`, and released too.
#[test]
fn work_that_returns_under_the_lease_finishes_or_fails_and_is_released() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let keeper = kept(&mut client, "k").await;
        let epoch = keeper.token().epoch();
        // Spawned: the worker's future is Send.
        let outcome = tokio::spawn(run_while_held(
            keeper,
            std::future::pending(),
            async |ctx| -> Result<Epoch, String> {
                assert!(!ctx.should_stop());
                assert!(ctx.check().is_ok());
                Ok(ctx.token().epoch())
            },
        ))
        .await
        .unwrap();
        assert!(
            matches!(outcome, WorkOutcome::Finished(seen) if seen == epoch),
            "{outcome:?}"
        );
        assert!(is_unowned(client.inspect("k").await.unwrap()));

        let keeper = kept(&mut client, "k").await;
        let outcome = run_while_held(keeper, std::future::pending(), async |_ctx| {
            Err::<(), _>("the work's own error")
        })
        .await;
        assert!(
            matches!(outcome, WorkOutcome::Failed("the work's own error")),
            "{outcome:?}"
        );
        assert!(is_unowned(client.inspect("k").await.unwrap()));
    });
}

/// The lease taken away while the work waits: the context's `stopped()`
/// resolves with the loss, and whatever the work returns then, the
/// outcome is `LeaseLost`.
#[test]
fn a_lease_lost_while_the_work_waits_resolves_stopped_and_the_outcome_is_lost() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let keeper = kept(&mut client, "k").await;
        let (started, work_started) = tokio::sync::oneshot::channel::<()>();
        let worker = tokio::spawn(run_while_held(
            keeper,
            std::future::pending(),
            async move |ctx| -> Result<&'static str, StopReason> {
                let _ = started.send(());
                let why = ctx.stopped().await;
                assert!(ctx.should_stop());
                assert!(ctx.check().is_err());
                match why {
                    StopReason::LeaseLost(_) => Ok("returned Ok after the loss"),
                    other => Err(other),
                }
            },
        ));
        work_started.await.unwrap();
        client.force_release("k").await.unwrap();
        let outcome = tokio::time::timeout(BOUND, worker)
            .await
            .expect("the work ended in time")
            .unwrap();
        assert!(
            matches!(
                outcome,
                WorkOutcome::LeaseLost(LeaseLoss::Refused(Refusal::ForceReleased))
            ),
            "{outcome:?}"
        );
    });
}

/// The cancellation resolving while the work waits: `stopped()` says
/// `Cancelled`, the work returns an error and the outcome is `Cancelled`;
/// the lease is released.
#[test]
fn a_cancellation_resolves_stopped_and_the_outcome_is_cancelled() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let keeper = kept(&mut client, "k").await;
        let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
        let (started, work_started) = tokio::sync::oneshot::channel::<()>();
        let worker = tokio::spawn(run_while_held(
            keeper,
            async {
                let _ = cancelled.await;
            },
            async move |ctx| -> Result<(), StopReason> {
                let _ = started.send(());
                Err(ctx.stopped().await)
            },
        ));
        work_started.await.unwrap();
        cancel.send(()).unwrap();
        let outcome = tokio::time::timeout(BOUND, worker)
            .await
            .expect("the work ended in time")
            .unwrap();
        assert!(matches!(outcome, WorkOutcome::Cancelled), "{outcome:?}");
        assert!(is_unowned(client.inspect("k").await.unwrap()));
    });
}

/// A task reads release events of its watched keys with `.await`, through
/// the process's one listener session, and nothing of other keys.
#[test]
fn an_async_release_watch_delivers_its_keys_releases_to_a_task() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let watched = client
            .acquire("watched", "o", TTL)
            .await
            .unwrap()
            .granted()
            .unwrap();
        let other = client
            .acquire("other", "o", TTL)
            .await
            .unwrap()
            .granted()
            .unwrap();
        let waiter = LeaseWaiter::new(&client);
        let watch = waiter.watch_releases(["watched"]).unwrap();
        assert_eq!(watch.wait_armed(BOUND).await, 1);
        assert!(watch.is_armed("watched") && !watch.contains("other"));
        // A session coming up queues a resync; read past it.
        while let Some(event) = watch.try_recv() {
            assert_eq!(event, ReleaseEvent::Resync);
        }
        let reader = tokio::spawn(async move {
            let event = watch.recv().await;
            (watch, event)
        });
        assert_eq!(client.release(&other).await.unwrap(), Release::Released);
        assert_eq!(client.release(&watched).await.unwrap(), Release::Released);
        let (mut watch, event) = tokio::time::timeout(BOUND, reader)
            .await
            .expect("an event in time")
            .unwrap();
        assert_eq!(
            event,
            ReleaseEvent::Released {
                key: "watched".to_owned()
            }
        );
        assert_eq!(watch.recv_timeout(Duration::from_millis(50)).await, None);
        assert!(watch.remove("watched"));
        assert!(watch.is_empty());
    });
}

/// A wait dropped while its attempt waits on the key's row lock: the
/// attempt still completes once the lock goes, and the grant it got, with
/// nobody left to take it, is released at once rather than left to lapse
/// at its ttl.
#[test]
fn a_wait_dropped_mid_attempt_leaves_no_grant_behind() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        // The key's row exists, free (epoch 2 after the release).
        let first = client
            .acquire("k", "a", TTL)
            .await
            .unwrap()
            .granted()
            .unwrap();
        assert_eq!(client.release(&first).await.unwrap(), Release::Released);
        let mut blocker = db.conn();
        blocker
            .batch_execute("BEGIN; SELECT 1 FROM lease.leases WHERE key = 'k' FOR UPDATE")
            .unwrap();
        let waiter = LeaseWaiter::new(&client);
        let wait = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                waiter
                    .acquire("k", "b", Duration::from_secs(600), Wait::UntilCancelled)
                    .await
            }
        });
        let mut admin = db.conn();
        eventually("the attempt waits on the row lock", || {
            query_bool(
                &mut admin,
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE '%lease.acquire%') AS flag",
            )
        })
        .await;
        wait.abort();
        assert!(wait.await.unwrap_err().is_cancelled());
        blocker.batch_execute("ROLLBACK").unwrap();
        // The attempt was granted after the lock went (epoch 3: a release
        // moves the epoch too), then released (epoch 4): the key is free
        // again, not held by "b" for 600 s.
        let mut conn = db.conn();
        eventually("the stranded grant released", || {
            matches!(
                conn.inspect("k").unwrap(),
                Some(LeaseState::Free { epoch, .. }) if epoch == 4
            )
        })
        .await;
    });
}

/// A task's sleep wakes at once when the work must stop (the forced
/// release seen by the next renew), and otherwise sleeps its duration.
#[test]
fn a_tasks_sleep_wakes_on_the_loss() {
    let db = TestDb::new();
    runtime().block_on(async {
        let mut client = client(&db).await;
        let keeper = kept(&mut client, "k").await;
        let outcome = run_while_held(keeper, std::future::pending(), async |ctx| {
            ctx.sleep(Duration::from_millis(20)).await?;
            Ok::<_, StopReason>(())
        })
        .await;
        assert!(matches!(outcome, WorkOutcome::Finished(())), "{outcome:?}");

        let keeper = kept(&mut client, "k").await;
        let mut admin = client.clone();
        let outcome = run_while_held(keeper, std::future::pending(), async |ctx| {
            admin.force_release("k").await.unwrap();
            let woke = tokio::time::timeout(BOUND, ctx.sleep(BOUND * 10))
                .await
                .expect("the sleep woke on the loss");
            Err::<(), _>(woke)
        })
        .await;
        assert!(
            matches!(
                outcome,
                WorkOutcome::LeaseLost(LeaseLoss::Refused(Refusal::ForceReleased))
            ),
            "{outcome:?}"
        );
    });
}
