//! docs/SPECIFICATION.md §1.3: acquire, renew, release, inspect; statuses and precedence
//! (I4, I5, I10).

use std::time::Duration;

use leasehold::{
    acquire, acquire_waiting, inspect, release, renew, Acquisition, LeaseError, LeaseState,
    Refusal, Release, Renewal,
};

use crate::common::*;

const SHORT: Duration = Duration::from_millis(250);

fn lapse(conn: &mut diesel::PgConnection, key: &str, owner: &str) -> leasehold::Lease {
    let lease = granted(acquire(conn, key, owner, SHORT).unwrap());
    wait_until_server_time_passes(conn, lease.expires_at());
    lease
}

#[test]
fn same_owner_acquire_of_a_held_lease_is_idempotent_same_epoch_and_expiry() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let first = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    let again = granted(acquire(&mut conn, "k", "a", Duration::from_secs(300)).unwrap());
    assert_eq!(again, first);
}

#[test]
fn other_owner_acquire_without_wait_is_denied_with_null_epoch_and_expiry() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(
        acquire(&mut conn, "k", "b", TTL).unwrap(),
        Acquisition::Denied
    );
    let rows = query_lines(
        &mut conn,
        "SELECT format('%s|%s|%s', acquired, epoch IS NULL, expires_at IS NULL) AS line \
         FROM lease.acquire('k', 'b', interval '30s')",
    );
    assert_eq!(rows, vec!["f|t|t"]);
}

#[test]
fn blocking_acquire_times_out_with_sqlstate_57014_and_a_distinct_error() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    let error = acquire_waiting(&mut conn, "k", "b", TTL, Duration::from_millis(150)).unwrap_err();
    assert!(
        matches!(error, LeaseError::TimedOut { ref key, waited } if key == "k" && waited == Duration::from_millis(150)),
        "{error:?}"
    );
    assert_eq!(
        sqlstate_of(
            &mut conn,
            "SELECT * FROM lease.acquire('k', 'b', interval '30s', interval '100ms')"
        ),
        "57014"
    );
    // Denial (no wait) is distinguishable: a value, not an error.
    assert_eq!(
        acquire(&mut conn, "k", "b", TTL).unwrap(),
        Acquisition::Denied
    );
    assert_eq!(inspect(&mut conn, "k").unwrap().unwrap().epoch(), 1);
}

#[test]
fn blocking_acquire_takes_over_when_the_holder_lapses_during_the_wait() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let held = granted(acquire(&mut conn, "k", "a", Duration::from_millis(400)).unwrap());
    let lease = acquire_waiting(&mut conn, "k", "b", TTL, Duration::from_secs(20)).unwrap();
    assert_eq!(lease.epoch(), 2);
    assert!(server_now(&mut conn) > held.expires_at());
}

#[test]
fn blocking_acquire_wakes_after_a_release() {
    let db = TestDb::new();
    let mut holder = db.conn();
    let lease = granted(acquire(&mut holder, "k", "a", TTL).unwrap());
    let url = db.url.clone();
    let waiter = std::thread::spawn(move || {
        let mut conn = diesel::Connection::establish(&url).unwrap();
        acquire_waiting(&mut conn, "k", "b", TTL, Duration::from_secs(20))
    });
    // Synchronise on the waiter really polling inside the SQL function.
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = '{}' AND wait_event = 'PgSleep') AS flag",
        db.name
    );
    let mut observed = false;
    for _ in 0..2_000 {
        if query_bool(&mut holder, &sql) {
            observed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(observed, "waiter never started polling");
    assert_eq!(
        release(&mut holder, "k", "a", lease.epoch()).unwrap(),
        Release::Released
    );
    let taken = waiter.join().unwrap().unwrap();
    assert_eq!(taken.owner(), "b");
    assert_eq!(taken.epoch(), 3);
}

#[test]
fn renew_extends_expiry_and_never_changes_the_epoch() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(acquire(&mut conn, "k", "a", Duration::from_secs(5)).unwrap());
    let Renewal::Renewed { expires_at } =
        renew(&mut conn, "k", "a", 1, Duration::from_secs(60)).unwrap()
    else {
        panic!("renew of a held lease failed");
    };
    assert!(expires_at > lease.expires_at());
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 1,
            expires_at
        })
    );
}

#[test]
fn renew_and_release_of_an_unknown_key_report_not_owner() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert_eq!(
        renew(&mut conn, "nope", "a", 1, TTL).unwrap(),
        Renewal::Refused(Refusal::NotOwner)
    );
    assert_eq!(
        release(&mut conn, "nope", "a", 1).unwrap(),
        Release::Refused(Refusal::NotOwner)
    );
    assert_eq!(
        inspect(&mut conn, "nope").unwrap(),
        None,
        "a failed call must not create the key"
    );
}

#[test]
fn renew_and_release_of_a_free_key_report_not_owner_even_for_the_last_holder() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(release(&mut conn, "k", "a", 1).unwrap(), Release::Released);
    assert_eq!(
        renew(&mut conn, "k", "a", 1, TTL).unwrap(),
        Renewal::Refused(Refusal::NotOwner)
    );
    assert_eq!(
        release(&mut conn, "k", "a", 1).unwrap(),
        Release::Refused(Refusal::NotOwner)
    );
}

#[test]
fn renew_and_release_by_a_different_owner_report_not_owner() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(
        renew(&mut conn, "k", "b", 1, TTL).unwrap(),
        Renewal::Refused(Refusal::NotOwner)
    );
    assert_eq!(
        release(&mut conn, "k", "b", 1).unwrap(),
        Release::Refused(Refusal::NotOwner)
    );
    assert!(inspect(&mut conn, "k").unwrap().unwrap().is_held());
}

#[test]
fn renew_and_release_of_an_expired_own_grant_report_lapsed() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = lapse(&mut conn, "k", "a");
    assert_eq!(
        renew(&mut conn, "k", "a", lease.epoch(), TTL).unwrap(),
        Renewal::Refused(Refusal::Lapsed)
    );
    assert_eq!(
        release(&mut conn, "k", "a", lease.epoch()).unwrap(),
        Release::Refused(Refusal::Lapsed)
    );
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        Some(LeaseState::Unowned { epoch: 1 })
    );
}

#[test]
fn renew_after_takeover_reports_lapsed_to_the_lapsed_owner() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let old = lapse(&mut conn, "k", "a");
    let new = granted(acquire(&mut conn, "k", "b", TTL).unwrap());
    assert_eq!(new.epoch(), 2);
    assert_eq!(
        renew(&mut conn, "k", "a", old.epoch(), TTL).unwrap(),
        Renewal::Refused(Refusal::Lapsed)
    );
    assert_eq!(
        release(&mut conn, "k", "a", old.epoch()).unwrap(),
        Release::Refused(Refusal::Lapsed)
    );
    // A bystander hears not_owner.
    assert_eq!(
        renew(&mut conn, "k", "c", 2, TTL).unwrap(),
        Renewal::Refused(Refusal::NotOwner)
    );
    // The new holder is untouched.
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        Some(LeaseState::Held {
            owner: "b".into(),
            epoch: 2,
            expires_at: new.expires_at()
        })
    );
}

#[test]
fn takeover_history_is_one_grant_deep() {
    let db = TestDb::new();
    let mut conn = db.conn();
    lapse(&mut conn, "k", "a");
    lapse(&mut conn, "k", "b");
    granted(acquire(&mut conn, "k", "c", TTL).unwrap());
    assert_eq!(
        renew(&mut conn, "k", "b", 2, TTL).unwrap(),
        Renewal::Refused(Refusal::Lapsed)
    );
    assert_eq!(
        renew(&mut conn, "k", "a", 1, TTL).unwrap(),
        Renewal::Refused(Refusal::NotOwner)
    );
}

#[test]
fn released_then_regranted_key_tells_the_releaser_not_owner() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(release(&mut conn, "k", "a", 1).unwrap(), Release::Released);
    granted(acquire(&mut conn, "k", "b", TTL).unwrap());
    assert_eq!(
        renew(&mut conn, "k", "a", 1, TTL).unwrap(),
        Renewal::Refused(Refusal::NotOwner)
    );
}

#[test]
fn renew_and_release_with_a_stale_epoch_report_epoch_mismatch() {
    let db = TestDb::new();
    let mut conn = db.conn();
    lapse(&mut conn, "k", "a");
    let current = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(current.epoch(), 2);
    assert_eq!(
        renew(&mut conn, "k", "a", 1, TTL).unwrap(),
        Renewal::Refused(Refusal::EpochMismatch)
    );
    assert_eq!(
        release(&mut conn, "k", "a", 1).unwrap(),
        Release::Refused(Refusal::EpochMismatch)
    );
    assert_eq!(
        release(&mut conn, "k", "a", 99).unwrap(),
        Release::Refused(Refusal::EpochMismatch)
    );
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 2,
            expires_at: current.expires_at()
        })
    );
}

#[test]
fn status_precedence_is_not_owner_then_lapsed_then_epoch_mismatch() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // Wrong owner AND expired AND wrong epoch: not_owner wins.
    lapse(&mut conn, "k", "a");
    assert_eq!(
        renew(&mut conn, "k", "b", 7, TTL).unwrap(),
        Renewal::Refused(Refusal::NotOwner)
    );
    // Right owner, expired AND wrong epoch: lapsed wins.
    assert_eq!(
        renew(&mut conn, "k", "a", 7, TTL).unwrap(),
        Renewal::Refused(Refusal::Lapsed)
    );
    assert_eq!(
        release(&mut conn, "k", "a", 7).unwrap(),
        Release::Refused(Refusal::Lapsed)
    );
    // Right owner, live, wrong epoch: epoch_mismatch.
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(
        renew(&mut conn, "k", "a", 7, TTL).unwrap(),
        Renewal::Refused(Refusal::EpochMismatch)
    );
}

#[test]
fn refused_renew_and_release_change_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    lapse(&mut conn, "gone", "a");
    granted(acquire(&mut conn, "held", "a", TTL).unwrap());
    let before = table_snapshot(&mut conn);
    let _ = renew(&mut conn, "gone", "a", 1, TTL).unwrap();
    let _ = release(&mut conn, "gone", "a", 1).unwrap();
    let _ = renew(&mut conn, "held", "b", 1, TTL).unwrap();
    let _ = renew(&mut conn, "held", "a", 5, TTL).unwrap();
    let _ = release(&mut conn, "held", "a", 5).unwrap();
    let _ = acquire(&mut conn, "held", "b", TTL).unwrap();
    assert_eq!(table_snapshot(&mut conn), before);
}
