//! Interrupted blocking acquires change nothing (I9).

use crate::common::*;
use leasehold::Leases;

#[test]
fn statement_timeout_during_a_blocking_acquire_changes_nothing() {
    let cluster = Cluster::start(false);
    let mut conn = cluster.conn();
    granted(conn.acquire("k", "a", TTL).unwrap());
    let before = snapshot(&mut conn);
    let (_, waiter) = blocked_waiter(&cluster, &mut conn, "SET statement_timeout = '400ms'");
    let error = waiter.join().unwrap().unwrap_err();
    // 57014 like the lease wait timeout, but the statement's timeout: a
    // database error, not the typed TimedOut of the 60 s wait bound.
    assert!(
        database_error(&error)
            .is_some_and(|source| source.to_string().contains("statement timeout")),
        "{error:?}"
    );
    assert_eq!(snapshot(&mut conn), before);
}

#[test]
fn cancel_during_a_blocking_acquire_changes_nothing() {
    let cluster = Cluster::start(false);
    let mut conn = cluster.conn();
    granted(conn.acquire("k", "a", TTL).unwrap());
    let before = snapshot(&mut conn);
    let (pid, waiter) = blocked_waiter(&cluster, &mut conn, "SELECT 1");
    assert!(query_bool(
        &mut conn,
        &format!("SELECT pg_cancel_backend({pid}) AS flag")
    ));
    let error = waiter.join().unwrap().unwrap_err();
    assert!(
        database_error(&error).is_some_and(|source| source
            .to_string()
            .contains("canceling statement due to user request")),
        "{error:?}"
    );
    assert_eq!(snapshot(&mut conn), before);
}
