//! The r2d2 convenience handle behaves like the connection API.

use leasehold::{Acquisition, LeaseClient, LeaseState, Release, Renewal};

use crate::common::*;

#[test]
fn pool_client_runs_the_full_cycle_without_a_caller_connection() {
    let db = TestDb::new();
    let client = LeaseClient::connect(&db.url, 2).unwrap();
    let lease = client
        .acquire("k", "a", TTL)
        .unwrap()
        .granted()
        .expect("granted");
    assert_eq!(client.acquire("k", "b", TTL).unwrap(), Acquisition::Denied);
    assert!(matches!(
        client.renew("k", "a", lease.epoch(), TTL).unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        client.release("k", "a", lease.epoch()).unwrap(),
        Release::Released
    );
    assert_eq!(
        client.inspect("k").unwrap(),
        Some(LeaseState::Unowned { epoch: 2 })
    );
    assert_eq!(client.inspect("none").unwrap(), None);
}

#[test]
fn pool_client_reports_an_unreachable_database_as_a_pool_error() {
    let url = url_with_database(&admin_url(), "leasehold_no_such_database");
    let manager = diesel::r2d2::ConnectionManager::<diesel::PgConnection>::new(url);
    let pool = diesel::r2d2::Pool::builder()
        .connection_timeout(std::time::Duration::from_millis(300))
        .build_unchecked(manager);
    let error = LeaseClient::new(pool).acquire("k", "a", TTL).unwrap_err();
    assert!(matches!(error, leasehold::LeaseError::Pool(_)), "{error:?}");
    assert!(error
        .to_string()
        .contains("check that the database is reachable"));
}
