//! docs/SPECIFICATION.md §1.3: acquire, renew, release, inspect; statuses and precedence
//! (I4, I5, I10).

use std::time::Duration;

use diesel::connection::SimpleConnection;
use leasehold::{Acquisition, ErrorKind, LeaseState, Leases, Refusal, Release, Renewal};

use crate::common::*;

const SHORT: Duration = Duration::from_millis(250);

fn lapse(conn: &mut diesel::PgConnection, key: &str, owner: &str) -> leasehold::Lease {
    let lease = granted(conn.acquire(key, owner, SHORT).unwrap());
    wait_until_server_time_passes(conn, lease.expires_at());
    lease
}

#[test]
fn same_owner_acquire_of_a_held_lease_is_idempotent_same_epoch_and_expiry() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let first = granted(conn.acquire("k", "a", TTL).unwrap());
    let again = granted(conn.acquire("k", "a", Duration::from_secs(300)).unwrap());
    assert_eq!(again, first);
}

#[test]
fn other_owner_acquire_without_wait_is_denied_with_null_epoch_and_expiry() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(conn.acquire("k", "b", TTL).unwrap(), Acquisition::Denied);
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
    granted(conn.acquire("k", "a", TTL).unwrap());
    let error = conn
        .acquire_waiting("k", "b", TTL, Duration::from_millis(150))
        .unwrap_err();
    assert!(
        error.kind() == ErrorKind::TimedOut
            && error.key() == Some("k")
            && error.waited() == Some(Duration::from_millis(150)),
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
    assert_eq!(conn.acquire("k", "b", TTL).unwrap(), Acquisition::Denied);
    assert_eq!(conn.inspect("k").unwrap().unwrap().epoch(), 1);
}

#[test]
fn blocking_acquire_takes_over_when_the_holder_lapses_during_the_wait() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let held = granted(conn.acquire("k", "a", Duration::from_millis(400)).unwrap());
    let lease = conn
        .acquire_waiting("k", "b", TTL, Duration::from_secs(20))
        .unwrap();
    assert_eq!(lease.epoch(), 2);
    assert!(server_now(&mut conn) > held.expires_at());
}

#[test]
fn blocking_acquire_wakes_after_a_release() {
    let db = TestDb::new();
    let mut holder = db.conn();
    let lease = granted(holder.acquire("k", "a", TTL).unwrap());
    let url = db.url.clone();
    let waiter = std::thread::spawn(move || {
        let mut conn: diesel::PgConnection = diesel::Connection::establish(&url).unwrap();
        conn.acquire_waiting("k", "b", TTL, Duration::from_secs(20))
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
        holder
            .release(&leasehold_test_support::grant("k", "a", lease.epoch()))
            .unwrap(),
        Release::Released
    );
    let taken = waiter.join().unwrap().unwrap();
    assert_eq!(taken.owner(), "b");
    assert_eq!(taken.epoch(), 3);
}

/// A wait polls every 50 ms (§1.3): it neither sleeps through its wait
/// (a key released meanwhile would wait for the deadline) nor spins (a
/// waiter would burn a server core for its whole wait). Counted by the
/// server: each poll reads the key's row through the primary key, as a
/// call without a wait does once (`pg_stat_xact_user_tables`), so a wait
/// of 500 ms makes about ten such reads; a sleep through the wait makes
/// two, a spin thousands. The bounds leave room for a loaded machine's
/// late wake-ups.
#[test]
fn a_wait_polls_the_key_every_50_ms() {
    let db = TestDb::new();
    let mut holder = db.conn();
    granted(holder.acquire("poll/k", "a", TTL).unwrap());
    let mut waiter = db.conn();
    // The session's counts not yet flushed span its earlier transactions,
    // so each call is judged by the difference it makes.
    let key_reads = |conn: &mut diesel::PgConnection| -> i64 {
        query_lines(
            conn,
            "SELECT COALESCE(sum(idx_scan), 0)::text AS line FROM pg_stat_xact_user_tables
              WHERE schemaname = 'lease' AND relname = 'leases'",
        )[0]
        .parse()
        .expect("a count")
    };
    let mut reads_of = |wait: &str| -> (String, i64) {
        waiter.batch_execute("BEGIN").expect("begin");
        let before = key_reads(&mut waiter);
        let sqlstate = sqlstate_of(
            &mut waiter,
            &format!("SELECT * FROM lease.acquire('poll/k', 'b', '1 min', '{wait}')"),
        );
        let after = key_reads(&mut waiter);
        waiter.batch_execute("COMMIT").expect("commit");
        (sqlstate, after - before)
    };
    let (denied, one_poll) = reads_of("0");
    let (timed_out, waited) = reads_of("500 ms");
    assert_eq!((denied.as_str(), timed_out.as_str()), ("00000", "57014"));
    assert!(one_poll >= 1, "a denial reads the key's row: {one_poll}");
    let polls = waited / one_poll;
    assert!(
        (4..=30).contains(&polls),
        "a wait of 500 ms polled {polls} times ({waited} reads, {one_poll} a poll)"
    );
}

#[test]
fn renew_extends_expiry_and_never_changes_the_epoch() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("k", "a", Duration::from_secs(5)).unwrap());
    let Renewal::Renewed { expires_at } = conn
        .renew(
            &leasehold_test_support::grant("k", "a", 1),
            Duration::from_secs(60),
        )
        .unwrap()
    else {
        panic!("renew of a held lease failed");
    };
    assert!(expires_at > lease.expires_at());
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 1.into(),
            expires_at
        })
    );
}

#[test]
fn renew_and_release_of_an_unknown_key_report_not_owner() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("nope", "a", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::NeverHeld)
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant("nope", "a", 1))
            .unwrap(),
        Release::Refused(Refusal::NeverHeld)
    );
    assert_eq!(
        conn.inspect("nope").unwrap(),
        None,
        "a failed call must not create the key"
    );
}

#[test]
fn renew_and_release_of_a_free_key_report_not_owner_even_for_the_last_holder() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", 1))
            .unwrap(),
        Release::Released
    );
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Released)
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", 1))
            .unwrap(),
        Release::Refused(Refusal::Released)
    );
}

#[test]
fn renew_and_release_by_a_different_owner_report_not_owner() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "b", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::NeverHeld)
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "b", 1))
            .unwrap(),
        Release::Refused(Refusal::NeverHeld)
    );
    assert!(conn.inspect("k").unwrap().unwrap().is_held());
}

#[test]
fn renew_and_release_of_an_expired_own_grant_report_lapsed() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = lapse(&mut conn, "k", "a");
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", lease.epoch()), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", lease.epoch()))
            .unwrap(),
        Release::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    assert_eq!(
        conn.inspect("k")
            .unwrap()
            .map(|state| (state.as_str(), state.epoch())),
        Some(("lapsed", 1.into()))
    );
}

#[test]
fn renew_after_takeover_reports_lapsed_to_the_lapsed_owner() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let old = lapse(&mut conn, "k", "a");
    let new = granted(conn.acquire("k", "b", TTL).unwrap());
    assert_eq!(new.epoch(), 2);
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", old.epoch()), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: Some(2.into())
        })
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", old.epoch()))
            .unwrap(),
        Release::Refused(Refusal::Lapsed {
            taken_over_by: Some(2.into())
        })
    );
    // A bystander hears not_owner.
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "c", 2), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::NeverHeld)
    );
    // The new holder is untouched.
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "b".into(),
            epoch: 2.into(),
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
    granted(conn.acquire("k", "c", TTL).unwrap());
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "b", 2), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: Some(3.into())
        })
    );
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Superseded { by: 3.into() })
    );
}

#[test]
fn released_then_regranted_key_tells_the_releaser_not_owner() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", 1))
            .unwrap(),
        Release::Released
    );
    granted(conn.acquire("k", "b", TTL).unwrap());
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Superseded { by: 3.into() })
    );
}

#[test]
fn renew_and_release_with_a_stale_epoch_report_epoch_mismatch() {
    let db = TestDb::new();
    let mut conn = db.conn();
    lapse(&mut conn, "k", "a");
    let current = granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(current.epoch(), 2);
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::EpochMismatch {
            held: Some(2.into())
        })
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", 1))
            .unwrap(),
        Release::Refused(Refusal::EpochMismatch {
            held: Some(2.into())
        })
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", 99))
            .unwrap(),
        Release::Refused(Refusal::EpochMismatch {
            held: Some(2.into())
        })
    );
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 2.into(),
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
        conn.renew(&leasehold_test_support::grant("k", "b", 7), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::NeverHeld)
    );
    // Right owner, expired AND wrong epoch: lapsed wins.
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", 7), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", 7))
            .unwrap(),
        Release::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    // Right owner, live, wrong epoch: epoch_mismatch.
    granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", 7), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::EpochMismatch {
            held: Some(2.into())
        })
    );
}

#[test]
fn refused_renew_and_release_change_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    lapse(&mut conn, "gone", "a");
    granted(conn.acquire("held", "a", TTL).unwrap());
    let before = table_snapshot(&mut conn);
    let _ = conn
        .renew(&leasehold_test_support::grant("gone", "a", 1), TTL)
        .unwrap();
    let _ = conn
        .release(&leasehold_test_support::grant("gone", "a", 1))
        .unwrap();
    let _ = conn
        .renew(&leasehold_test_support::grant("held", "b", 1), TTL)
        .unwrap();
    let _ = conn
        .renew(&leasehold_test_support::grant("held", "a", 5), TTL)
        .unwrap();
    let _ = conn
        .release(&leasehold_test_support::grant("held", "a", 5))
        .unwrap();
    let _ = conn.acquire("held", "b", TTL).unwrap();
    assert_eq!(table_snapshot(&mut conn), before);
}

// ---- waits end on time (I7) ----

/// The wait every timing test below asks for.
const WAIT: Duration = Duration::from_secs(1);
/// The documented poll interval of a waiting acquire (docs/guide/getting-started.md: "polls every
/// 50 ms").
const POLL: Duration = Duration::from_millis(50);
/// Allowance on top of one poll interval for a loaded machine: between its
/// last poll and raising, a backend may be descheduled (2 busy cores, the
/// whole workspace's tests in parallel). Measured on the server, so client
/// scheduling does not count; observed lateness under that load was under
/// 10 ms, so this is generous, yet it still fails a poll that oversleeps
/// the deadline by a second, and it is far below the `statement_timeout`
/// that stops a wait which never ends.
const SCHEDULING_SLACK: Duration = Duration::from_millis(500);
/// Stops a broken wait that would never end; the test then fails on the
/// elapsed time and on the missing `lease_wait_timeout` constraint.
const RUNAWAY_STOP: Duration = Duration::from_secs(20);

/// Runs `lease.acquire(key, owner, 30s, wait)` and times it on the server:
/// `clock_timestamp()` right before and right after the call, inside one
/// statement, so client round trips do not count. Returns the SQLSTATE
/// ("00000" if it returned), the error's CONSTRAINT name and the elapsed
/// server time. Works inside an open transaction (the error is caught in a
/// subtransaction).
fn timed_blocking_acquire(
    conn: &mut diesel::PgConnection,
    key: &str,
    owner: &str,
    wait: Duration,
) -> (String, String, Duration) {
    use diesel::connection::SimpleConnection;
    conn.batch_execute(&format!(
        "SET statement_timeout = '{}ms';
         CREATE OR REPLACE FUNCTION pg_temp.timed_acquire(p_key text, p_owner text, p_wait interval)
         RETURNS text LANGUAGE plpgsql AS $f$
         DECLARE
             t0 timestamptz;
             state text := '00000';
             cons text := '';
         BEGIN
             t0 := clock_timestamp();
             BEGIN
                 PERFORM * FROM lease.acquire(p_key, p_owner, interval '30s', p_wait);
             EXCEPTION WHEN OTHERS OR query_canceled THEN
                 GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, cons = CONSTRAINT_NAME;
             END;
             RETURN format('%s|%s|%s', state, cons,
                 floor(extract(epoch FROM clock_timestamp() - t0) * 1000000)::bigint);
         END $f$;",
        (WAIT + RUNAWAY_STOP).as_millis()
    ))
    .expect("create pg_temp.timed_acquire");
    let line = query_lines(
        conn,
        &format!(
            "SELECT pg_temp.timed_acquire({}, {}, interval '{} microseconds') AS line",
            quote(key),
            quote(owner),
            wait.as_micros()
        ),
    )
    .remove(0);
    let mut parts = line.split('|');
    let state = parts.next().unwrap().to_owned();
    let constraint = parts.next().unwrap().to_owned();
    let micros: u64 = parts.next().unwrap().parse().unwrap();
    (state, constraint, Duration::from_micros(micros))
}

/// The wait raised the documented timeout, lasted at least the whole wait
/// (counted from the call) and ended no later than one poll interval after
/// it, plus the allowance for load.
fn assert_wait_ended_on_time(outcome: (String, String, Duration), wait: Duration) {
    let (state, constraint, elapsed) = outcome;
    assert_eq!(
        (state.as_str(), constraint.as_str()),
        ("57014", "lease_wait_timeout"),
        "after {elapsed:?}"
    );
    assert!(
        elapsed >= wait,
        "the wait ended after {elapsed:?}, before the {wait:?} it was given"
    );
    assert!(
        elapsed <= wait + POLL + SCHEDULING_SLACK,
        "the wait of {wait:?} ended only after {elapsed:?} (allowed: one {POLL:?} poll + {SCHEDULING_SLACK:?} slack)"
    );
}

#[test]
fn blocking_acquire_raises_57014_no_later_than_one_poll_interval_after_the_wait() {
    let db = TestDb::new();
    let mut holder = db.conn();
    let mut waiter = db.conn();
    granted(holder.acquire("k", "a", TTL).unwrap());
    let before = table_snapshot(&mut holder);
    assert_wait_ended_on_time(timed_blocking_acquire(&mut waiter, "k", "b", WAIT), WAIT);
    assert_eq!(table_snapshot(&mut holder), before);
}

/// The wait is counted from the call on the server clock, not from the
/// transaction start: inside a transaction that began more than the wait
/// before the call, the acquire still waits its whole wait, then raises.
#[test]
fn blocking_acquire_inside_a_transaction_begun_long_before_waits_the_whole_wait_then_raises_57014()
{
    use diesel::connection::SimpleConnection;
    let db = TestDb::new();
    let mut holder = db.conn();
    let mut waiter = db.conn();
    granted(holder.acquire("k", "a", TTL).unwrap());
    let before = table_snapshot(&mut holder);
    waiter.batch_execute("BEGIN").unwrap();
    let started = crate::spec_1_1_state::transaction_start(&mut waiter);
    let long_before = chrono::Duration::from_std(WAIT * 2).unwrap();
    wait_until_server_time_passes(&mut waiter, started + long_before);
    assert_wait_ended_on_time(timed_blocking_acquire(&mut waiter, "k", "b", WAIT), WAIT);
    assert_eq!(
        crate::spec_1_1_state::transaction_start(&mut waiter),
        started,
        "still the same transaction"
    );
    waiter.batch_execute("COMMIT").unwrap();
    assert_eq!(table_snapshot(&mut holder), before);
}
