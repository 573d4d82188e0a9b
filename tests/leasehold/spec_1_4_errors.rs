//! docs/SPECIFICATION.md §1.4: invalid input raises 22023 naming every violation, and every
//! error changes nothing (I9).

use std::time::Duration;

use leasehold::{ErrorKind, LeaseError, Leases};

use crate::common::*;

fn violations(error: LeaseError) -> Vec<String> {
    match error {
        e if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
            e.violations().to_vec()
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// Each case: SQL call, the violations its DETAIL must name.
const SQL_CASES: &[(&str, &[&str])] = &[
    (
        "SELECT * FROM lease.acquire(NULL, 'o', interval '1s')",
        &["key must not be NULL"],
    ),
    (
        "SELECT * FROM lease.acquire('', 'o', interval '1s')",
        &["key must not be empty"],
    ),
    (
        "SELECT * FROM lease.acquire('k', NULL, interval '1s')",
        &["owner must not be NULL"],
    ),
    (
        "SELECT * FROM lease.acquire('k', '', interval '1s')",
        &["owner must not be empty"],
    ),
    (
        "SELECT * FROM lease.acquire('k', 'o', NULL)",
        &["ttl must not be NULL"],
    ),
    (
        "SELECT * FROM lease.acquire('k', 'o', interval '0')",
        &["ttl must be positive"],
    ),
    (
        "SELECT * FROM lease.acquire('k', 'o', interval '-5s')",
        &["ttl must be positive"],
    ),
    (
        "SELECT * FROM lease.acquire('k', 'o', interval '1s', NULL)",
        &["wait must not be NULL"],
    ),
    (
        "SELECT * FROM lease.acquire('k', 'o', interval '1s', interval '-1s')",
        &["wait must not be negative"],
    ),
    (
        "SELECT * FROM lease.renew('k', 'o', NULL, interval '1s')",
        &["epoch must not be NULL"],
    ),
    (
        "SELECT * FROM lease.renew('k', 'o', 1, interval '0')",
        &["ttl must be positive"],
    ),
    (
        "SELECT * FROM lease.release('k', 'o', NULL)",
        &["epoch must not be NULL"],
    ),
    (
        "SELECT * FROM lease.release('', '', NULL)",
        &[
            "key must not be empty",
            "owner must not be empty",
            "epoch must not be NULL",
        ],
    ),
    (
        "SELECT * FROM lease.why_refused('k', 'o', NULL)",
        &["epoch must not be NULL"],
    ),
    (
        "SELECT * FROM lease.why_refused('', NULL, NULL)",
        &[
            "key must not be empty",
            "owner must not be NULL",
            "epoch must not be NULL",
        ],
    ),
    (
        "SELECT * FROM lease.inspect('')",
        &["key must not be empty"],
    ),
    ("SELECT lease.key_state(NULL)", &["key must not be NULL"]),
    (
        "SELECT * FROM lease.inspect(NULL)",
        &["key must not be NULL"],
    ),
    // The smallest valid epoch and up_to beside an invalid argument: only
    // the invalid one is named.
    (
        "SELECT * FROM lease.admit('', 'k', 1)",
        &["resource must not be empty"],
    ),
    (
        "SELECT * FROM lease.admit_held('r', 'k', '', 1)",
        &["owner must not be empty"],
    ),
    (
        "SELECT * FROM lease.fence('', 'k', 0)",
        &["resource must not be empty"],
    ),
    (
        "SELECT * FROM lease.fence('r', 'k', -1)",
        &["up_to must not be negative"],
    ),
    (
        "SELECT * FROM lease.admit('r', 'k', 0)",
        &["epoch must be at least 1"],
    ),
    // One invalid argument, in each place, beside valid ones: a shortcut
    // that let it through would answer with another error, or none.
    (
        "SELECT * FROM lease.admit('r', '', 1)",
        &["key must not be empty"],
    ),
    (
        "SELECT * FROM lease.check_held('', 'o', 1)",
        &["key must not be empty"],
    ),
    (
        "SELECT * FROM lease.check_held('k', '', 1)",
        &["owner must not be empty"],
    ),
    (
        "SELECT * FROM lease.admit_held('', 'k', 'o', 1)",
        &["resource must not be empty"],
    ),
    (
        "SELECT * FROM lease.admit_held('r', '', 'o', 1)",
        &["key must not be empty"],
    ),
    (
        "SELECT * FROM lease.renew_admit('', 'k', 'o', 1, interval '1s')",
        &["resource must not be empty"],
    ),
    (
        "SELECT * FROM lease.renew_admit('r', '', 'o', 1, interval '1s')",
        &["key must not be empty"],
    ),
    (
        "SELECT * FROM lease.renew_admit('r', 'k', '', 1, interval '1s')",
        &["owner must not be empty"],
    ),
    (
        "SELECT * FROM lease.renew_admit('r', 'k', 'o', 1, interval '0')",
        &["ttl must be positive"],
    ),
    (
        "SELECT * FROM lease.fence('r', '', 0)",
        &["key must not be empty"],
    ),
    // Pruning's batch at and past its bounds, beside a valid or an invalid
    // idle time.
    (
        "SELECT * FROM lease.prune_keys('1 hour', NULL, 0)",
        &["batch must be between 1 and 100000"],
    ),
    (
        "SELECT * FROM lease.prune_keys('1 hour', NULL, 100001)",
        &["batch must be between 1 and 100000"],
    ),
    (
        "SELECT * FROM lease.prune_guards('1 hour', NULL, NULL)",
        &["batch must not be NULL"],
    ),
    (
        "SELECT * FROM lease.prune_keys('0 s', NULL, 1)",
        &["idle must be positive"],
    ),
    (
        "SELECT * FROM lease.prune_guards('0 s', NULL, 100000)",
        &["idle must be positive"],
    ),
    // A NULL epoch (or up_to) beside valid arguments, for each function
    // that takes one: the only invalid part, so only the full check finds it.
    (
        "SELECT * FROM lease.admit('r', 'k', NULL)",
        &["epoch must not be NULL"],
    ),
    (
        "SELECT * FROM lease.check_held('k', 'o', NULL)",
        &["epoch must not be NULL"],
    ),
    (
        "SELECT * FROM lease.admit_held('r', 'k', 'o', NULL)",
        &["epoch must not be NULL"],
    ),
    (
        "SELECT * FROM lease.renew_admit('r', 'k', 'o', NULL, interval '1s')",
        &["epoch must not be NULL"],
    ),
    (
        "SELECT * FROM lease.fence('r', 'k', NULL)",
        &["up_to must not be NULL"],
    ),
    (
        "SELECT * FROM lease.acquire('', NULL, interval '-1s', interval '-1s')",
        &[
            "key must not be empty",
            "owner must not be NULL",
            "ttl must be positive",
            "wait must not be negative",
        ],
    ),
    (
        "SELECT * FROM lease.renew(NULL, '', NULL, NULL)",
        &[
            "key must not be NULL",
            "owner must not be empty",
            "ttl must not be NULL",
            "epoch must not be NULL",
        ],
    ),
];

#[test]
fn every_invalid_input_raises_22023_naming_all_violations_and_changes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(conn.acquire("k", "o", TTL).unwrap());
    let before = table_snapshot(&mut conn);
    for (sql, expected) in SQL_CASES {
        assert_eq!(sqlstate_of(&mut conn, sql), "22023", "{sql}");
        let error = diesel::RunQueryDsl::execute(diesel::sql_query(*sql), &mut conn).unwrap_err();
        let diesel::result::Error::DatabaseError(_, info) = &error else {
            panic!("{sql}: {error:?}")
        };
        assert_eq!(info.constraint_name(), Some("lease_invalid_input"), "{sql}");
        // The message names the function called, not one it calls.
        let called = sql
            .split("lease.")
            .nth(1)
            .and_then(|rest| rest.split('(').next())
            .expect("a call of a lease function");
        assert!(
            info.message()
                .starts_with(&format!("invalid input to lease.{called}: ")),
            "{sql}: {}",
            info.message()
        );
        let detail: Vec<&str> = info.details().unwrap_or("").split("; ").collect();
        assert_eq!(&detail, expected, "{sql}");
    }
    assert_eq!(table_snapshot(&mut conn), before);
}

#[test]
fn rust_api_maps_invalid_input_to_typed_violations() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert_eq!(
        violations(conn.acquire("", "o", TTL).unwrap_err()),
        ["key must not be empty"]
    );
    assert_eq!(
        violations(conn.acquire("", "", Duration::ZERO).unwrap_err()),
        [
            "key must not be empty",
            "owner must not be empty",
            "ttl must be positive"
        ]
    );
    // A grant with an empty name or an epoch below 1 cannot even be named:
    // renew and release take a token, and a token refuses those parts.
    let refused = |key: &str, owner: &str, epoch: i64| match leasehold::FencingToken::new(
        key,
        owner,
        leasehold::Epoch::new(epoch),
    ) {
        Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
            e.violations().to_vec()
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    };
    assert_eq!(
        refused("k", "", 1),
        ["fencing token owner must not be empty"]
    );
    assert_eq!(refused("", "o", 1), ["fencing token key must not be empty"]);
    assert_eq!(
        refused("k", "o", 0),
        ["fencing token epoch must be at least 1 (got 0)"]
    );
    assert_eq!(
        violations(
            conn.renew(&leasehold_test_support::grant("k\0x", "o", 1), TTL)
                .unwrap_err()
        ),
        ["key must not contain NUL characters"]
    );
    assert_eq!(
        violations(conn.inspect("").unwrap_err()),
        ["key must not be empty"]
    );
    assert_eq!(
        violations(conn.acquire("k\0x", "o", TTL).unwrap_err()),
        ["key must not contain NUL characters"]
    );
    assert_eq!(
        violations(
            conn.acquire("k", "o", Duration::from_secs(200 * 366 * 86_400))
                .unwrap_err()
        ),
        ["ttl must be at most 100 years"]
    );
    let error = conn.acquire("", "o", TTL).unwrap_err().to_string();
    assert!(
        error.contains("key must not be empty") && !error.contains('\n'),
        "{error}"
    );
    assert_eq!(
        conn.inspect("k").unwrap(),
        None,
        "invalid calls must create nothing"
    );
}

#[test]
fn sub_microsecond_ttl_rounds_up_instead_of_becoming_zero() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // 1 ns is a positive ttl; it must not be refused as "not positive".
    let lease = granted(conn.acquire("k", "o", Duration::from_nanos(1)).unwrap());
    assert_eq!(lease.epoch(), 1);
}

#[test]
fn timeout_error_changes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(conn.acquire("k", "a", TTL).unwrap());
    let before = table_snapshot(&mut conn);
    let error = conn
        .acquire_waiting("k", "b", TTL, Duration::from_millis(60))
        .unwrap_err();
    assert!(error.kind() == ErrorKind::TimedOut && error.key().is_some());
    assert_eq!(table_snapshot(&mut conn), before);
}

/// Intervals that interval ordering (a month counts as 30 days) judges
/// fine but that add no time, too much time, or cannot be added to the
/// current time at all; each with the violation it must be named by, for a
/// ttl and for a wait.
const ODD_INTERVALS: &[(&str, &str, &str)] = &[
    // 12 months are 365 or 366 days: now + this is about 4 days ago.
    (
        "-1 year 361 days",
        "ttl must be positive",
        "wait must not be negative",
    ),
    // Orders as 1 day; adds about 2,400 years.
    (
        "2000000 mon -59999999 days",
        "ttl must be at most 100 years",
        "wait must be at most 100 years",
    ),
    // Orders as 1 day; now - 2,000,000 months is before 4713 BC.
    (
        "-2000000 mon 60000001 days",
        "ttl must not overflow when added to the current time",
        "wait must not overflow when added to the current time",
    ),
];

/// Every lease and guard row, for "nothing changed" checks.
fn lease_and_guard_snapshot(conn: &mut diesel::PgConnection) -> Vec<String> {
    let mut rows = table_snapshot(conn);
    rows.extend(query_lines(
        conn,
        "SELECT format('%s|%s|%s', resource, lease_key, accepted_epoch) AS line FROM lease.guards ORDER BY resource",
    ));
    rows
}

/// §1.3, §1.4: ttl and wait are judged by the time they add at the call,
/// in acquire, renew and renew_admit; each odd interval raises 22023 naming
/// its violation, and nothing changes (I9).
#[test]
fn ttl_and_wait_are_judged_by_the_time_they_add_not_by_interval_ordering() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("k", "o", TTL).unwrap());
    let epoch = lease.epoch();
    let before = lease_and_guard_snapshot(&mut conn);
    for (interval, ttl_violation, wait_violation) in ODD_INTERVALS {
        let cases = [
            (
                format!("SELECT * FROM lease.acquire('fresh', 'o', interval '{interval}')"),
                ttl_violation,
            ),
            (
                format!("SELECT * FROM lease.acquire('fresh', 'o', interval '1s', interval '{interval}')"),
                wait_violation,
            ),
            (
                format!("SELECT * FROM lease.renew('k', 'o', {epoch}, interval '{interval}')"),
                ttl_violation,
            ),
            (
                format!("SELECT lease.renew_admit('r', 'k', 'o', {epoch}, interval '{interval}')"),
                ttl_violation,
            ),
        ];
        for (sql, violation) in &cases {
            assert_eq!(sqlstate_of(&mut conn, sql), "22023", "{sql}");
            let error = diesel::RunQueryDsl::execute(diesel::sql_query(sql.as_str()), &mut conn)
                .unwrap_err();
            let diesel::result::Error::DatabaseError(_, info) = &error else {
                panic!("{sql}: {error:?}")
            };
            assert_eq!(info.constraint_name(), Some("lease_invalid_input"), "{sql}");
            // The message names the function called, not one it calls.
            let called = sql
                .split("lease.")
                .nth(1)
                .and_then(|rest| rest.split('(').next())
                .expect("a call of a lease function");
            assert!(
                info.message()
                    .starts_with(&format!("invalid input to lease.{called}: ")),
                "{sql}: {}",
                info.message()
            );
            assert_eq!(info.details(), Some(**violation), "{sql}");
            assert_eq!(lease_and_guard_snapshot(&mut conn), before, "{sql}");
        }
    }
    // Intervals that mix units but add a sensible time are accepted.
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT acquired::text AS line FROM lease.acquire('mixed2', 'o', interval '1 mon -1 day', interval '1 day -1 hour')"
        ),
        ["true"]
    );
}

/// §1.4: a call that writes raises `synchronous_commit` from `off` or
/// `local` to `on` for its own transaction, so its commit waits for the WAL
/// flush (the crash tests are in tests/failure_model/durability.rs). Calls
/// that change nothing leave the caller's setting alone, and so do writing
/// calls under remote_write and remote_apply.
#[test]
fn writing_calls_raise_synchronous_commit_to_on_for_their_transaction_only() {
    use diesel::connection::SimpleConnection;
    let db = TestDb::new();
    let mut conn = db.conn();
    let setting = |conn: &mut diesel::PgConnection| {
        query_lines(conn, "SELECT current_setting('synchronous_commit') AS line").remove(0)
    };
    let held = granted(conn.acquire("held", "a", TTL).unwrap());
    // (call, whether it writes)
    let calls: Vec<(String, bool)> = vec![
        ("SELECT * FROM lease.inspect('held')".into(), false),
        (
            "SELECT * FROM lease.acquire('held', 'b', interval '30s')".into(),
            false,
        ),
        (
            format!(
                "SELECT * FROM lease.renew('held', 'b', {}, interval '30s')",
                held.epoch()
            ),
            false,
        ),
        (
            format!("SELECT * FROM lease.release('held', 'b', {})", held.epoch()),
            false,
        ),
        ("SELECT * FROM lease.inspect_guard('r')".into(), false),
        (
            "SELECT * FROM lease.acquire('k', 'a', interval '30s')".into(),
            true,
        ),
        (
            "SELECT * FROM lease.acquire('k', 'a', interval '30s', interval '1 day -1 hour')"
                .into(),
            true,
        ),
        (
            format!(
                "SELECT * FROM lease.renew('held', 'a', {}, interval '30s')",
                held.epoch()
            ),
            true,
        ),
        (
            format!("SELECT * FROM lease.release('held', 'a', {})", held.epoch()),
            true,
        ),
        (
            format!("SELECT lease.admit('r', 'held', {})", held.epoch()),
            true,
        ),
        (
            format!(
                "SELECT lease.renew_admit('r', 'held', 'a', {}, interval '30s')",
                held.epoch()
            ),
            true,
        ),
        ("SELECT lease.fence('r2', 'held', 0)".into(), true),
    ];
    for (call, writes) in &calls {
        for (caller, after_a_write) in [
            ("off", "on"),
            ("local", "on"),
            ("remote_write", "remote_write"),
            ("remote_apply", "remote_apply"),
            ("on", "on"),
        ] {
            conn.batch_execute(&format!(
                "BEGIN; SET LOCAL synchronous_commit = {caller}; {call}"
            ))
            .unwrap_or_else(|e| panic!("{call}: {e}"));
            let expected = if *writes { after_a_write } else { caller };
            assert_eq!(setting(&mut conn), expected, "{call} under {caller}");
            conn.batch_execute("ROLLBACK").unwrap();
        }
    }
    // The raise ends with the transaction.
    conn.batch_execute("SET synchronous_commit = off").unwrap();
    granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(setting(&mut conn), "off");
}
