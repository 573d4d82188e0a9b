//! docs/SPECIFICATION.md §1.1: states per key (absent, FREE, HELD, LAPSED) and lazy expiry.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::sql_types::Timestamptz;
use diesel::{PgConnection, QueryableByName, RunQueryDsl};
use leasehold::{Acquisition, LeaseState, Leases, Refusal, Release, Renewal};

use crate::common::*;

#[derive(QueryableByName)]
struct TransactionStart {
    #[diesel(sql_type = Timestamptz)]
    at: DateTime<Utc>,
}

/// The start of the connection's current transaction (`now()`): the instant
/// a call must NOT judge expiry by. Also used by `concurrency.rs`.
pub(crate) fn transaction_start(conn: &mut PgConnection) -> DateTime<Utc> {
    diesel::sql_query("SELECT now() AS at")
        .get_result::<TransactionStart>(conn)
        .expect("transaction start")
        .at
}

#[test]
fn never_leased_key_inspects_as_zero_rows() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert_eq!(conn.inspect("never").unwrap(), None);
    let rows = query_lines(
        &mut conn,
        "SELECT held::text AS line FROM lease.inspect('never')",
    );
    assert!(rows.is_empty());
}

#[test]
fn released_key_keeps_one_unowned_row_with_its_counter() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", lease.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Free {
            epoch: 2.into(),
            force_released: false
        })
    );
    let rows = query_lines(
        &mut conn,
        "SELECT format('%s|%s|%s|%s', held, owner IS NULL, epoch, expires_at IS NULL) AS line FROM lease.inspect('k')",
    );
    assert_eq!(rows, vec!["f|t|2|t"]);
}

#[test]
fn held_key_inspects_with_owner_epoch_and_expiry() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 1.into(),
            expires_at: lease.expires_at()
        })
    );
}

#[test]
fn lapsed_lease_reports_unowned_and_is_acquirable_with_no_reaper() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(
        conn.acquire("k", "a", std::time::Duration::from_millis(300))
            .unwrap(),
    );
    assert_eq!(
        conn.acquire("k", "b", TTL).unwrap(),
        leasehold::Acquisition::Denied
    );
    wait_until_server_time_passes(&mut conn, lease.expires_at());
    // Nothing ran in between: the stored row still says "a" holds it...
    assert!(raw_row(&mut conn, "k").unwrap().starts_with("a|1|t|"));
    // ...yet every operation evaluates expiry itself.
    assert_eq!(
        conn.inspect("k")
            .unwrap()
            .map(|state| (state.as_str(), state.epoch())),
        Some(("lapsed", 1.into()))
    );
    let taken = granted(conn.acquire("k", "b", TTL).unwrap());
    assert_eq!(taken.epoch(), 2);
}

#[test]
fn expiry_is_server_clock_plus_ttl() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let before = server_now(&mut conn);
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    let after = server_now(&mut conn);
    let ttl = chrono::Duration::from_std(TTL).unwrap();
    assert!(
        lease.expires_at() >= before + ttl,
        "expiry earlier than server now + ttl"
    );
    assert!(
        lease.expires_at() <= after + ttl,
        "expiry later than server now + ttl"
    );
}

#[test]
fn no_function_accepts_a_client_timestamp_and_session_settings_do_not_move_the_clock() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let timestamp_args = query_lines(
        &mut conn,
        "SELECT p.proname::text AS line FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = 'lease' AND EXISTS (SELECT 1 FROM unnest(p.proargtypes) t \
         WHERE t IN ('timestamptz'::regtype, 'timestamp'::regtype, 'date'::regtype))",
    );
    assert!(
        timestamp_args.is_empty(),
        "functions taking timestamps: {timestamp_args:?}"
    );
    // A session time zone is presentation only; expiry is an absolute instant.
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    diesel::connection::SimpleConnection::batch_execute(
        &mut conn,
        "SET TimeZone = 'Pacific/Kiritimati'",
    )
    .unwrap();
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 1.into(),
            expires_at: lease.expires_at()
        })
    );
}

// ---- expiry is decided on the server clock at the call (I6, I7) ----
//
// Each test opens a transaction, fixes its start (`now()`) while the grant
// is live, waits until the server clock has passed the expiry, and only then
// calls: a call that judged expiry by the transaction start would still see
// the grant live.

/// `holder_tx` opens a transaction; then `grantor` grants `k` to `a` for a
/// short ttl, so the transaction began before the grant's expiry whatever
/// the machine's load. Returns the grant once the server clock has passed
/// its expiry.
fn grant_lapsing_inside_an_open_transaction(
    holder_tx: &mut PgConnection,
    grantor: &mut PgConnection,
) -> leasehold::Lease {
    holder_tx.batch_execute("BEGIN").unwrap();
    let started = transaction_start(holder_tx);
    let lease = granted(
        grantor
            .acquire("k", "a", Duration::from_millis(200))
            .unwrap(),
    );
    assert!(started < lease.expires_at());
    wait_until_server_time_passes(grantor, lease.expires_at());
    assert_eq!(
        transaction_start(holder_tx),
        started,
        "still the same transaction"
    );
    lease
}

#[test]
fn release_inside_a_transaction_begun_before_expiry_reports_lapsed() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let mut grantor = db.conn();
    let lease = grant_lapsing_inside_an_open_transaction(&mut conn, &mut grantor);
    let before = table_snapshot(&mut conn);
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", lease.epoch()))
            .unwrap(),
        Release::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    assert_eq!(
        table_snapshot(&mut conn),
        before,
        "a lapsed release changes nothing"
    );
    conn.batch_execute("COMMIT").unwrap();
    assert_eq!(table_snapshot(&mut grantor), before);
    assert_eq!(
        grantor
            .inspect("k")
            .unwrap()
            .map(|state| (state.as_str(), state.epoch())),
        Some(("lapsed", 1.into()))
    );
}

#[test]
fn renew_inside_a_transaction_begun_before_expiry_reports_lapsed() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let mut grantor = db.conn();
    let lease = grant_lapsing_inside_an_open_transaction(&mut conn, &mut grantor);
    let before = table_snapshot(&mut conn);
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "a", lease.epoch()), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    assert_eq!(
        table_snapshot(&mut conn),
        before,
        "a lapsed renew changes nothing"
    );
    conn.batch_execute("COMMIT").unwrap();
    assert_eq!(table_snapshot(&mut grantor), before);
    assert_eq!(
        grantor
            .inspect("k")
            .unwrap()
            .map(|state| (state.as_str(), state.epoch())),
        Some(("lapsed", 1.into()))
    );
}

/// The other calls judge expiry the same way: inside the old transaction
/// the grant inspects as unowned and another owner takes it over.
#[test]
fn inspect_and_acquire_inside_a_transaction_begun_before_expiry_see_the_grant_lapsed() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let mut grantor = db.conn();
    grant_lapsing_inside_an_open_transaction(&mut conn, &mut grantor);
    assert_eq!(
        conn.inspect("k")
            .unwrap()
            .map(|state| (state.as_str(), state.epoch())),
        Some(("lapsed", 1.into()))
    );
    let before = server_now(&mut conn);
    let taken = granted(conn.acquire("k", "b", TTL).unwrap());
    assert_eq!(
        (taken.owner(), taken.epoch()),
        ("b", leasehold::Epoch::new(2))
    );
    let ttl = chrono::Duration::from_std(TTL).unwrap();
    assert!(
        taken.expires_at() >= before + ttl,
        "the takeover's expiry counts from the call, not the transaction start"
    );
    conn.batch_execute("COMMIT").unwrap();
    assert_eq!(grantor.acquire("k", "a", TTL).unwrap(), Acquisition::Denied);
}

/// A renew inside a long transaction extends from the server clock at the
/// call (`clock_timestamp()`), never from the transaction start.
#[test]
fn renew_inside_a_long_transaction_sets_expiry_from_the_clock_at_the_call() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    conn.batch_execute("BEGIN").unwrap();
    let started = transaction_start(&mut conn);
    wait_until_server_time_passes(&mut conn, started + chrono::Duration::milliseconds(300));
    let before = server_now(&mut conn);
    let Renewal::Renewed { expires_at } = conn
        .renew(&leasehold_test_support::grant("k", "a", lease.epoch()), TTL)
        .unwrap()
    else {
        panic!("renew of a live grant failed");
    };
    let after = server_now(&mut conn);
    let ttl = chrono::Duration::from_std(TTL).unwrap();
    assert!(
        expires_at >= before + ttl,
        "expiry {expires_at} earlier than the call's clock {before} + ttl (transaction began {started})"
    );
    assert!(
        expires_at <= after + ttl,
        "expiry later than server now + ttl"
    );
    conn.batch_execute("COMMIT").unwrap();
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: lease.epoch(),
            expires_at
        })
    );
}

// ---- inspect of a lapsed grant (I6) ----

/// A lapsed grant inspects exactly like a released key: `held = false`,
/// `owner` and `expires_at` NULL, and the counter — never the stale holder
/// or its stale expiry, though the stored row still carries both.
#[test]
fn lapsed_grant_inspects_as_not_held_with_null_owner_and_expiry_and_the_counter() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("k", "a", STILL_HELD_NEXT_STEP).unwrap());
    let sql = "SELECT format('%s|%s|%s|%s', held, coalesce(owner, '<null>'), epoch, \
               coalesce(expires_at::text, '<null>')) AS line FROM lease.inspect('k')";
    let live = query_lines(&mut conn, sql);
    assert_eq!(live.len(), 1);
    assert!(live[0].starts_with("t|a|1|"), "{live:?}");
    wait_until_server_time_passes(&mut conn, lease.expires_at());
    assert!(raw_row(&mut conn, "k").unwrap().starts_with("a|1|t|"));
    assert_eq!(query_lines(&mut conn, sql), ["f|<null>|1|<null>"]);
    // Likewise once a second grant has lapsed after a takeover.
    let second = granted(conn.acquire("k", "b", Duration::from_millis(200)).unwrap());
    wait_until_server_time_passes(&mut conn, second.expires_at());
    assert_eq!(query_lines(&mut conn, sql), ["f|<null>|2|<null>"]);
    assert_eq!(
        conn.inspect("k")
            .unwrap()
            .map(|state| (state.as_str(), state.epoch())),
        Some(("lapsed", 2.into()))
    );
}
