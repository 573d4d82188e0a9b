//! Downtime never extends ownership (I11).

use crate::common::*;
use leasehold::Leases;
use std::time::Instant;

fn downtime_past_expiry(crash: bool) {
    let cluster = Cluster::start(true);
    let mut conn = cluster.conn();
    let lease = granted(conn.acquire("k", "a", Duration::from_millis(500)).unwrap());
    drop(conn);
    if crash {
        cluster.pg.kill_postmaster().unwrap();
    } else {
        cluster.pg.stop(StopMode::Fast).unwrap();
    }
    // The server is down, so its clock cannot be asked; it is this
    // machine's clock, which the check below confirms after the restart.
    while Utc::now() <= lease.expires_at() {
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.pg.restart().unwrap();
    let mut conn = cluster.conn();
    // First access after recovery, with no wait of any kind:
    let taken = granted(conn.acquire("k", "b", TTL).unwrap());
    assert_eq!(taken.epoch(), 2);
    assert!(server_now(&mut conn) > lease.expires_at());
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: Some(2.into())
        })
    );
}

#[test]
fn downtime_past_expiry_never_extends_ownership_after_a_clean_stop() {
    downtime_past_expiry(false);
}

#[test]
fn downtime_past_expiry_never_extends_ownership_after_a_crash() {
    downtime_past_expiry(true);
}

/// A wait that begins while the database is down is granted once it is back,
/// within its bound: the waiter tries again instead of failing on its first
/// attempt. A wait that ends before then answers its last attempt's error
/// (the database not reached), not that the key was held.
#[test]
fn a_wait_begun_with_the_database_down_is_granted_once_it_is_back() {
    use leasehold::wait::{LeaseWaiter, Wait};
    use leasehold::{ErrorKind, LeaseClient};
    let cluster = Cluster::start(false);
    let client = LeaseClient::builder(&cluster.url())
        .max_size(2)
        .checkout_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let waiter = LeaseWaiter::new(&client);
    cluster.pg.stop(StopMode::Fast).unwrap();
    let unreached = waiter
        .acquire("k", "a", TTL, Wait::AtMost(Duration::from_secs(1)))
        .expect_err("no database to grant it");
    // The last attempt's own error: the pool found no server (or a pooled
    // session died under the attempt, its outcome unknown).
    assert!(
        matches!(
            unreached.kind(),
            ErrorKind::Unavailable | ErrorKind::OutcomeUnknown
        ),
        "{unreached}"
    );
    let (started, waiting) = std::sync::mpsc::channel();
    let wait = std::thread::spawn(move || {
        started.send(()).unwrap();
        waiter.acquire("k", "a", TTL, Wait::AtMost(Duration::from_secs(60)))
    });
    waiting.recv().unwrap();
    // Let its first attempt meet the stopped server (a checkout gives up
    // after 500 ms): the pass does not depend on this pause, a waiter that
    // gave up on its first attempt fails it reliably.
    std::thread::sleep(Duration::from_secs(1));
    cluster.pg.restart().unwrap();
    let lease = wait
        .join()
        .unwrap()
        .expect("granted once the database is back");
    assert_eq!((lease.key(), lease.epoch().get()), ("k", 1));
}

/// A campaign begun with the database down leads once it is back, with no
/// retry loop of the caller's.
#[test]
fn a_campaign_begun_with_the_database_down_leads_once_it_is_back() {
    use leasehold::hold::Election;
    use leasehold::LeaseClient;
    let cluster = Cluster::start(false);
    let client = LeaseClient::builder(&cluster.url())
        .max_size(2)
        .checkout_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let election = Election::new(&client, "scheduler", "replica-1", TTL);
    cluster.pg.stop(StopMode::Fast).unwrap();
    let (started, campaigning) = std::sync::mpsc::channel();
    let campaign = std::thread::spawn(move || {
        started.send(()).unwrap();
        election.campaign(Duration::from_secs(60))
    });
    campaigning.recv().unwrap();
    // Let the campaign meet the stopped server first (as in the wait above).
    std::thread::sleep(Duration::from_secs(1));
    cluster.pg.restart().unwrap();
    let term = campaign
        .join()
        .unwrap()
        .expect("leads once the database is back");
    assert!(term.is_leading());
    assert_eq!(term.token().key(), "scheduler");
}

/// A bounded wait stays bounded with the database down, whatever the
/// pool's checkout timeout (here the default, 30 s): each attempt waits
/// for a connection at most what is left of the wait, and at least
/// `ATTEMPT_CHECKOUT_FLOOR` so the last one can still connect. A waiter's
/// acquire and an election's campaign alike.
#[test]
fn a_bounded_wait_with_the_database_down_ends_by_its_bound_not_the_pools_timeout() {
    use leasehold::hold::Election;
    use leasehold::wait::{LeaseWaiter, Wait, ATTEMPT_CHECKOUT_FLOOR};
    use leasehold::{ErrorKind, LeaseClient};
    const WAIT: Duration = Duration::from_secs(1);
    /// Scheduling and the last attempt's own work, on a loaded machine.
    const SLACK: Duration = Duration::from_secs(2);
    let cluster = Cluster::start(false);
    let client = LeaseClient::builder(&cluster.url())
        .max_size(2)
        .build()
        .unwrap();
    let waiter = LeaseWaiter::new(&client);
    let election = Election::new(&client, "scheduler", "replica-1", TTL);
    cluster.pg.stop(StopMode::Fast).unwrap();
    let started = Instant::now();
    let waited = waiter.acquire("k", "a", TTL, Wait::AtMost(WAIT));
    let waiter_took = started.elapsed();
    let started = Instant::now();
    let campaigned = election.campaign(WAIT);
    let campaign_took = started.elapsed();
    for (what, took, kind) in [
        (
            "the wait",
            waiter_took,
            waited.map(|_| ()).map_err(|e| e.kind()),
        ),
        (
            "the campaign",
            campaign_took,
            campaigned.map(|_| ()).map_err(|e| e.kind()),
        ),
    ] {
        assert!(
            matches!(
                kind,
                Err(ErrorKind::Unavailable | ErrorKind::OutcomeUnknown)
            ),
            "{what}: {kind:?}"
        );
        assert!(
            took < WAIT + ATTEMPT_CHECKOUT_FLOOR + SLACK,
            "{what} took {took:?}"
        );
    }
}
