//! A too-short ttl: a liveness mistake, never a safety violation.

use crate::common::*;
use leasehold::Leases;

#[test]
fn too_short_ttl_shows_up_as_lapsed_and_harms_nobody() {
    let cluster = Cluster::start(false);
    let mut hasty = cluster.conn();
    let mut other = cluster.conn();
    let lease = granted(
        hasty
            .acquire("k", "hasty", Duration::from_millis(50))
            .unwrap(),
    );
    // The "work" outlasts the ttl; meanwhile someone else takes over.
    wait_until_server_time_passes(&mut other, lease.expires_at());
    let next = granted(other.acquire("k", "b", TTL).unwrap());
    fenced_write(&mut other, next.token(), Check::LeaseHeld).unwrap();
    let before = snapshot(&mut other);
    assert_eq!(
        hasty
            .renew(
                &leasehold_test_support::grant("k", "hasty", lease.epoch()),
                TTL
            )
            .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: Some(2.into())
        })
    );
    assert_eq!(
        hasty
            .release(&leasehold_test_support::grant("k", "hasty", lease.epoch()))
            .unwrap(),
        Release::Refused(Refusal::Lapsed {
            taken_over_by: Some(2.into())
        })
    );
    assert!(matches!(
        fenced_write(&mut hasty, lease.token(), Check::Token),
        Err(FencedError::Guard(ref e)) if stale_epoch_of(e).is_some()
    ));
    assert!(matches!(
        fenced_write(&mut hasty, lease.token(), Check::LeaseHeld),
        Err(FencedError::Guard(ref e)) if not_held_reason(e) == Some(Refusal::Lapsed {
            taken_over_by: Some(leasehold::Epoch(2))
        })
    ));
    assert_eq!(
        snapshot(&mut other),
        before,
        "the hasty holder changed something"
    );
}
