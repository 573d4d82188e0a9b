//! Release wake-ups as events (`LeaseWaiter::watch_releases`, what
//! `leasehold watch --events` shows as `wake`): delivered for the watched
//! keys only, through the waiters' one shared listener session, and a
//! resync whenever that session is lost.
//!
//! Every step waits for observable state: the watch's keys armed
//! (registered in a listening session), the listener's session count.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use leasehold::wait::{ReleaseEvent, ReleaseWatch, LISTENER_APPLICATION_NAME, WAITER_LIMIT};
use leasehold::{ErrorKind, Leases, Release};

use crate::common::*;
use crate::holders::{strict_waiter_at, wait_armed, LONG_WAIT};
use leasehold::admin::Operator;

/// How long a test waits for something that should come at once.
const SOON: Duration = Duration::from_secs(15);

/// The next event other than a resync (a session coming up queues one),
/// waiting up to [`SOON`].
fn next_release(watch: &ReleaseWatch) -> Option<String> {
    let until = Instant::now() + SOON;
    loop {
        match watch.recv_timeout(until.saturating_duration_since(Instant::now()))? {
            ReleaseEvent::Released { key } => return Some(key),
            _ => continue,
        }
    }
}

/// The listener sessions of this test's database.
fn listener_sessions(conn: &mut diesel::PgConnection, db: &TestDb) -> Vec<String> {
    query_lines(
        conn,
        &format!(
            "SELECT pid::text AS line FROM pg_stat_activity
              WHERE datname = '{}' AND application_name = '{LISTENER_APPLICATION_NAME}'",
            db.name
        ),
    )
}

#[test]
fn a_release_watch_reports_releases_of_its_keys_and_no_others() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let waiter = strict_waiter_at(&db.url);
    let watched = granted(conn.acquire("watched", "o", TTL).unwrap());
    let other = granted(conn.acquire("other", "o", TTL).unwrap());
    let watch = waiter
        .watch_releases(["watched", "watched", "never-leased"])
        .unwrap();
    assert_eq!(watch.len(), 2, "a key given twice is watched once");
    assert_eq!(watch.wait_armed(SOON), 2, "{:?}", waiter.listener_status());
    assert!(watch.is_armed("watched") && !watch.is_armed("other"));

    // "other" notifies too (this session registers it), but nobody in
    // this process watches it; its notification arrives first, so had it
    // been delivered, it would be the first event.
    query_lines(&mut conn, "SELECT lease._waiter_watch('other') AS line");
    assert_eq!(
        conn.release(&leasehold_test_support::grant("other", "o", other.epoch()))
            .unwrap(),
        Release::Released
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "watched",
            "o",
            watched.epoch()
        ))
        .unwrap(),
        Release::Released
    );
    assert_eq!(next_release(&watch).as_deref(), Some("watched"));
    assert!(
        waiter.listener_status().unmatched_notifications >= 1,
        "{:?}",
        waiter.listener_status()
    );
    // A forced release is a release too.
    granted(conn.acquire("watched", "o", TTL).unwrap());
    conn.force_release("watched").unwrap();
    assert_eq!(next_release(&watch).as_deref(), Some("watched"));
    assert_eq!(watch.try_recv(), None);
}

#[test]
fn a_release_watch_shares_the_waiters_listener_session() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let waiter = strict_waiter_at(&db.url);
    let holder = granted(conn.acquire("k", "holder", TTL).unwrap());
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("k", "waiter", TTL, LONG_WAIT))
    };
    wait_armed(&waiter, "k", 1);
    let mut watch = waiter.watch_releases(["k"]).unwrap();
    assert_eq!(watch.wait_armed(SOON), 1);
    assert!(watch.add("k2").unwrap());
    assert!(!watch.add("k2").unwrap());
    assert_eq!(watch.wait_armed(SOON), 2);
    // One listener session serves the waiter and the watch.
    assert_eq!(listener_sessions(&mut conn, &db).len(), 1);
    assert_eq!(waiter.listener_status().sessions, 1);

    // One release wakes both.
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "k",
            "holder",
            holder.epoch()
        ))
        .unwrap(),
        Release::Released
    );
    assert_eq!(next_release(&watch).as_deref(), Some("k"));
    let lease = waiting.join().unwrap().unwrap();
    assert_eq!(lease.owner(), "waiter");

    // A key no longer watched is not reported.
    assert!(watch.remove("k"));
    assert!(!watch.remove("k"));
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "waiter", lease.epoch()))
            .unwrap(),
        Release::Released
    );
    let k2 = granted(conn.acquire("k2", "o", TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k2", "o", k2.epoch()))
            .unwrap(),
        Release::Released
    );
    assert_eq!(next_release(&watch).as_deref(), Some("k2"));
}

#[test]
fn a_release_watch_is_told_to_resync_when_the_listener_session_is_lost() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let waiter = strict_waiter_at(&db.url);
    let watch = waiter.watch_releases(["k"]).unwrap();
    assert_eq!(watch.wait_armed(SOON), 1);
    while watch.try_recv().is_some() {}
    let pid = waiter.listener_status().backend_pid.unwrap();
    conn.batch_execute(&format!("SELECT pg_terminate_backend({pid}, 10000)"))
        .unwrap();
    assert_eq!(watch.recv_timeout(SOON), Some(ReleaseEvent::Resync));
    // The listener comes back on a session of its own and registers the
    // key again: releases are reported again.
    assert_eq!(watch.wait_armed(SOON), 1, "{:?}", waiter.listener_status());
    assert!(waiter.listener_status().sessions >= 2);
    let lease = granted(conn.acquire("k", "o", TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "o", lease.epoch()))
            .unwrap(),
        Release::Released
    );
    assert_eq!(next_release(&watch).as_deref(), Some("k"));
}

#[test]
fn a_release_watch_refuses_keys_it_could_never_report_and_more_than_the_limit() {
    let db = TestDb::new();
    let waiter = strict_waiter_at(&db.url);
    for keys in [vec![String::new()], vec!["a\0b".to_owned()]] {
        match waiter.watch_releases(&keys) {
            Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
                assert_eq!(e.violations().len(), 1)
            }
            other => panic!("{keys:?}: expected InvalidInput, got {other:?}"),
        }
    }
    let too_many: Vec<String> = (0..=WAITER_LIMIT).map(|i| format!("key-{i}")).collect();
    match waiter.watch_releases(&too_many) {
        Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
            let violations = e.violations();
            assert!(
                violations[0].contains("at most 10000 keys"),
                "{violations:?}"
            )
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    // Nothing was registered for the refused watches.
    assert_eq!(waiter.listener_status().failed_registrations, 0);
    let mut watch = waiter.watch_releases(["a"]).unwrap();
    assert!(matches!(
        watch.add(""),
        Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty()
    ));
    assert_eq!(watch.len(), 1);
}
