//! docs/SPECIFICATION.md §1.1: states per key (absent, FREE, HELD, LAPSED) and lazy expiry.

use leasehold::{acquire, inspect, release, LeaseState};

use crate::common::*;

#[test]
fn never_leased_key_inspects_as_zero_rows() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert_eq!(inspect(&mut conn, "never").unwrap(), None);
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
    let lease = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(
        release(&mut conn, "k", "a", lease.epoch()).unwrap(),
        leasehold::Release::Released
    );
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        Some(LeaseState::Unowned { epoch: 2 })
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
    let lease = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 1,
            expires_at: lease.expires_at()
        })
    );
}

#[test]
fn lapsed_lease_reports_unowned_and_is_acquirable_with_no_reaper() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease =
        granted(acquire(&mut conn, "k", "a", std::time::Duration::from_millis(300)).unwrap());
    assert_eq!(
        acquire(&mut conn, "k", "b", TTL).unwrap(),
        leasehold::Acquisition::Denied
    );
    wait_until_server_time_passes(&mut conn, lease.expires_at());
    // Nothing ran in between: the stored row still says "a" holds it...
    assert!(raw_row(&mut conn, "k").unwrap().starts_with("a|1|t|"));
    // ...yet every operation evaluates expiry itself.
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        Some(LeaseState::Unowned { epoch: 1 })
    );
    let taken = granted(acquire(&mut conn, "k", "b", TTL).unwrap());
    assert_eq!(taken.epoch(), 2);
}

#[test]
fn expiry_is_server_clock_plus_ttl() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let before = server_now(&mut conn);
    let lease = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
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
    let lease = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    diesel::connection::SimpleConnection::batch_execute(
        &mut conn,
        "SET TimeZone = 'Pacific/Kiritimati'",
    )
    .unwrap();
    assert_eq!(
        inspect(&mut conn, "k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 1,
            expires_at: lease.expires_at()
        })
    );
}
