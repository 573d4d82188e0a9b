//! Downtime never extends ownership (I11).

use crate::common::*;
use leasehold::Leases;

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
