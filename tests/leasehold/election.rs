//! Electing a leader (`hold::Election`, `aio::Election`): one candidate
//! leads at a time, a resignation hands the key to a waiting candidate at
//! once with a higher term, `leader()` says who leads, and a term lost
//! under the leader's work stops the work and wakes its sleep, and an
//! observer sees every change of leader, a grant after a lapse included,
//! woken by notifications. Every wait here ends on observable state (a
//! campaign's answer, the server's row, an observer's event).

use std::time::Duration;

use leasehold::admin::Operator;
use leasehold::hold::{CancelToken, Election, LeaderChange, LeaseLoss, StopReason, WorkOutcome};
use leasehold::wait::{LeaseWaiter, Wait};
use leasehold::{Acquisition, LeaseClient, Leases, Refusal, Release};
use leasehold_test_support::TestDb;

#[cfg(feature = "async")]
use crate::aio_common::runtime;

const TTL: Duration = Duration::from_secs(30);
/// Longer than any wait here should take.
const BOUND: Duration = Duration::from_secs(60);

fn client(db: &TestDb) -> LeaseClient {
    LeaseClient::builder(&db.url)
        .max_size(4)
        .checkout_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

#[test]
fn one_candidate_leads_and_a_resignation_hands_over_to_the_next() {
    let db = TestDb::new();
    let first = Election::new(&client(&db), "scheduler", "replica-1", TTL);
    let second = Election::new(&client(&db), "scheduler", "replica-2", TTL);
    assert_eq!(first.leader().unwrap(), None);
    let term = first.campaign(Duration::ZERO).unwrap();
    assert!(term.is_leading());
    let leader = first.leader().unwrap().expect("a leader");
    assert_eq!(
        (leader.candidate.as_str(), leader.epoch),
        ("replica-1", term.token().epoch())
    );
    assert_eq!(second.leader().unwrap(), Some(leader.clone()));
    // The second candidate cannot lead while the first does.
    let error = second.campaign(Duration::ZERO).expect_err("led already");
    assert_eq!(error.kind(), leasehold::ErrorKind::TimedOut, "{error}");
    let waiting = std::thread::spawn(move || second.campaign(BOUND));
    assert_eq!(term.resign().unwrap(), Release::Released);
    let next = waiting
        .join()
        .unwrap()
        .expect("the second leads once the first resigned");
    assert!(next.token().epoch() > leader.epoch, "a higher term");
    let now = first.leader().unwrap().expect("a leader");
    assert_eq!(
        (now.candidate.as_str(), now.epoch),
        ("replica-2", next.token().epoch())
    );
    drop(next);
}

#[test]
fn a_term_lost_under_the_leaders_work_stops_it_and_wakes_its_sleep() {
    let db = TestDb::new();
    let election = Election::new(
        &client(&db),
        "scheduler",
        "replica-1",
        Duration::from_secs(3),
    );
    let term = election.campaign(Duration::ZERO).unwrap();
    let mut operator = db.conn();
    let (slept, woke) = std::sync::mpsc::channel();
    let outcome = term.lead(&CancelToken::new(), |ctx| {
        operator.force_release("scheduler").unwrap();
        slept.send(ctx.sleep(BOUND)).unwrap();
        Err::<(), _>("deposed")
    });
    assert!(
        matches!(
            outcome,
            WorkOutcome::LeaseLost(LeaseLoss::Refused(Refusal::ForceReleased))
        ),
        "{outcome:?}"
    );
    assert!(
        matches!(
            woke.recv_timeout(BOUND).unwrap(),
            Err(StopReason::LeaseLost(_))
        ),
        "the sleep woke on the loss"
    );
    assert_eq!(election.leader().unwrap(), None);
}

/// Longer than any test: an observer with it never polls, so each change
/// it reports was announced (or found at the leader's expiry).
const NEVER: Duration = Duration::from_secs(3600);
/// The lapsing holder's ttl.
const SHORT_TTL: Duration = Duration::from_secs(1);

/// `(candidate, epoch)` of an `Elected`, for comparisons.
fn elected(change: Option<LeaderChange>) -> (String, i64) {
    match change {
        Some(LeaderChange::Elected(leader)) => (leader.candidate, leader.epoch.get()),
        other => panic!("expected a new leader, got {other:?}"),
    }
}

fn granted(acquisition: Acquisition) -> leasehold::Lease {
    match acquisition {
        Acquisition::Granted(lease) => lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn an_observer_sees_every_change_a_grant_after_a_lapse_included_without_polling() {
    let db = TestDb::new();
    let client = client(&db);
    let waiter = LeaseWaiter::builder(&client)
        .fallback_poll(NEVER)
        .recheck_every(NEVER)
        .build();
    let election = Election::new(&client, "scheduler", "observer", TTL).with_waiter(&waiter);
    let first = granted(client.clone().acquire("scheduler", "a", SHORT_TTL).unwrap());
    let mut watch = election.observe().unwrap();
    // The state now, then its lapse, found at the expiry.
    assert_eq!(
        elected(watch.recv_timeout(BOUND)),
        ("a".to_owned(), first.epoch().get())
    );
    assert_eq!(watch.leader().map(|l| l.candidate.as_str()), Some("a"));
    assert_eq!(
        watch.recv_timeout(BOUND),
        Some(LeaderChange::Lapsed {
            candidate: "a".to_owned(),
            epoch: first.epoch()
        })
    );
    assert_eq!(watch.leader(), None);
    // A grant with no release before it: announced by its notification.
    let second = granted(client.clone().acquire("scheduler", "b", TTL).unwrap());
    assert_eq!(
        elected(watch.recv_timeout(BOUND)),
        ("b".to_owned(), second.epoch().get())
    );
    assert_eq!(client.clone().release(&second).unwrap(), Release::Released);
    assert!(
        matches!(watch.recv_timeout(BOUND), Some(LeaderChange::Released { epoch }) if epoch > second.epoch()),
        "the release, its counter past the term"
    );
    // A campaign's term is seen like any grant.
    let term = election.campaign(Duration::ZERO).unwrap();
    assert_eq!(
        elected(watch.recv_timeout(BOUND)),
        ("observer".to_owned(), term.token().epoch().get())
    );
    assert_eq!(
        watch.recv_timeout(Duration::ZERO),
        None,
        "nothing else changed"
    );
}

#[test]
fn observing_a_name_that_cannot_be_a_key_is_refused_up_front() {
    let db = TestDb::new();
    for name in ["", "bad\0name"] {
        let error = Election::new(&client(&db), name, "observer", TTL)
            .observe()
            .expect_err("not a key");
        assert_eq!(error.kind(), leasehold::ErrorKind::InvalidInput, "{error}");
    }
}

#[test]
fn a_campaign_can_be_cancelled() {
    let db = TestDb::new();
    let leading = Election::new(&client(&db), "scheduler", "replica-1", TTL);
    let _term = leading.campaign(Duration::ZERO).unwrap();
    let waiting = Election::new(&client(&db), "scheduler", "replica-2", TTL);
    let cancel = CancelToken::new();
    let canceller = cancel.clone();
    let campaign =
        std::thread::spawn(move || waiting.campaign_cancellable(Wait::UntilCancelled, &canceller));
    cancel.cancel();
    let error = campaign.join().unwrap().expect_err("cancelled");
    assert_eq!(error.kind(), leasehold::ErrorKind::Cancelled, "{error}");
}

#[cfg(feature = "async")]
#[test]
fn the_async_face_elects_alike_and_a_terms_loss_is_a_future() {
    use leasehold::aio::{AsyncLeaseClient, AsyncOperator};
    let db = TestDb::new();
    runtime().block_on(async {
        let client = AsyncLeaseClient::connect(&db.url, 4).await.unwrap();
        let first = leasehold::aio::Election::new(&client, "scheduler", "replica-1", TTL);
        let second = leasehold::aio::Election::new(&client, "scheduler", "replica-2", TTL);
        let term = first.campaign(Duration::ZERO).await.unwrap();
        let leader = second.leader().await.unwrap().expect("a leader");
        assert_eq!(
            (leader.candidate.as_str(), leader.epoch),
            ("replica-1", term.token().epoch())
        );
        let waiting = tokio::spawn(async move { second.campaign(BOUND).await });
        assert_eq!(term.resign().await.unwrap(), Release::Released);
        let next = tokio::time::timeout(BOUND, waiting)
            .await
            .expect("in time")
            .unwrap()
            .expect("the second leads once the first resigned");
        assert!(next.token().epoch() > leader.epoch);
        let lost = next.lost();
        client.clone().force_release("scheduler").await.unwrap();
        let loss = tokio::time::timeout(BOUND, lost)
            .await
            .expect("the loss in time");
        assert!(
            matches!(loss, Some(LeaseLoss::Refused(Refusal::ForceReleased))),
            "{loss:?}"
        );
        assert!(!next.is_leading());
    });
}

#[cfg(feature = "async")]
#[test]
fn the_async_observer_is_a_stream_of_the_same_changes() {
    use leasehold::aio::{AsyncLeaseClient, AsyncLeases};
    let db = TestDb::new();
    runtime().block_on(async {
        let client = AsyncLeaseClient::connect(&db.url, 4).await.unwrap();
        let waiter = leasehold::aio::LeaseWaiter::builder(&client)
            .fallback_poll(NEVER)
            .recheck_every(NEVER)
            .build();
        let election = leasehold::aio::Election::new(&client, "scheduler", "observer", TTL)
            .with_waiter(&waiter);
        let first = granted(client.clone().acquire("scheduler", "a", SHORT_TTL).await.unwrap());
        let mut watch = election.observe().await.unwrap();
        assert_eq!(
            elected(watch.recv_timeout(BOUND).await),
            ("a".to_owned(), first.epoch().get())
        );
        assert_eq!(
            watch.recv_timeout(BOUND).await,
            Some(LeaderChange::Lapsed {
                candidate: "a".to_owned(),
                epoch: first.epoch()
            })
        );
        // A recv dropped while it waits loses nothing: the grant still comes.
        assert_eq!(watch.recv_timeout(Duration::from_millis(1)).await, None);
        let second = granted(client.clone().acquire("scheduler", "b", TTL).await.unwrap());
        let next = std::future::poll_fn(|cx| {
            futures_core::Stream::poll_next(std::pin::Pin::new(&mut watch), cx)
        });
        let next = tokio::time::timeout(BOUND, next).await.expect("in time");
        assert_eq!(elected(next), ("b".to_owned(), second.epoch().get()));
        assert_eq!(watch.leader().map(|l| l.candidate.as_str()), Some("b"));
        assert_eq!(
            client.clone().release(&second).await.unwrap(),
            Release::Released
        );
        assert!(
            matches!(watch.recv_timeout(BOUND).await, Some(LeaderChange::Released { epoch }) if epoch > second.epoch()),
            "the release, its counter past the term"
        );
    });
}
