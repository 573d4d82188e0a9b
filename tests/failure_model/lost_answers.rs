//! Connection lost mid-call: "outcome unknown", resolved by a re-read.

use crate::common::*;
use crate::proxy;
use leasehold::Leases;

/// The waiter's backend is terminated mid-call: the client cannot know
/// whether anything committed, so it must say "outcome unknown"; the
/// re-read shows that nothing did.
#[test]
fn terminated_backend_during_a_blocking_acquire_reports_outcome_unknown_and_changes_nothing() {
    let cluster = Cluster::start(false);
    let mut conn = cluster.conn();
    granted(conn.acquire("k", "a", TTL).unwrap());
    let before = snapshot(&mut conn);
    let (pid, waiter) = blocked_waiter(&cluster, &mut conn, "SELECT 1");
    assert!(query_bool(
        &mut conn,
        &format!("SELECT pg_terminate_backend({pid}) AS flag")
    ));
    let error = waiter.join().unwrap().unwrap_err();
    assert!(
        error.kind() == ErrorKind::OutcomeUnknown
            && error.operation() == Some(Operation::ACQUIRE)
            && error.key() == Some("k"),
        "{error:?}"
    );
    // Resolution: the re-read shows the holder unchanged.
    assert_eq!(snapshot(&mut conn), before);
    assert_eq!(conn.inspect("k").unwrap().unwrap().epoch(), 1);
}

fn proxied(cluster_tcp: &LocalPostgres) -> (proxy::Proxy, PgConnection) {
    let proxy = proxy::Proxy::start(cluster_tcp.port());
    let mut conn = PgConnection::establish(&proxy.url("postgres")).expect("connect via proxy");
    // Prepare every lease statement on this connection, so that the call
    // under test is exactly one Bind/Execute/Sync round trip.
    let warm = granted(conn.acquire("warm-up", "w", TTL).unwrap());
    let _ = conn
        .renew(
            &leasehold_test_support::grant("warm-up", "w", warm.epoch()),
            TTL,
        )
        .unwrap();
    let _ = conn
        .release(&leasehold_test_support::grant("warm-up", "w", warm.epoch()))
        .unwrap();
    (proxy, conn)
}

fn tcp_cluster() -> Cluster {
    Cluster::from(LocalPostgres::builder().durable(false).tcp(true))
}

/// The server commits the acquire, the answer never arrives: the client
/// reports OutcomeUnknown (neither Granted nor Denied nor a plain error);
/// inspect resolves it as granted, and the idempotent re-acquire returns
/// the very same grant. A never-seen key, granted by the SQL function in
/// one request, whose answer is lost.
#[test]
fn acquire_whose_answer_is_lost_after_commit_reports_outcome_unknown_and_inspect_finds_it_granted()
{
    let cluster = tcp_cluster();
    let (proxy, mut conn) = proxied(&cluster.pg);
    proxy.drop_next_answer();
    let error = conn.acquire("k", "a", TTL).unwrap_err();
    assert!(
        error.kind() == ErrorKind::OutcomeUnknown
            && error.operation() == Some(Operation::ACQUIRE)
            && error.key() == Some("k"),
        "{error:?}"
    );
    assert!(proxy.answer_was_dropped(), "the proxy never saw the answer");
    let mut direct = cluster.conn();
    let Some(LeaseState::Held {
        owner,
        epoch,
        expires_at,
    }) = direct.inspect("k").unwrap()
    else {
        panic!("the acquire committed, inspect must show it");
    };
    assert_eq!((owner.as_str(), epoch), ("a", leasehold::Epoch::new(1)));
    let again = granted(direct.acquire("k", "a", TTL).unwrap());
    assert_eq!(
        (again.epoch(), again.expires_at()),
        (leasehold::Epoch::new(1), expires_at)
    );
}

/// The connection breaks before the call reaches the server: the client
/// still cannot tell, reports OutcomeUnknown, and inspect resolves it as
/// not granted.
#[test]
fn acquire_lost_before_the_server_saw_it_reports_outcome_unknown_and_inspect_finds_nothing() {
    let cluster = tcp_cluster();
    let (proxy, mut conn) = proxied(&cluster.pg);
    proxy.drop_next_request();
    let error = conn.acquire("k", "a", TTL).unwrap_err();
    assert!(
        error.kind() == ErrorKind::OutcomeUnknown && error.operation() == Some(Operation::ACQUIRE),
        "{error:?}"
    );
    let mut direct = cluster.conn();
    assert_eq!(direct.inspect("k").unwrap(), None);
}

/// Renew and release with lost answers: OutcomeUnknown, and the re-read
/// shows each took effect.
#[test]
fn renew_and_release_whose_answers_are_lost_report_outcome_unknown_and_inspect_resolves_them() {
    let cluster = tcp_cluster();
    let mut direct = cluster.conn();
    let lease = granted(direct.acquire("k", "a", Duration::from_secs(5)).unwrap());

    let (proxy, mut conn) = proxied(&cluster.pg);
    proxy.drop_next_answer();
    let error = conn
        .renew(&leasehold_test_support::grant("k", "a", lease.epoch()), TTL)
        .unwrap_err();
    assert!(
        error.kind() == ErrorKind::OutcomeUnknown && error.operation() == Some(Operation::RENEW),
        "{error:?}"
    );
    let Some(LeaseState::Held { expires_at, .. }) = direct.inspect("k").unwrap() else {
        panic!("the lease must still be held");
    };
    assert!(expires_at > lease.expires_at(), "the renewal committed");

    let (proxy, mut conn) = proxied(&cluster.pg);
    proxy.drop_next_answer();
    let error = conn
        .release(&leasehold_test_support::grant("k", "a", lease.epoch()))
        .unwrap_err();
    assert!(
        error.kind() == ErrorKind::OutcomeUnknown && error.operation() == Some(Operation::RELEASE),
        "{error:?}"
    );
    assert_eq!(
        direct.inspect("k").unwrap(),
        Some(LeaseState::Free {
            epoch: 2.into(),
            force_released: false
        }),
        "the release committed"
    );
}

/// Inside the caller's (diesel) transaction a broken connection is not
/// "outcome unknown": nothing commits before the caller's COMMIT, so the
/// call's effect is certainly gone with the transaction.
#[test]
fn a_lost_answer_inside_a_transaction_is_a_database_error_and_nothing_commits() {
    let cluster = tcp_cluster();
    let (proxy, mut conn) = proxied(&cluster.pg);
    let mut lease_error = None;
    let _ = conn.transaction::<(), diesel::result::Error, _>(|conn| {
        proxy.drop_next_answer();
        lease_error = conn.acquire("k", "a", TTL).err();
        Err(diesel::result::Error::RollbackTransaction)
    });
    let error = lease_error.expect("the acquire must fail");
    assert!(database_error(&error).is_some(), "{error:?}");
    let mut direct = cluster.conn();
    wait_for(
        &mut direct,
        "the proxied backend exiting",
        "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'client backend' AND client_addr IS NOT NULL) AS flag",
    );
    assert_eq!(direct.inspect("k").unwrap(), None);
}
