//! Electing a leader (`hold::Election`, `aio::Election`): one candidate
//! leads at a time, a resignation hands the key to a waiting candidate at
//! once with a higher term, `leader()` says who leads, and a term lost
//! under the leader's work stops the work and wakes its sleep. Every wait
//! here ends on observable state (a campaign's answer, the server's row).

use std::time::Duration;

use leasehold::admin::Operator;
use leasehold::hold::{CancelToken, Election, LeaseLoss, StopReason, WorkOutcome};
use leasehold::wait::Wait;
use leasehold::{LeaseClient, Refusal, Release};
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
