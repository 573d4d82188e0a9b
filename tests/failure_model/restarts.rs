//! Restarts and crashes: the last committed state stands (I11).

use crate::common::*;
use leasehold::Leases;

/// Builds a state with every kind of key (held, free, lapsed, taken over)
/// and a guard record, and returns its exact snapshot.
fn committed_state(cluster: &Cluster) -> Vec<String> {
    let mut conn = cluster.conn();
    granted(conn.acquire("held", "a", TTL).unwrap());
    let free = granted(conn.acquire("free", "a", TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant("free", "a", free.epoch()))
            .unwrap(),
        Release::Released
    );
    let old = granted(
        conn.acquire("taken", "a", Duration::from_millis(100))
            .unwrap(),
    );
    wait_until_server_time_passes(&mut conn, old.expires_at());
    let new = granted(conn.acquire("taken", "b", TTL).unwrap());
    fenced_write(&mut conn, new.token(), Check::LeaseHeld).unwrap();
    snapshot(&mut conn)
}

/// After the restart: the same rows, and they still act as they did.
fn assert_state_stands(cluster: &Cluster, before: &[String]) {
    let mut conn = cluster.conn();
    assert_eq!(snapshot(&mut conn), before, "the committed state changed");
    assert_eq!(
        conn.acquire("held", "x", TTL).unwrap(),
        Acquisition::Denied,
        "a held lease must stay held"
    );
    assert!(matches!(
        conn.renew(&leasehold_test_support::grant("held", "a", 1), TTL)
            .unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        granted(conn.acquire("free", "x", TTL).unwrap()).epoch(),
        3,
        "the released key's counter (2) must stand"
    );
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("taken", "a", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: Some(2.into())
        }),
        "the taken-over holder must still hear lapsed"
    );
    let stale = leasehold::FencingToken::new("taken", "a", leasehold::Epoch::from(1)).unwrap();
    assert!(matches!(
        fenced_write(&mut conn, &stale, Check::Token),
        Err(FencedError::Guard(ref e))
            if matches!(stale_epoch_of(e), Some((_, _, leasehold::Epoch(2))))
    ));
}

#[test]
fn clean_restart_keeps_the_last_committed_state_and_epochs() {
    let cluster = Cluster::start(true);
    let before = committed_state(&cluster);
    cluster.pg.stop(StopMode::Fast).unwrap();
    cluster.pg.restart().unwrap();
    assert_state_stands(&cluster, &before);
}

#[test]
fn immediate_shutdown_keeps_the_last_committed_state_and_epochs() {
    let cluster = Cluster::start(true);
    let before = committed_state(&cluster);
    cluster.pg.stop(StopMode::Immediate).unwrap();
    cluster.pg.restart().unwrap();
    assert!(
        cluster.pg.log_tail(200).contains("not properly shut down"),
        "the restart must have run crash recovery"
    );
    assert_state_stands(&cluster, &before);
}

#[test]
fn postmaster_sigkill_keeps_the_last_committed_state_and_epochs() {
    let cluster = Cluster::start(true);
    let before = committed_state(&cluster);
    cluster.crash_and_recover();
    assert!(cluster.pg.log_tail(200).contains("not properly shut down"));
    assert_state_stands(&cluster, &before);
}

/// An acquire (a first grant and a takeover) and a release inside a
/// transaction that never committed when the server died leave no trace:
/// the next grants get exactly the epochs they would have got anyway.
#[test]
fn uncommitted_calls_in_flight_at_a_crash_leave_no_trace() {
    let cluster = Cluster::start(true);
    let mut conn = cluster.conn();
    let old = granted(conn.acquire("old", "a", TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant("old", "a", old.epoch()))
            .unwrap(),
        Release::Released
    );
    granted(conn.acquire("held", "a", TTL).unwrap());
    let before = snapshot(&mut conn);
    let mut in_flight = cluster.conn();
    in_flight.batch_execute("BEGIN").unwrap();
    assert_eq!(
        granted(in_flight.acquire("new", "b", TTL).unwrap()).epoch(),
        1
    );
    assert_eq!(
        granted(in_flight.acquire("old", "b", TTL).unwrap()).epoch(),
        3
    );
    assert_eq!(
        in_flight
            .release(&leasehold_test_support::grant("held", "a", 1))
            .unwrap(),
        Release::Released
    );
    cluster.crash_and_recover();
    let mut conn = cluster.conn();
    assert_eq!(snapshot(&mut conn), before);
    assert_eq!(conn.inspect("new").unwrap(), None);
    assert_eq!(granted(conn.acquire("old", "c", TTL).unwrap()).epoch(), 3);
    assert!(conn.inspect("held").unwrap().unwrap().is_held());
}

/// Epochs granted before each of several crashes stay below every epoch
/// granted after it, and the counter inspect reports never goes back.
#[test]
fn epochs_never_regress_across_repeated_crashes() {
    let cluster = Cluster::start(true);
    let mut highest = 0;
    for round in 0..3 {
        let mut conn = cluster.conn();
        for _ in 0..3 {
            let lease = granted(conn.acquire("k", &format!("w{round}"), TTL).unwrap());
            assert!(lease.epoch() > highest, "round {round}: {lease:?}");
            highest = lease.epoch().get();
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
        let counter = conn.inspect("k").unwrap().unwrap().epoch();
        drop(conn);
        cluster.crash_and_recover();
        let mut conn = cluster.conn();
        assert_eq!(
            conn.inspect("k").unwrap().unwrap().epoch(),
            counter,
            "round {round}: the counter moved across the crash"
        );
        highest = counter.get();
    }
}

/// G1 across a crash: the guard record stands, so a stale writer stays
/// refused after recovery.
#[test]
fn guard_records_survive_a_crash_and_keep_refusing_stale_epochs() {
    let cluster = Cluster::start(true);
    let mut conn = cluster.conn();
    // Real grants up to epoch 3: guards admit only epochs a key granted.
    let first = conn.acquire("k", "a", TTL).unwrap().granted().unwrap();
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", first.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    let new = conn
        .acquire("k", "b", TTL)
        .unwrap()
        .granted()
        .unwrap()
        .token()
        .clone();
    assert_eq!(new.epoch(), 3);
    fenced_write(&mut conn, &new, Check::Token).unwrap();
    drop(conn);
    cluster.crash_and_recover();
    let mut conn = cluster.conn();
    let stale = leasehold::FencingToken::new("k", "a", leasehold::Epoch::from(2)).unwrap();
    assert!(matches!(
        fenced_write(&mut conn, &stale, Check::Token),
        Err(FencedError::Guard(ref e)) if matches!(
            stale_epoch_of(e),
            Some((_, leasehold::Epoch(2), leasehold::Epoch(3)))
        )
    ));
    assert_eq!(writes(&mut conn), ["b@3"]);
}

/// A fenced write left in a prepared transaction keeps its lock on the
/// lease row (G6) through a disconnect and a restart: every takeover waits
/// and times out, until the transaction is resolved (safety holds,
/// availability does not). docs/guide/guards.md, "Prepared transactions".
#[test]
fn a_prepared_fenced_write_holds_off_every_takeover_until_it_is_resolved() {
    use leasehold::guard::Fencing;
    use leasehold::ErrorKind;

    let cluster = Cluster::from(
        LocalPostgres::builder()
            .durable(true)
            .setting("max_prepared_transactions", "2"),
    );
    let mut conn = cluster.conn();
    conn.batch_execute(
        "CREATE TABLE jobs (id int PRIMARY KEY); SELECT lease.protect_table('jobs', 'jobs-leader')",
    )
    .unwrap();
    let lease = granted(
        conn.acquire("jobs-leader", "a", Duration::from_millis(300))
            .unwrap(),
    );
    {
        let mut writer = cluster.conn();
        writer.batch_execute("BEGIN").unwrap();
        writer.present(&lease).unwrap();
        writer
            .batch_execute("INSERT INTO jobs VALUES (1); PREPARE TRANSACTION 'fenced-write'")
            .unwrap();
    }
    wait_until_server_time_passes(&mut conn, lease.expires_at());
    let takeover = |conn: &mut PgConnection| match conn.acquire("jobs-leader", "b", TTL) {
        Err(error) => assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}"),
        Ok(other) => panic!("a takeover went past the prepared write: {other:?}"),
    };
    takeover(&mut conn);
    drop(conn);
    cluster.pg.restart().unwrap();
    let mut conn = cluster.conn();
    takeover(&mut conn);
    conn.batch_execute("COMMIT PREPARED 'fenced-write'")
        .unwrap();
    let successor = granted(conn.acquire("jobs-leader", "b", TTL).unwrap());
    assert!(successor.epoch() > lease.epoch());
    assert_eq!(
        query_lines(&mut conn, "SELECT count(*)::text AS line FROM jobs"),
        vec!["1"]
    );
}
