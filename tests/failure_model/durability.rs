//! docs/SPECIFICATION.md §1.4 and I11: a call's effects are durable once its
//! transaction commits, whatever `synchronous_commit` the caller's session
//! set.
//!
//! The cluster is durable (fsync on) but its WAL writer sleeps 10 s between
//! rounds, so an asynchronous commit stays in the server's WAL buffers, in
//! shared memory, until the postmaster is killed right after the
//! acknowledgement. Only a commit that waited for its WAL flush survives.
//! (Against SQL that leaves the caller's `synchronous_commit = off` in
//! place, these tests fail: the acknowledged grant, release or guarded
//! write is gone after recovery.)

use crate::common::*;
use leasehold::Leases;

fn cluster_with_a_slow_wal_writer() -> Cluster {
    Cluster::from(
        LocalPostgres::builder()
            .durable(true)
            .setting("wal_writer_delay", "10s"),
    )
}

/// A session that asks for asynchronous commits.
fn asynchronous_session(cluster: &Cluster) -> PgConnection {
    let mut conn = cluster.conn();
    conn.batch_execute("SET synchronous_commit = off").unwrap();
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT current_setting('synchronous_commit') AS line"
        ),
        ["off"]
    );
    conn
}

#[test]
fn an_acknowledged_grant_survives_a_crash_with_synchronous_commit_off() {
    let cluster = cluster_with_a_slow_wal_writer();
    let mut conn = asynchronous_session(&cluster);
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    cluster.crash_and_recover();
    drop(conn);
    assert_eq!(
        cluster.conn().inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: lease.epoch(),
            expires_at: lease.expires_at(),
        }),
        "the acknowledged grant was lost in the crash"
    );
}

#[test]
fn an_acknowledged_release_survives_a_crash_with_synchronous_commit_off() {
    let cluster = cluster_with_a_slow_wal_writer();
    let lease = granted(cluster.conn().acquire("k", "a", TTL).unwrap());
    let mut conn = asynchronous_session(&cluster);
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", lease.epoch()))
            .unwrap(),
        Release::Released
    );
    cluster.crash_and_recover();
    drop(conn);
    assert_eq!(
        cluster.conn().inspect("k").unwrap(),
        Some(LeaseState::Free {
            epoch: leasehold::Epoch::new(lease.epoch().get() + 1),
            force_released: false,
        }),
        "the acknowledged release was lost in the crash"
    );
}

#[test]
fn an_acknowledged_guarded_write_survives_a_crash_with_synchronous_commit_off() {
    let cluster = cluster_with_a_slow_wal_writer();
    let lease = granted(cluster.conn().acquire("k", "a", TTL).unwrap());
    let mut conn = asynchronous_session(&cluster);
    fenced_write(&mut conn, lease.token(), Check::Token).unwrap();
    cluster.crash_and_recover();
    drop(conn);
    let mut conn = cluster.conn();
    assert_eq!(
        writes(&mut conn),
        [format!("a@{}", lease.epoch())],
        "the acknowledged guarded write was lost in the crash"
    );
}
