//! docs/SPECIFICATION.md §1.8 and invariant I16: pruning idle rows
//! never lets an epoch be granted twice, go back, or be admitted again where
//! it was stale; it races grants and admissions safely; bad input and
//! roles without the grant change nothing.

use std::sync::mpsc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::PgConnection;
use leasehold::{
    admin::{PruneOptions, PruneReport},
    error::LeaseError,
    ErrorKind, FencingToken, LeaseState, Leases, Refusal,
};
use leasehold_test_support::Deployment;

use crate::common::*;
use leasehold::admin::Operator;
use leasehold::guard::Check;
use leasehold::guard::Fencing;

/// The idle time these tests prune with: short, so that a test waits for it
/// on the server's clock instead of back-dating rows.
const IDLE: Duration = Duration::from_millis(20);

fn options() -> PruneOptions {
    PruneOptions::new(IDLE)
}

/// Waits until the server's clock is `IDLE` past `instant`.
fn wait_idle_after(conn: &mut PgConnection, instant: DateTime<Utc>) {
    let idle = chrono::Duration::from_std(IDLE).unwrap();
    wait_until_server_time_passes(conn, instant + idle);
}

/// A full prune, twice with the idle time between: the first records the
/// FREE rows, the second removes them (and every guard record that may go
/// once its key has gone). Returns the second report.
fn prune_idle_rows(conn: &mut PgConnection) -> PruneReport {
    conn.prune(&options()).unwrap();
    let now = server_now(conn);
    wait_idle_after(conn, now);
    conn.prune(&options()).unwrap()
}

/// Grants `key` to `owner` and releases it: the key is FREE with a counter
/// one above the returned epoch.
fn grant_and_release(conn: &mut PgConnection, key: &str, owner: &str) -> i64 {
    let lease = granted(conn.acquire(key, owner, TTL).unwrap());
    assert_eq!(
        conn.release(&leasehold_test_support::grant(key, owner, lease.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    lease.epoch().get()
}

/// A grant of `key` that writes `resource`'s record while it is held, then
/// is released: a FREE key with a guard record. Guards admit only a key's
/// newest grant (G2), so the record is written before the release.
fn admit_then_release(conn: &mut PgConnection, key: &str, owner: &str, resource: &str) -> i64 {
    let lease = granted(conn.acquire(key, owner, TTL).unwrap());
    conn.admit(resource, &lease.token(), Check::Token).unwrap();
    assert_eq!(
        conn.release(&leasehold_test_support::grant(key, owner, lease.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    lease.epoch().get()
}

/// Key pruning alone (`lease.prune_keys`), twice with the idle time
/// between: FREE and lapsed rows go, the guard records stay for a test of
/// guard pruning.
fn prune_keys_only(conn: &mut PgConnection) {
    conn.batch_execute("SELECT * FROM lease.prune_keys('20 ms')")
        .unwrap();
    let now = server_now(conn);
    wait_idle_after(conn, now);
    conn.batch_execute("SELECT * FROM lease.prune_keys('20 ms')")
        .unwrap();
}

/// One batch of one row of `function` (`prune_keys` or `prune_guards`)
/// with `idle`, after the digest `after` (an SQL expression). Answers
/// "<examined> <column>" (`column`: pruned or sighted) and next_after in
/// hex, "" at the end.
fn one_batch(
    conn: &mut PgConnection,
    function: &str,
    idle: &str,
    column: &str,
    after: &str,
) -> (String, String) {
    let line = query_lines(
        conn,
        &format!(
            "SELECT format('%s %s', examined, {column}) || '|' || COALESCE(encode(next_after, 'hex'), '') AS line
               FROM lease.{function}('{idle}', {after}, 1)"
        ),
    )
    .remove(0);
    let (counts, next) = line.split_once('|').expect("two parts");
    (counts.to_owned(), next.to_owned())
}

fn row_exists(conn: &mut PgConnection, key: &str) -> bool {
    query_bool(
        conn,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM lease.leases WHERE key = {}) AS flag",
            quote(key)
        ),
    )
}

fn token(key: &str, owner: &str, epoch: i64) -> FencingToken {
    FencingToken::new(key, owner, leasehold::Epoch::from(epoch)).unwrap()
}

/// Every row of every table a prune may touch, for "nothing changed".
fn everything(conn: &mut PgConnection) -> Vec<String> {
    let mut rows = table_snapshot(conn);
    rows.extend(query_lines(
        conn,
        "SELECT format('guard %s|%s|%s|%s', resource, lease_key, accepted_epoch, updated_at) AS line \
         FROM lease.guards ORDER BY resource",
    ));
    rows.extend(query_lines(
        conn,
        "SELECT format('sighting %s|%s|%s', key_hash, epoch, seen_at) AS line \
         FROM lease.prune_sightings ORDER BY key_hash",
    ));
    rows.extend(query_lines(
        conn,
        "SELECT format('waiter %s|%s', key_hash, backend_pid) AS line \
         FROM lease.waiters ORDER BY key_hash, backend_pid",
    ));
    rows.extend(query_lines(
        conn,
        "SELECT format('lineage %s|%s', pruned_through, external_floor) AS line FROM lease.lineage",
    ));
    rows.extend(query_lines(
        conn,
        "SELECT format('group %s|%s|%s|%s', id, owner, expires_at, members) AS line \
         FROM lease.groups ORDER BY id",
    ));
    rows.extend(query_lines(
        conn,
        "SELECT format('member %s|%s', key, group_id) AS line \
         FROM lease.leases WHERE group_id IS NOT NULL ORDER BY key",
    ));
    rows
}

#[test]
fn a_recreated_key_starts_above_every_epoch_it_had() {
    let db = TestDb::new();
    let mut conn = db.conn();
    grant_and_release(&mut conn, "job-1", "a");
    let last = grant_and_release(&mut conn, "job-1", "a");
    // A second key whose last grant lapsed, pruned by its expiry.
    let lapsed = granted(
        conn.acquire("job-2", "b", Duration::from_millis(1))
            .unwrap(),
    );
    wait_idle_after(&mut conn, lapsed.expires_at());

    let report = prune_idle_rows(&mut conn);
    assert!(!row_exists(&mut conn, "job-1") && !row_exists(&mut conn, "job-2"));
    assert_eq!(
        report.keys_pruned, 1,
        "job-2 went in the first pass: {report:?}"
    );
    assert!(report.watermark > last, "{report:?}");

    let again = granted(conn.acquire("job-1", "a", TTL).unwrap());
    assert!(again.epoch() > last + 1, "{} after {}", again.epoch(), last);
    let again = granted(conn.acquire("job-2", "b", TTL).unwrap());
    assert!(again.epoch() > lapsed.epoch());
}

#[test]
fn a_stale_epoch_stays_refused_at_a_resource_whose_record_was_pruned() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let old = granted(conn.acquire("k", "a", TTL).unwrap());
    conn.admit("r", &old, Check::Token).unwrap();
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "a", old.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    let newer = admit_then_release(&mut conn, "k", "b", "r");
    let record_written = server_now(&mut conn);
    wait_idle_after(&mut conn, record_written);

    let report = prune_idle_rows(&mut conn);
    assert_eq!(report.guards_pruned, 1, "{report:?}");
    assert_eq!(conn.inspect_guard("r").unwrap(), None);

    // The key has no row: every epoch of it is refused (G7).
    for epoch in [old.epoch(), newer.into()] {
        match conn.admit("r", &token("k", "x", epoch.get()), Check::Token) {
            Err(e)
                if e.kind() == ErrorKind::Fenced
                    && matches!(e.refusal(), Some(Refusal::EpochNotGranted { .. })) => {}
            other => panic!("epoch {epoch} without a key row: {other:?}"),
        }
    }
    // The key is back: its old epochs are refused as stale, its new one is
    // admitted.
    let back = granted(conn.acquire("k", "c", TTL).unwrap());
    for epoch in [old.epoch(), newer.into()] {
        match conn.admit("r", &token("k", "x", epoch.get()), Check::Token) {
            Err(e)
                if e.kind() == ErrorKind::Fenced
                    && matches!(e.refusal(), Some(Refusal::StaleEpoch { .. })) =>
            {
                assert_eq!(
                    e.refusal(),
                    Some(Refusal::StaleEpoch {
                        accepted: back.epoch()
                    })
                )
            }
            other => panic!("stale epoch {epoch} after the prune: {other:?}"),
        }
    }
    conn.admit("r", &back, Check::Token).unwrap();
}

#[test]
fn a_live_key_below_the_watermark_keeps_being_admitted() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let live = granted(conn.acquire("live", "a", TTL).unwrap());
    pretend_granted(&mut conn, "busy-past", 1_000);
    let report = prune_idle_rows(&mut conn);
    assert!(report.watermark >= 1_000, "{report:?}");
    assert!(row_exists(&mut conn, "live"));
    // A resource the live key never wrote: its first admission works.
    conn.admit("fresh", &live, Check::Token).unwrap();
    // A key created after the prune starts above the watermark.
    let new = granted(conn.acquire("new", "a", TTL).unwrap());
    assert!(new.epoch() > 1_000);
}

#[test]
fn held_keys_and_records_of_live_keys_stay_and_free_keys_wait_for_their_idle_time() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let held = granted(conn.acquire("held", "a", TTL).unwrap());
    conn.admit("r-held", &held, Check::Token).unwrap();
    admit_then_release(&mut conn, "free", "a", "r-free");
    // An hour's idle time: the FREE key is recorded, twice, and stays.
    let an_hour = PruneOptions::new(Duration::from_secs(3600));
    for _ in 0..2 {
        let report = conn.prune(&an_hour).unwrap();
        assert_eq!(
            (report.keys_pruned, report.guards_pruned),
            (0, 0),
            "{report:?}"
        );
    }
    assert!(row_exists(&mut conn, "free"));
    // Once it has been idle long enough, the FREE key and its record go;
    // the held key and its record stay.
    prune_idle_rows(&mut conn);
    assert!(!row_exists(&mut conn, "free"));
    assert_eq!(conn.inspect_guard("r-free").unwrap(), None);
    assert!(row_exists(&mut conn, "held"));
    assert!(conn.inspect_guard("r-held").unwrap().is_some());
}

/// Runs `sql` on a new connection in another thread and reports its
/// outcome (Ok or the error's text) when it finishes.
fn spawn_sql(db: &TestDb, sql: String) -> mpsc::Receiver<Result<(), String>> {
    let mut other = db.conn();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(other.batch_execute(&sql).map_err(|e| e.to_string()));
    });
    rx
}

/// Every idle key goes, the last in digest order too: each batch's
/// examined range includes its upper end, and a pass with nothing held
/// leaves no row behind.
#[test]
fn a_prune_removes_every_idle_key_up_to_the_last_in_digest_order() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let keys: Vec<String> = (0..7).map(|i| format!("idle-{i}")).collect();
    for key in &keys {
        grant_and_release(&mut conn, key, "a");
    }
    let report = prune_idle_rows(&mut conn);
    assert_eq!(report.keys_pruned, keys.len() as u64, "{report:?}");
    let left: Vec<&String> = keys
        .iter()
        .filter(|key| row_exists(&mut conn, key))
        .collect();
    assert!(left.is_empty(), "idle keys left after the prune: {left:?}");
}

#[test]
fn a_prune_skips_a_key_whose_grant_is_in_progress() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lapsed = granted(conn.acquire("k", "a", Duration::from_millis(1)).unwrap());
    wait_idle_after(&mut conn, lapsed.expires_at());
    let mut granter = db.conn();
    granter
        .batch_execute("BEGIN; SELECT * FROM lease.acquire('k', 'b', '30 s')")
        .unwrap();
    // The row is locked by the grant: skipped, not waited for. (Were the
    // prune to wait, it would wait for ever on this thread's own other
    // session: the lock timeout turns that into a failure.)
    conn.batch_execute("SET lock_timeout = '10s'").unwrap();
    let report = conn.prune(&options()).unwrap();
    assert_eq!(report.keys_pruned, 0, "{report:?}");
    granter.batch_execute("COMMIT").unwrap();
    let state = conn.inspect("k").unwrap().unwrap();
    assert!(
        matches!(&state, LeaseState::Held { owner, .. } if owner == "b"),
        "the grant committed: {state:?}"
    );
    let report = prune_idle_rows(&mut conn);
    assert_eq!(report.keys_pruned, 0, "a held key: {report:?}");
}

#[test]
fn a_grant_that_meets_a_prune_batch_waits_and_comes_back_above_the_watermark() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lapsed = granted(conn.acquire("k", "a", Duration::from_millis(1)).unwrap());
    wait_idle_after(&mut conn, lapsed.expires_at());
    let mut pruner = db.conn();
    pruner
        .batch_execute("BEGIN; SELECT * FROM lease.prune_keys('20 ms')")
        .unwrap();
    assert!(!query_bool(
        &mut pruner,
        "SELECT EXISTS (SELECT 1 FROM lease.leases WHERE key = 'k') AS flag"
    ));
    let outcome = spawn_sql(
        &db,
        "CREATE TABLE got AS SELECT * FROM lease.acquire('k', 'b', '30 s', '10 s')".into(),
    );
    wait_for_lock_waiter(&mut conn, &db.name);
    pruner.batch_execute("COMMIT").unwrap();
    outcome.recv().unwrap().unwrap();
    let epoch = query_lines(&mut conn, "SELECT epoch::text AS line FROM got").remove(0);
    assert!(
        epoch.parse::<i64>().unwrap() > lapsed.epoch(),
        "{epoch} after {}",
        lapsed.epoch()
    );
}

#[test]
fn a_repeatable_read_grant_from_before_the_prune_fails_to_serialize() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lapsed = granted(conn.acquire("k", "a", Duration::from_millis(1)).unwrap());
    wait_idle_after(&mut conn, lapsed.expires_at());
    let mut granter = db.conn();
    granter
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM lease.leases")
        .unwrap();
    conn.prune(&options()).unwrap();
    assert!(!row_exists(&mut conn, "k"));
    let error = granter
        .batch_execute("SELECT * FROM lease.acquire('k', 'b', '30 s')")
        .unwrap_err()
        .to_string();
    assert!(error.contains("could not serialize"), "{error}");
    granter.batch_execute("ROLLBACK").unwrap();
    let again = granted(conn.acquire("k", "b", TTL).unwrap());
    assert!(again.epoch() > lapsed.epoch());
}

#[test]
fn a_prune_skips_a_key_an_open_admission_holds_and_an_admission_after_a_prune_is_refused() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lapsed = granted(conn.acquire("k", "a", Duration::from_millis(1)).unwrap());
    wait_idle_after(&mut conn, lapsed.expires_at());
    let epoch = lapsed.epoch();

    // Admission first: its FOR KEY SHARE lock makes the prune skip the key
    // (the lock timeout fails a prune that waits for it instead).
    conn.batch_execute("SET lock_timeout = '10s'").unwrap();
    let mut writer = db.conn();
    writer
        .batch_execute(&format!("BEGIN; SELECT lease.admit('r', 'k', {epoch})"))
        .unwrap();
    assert_eq!(conn.prune(&options()).unwrap().keys_pruned, 0);
    writer.batch_execute("COMMIT").unwrap();
    assert!(row_exists(&mut conn, "k"));

    // The prune first: the admission waits for it, then finds no key row.
    let mut pruner = db.conn();
    pruner
        .batch_execute("BEGIN; SELECT * FROM lease.prune_keys('20 ms')")
        .unwrap();
    let outcome = spawn_sql(&db, format!("SELECT lease.admit('r2', 'k', {epoch})"));
    wait_for_lock_waiter(&mut conn, &db.name);
    pruner.batch_execute("COMMIT").unwrap();
    let error = outcome.recv().unwrap().unwrap_err();
    assert!(error.contains("was never granted"), "{error}");
    assert_eq!(conn.inspect_guard("r2").unwrap(), None);
}

#[test]
fn bad_input_is_22023_and_changes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lapsed = granted(conn.acquire("k", "a", Duration::from_millis(1)).unwrap());
    wait_idle_after(&mut conn, lapsed.expires_at());
    let before = everything(&mut conn);
    for call in [
        "SELECT * FROM lease.prune_keys('0 s')",
        "SELECT * FROM lease.prune_keys('-1 hour')",
        "SELECT * FROM lease.prune_keys('1 mon -31 days')",
        "SELECT * FROM lease.prune_keys('101 years')",
        "SELECT * FROM lease.prune_keys(NULL)",
        "SELECT * FROM lease.prune_keys('1 hour', NULL, 0)",
        "SELECT * FROM lease.prune_keys('1 hour', NULL, 100001)",
        "SELECT * FROM lease.prune_guards('0 s')",
        "SELECT * FROM lease.prune_guards('1000000 years')",
    ] {
        assert_eq!(sqlstate_of(&mut conn, call), "22023", "{call}");
    }
    for idle in [Duration::ZERO, Duration::from_secs(101 * 366 * 24 * 3600)] {
        match conn.prune(&PruneOptions::new(idle)) {
            Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
                let violations = e.violations();
                assert_eq!(violations.len(), 1, "{violations:?}");
                assert!(violations[0].starts_with("idle must be"), "{violations:?}");
            }
            other => panic!("idle {idle:?}: {other:?}"),
        }
    }
    let bad_batch = PruneOptions {
        batch: 0,
        ..options()
    };
    assert!(matches!(
        conn.prune(&bad_batch),
        Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty()
    ));
    assert_eq!(before, everything(&mut conn));
}

#[test]
fn a_role_without_the_grant_gets_42501_and_a_granted_operator_prunes() {
    let deployment = Deployment::new();
    let mut operator = deployment.conn_as(&deployment.operator);
    let mut app = deployment.conn_as(&deployment.app);
    let lapsed = granted(app.acquire("k", "a", Duration::from_millis(1)).unwrap());
    wait_idle_after(&mut app, lapsed.expires_at());
    for role in [&deployment.app, &deployment.operator, &deployment.attacker] {
        let mut conn = deployment.conn_as(role);
        for call in [
            "SELECT * FROM lease.prune_keys('20 ms')",
            "SELECT * FROM lease.prune_guards('20 ms')",
        ] {
            assert_eq!(sqlstate_of(&mut conn, call), "42501", "{role}: {call}");
        }
    }
    match operator.prune(&options()) {
        Err(e) if database_error(&e).is_some() => {
            let text = database_error(&e).unwrap().to_string();
            assert!(
                text.contains("permission denied for function prune_keys"),
                "{text}"
            );
        }
        other => panic!("an operator without the grant: {other:?}"),
    }
    assert!(app.inspect("k").unwrap().is_some(), "nothing pruned");
    deployment.admin_exec(&format!(
        "GRANT EXECUTE ON FUNCTION lease.prune_keys(interval, bytea, integer, boolean), \
         lease.prune_guards(interval, bytea, integer, boolean) TO {}",
        deployment.operator
    ));
    let report = operator.prune(&options()).unwrap();
    assert_eq!(report.keys_pruned, 1, "{report:?}");
    assert!(app.inspect("k").unwrap().is_none());
}

#[test]
fn a_dry_run_changes_nothing_and_says_what_a_prune_would_remove() {
    let db = TestDb::new();
    let mut conn = db.conn();
    for n in 0..5 {
        let key = format!("free-{n}");
        admit_then_release(&mut conn, &key, "a", &format!("r-{n}"));
    }
    let lapsed = granted(
        conn.acquire("lapsed", "a", Duration::from_millis(1))
            .unwrap(),
    );
    granted(conn.acquire("held", "a", TTL).unwrap());
    // A heartbeat group that lapsed an hour ago: a real prune removes it, a
    // dry run must not.
    conn.batch_execute(
        "INSERT INTO lease.groups (id, owner, expires_at, members)
         VALUES (42, 'a', clock_timestamp() - interval '1 hour', 0)",
    )
    .unwrap();
    wait_idle_after(&mut conn, lapsed.expires_at());

    let dry = PruneOptions {
        dry_run: true,
        batch: 2,
        ..options()
    };
    let before = everything(&mut conn);
    let report = conn.prune(&dry).unwrap();
    assert_eq!(before, everything(&mut conn), "a dry run wrote");
    assert!(report.dry_run);
    assert_eq!(
        (
            report.keys_examined,
            report.keys_pruned,
            report.keys_sighted
        ),
        (7, 1, 5),
        "{report:?}"
    );
    let real = conn
        .prune(&PruneOptions {
            batch: 2,
            ..options()
        })
        .unwrap();
    assert_eq!((real.keys_pruned, real.keys_sighted), (1, 5), "{real:?}");
    assert_eq!(
        query_lines(&mut conn, "SELECT count(*)::text AS line FROM lease.groups"),
        ["0"]
    );
    // Sighted, but not idle for an hour: nothing a prune would remove.
    let not_yet = conn
        .prune(&PruneOptions {
            dry_run: true,
            ..PruneOptions::new(Duration::from_secs(3600))
        })
        .unwrap();
    assert_eq!(
        (not_yet.keys_pruned, not_yet.keys_sighted),
        (0, 0),
        "{not_yet:?}"
    );
    let now = server_now(&mut conn);
    wait_idle_after(&mut conn, now);
    let before = everything(&mut conn);
    let report = conn.prune(&dry).unwrap();
    assert_eq!(before, everything(&mut conn), "a dry run wrote");
    // The guard records stay while their keys do (a dry run prunes no key
    // first): none counted.
    assert_eq!(
        (
            report.keys_pruned,
            report.keys_sighted,
            report.guards_pruned
        ),
        (5, 0, 0),
        "{report:?}"
    );
    // The keys go first; then a dry run of the guard records, in batches
    // of two, counts every record the real prune then removes.
    conn.batch_execute("SELECT * FROM lease.prune_keys('20 ms')")
        .unwrap();
    let before = everything(&mut conn);
    let mut after = "NULL".to_string();
    let mut would = 0;
    loop {
        let line = query_lines(
            &mut conn,
            &format!(
                "SELECT pruned || '|' || COALESCE(encode(next_after, 'hex'), '') AS line
                   FROM lease.prune_guards('20 ms', {after}, 2, true)"
            ),
        )
        .remove(0);
        let (pruned, next) = line.split_once('|').expect("two parts");
        would += pruned.parse::<i64>().expect("a count");
        if next.is_empty() {
            break;
        }
        after = format!("decode('{next}', 'hex')");
    }
    assert_eq!(before, everything(&mut conn), "a dry run wrote");
    assert_eq!(would, 5);
    let real = conn.prune(&options()).unwrap();
    assert_eq!((real.keys_pruned, real.guards_pruned), (0, 5), "{real:?}");
}

#[test]
fn the_watermark_and_a_raised_generation_compose() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // A pruned counter below a raised generation: the generation wins.
    let old = grant_and_release(&mut conn, "a", "x");
    prune_idle_rows(&mut conn);
    conn.raise_generation(1).unwrap();
    let floor = (1_i64 << 40) + 1;
    let back = granted(conn.acquire("a", "x", TTL).unwrap());
    assert_eq!(back.epoch(), floor);
    assert!(back.epoch() > old);
    // A pruned counter above the generation's floor: the watermark wins,
    // for the pruned key and for every new key.
    assert_eq!(
        conn.release(&leasehold_test_support::grant("a", "x", back.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    let top = grant_and_release(&mut conn, "a", "x");
    let report = prune_idle_rows(&mut conn);
    assert!(report.watermark > top, "{report:?}");
    let back = granted(conn.acquire("a", "x", TTL).unwrap());
    assert!(back.epoch() > top);
    let new = granted(conn.acquire("b", "x", TTL).unwrap());
    assert!(new.epoch() > top && new.epoch() < (2_i64 << 40));
    // A dump restored into another cluster (a new lineage) starts a
    // generation above the pruned counters too, even when no row is left.
    conn.raise_generation(5).unwrap();
    let fifth = grant_and_release(&mut conn, "c", "x");
    prune_idle_rows(&mut conn);
    assert!(!row_exists(&mut conn, "c"));
    // The other cluster's system identifier; the raised floor left out, so
    // that only the counters (pruned or not) can order the new lineage.
    conn.batch_execute("UPDATE lease.lineage SET system_identifier = 1, external_floor = 0")
        .unwrap();
    let generation = conn.generation().unwrap().generation;
    assert_eq!(
        generation, 6,
        "one above generation 5 of pruned counter {fifth}"
    );
}

/// Idleness is judged by the clock at the prune, not by the start of the
/// prune's transaction: a grant and its heartbeat group lapse, a
/// transaction begins, and once the clock (not the transaction's start) is
/// a second past the lapse, a prune in that transaction with `idle` of one
/// second removes both.
#[test]
fn a_prune_in_a_transaction_begun_earlier_judges_idleness_by_the_clock_at_the_call() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("idle/a", "o", TTL).unwrap());
    let join = conn
        .join_group(
            &leasehold_test_support::grants("o", &[("idle/a", lease.epoch())]),
            TTL,
        )
        .unwrap();
    assert_eq!(join.renewed(), 1, "{join:?}");
    conn.batch_execute(
        "UPDATE lease.leases SET expires_at = clock_timestamp() WHERE key = 'idle/a';
         UPDATE lease.groups SET expires_at = clock_timestamp();",
    )
    .unwrap();
    let mut late = db.conn();
    late.batch_execute("BEGIN").unwrap();
    assert_eq!(
        query_lines(&mut late, "SELECT count(*)::text AS line FROM lease.groups"),
        ["1"]
    );
    let idle_enough =
        "SELECT (max(expires_at) <= clock_timestamp() - interval '1 second')::text AS line
                         FROM (SELECT expires_at FROM lease.leases UNION ALL
                               SELECT expires_at FROM lease.groups) AS e";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while query_lines(&mut conn, idle_enough) != ["true"] {
        assert!(std::time::Instant::now() < deadline, "never a second idle");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        query_lines(
            &mut late,
            "SELECT pruned::text AS line FROM lease.prune_keys('1 second')"
        ),
        ["1"]
    );
    late.batch_execute("COMMIT").unwrap();
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT ((SELECT count(*) FROM lease.leases) + (SELECT count(*) FROM lease.groups))::text AS line"
        ),
        ["0"]
    );
}

/// A guard record is dated by the clock at the admission or fence that
/// wrote it, not by the start of the writer's transaction: guard pruning
/// measures a record's idle time from that date (§1.8), so a record
/// written just now in a transaction begun long before must not look
/// idle. Checked inside that transaction, once the server's clock is a
/// second past its start.
#[test]
fn a_guard_record_is_dated_by_the_clock_at_the_call_not_the_transactions_start() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("dated/k", "o", TTL).unwrap());
    let epoch = i64::from(lease.epoch());
    let mut late = db.conn();
    late.batch_execute("BEGIN").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !query_bool(
        &mut late,
        "SELECT clock_timestamp() > now() + interval '1 second' AS flag",
    ) {
        assert!(
            std::time::Instant::now() < deadline,
            "the clock never moved"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    late.batch_execute(&format!(
        "SELECT lease.admit('dated/admitted', 'dated/k', {epoch});
         SELECT lease.fence('dated/fenced', 'dated/k', {epoch});"
    ))
    .unwrap();
    assert_eq!(
        query_lines(
            &mut late,
            "SELECT string_agg(resource || ' ' || (updated_at > now() + interval '1 second')::text, ', '
                               ORDER BY resource) AS line
               FROM lease.guards"
        ),
        ["dated/admitted true, dated/fenced true"]
    );
    late.batch_execute("COMMIT").unwrap();
}

/// A FREE key's idle time is measured by the clock at each prune, not by
/// the start of the prune's transaction: the first prune records the
/// sighting, a transaction begins at once, and once the clock is a second
/// past the sighting, a prune with `idle` of one second in that
/// transaction removes the row (its transaction began less than a second
/// after the sighting).
#[test]
fn a_free_keys_idle_time_is_measured_by_the_clock_at_the_prune() {
    let db = TestDb::new();
    let mut conn = db.conn();
    grant_and_release(&mut conn, "idle/free", "o");
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT format('%s %s', pruned, sighted) AS line FROM lease.prune_keys('1 second')"
        ),
        ["0 1"]
    );
    let mut late = db.conn();
    late.batch_execute("BEGIN").unwrap();
    assert_eq!(
        query_lines(
            &mut late,
            "SELECT count(*)::text AS line FROM lease.prune_sightings"
        ),
        ["1"]
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !query_bool(
        &mut conn,
        "SELECT seen_at <= clock_timestamp() - interval '1 second' AS flag FROM lease.prune_sightings",
    ) {
        assert!(std::time::Instant::now() < deadline, "never a second idle");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        query_lines(
            &mut late,
            "SELECT pruned::text AS line FROM lease.prune_keys('1 second')"
        ),
        ["1"]
    );
    late.batch_execute("COMMIT").unwrap();
    assert!(!row_exists(&mut conn, "idle/free"));
}

/// A batch covers exactly the digests after `after`, up to the last one it
/// examined: a row of the batch before, which that batch skipped because
/// another transaction held it, is not pruned by the next batch, even once
/// the lock is gone (the next pass reaches it). Two lapsed keys, the first
/// by digest locked while the first batch (of one row) runs.
#[test]
fn a_batch_never_prunes_a_row_of_the_batch_before() {
    let db = TestDb::new();
    let mut conn = db.conn();
    for key in ["batch/a", "batch/b"] {
        let lease = granted(conn.acquire(key, "o", Duration::from_millis(1)).unwrap());
        wait_idle_after(&mut conn, lease.expires_at());
    }
    let first = query_lines(
        &mut conn,
        "SELECT key AS line FROM lease.leases ORDER BY key_hash LIMIT 1",
    )
    .remove(0);
    let mut locker = db.conn();
    locker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM lease.leases WHERE key = {} FOR UPDATE;",
            quote(&first)
        ))
        .unwrap();
    // A prune that waited for the lock would wait for ever on this
    // thread's own other session: the lock timeout fails it instead.
    conn.batch_execute("SET lock_timeout = '10s'").unwrap();
    let batch = |conn: &mut PgConnection, after: &str| {
        one_batch(conn, "prune_keys", "20 ms", "pruned", after)
    };
    let (counts, next) = batch(&mut conn, "NULL");
    assert_eq!(counts, "1 0", "the locked row is skipped");
    locker.batch_execute("COMMIT").unwrap();
    let (counts, _) = batch(&mut conn, &format!("decode('{next}', 'hex')"));
    assert_eq!(counts, "1 1");
    assert!(
        row_exists(&mut conn, &first),
        "the skipped row waits for the next pass"
    );
}

/// A guard record's idle time is measured by the clock at the prune, not
/// by the start of the prune's transaction: the record's key is pruned, a
/// transaction begins less than a second after the record was written,
/// and once the clock is a second past that write, a guard prune with
/// `idle` of one second in that transaction removes the record.
#[test]
fn a_guard_records_idle_time_is_measured_by_the_clock_at_the_prune() {
    let db = TestDb::new();
    let mut conn = db.conn();
    admit_then_release(&mut conn, "idle/key", "o", "idle/resource");
    prune_keys_only(&mut conn);
    assert!(!row_exists(&mut conn, "idle/key"));
    let mut late = db.conn();
    late.batch_execute("BEGIN").unwrap();
    assert!(
        query_bool(
            &mut late,
            "SELECT updated_at > now() - interval '1 second' AS flag FROM lease.guards"
        ),
        "the transaction began within a second of the write"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !query_bool(
        &mut conn,
        "SELECT updated_at <= clock_timestamp() - interval '1 second' AS flag FROM lease.guards",
    ) {
        assert!(std::time::Instant::now() < deadline, "never a second idle");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        query_lines(
            &mut late,
            "SELECT pruned::text AS line FROM lease.prune_guards('1 second')"
        ),
        ["1"]
    );
    late.batch_execute("COMMIT").unwrap();
    assert_eq!(conn.inspect_guard("idle/resource").unwrap(), None);
}

/// Guard pruning's batches are bounded as key pruning's are: a record the
/// batch before skipped because another transaction held it is not pruned
/// by the next batch. Two records whose keys were pruned, the first by
/// digest locked while the first batch (of one record) runs.
#[test]
fn a_guard_batch_never_prunes_a_record_of_the_batch_before() {
    let db = TestDb::new();
    let mut conn = db.conn();
    for name in ["a", "b"] {
        let key = format!("guard-batch/{name}");
        admit_then_release(&mut conn, &key, "o", &format!("guard-batch/r-{name}"));
    }
    prune_keys_only(&mut conn);
    let first = query_lines(
        &mut conn,
        "SELECT resource AS line FROM lease.guards ORDER BY resource_hash LIMIT 1",
    )
    .remove(0);
    let mut locker = db.conn();
    locker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM lease.guards WHERE resource = {} FOR UPDATE;",
            quote(&first)
        ))
        .unwrap();
    // A prune that waited for the lock would wait for ever on this
    // thread's own other session: the lock timeout fails it instead.
    conn.batch_execute("SET lock_timeout = '10s'").unwrap();
    let batch = |conn: &mut PgConnection, after: &str| {
        one_batch(conn, "prune_guards", "20 ms", "pruned", after)
    };
    let (counts, next) = batch(&mut conn, "NULL");
    assert_eq!(counts, "1 0", "the locked record is skipped");
    locker.batch_execute("COMMIT").unwrap();
    let (counts, _) = batch(&mut conn, &format!("decode('{next}', 'hex')"));
    assert_eq!(counts, "1 1");
    assert!(
        conn.inspect_guard(&first).unwrap().is_some(),
        "the skipped record waits for the next pass"
    );
}

/// The watermark only rises: a prune whose highest removed counter is below
/// it leaves it, and one whose highest equals it does not write it again.
/// A prune that removes nothing leaves the session's
/// `synchronous_commit` as it was (one that removes rows makes its commit
/// durable, `operator_writes_are_durable_at_commit_whatever_the_session_set`).
#[test]
fn the_watermark_only_rises_and_an_empty_prune_forces_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // high: FREE at 10; low and equal: held at 2 and 10, freed later.
    conn.batch_execute(
        "INSERT INTO lease.leases (key, key_hash, owner, epoch, expires_at, first_epoch)
         VALUES ('wm/high', lease._key_hash('wm/high'), NULL, 10, NULL, 1),
                ('wm/low', lease._key_hash('wm/low'), 'o', 2, clock_timestamp() + interval '1 hour', 1),
                ('wm/equal', lease._key_hash('wm/equal'), 'o', 10, clock_timestamp() + interval '1 hour', 1)",
    )
    .unwrap();
    let watermark = |conn: &mut PgConnection| {
        query_lines(
            conn,
            "SELECT pruned_through::text AS line FROM lease.lineage",
        )
        .remove(0)
    };
    // Sights the FREE rows, waits out the idle time, prunes; answers the
    // rows removed and the lineage row's writes in that prune's transaction.
    let prune = |conn: &mut PgConnection| -> String {
        conn.batch_execute("SELECT * FROM lease.prune_keys('20 ms')")
            .unwrap();
        let now = server_now(conn);
        wait_idle_after(conn, now);
        let writes = "SELECT n_tup_upd::text AS line FROM pg_stat_xact_user_tables
                       WHERE schemaname = 'lease' AND relname = 'lineage'";
        conn.batch_execute("BEGIN").unwrap();
        let before: i64 = query_lines(conn, writes)[0].parse().unwrap();
        let pruned = query_lines(
            conn,
            "SELECT pruned::text AS line FROM lease.prune_keys('20 ms')",
        )
        .remove(0);
        let after: i64 = query_lines(conn, writes)[0].parse().unwrap();
        conn.batch_execute("COMMIT").unwrap();
        format!("pruned {pruned}, lineage writes {}", after - before)
    };
    assert_eq!(prune(&mut conn), "pruned 1, lineage writes 1");
    assert_eq!(watermark(&mut conn), "10");
    let free = |conn: &mut PgConnection, key: &str| {
        conn.batch_execute(&format!(
            "UPDATE lease.leases SET owner = NULL, expires_at = NULL WHERE key = {}",
            quote(key)
        ))
        .unwrap();
    };
    free(&mut conn, "wm/low");
    assert_eq!(prune(&mut conn), "pruned 1, lineage writes 0");
    assert_eq!(
        watermark(&mut conn),
        "10",
        "a lower counter never lowers it"
    );
    free(&mut conn, "wm/equal");
    assert_eq!(prune(&mut conn), "pruned 1, lineage writes 0");
    assert_eq!(watermark(&mut conn), "10");

    // A held key: the prune examines it and removes nothing.
    granted(conn.acquire("wm/held", "o", TTL).unwrap());
    conn.batch_execute("SET synchronous_commit = off; BEGIN")
        .unwrap();
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT pruned || ' ' || current_setting('synchronous_commit') AS line FROM lease.prune_keys('20 ms')"
        ),
        ["0 off"]
    );
    conn.batch_execute("COMMIT").unwrap();
}

/// A prune removes exactly the sightings of the rows it removes, and of
/// their waiter rows exactly those whose session is gone; a FREE row
/// already sighted at its counter is not sighted again (its idle time
/// keeps running). Sightings and waiter rows written directly: one of
/// `a` two hours ago (prunable with `idle` of one hour), one of `b` just
/// now; waiter rows of `a` from a session that is gone and from a live
/// one, and of `b` from a session that is gone.
#[test]
fn a_prune_removes_exactly_the_sightings_and_dead_waiters_of_the_rows_it_removes() {
    let db = TestDb::new();
    let mut conn = db.conn();
    grant_and_release(&mut conn, "sight/a", "o");
    grant_and_release(&mut conn, "sight/b", "o");
    let live = db.conn();
    let mut live = live;
    let live_pid: i32 = query_lines(&mut live, "SELECT pg_backend_pid()::text AS line")[0]
        .parse()
        .unwrap();
    let gone_pid = i32::MAX;
    conn.batch_execute(&format!(
        "INSERT INTO lease.prune_sightings (key_hash, epoch, seen_at)
              SELECT key_hash, epoch,
                     CASE key WHEN 'sight/a' THEN clock_timestamp() - interval '2 hours'
                              ELSE clock_timestamp() END
                FROM lease.leases;
         INSERT INTO lease.waiters (key_hash, backend_pid)
         VALUES (lease._key_hash('sight/a'), {gone_pid}),
                (lease._key_hash('sight/a'), {live_pid}),
                (lease._key_hash('sight/b'), {gone_pid});"
    ))
    .unwrap();
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT format('%s %s %s', pruned, sighted, waiters) AS line FROM lease.prune_keys('1 hour')"
        ),
        ["1 0 1"]
    );
    assert_eq!(
        query_lines(
            &mut conn,
            &format!(
                "SELECT string_agg(what, ', ' ORDER BY what) AS line FROM (
                     SELECT 'sighting ' || l.key AS what
                       FROM lease.prune_sightings AS s LEFT JOIN lease.leases AS l USING (key_hash)
                     UNION ALL
                     SELECT 'waiter ' || COALESCE(l.key, 'of a pruned key') || CASE w.backend_pid WHEN {live_pid} THEN ' live' ELSE ' gone' END
                       FROM lease.waiters AS w LEFT JOIN lease.leases AS l USING (key_hash)) AS rows"
            )
        ),
        ["sighting sight/b, waiter of a pruned key live, waiter sight/b gone"]
    );
}

/// A batch sights only the rows after `after`: the last row of the batch
/// before, granted and released again between the two batches (a new
/// counter), is sighted by the next pass, not by the next batch. Two FREE
/// keys never sighted, batches of one.
#[test]
fn a_batch_never_sights_a_row_of_the_batch_before() {
    let db = TestDb::new();
    let mut conn = db.conn();
    grant_and_release(&mut conn, "resight/a", "o");
    grant_and_release(&mut conn, "resight/b", "o");
    let first = query_lines(
        &mut conn,
        "SELECT key AS line FROM lease.leases ORDER BY key_hash LIMIT 1",
    )
    .remove(0);
    let batch = |conn: &mut PgConnection, after: &str| {
        one_batch(conn, "prune_keys", "1 hour", "sighted", after)
    };
    let (counts, next) = batch(&mut conn, "NULL");
    assert_eq!(counts, "1 1");
    grant_and_release(&mut conn, &first, "o");
    let (counts, _) = batch(&mut conn, &format!("decode('{next}', 'hex')"));
    assert_eq!(counts, "1 1", "only the batch's own row is sighted");
}

/// A dry run counts a guard record of a pruned incarnation of a key that is
/// back (the record's epochs are below the key's new first epoch) as the
/// real prune then removes it: the key's row of the new incarnation does
/// not keep the old record.
#[test]
fn a_dry_run_counts_the_record_of_a_pruned_incarnation_as_the_prune_removes_it() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let epoch = admit_then_release(&mut conn, "back/k", "a", "back/r");
    prune_keys_only(&mut conn);
    assert!(!row_exists(&mut conn, "back/k"));
    let back = granted(conn.acquire("back/k", "b", TTL).unwrap());
    assert!(back.epoch() > epoch);
    let pruned = |conn: &mut PgConnection, dry_run: bool| {
        query_lines(
            conn,
            &format!("SELECT pruned::text AS line FROM lease.prune_guards('20 ms', NULL, 1000, {dry_run})"),
        )
        .remove(0)
    };
    assert_eq!(pruned(&mut conn, true), "1", "the dry run");
    assert_eq!(pruned(&mut conn, false), "1", "the prune");
    assert_eq!(conn.inspect_guard("back/r").unwrap(), None);
}

/// The diesel error of the old `LeaseError::Database` (the database failed
/// the call otherwise): kind Other, or Unavailable when the connection died.
fn database_error(error: &LeaseError) -> Option<&diesel::result::Error> {
    let operation = error.operation()?;
    let fits = matches!(error.kind(), ErrorKind::Other | ErrorKind::Unavailable)
        && error
            .to_string()
            .starts_with(&format!("lease {operation} failed in the database"));
    if !fits {
        return None;
    }
    std::error::Error::source(error)?.downcast_ref::<diesel::result::Error>()
}
