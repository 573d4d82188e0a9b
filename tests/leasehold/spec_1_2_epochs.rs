//! docs/SPECIFICATION.md §1.2: the fencing counter (I2, I3).

use std::time::Duration;

use leasehold::{Acquisition, LeaseState, Leases, Release};

use crate::common::*;

#[test]
fn first_grant_of_a_fresh_key_is_epoch_1() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert_eq!(granted(conn.acquire("fresh", "a", TTL).unwrap()).epoch(), 1);
}

#[test]
fn takeover_of_a_lapsed_epoch_1_grant_is_epoch_2() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let first = granted(conn.acquire("k", "a", Duration::from_millis(200)).unwrap());
    wait_until_server_time_passes(&mut conn, first.expires_at());
    assert_eq!(granted(conn.acquire("k", "b", TTL).unwrap()).epoch(), 2);
}

#[test]
fn release_increments_the_counter_and_the_next_grant_is_counter_plus_one() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let first = granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", first.epoch()))
            .unwrap(),
        Release::Released
    );
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Free {
            epoch: 2.into(),
            force_released: false
        })
    );
    assert_eq!(granted(conn.acquire("k", "b", TTL).unwrap()).epoch(), 3);
}

#[test]
fn owner_reacquiring_its_own_lapsed_grant_gets_a_new_epoch() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let first = granted(conn.acquire("k", "a", Duration::from_millis(200)).unwrap());
    wait_until_server_time_passes(&mut conn, first.expires_at());
    let second = granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(second.epoch(), 2);
    assert!(second.expires_at() > first.expires_at());
}

#[test]
fn unowned_inspect_reports_the_counter_and_the_next_grant_exceeds_it() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let first = granted(conn.acquire("k", "a", Duration::from_millis(200)).unwrap());
    wait_until_server_time_passes(&mut conn, first.expires_at());
    let reported = conn.inspect("k").unwrap().unwrap();
    assert_eq!((reported.as_str(), reported.epoch()), ("lapsed", 1.into()));
    let next = granted(conn.acquire("k", "b", TTL).unwrap());
    assert!(next.epoch() > reported.epoch());
}

/// I2 + I3 over a long deterministic mix of operations: every reported epoch
/// is >= the previous report, and every grant exceeds everything reported or
/// granted before it.
#[test]
fn epochs_never_decrease_and_each_grant_exceeds_all_earlier_epochs() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let mut highest_seen = 0_i64;
    let mut current: Option<leasehold::Lease> = None;
    let owners = ["a", "b", "c"];
    let mut seed = 0x2545_f491_u64;
    for step in 0..300 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let owner = owners[(seed % 3) as usize];
        match (seed >> 8) % 4 {
            0 | 1 => {
                if let Acquisition::Granted(lease) = conn.acquire("k", owner, TTL).unwrap() {
                    let same_grant = current.as_ref().is_some_and(|c| c.owner() == owner);
                    if same_grant {
                        assert_eq!(
                            lease.epoch(),
                            highest_seen,
                            "step {step}: idempotent acquire changed epoch"
                        );
                    } else {
                        assert!(
                            lease.epoch() > highest_seen,
                            "step {step}: grant {} not above {highest_seen}",
                            lease.epoch()
                        );
                    }
                    highest_seen = highest_seen.max(lease.epoch().get());
                    current = Some(lease);
                }
            }
            2 => {
                if let Some(lease) = current.take() {
                    assert_eq!(
                        conn.release(&leasehold_test_support::grant(
                            "k",
                            lease.owner(),
                            lease.epoch()
                        ))
                        .unwrap(),
                        Release::Released
                    );
                }
            }
            _ => {
                if let Some(lease) = &current {
                    let _ = conn
                        .renew(
                            &leasehold_test_support::grant("k", lease.owner(), lease.epoch()),
                            TTL,
                        )
                        .unwrap();
                }
            }
        }
        let reported = conn.inspect("k").unwrap().map_or(0, |s| s.epoch().into());
        assert!(
            reported >= highest_seen,
            "step {step}: inspect {reported} below {highest_seen}"
        );
        highest_seen = reported;
    }
    assert!(
        highest_seen > 50,
        "the mix should have produced many grants, got {highest_seen}"
    );
}
