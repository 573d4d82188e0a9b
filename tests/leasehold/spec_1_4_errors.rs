//! docs/SPECIFICATION.md §1.4: invalid input raises 22023 naming every violation, and every
//! error changes nothing (I9).

use std::time::Duration;

use leasehold::{acquire, acquire_waiting, inspect, release, renew, LeaseError};

use crate::common::*;

fn violations(error: LeaseError) -> Vec<String> {
    match error {
        LeaseError::InvalidInput { violations } => violations,
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
        "SELECT * FROM lease.inspect(NULL)",
        &["key must not be NULL"],
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
    granted(acquire(&mut conn, "k", "o", TTL).unwrap());
    let before = table_snapshot(&mut conn);
    for (sql, expected) in SQL_CASES {
        assert_eq!(sqlstate_of(&mut conn, sql), "22023", "{sql}");
        let error = diesel::RunQueryDsl::execute(diesel::sql_query(*sql), &mut conn).unwrap_err();
        let diesel::result::Error::DatabaseError(_, info) = &error else {
            panic!("{sql}: {error:?}")
        };
        assert_eq!(info.constraint_name(), Some("lease_invalid_input"), "{sql}");
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
        violations(acquire(&mut conn, "", "o", TTL).unwrap_err()),
        ["key must not be empty"]
    );
    assert_eq!(
        violations(acquire(&mut conn, "", "", Duration::ZERO).unwrap_err()),
        [
            "key must not be empty",
            "owner must not be empty",
            "ttl must be positive"
        ]
    );
    assert_eq!(
        violations(renew(&mut conn, "k", "", 1, TTL).unwrap_err()),
        ["owner must not be empty"]
    );
    assert_eq!(
        violations(release(&mut conn, "", "o", 1).unwrap_err()),
        ["key must not be empty"]
    );
    assert_eq!(
        violations(inspect(&mut conn, "").unwrap_err()),
        ["key must not be empty"]
    );
    assert_eq!(
        violations(acquire(&mut conn, "k\0x", "o", TTL).unwrap_err()),
        ["key must not contain NUL characters"]
    );
    assert_eq!(
        violations(
            acquire(&mut conn, "k", "o", Duration::from_secs(200 * 366 * 86_400)).unwrap_err()
        ),
        ["ttl must be at most 100 years"]
    );
    let error = acquire(&mut conn, "", "o", TTL).unwrap_err().to_string();
    assert!(
        error.contains("key must not be empty") && !error.contains('\n'),
        "{error}"
    );
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        None,
        "invalid calls must create nothing"
    );
}

#[test]
fn sub_microsecond_ttl_rounds_up_instead_of_becoming_zero() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // 1 ns is a positive ttl; it must not be refused as "not positive".
    let lease = granted(acquire(&mut conn, "k", "o", Duration::from_nanos(1)).unwrap());
    assert_eq!(lease.epoch(), 1);
}

#[test]
fn timeout_error_changes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    let before = table_snapshot(&mut conn);
    let error = acquire_waiting(&mut conn, "k", "b", TTL, Duration::from_millis(60)).unwrap_err();
    assert!(matches!(error, LeaseError::TimedOut { .. }));
    assert_eq!(table_snapshot(&mut conn), before);
}
