//! Many keys, one heartbeat: `lease.renew_many` and `lease.release_many`
//! (docs/SPECIFICATION.md §1.3), their Rust calls, and the [`KeeperSet`]
//! that keeps a set of leases alive with one call per heartbeat.
//!
//! The per-key answers are checked against the single-key calls on the same
//! states (two databases given the same rows), so the batch can never drift
//! from `renew`/`release`'s precedence. Lock behaviour is observed, not
//! assumed: a session's wait shows in pg_stat_activity, and every session
//! that could deadlock runs with `deadlock_timeout = '50ms'`, so a deadlock
//! surfaces as an error within the test.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use leasehold::{
    batch::MAX_KEYS_PER_CALL,
    error::Operation,
    hold::{KeeperSet, KeeperSetEvent, LeaseLoss},
    ErrorKind, LeaseState, Leases, Refusal, Release, Renewal,
};
use leasehold_test_support::Deployment;

use crate::common::*;
use crate::holders::{client, strict_waiter_at, wait_armed, LONG_WAIT};
use leasehold::admin::Operator;

/// One fixture row: key, owner, epoch, expiry in seconds from now,
/// lapsed_owner.
type Row = (
    &'static str,
    Option<&'static str>,
    i64,
    Option<i64>,
    Option<&'static str>,
);

/// Every state a presented grant (owner `o`, epoch 5) can meet, as raw
/// rows. `never` has no row.
const STATES: &[Row] = &[
    ("held", Some("o"), 5, Some(3600), None),
    ("wrong-epoch", Some("o"), 6, Some(3600), None),
    ("lapsed", Some("o"), 5, Some(-60), None),
    ("lapsed-wrong-epoch", Some("o"), 6, Some(-60), None),
    ("taken-over", Some("x"), 6, Some(3600), Some("o")),
    ("taken-twice", Some("y"), 7, Some(3600), Some("x")),
    ("other", Some("x"), 5, Some(3600), None),
    ("other-lapsed", Some("x"), 5, Some(-60), None),
    ("free", None, 6, None, None),
];

/// The keys passed, in an order that is neither the table's nor the
/// digests': answers must come back in this order.
const PRESENTED: &[&str] = &[
    "taken-twice",
    "held",
    "never",
    "lapsed",
    "free",
    "wrong-epoch",
    "other",
    "lapsed-wrong-epoch",
    "taken-over",
    "other-lapsed",
];

const OWNER: &str = "o";
const EPOCH: i64 = 5;

fn write_states(conn: &mut PgConnection) {
    for (key, owner, epoch, expires_in, lapsed_owner) in STATES {
        let text = |value: &Option<&str>| value.map_or("NULL".to_owned(), quote);
        let expires = expires_in.map_or("NULL".to_owned(), |seconds| {
            format!("clock_timestamp() + interval '{seconds} seconds'")
        });
        conn.batch_execute(&format!(
            "INSERT INTO lease.leases (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch) \
             VALUES ({k}, lease._key_hash({k}), {owner}, {epoch}, {expires}, {lapsed}, 1)",
            k = quote(key),
            owner = text(owner),
            lapsed = text(lapsed_owner),
        ))
        .unwrap();
    }
}

/// The rows, with the expiry reduced to whether it moved past the fixture's
/// (a renew sets now + 1 hour + 1 day below).
fn outcome_rows(conn: &mut PgConnection) -> Vec<String> {
    query_lines(
        conn,
        "SELECT format('%s|%s|%s|%s|%s', key, owner, epoch, \
                CASE WHEN expires_at IS NULL THEN 'none' \
                     WHEN expires_at > clock_timestamp() + interval '1 day' THEN 'extended' \
                     ELSE 'unchanged' END, lapsed_owner) AS line \
         FROM lease.leases ORDER BY key",
    )
}

fn presented() -> Vec<(&'static str, i64)> {
    PRESENTED.iter().map(|key| (*key, EPOCH)).collect()
}

const LONG_TTL: Duration = Duration::from_secs(3600 + 86_400 + 60);

fn renewal_status(renewal: Renewal) -> &'static str {
    match renewal {
        Renewal::Renewed { .. } => "ok",
        Renewal::Refused(why) => why.as_status(),
    }
}

fn release_status(release: Release) -> &'static str {
    match release {
        Release::Released => "ok",
        Release::Refused(why) => why.as_status(),
    }
}

#[test]
fn renew_many_answers_each_key_as_a_single_renew_would_and_changes_the_same_rows() {
    let (batch_db, single_db) = (TestDb::new(), TestDb::new());
    let (mut batch, mut single) = (batch_db.conn(), single_db.conn());
    write_states(&mut batch);
    write_states(&mut single);

    let answers = batch
        .renew_many(
            &leasehold_test_support::grants(OWNER, &presented()),
            LONG_TTL,
        )
        .unwrap();
    let batch_answers: Vec<(String, &str)> = answers
        .into_iter()
        .map(|answer| (answer.key, renewal_status(answer.renewal)))
        .collect();
    let single_answers: Vec<(String, &str)> = PRESENTED
        .iter()
        .map(|key| {
            let renewal = single
                .renew(&leasehold_test_support::grant(key, OWNER, EPOCH), LONG_TTL)
                .unwrap();
            ((*key).to_owned(), renewal_status(renewal))
        })
        .collect();

    assert_eq!(batch_answers, single_answers);
    // The fixture covers every status, so the comparison means something.
    for status in ["ok", "not_owner", "lapsed", "epoch_mismatch"] {
        assert!(
            batch_answers.iter().any(|(_, answer)| *answer == status),
            "no key answered {status}: {batch_answers:?}"
        );
    }
    assert_eq!(outcome_rows(&mut batch), outcome_rows(&mut single));
}

#[test]
fn release_many_answers_each_key_as_a_single_release_would_and_changes_the_same_rows() {
    let (batch_db, single_db) = (TestDb::new(), TestDb::new());
    let (mut batch, mut single) = (batch_db.conn(), single_db.conn());
    write_states(&mut batch);
    write_states(&mut single);

    let answers = batch
        .release_many(&leasehold_test_support::grants(OWNER, &presented()))
        .unwrap();
    let batch_answers: Vec<(String, &str)> = answers
        .into_iter()
        .map(|answer| (answer.key, release_status(answer.release)))
        .collect();
    let single_answers: Vec<(String, &str)> = PRESENTED
        .iter()
        .map(|key| {
            let released = single
                .release(&leasehold_test_support::grant(key, OWNER, EPOCH))
                .unwrap();
            ((*key).to_owned(), release_status(released))
        })
        .collect();

    assert_eq!(batch_answers, single_answers);
    assert!(batch_answers.contains(&("held".to_owned(), "ok")));
    assert_eq!(outcome_rows(&mut batch), outcome_rows(&mut single));
}

#[test]
fn a_renewed_key_gets_its_new_expiry_and_keeps_its_epoch() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let a = granted(conn.acquire("a", OWNER, TTL).unwrap());
    let b = granted(conn.acquire("b", OWNER, TTL).unwrap());
    let answers = conn
        .renew_many(
            &leasehold_test_support::grants(OWNER, &[("b", b.epoch()), ("a", a.epoch())]),
            LONG_TTL,
        )
        .unwrap();
    assert_eq!(answers.len(), 2);
    for (answer, lease) in answers.iter().zip([&b, &a]) {
        assert_eq!(answer.key, lease.key());
        let Renewal::Renewed { expires_at } = answer.renewal else {
            panic!("{answer:?}");
        };
        assert!(expires_at > lease.expires_at());
        assert_eq!(
            conn.inspect(lease.key()).unwrap(),
            Some(LeaseState::Held {
                owner: OWNER.into(),
                epoch: lease.epoch(),
                expires_at,
            })
        );
    }
    assert_eq!(
        conn.renew_many(&leasehold_test_support::grants::<i64>(OWNER, &[]), TTL)
            .unwrap(),
        vec![]
    );
}

/// The constraint name and DETAIL of a statement's error.
fn refusal_of(conn: &mut PgConnection, sql: &str) -> (String, String) {
    match diesel::sql_query(sql).execute(conn) {
        Err(DieselError::DatabaseError(_, info)) => (
            info.constraint_name().unwrap_or("").to_owned(),
            info.details().unwrap_or("").to_owned(),
        ),
        other => panic!("{sql} was not refused: {other:?}"),
    }
}

/// `sql` is refused with 22023 `lease_invalid_input` naming `violation`
/// among its violations, and the table is still `before`.
fn assert_refused_as_invalid(
    conn: &mut PgConnection,
    sql: &str,
    violation: &str,
    before: &[String],
) {
    let (constraint, detail) = refusal_of(conn, sql);
    assert_eq!(constraint, "lease_invalid_input", "{sql}");
    assert!(
        detail.split("; ").any(|named| named == violation),
        "{sql}: {detail:?} does not name {violation:?}"
    );
    assert_eq!(sqlstate_of(conn, sql), "22023", "{sql}");
    assert_eq!(table_snapshot(conn), before, "{sql} changed something");
}

#[test]
fn bad_batches_are_refused_with_22023_naming_the_violation_and_change_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    write_states(&mut conn);
    let before = table_snapshot(&mut conn);
    let many = |count: usize| {
        format!(
            "(SELECT array_agg('k' || g) FROM generate_series(1, {count}) g), 'o', \
             (SELECT array_agg(5::bigint) FROM generate_series(1, {count}) g)"
        )
    };
    let too_many = many(MAX_KEYS_PER_CALL + 1);
    let cases = [
        (
            "ARRAY['held','other'], 'o', ARRAY[5]::bigint[]",
            "keys and epochs must have the same length",
        ),
        (
            "ARRAY['held',NULL], 'o', ARRAY[5,5]::bigint[]",
            "keys must not contain NULL",
        ),
        (
            "ARRAY['held','other'], 'o', ARRAY[5,NULL]::bigint[]",
            "epochs must not contain NULL",
        ),
        (
            "ARRAY['held','held'], 'o', ARRAY[5,5]::bigint[]",
            "keys must not contain a key twice",
        ),
        (
            "ARRAY['held',''], 'o', ARRAY[5,5]::bigint[]",
            "keys must not contain an empty key",
        ),
        (
            "ARRAY['held', repeat('k', 16385)], 'o', ARRAY[5,5]::bigint[]",
            "keys must not contain a key over 16384 bytes",
        ),
        ("NULL, 'o', ARRAY[5]::bigint[]", "keys must not be NULL"),
        ("ARRAY['held'], 'o', NULL", "epochs must not be NULL"),
        (
            "ARRAY[['held'],['other']], 'o', ARRAY[[5],[5]]::bigint[]",
            "keys must be a one-dimensional array",
        ),
        // Only one of the two nested, and every key matching its grant:
        // nothing but the shape check can refuse it.
        (
            "ARRAY[['held']], 'o', ARRAY[5]::bigint[]",
            "keys must be a one-dimensional array",
        ),
        (
            "ARRAY['held'], 'o', ARRAY[[5]]::bigint[]",
            "epochs must be a one-dimensional array",
        ),
        (
            "ARRAY['held'], '', ARRAY[5]::bigint[]",
            "owner must not be empty",
        ),
        (too_many.as_str(), "keys must hold at most 1000 keys"),
    ];
    for (arguments, violation) in cases {
        for (call, ttl) in [("renew_many", ", interval '1 hour'"), ("release_many", "")] {
            let sql = format!("SELECT * FROM lease.{call}({arguments}{ttl})");
            assert_refused_as_invalid(&mut conn, &sql, violation, &before);
        }
    }
    let (_, detail) = refusal_of(
        &mut conn,
        "SELECT * FROM lease.renew_many(ARRAY['held'], 'o', ARRAY[5]::bigint[], interval '-1 second')",
    );
    assert_eq!(detail, "ttl must be positive");
    // The cap itself is allowed.
    let sql = format!(
        "SELECT count(*)::text AS line FROM lease.renew_many({}, interval '1 hour')",
        many(MAX_KEYS_PER_CALL)
    );
    assert_eq!(query_lines(&mut conn, &sql), vec!["1000"]);
    // A batch at a cap (as many keys as allowed, or a key as long as
    // allowed) with another fault: the fault is named alone, the cap is
    // not a violation.
    let at_caps_without_owner = [
        many(MAX_KEYS_PER_CALL).replacen(", 'o',", ", '',", 1),
        "ARRAY[repeat('k', 16384)], '', ARRAY[5]::bigint[]".to_string(),
    ];
    for arguments in &at_caps_without_owner {
        for (call, ttl) in [("renew_many", ", interval '1 hour'"), ("release_many", "")] {
            let sql = format!("SELECT * FROM lease.{call}({arguments}{ttl})");
            let (_, detail) = refusal_of(&mut conn, &sql);
            assert_eq!(detail, "owner must not be empty", "{call}");
        }
    }
    assert_eq!(table_snapshot(&mut conn), before);
}

/// The optional digests (`key_hashes`, what the Rust client sends) are
/// input like the keys: refused with 22023 when they cannot be the keys'
/// digests, whether or not the keys would have matched, and nothing
/// changes. Right digests renew and release as the keys alone do.
#[test]
fn a_batchs_digests_must_be_its_keys_digests() {
    let db = TestDb::new();
    let mut conn = db.conn();
    write_states(&mut conn);
    let before = table_snapshot(&mut conn);
    let digest = |key: &str| format!("sha256(convert_to('{key}', 'UTF8'))");
    let cases = [
        (
            format!("ARRAY[{}, {}]", digest("held"), digest("held")),
            "key_hashes must hold the SHA-256 digest of each key",
        ),
        (
            format!("ARRAY[{}, '\\x00'::bytea]", digest("held")),
            "key_hashes must hold the SHA-256 digest of each key",
        ),
        (
            format!("ARRAY[{}]", digest("held")),
            "key_hashes must have the same length as keys",
        ),
        (
            format!("ARRAY[{}, NULL]", digest("held")),
            "key_hashes must not contain NULL",
        ),
        (
            format!("ARRAY[[{}], [{}]]", digest("held"), digest("wrong-epoch")),
            "key_hashes must be a one-dimensional array",
        ),
    ];
    for (hashes, violation) in &cases {
        for (call, ttl) in [("renew_many", ", interval '1 hour'"), ("release_many", "")] {
            // 'held' matches its grant, so the refusal must also undo
            // what the call had already written.
            let sql = format!(
                "SELECT * FROM lease.{call}(ARRAY['held', 'wrong-epoch'], 'o', ARRAY[5, 6]::bigint[]{ttl}, {hashes})"
            );
            assert_refused_as_invalid(&mut conn, &sql, violation, &before);
        }
    }
    let right = format!("ARRAY[{}, {}]", digest("held"), digest("wrong-epoch"));
    assert_eq!(
        query_lines(
            &mut conn,
            &format!(
                "SELECT string_agg(key || '=' || status, ',' ORDER BY key) AS line FROM \
                 lease.renew_many(ARRAY['held', 'wrong-epoch'], 'o', ARRAY[5, 6]::bigint[], interval '1 hour', {right})"
            )
        ),
        vec!["held=ok,wrong-epoch=ok"]
    );

    // The Rust calls send digests they computed: a key outside ASCII is
    // renewed and released, so the client's digest is the server's (a
    // different one would have been refused as above).
    let key = "tenant/Zürich/日本";
    let held = granted(conn.acquire(key, OWNER, TTL).unwrap());
    let renewed = conn
        .renew_many(
            &leasehold_test_support::grants(OWNER, &[(key, held.epoch())]),
            LONG_TTL,
        )
        .unwrap();
    assert!(
        matches!(renewed[0].renewal, Renewal::Renewed { .. }),
        "{renewed:?}"
    );
    let released = conn
        .release_many(&leasehold_test_support::grants(
            OWNER,
            &[(key, held.epoch())],
        ))
        .unwrap();
    assert!(
        matches!(released[0].release, Release::Released),
        "{released:?}"
    );
    assert!(!conn.inspect(key).unwrap().unwrap().is_held());
}

#[test]
fn the_rust_calls_map_the_servers_refusals_to_invalid_input() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let held = granted(conn.acquire("a", OWNER, TTL).unwrap());
    let before = table_snapshot(&mut conn);
    let twice = [("a", held.epoch()), ("a", held.epoch())];
    for result in [
        conn.renew_many(&leasehold_test_support::grants(OWNER, &twice), TTL)
            .map(|_| ()),
        conn.release_many(&leasehold_test_support::grants(OWNER, &twice))
            .map(|_| ()),
    ] {
        match result {
            Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
                assert_eq!(e.violations(), vec!["keys must not contain a key twice"]);
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }
    let keys: Vec<String> = (0..=MAX_KEYS_PER_CALL).map(|i| format!("k{i}")).collect();
    let too_many: Vec<(&str, i64)> = keys.iter().map(|key| (key.as_str(), 1)).collect();
    match conn.renew_many(&leasehold_test_support::grants(OWNER, &too_many), TTL) {
        Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
            assert_eq!(e.violations(), vec!["keys must hold at most 1000 keys"]);
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert_eq!(table_snapshot(&mut conn), before);
}

#[test]
fn one_forbidden_key_refuses_the_whole_batch_before_anything_changes() {
    let deployment = Deployment::new();
    deployment
        .conn_as(&deployment.owner)
        .bind_namespace("billing/", &deployment.app)
        .unwrap();
    let mut worker = deployment.conn_as(&deployment.worker);
    let mine = granted(worker.acquire("jobs/1", "w", TTL).unwrap());
    let mut app = deployment.conn_as(&deployment.app);
    let theirs = granted(app.acquire("billing/1", "w", TTL).unwrap());
    let state = |deployment: &Deployment| table_snapshot(&mut deployment.admin());
    let before = state(&deployment);

    let batch = [("jobs/1", mine.epoch()), ("billing/1", theirs.epoch())];
    let refused = [
        (
            Operation::RENEW_MANY,
            worker
                .renew_many(&leasehold_test_support::grants("w", &batch), LONG_TTL)
                .map(|_| ()),
        ),
        (
            Operation::RELEASE_MANY,
            worker
                .release_many(&leasehold_test_support::grants("w", &batch))
                .map(|_| ()),
        ),
    ];
    for (operation, result) in refused {
        match result {
            Err(e)
                if e.kind() == ErrorKind::Forbidden
                    && e.table().is_none()
                    && e.refusal().is_none() =>
            {
                assert_eq!(e.operation(), Some(operation));
                assert_eq!(e.key().or(e.resource()), Some("billing/1"));
                assert_eq!(e.role(), Some(deployment.worker.as_str()));
            }
            other => panic!("expected Forbidden, got {other:?}"),
        }
        assert_eq!(state(&deployment), before, "{operation} changed something");
    }
    assert_eq!(
        sqlstate_of(
            &mut worker,
            &format!(
                "SELECT * FROM lease.renew_many(ARRAY['jobs/1','billing/1'], 'w', ARRAY[{},{}]::bigint[], interval '1 hour')",
                mine.epoch(),
                theirs.epoch()
            )
        ),
        "42501"
    );
    // A member of the bound role may renew the same batch.
    let answers = app
        .renew_many(&leasehold_test_support::grants("w", &batch), LONG_TTL)
        .unwrap();
    assert!(answers
        .iter()
        .all(|answer| matches!(answer.renewal, Renewal::Renewed { .. })));
}

/// A session that gives up on any lock wait after `bound`, and surfaces a
/// deadlock within 50 ms.
fn impatient(db: &TestDb, bound: &str) -> PgConnection {
    let mut conn = db.conn();
    conn.batch_execute(&format!(
        "SET lock_timeout = '{bound}'; SET deadlock_timeout = '50ms'"
    ))
    .unwrap();
    conn
}

/// How many backends of `db` wait on a lock right now.
fn lock_waiters(conn: &mut PgConnection, db: &str) -> usize {
    query_lines(
        conn,
        &format!(
            "SELECT count(*)::text AS line FROM pg_stat_activity \
             WHERE datname = '{db}' AND wait_event_type = 'Lock'"
        ),
    )[0]
    .parse()
    .unwrap()
}

fn wait_for_lock_waiters(conn: &mut PgConnection, db: &str, count: usize) {
    let until = Instant::now() + Duration::from_secs(20);
    while lock_waiters(conn, db) < count {
        assert!(
            Instant::now() < until,
            "{count} backends never waited on a lock"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_refused_batch_locks_nothing_and_an_applied_one_holds_its_rows_until_commit() {
    let db = TestDb::new();
    let mut holder = impatient(&db, "10s");
    let lease = granted(holder.acquire("k", OWNER, TTL).unwrap());

    // Refused in an open transaction: the holder's renew does not wait.
    let mut other = db.conn();
    other.batch_execute("BEGIN").unwrap();
    let refused = other
        .renew_many(
            &leasehold_test_support::grants("x", &[("k", lease.epoch())]),
            TTL,
        )
        .unwrap();
    assert_eq!(refused[0].renewal, Renewal::Refused(Refusal::NeverHeld));
    let refused = other
        .release_many(&leasehold_test_support::grants(
            OWNER,
            &[("k", lease.epoch().get() + 1)],
        ))
        .unwrap();
    assert_eq!(
        refused[0].release,
        Release::Refused(Refusal::EpochMismatch {
            held: Some(1.into())
        })
    );
    let mut quick = impatient(&db, "2s");
    assert!(matches!(
        quick
            .renew(
                &leasehold_test_support::grant("k", OWNER, lease.epoch()),
                TTL
            )
            .unwrap(),
        Renewal::Renewed { .. }
    ));
    other.batch_execute("COMMIT").unwrap();

    // Applied in an open transaction: the holder's renew waits for it.
    other.batch_execute("BEGIN").unwrap();
    let applied = other
        .renew_many(
            &leasehold_test_support::grants(OWNER, &[("k", lease.epoch())]),
            TTL,
        )
        .unwrap();
    assert!(matches!(applied[0].renewal, Renewal::Renewed { .. }));
    let (done_tx, done_rx) = mpsc::channel();
    let url = db.url.clone();
    let epoch = lease.epoch();
    let waiter = std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).unwrap();
        let answer = conn.renew(&leasehold_test_support::grant("k", OWNER, epoch), TTL);
        done_tx.send(()).unwrap();
        answer
    });
    let mut observer = db.conn();
    wait_for_lock_waiters(&mut observer, &db.name, 1);
    assert!(done_rx.try_recv().is_err(), "the renew did not wait");
    other.batch_execute("COMMIT").unwrap();
    assert!(matches!(
        waiter.join().unwrap().unwrap(),
        Renewal::Renewed { .. }
    ));
}

#[test]
fn two_batches_over_the_same_keys_in_opposite_orders_never_deadlock() {
    let db = TestDb::new();
    let mut setup = db.conn();
    let keys: Vec<String> = (0..40).map(|i| format!("shard-{i:02}")).collect();
    let mut grants = Vec::new();
    for key in &keys {
        let lease = granted(setup.acquire(key, OWNER, TTL).unwrap());
        grants.push((key.clone(), lease.epoch()));
    }
    // A blocker holds the key in the middle of the input order, so both
    // batches stop there: one locking in input order, the other in reverse
    // order, would then each hold what the other needs.
    let middle = &grants[grants.len() / 2];
    let mut blocker = db.conn();
    blocker.batch_execute("BEGIN").unwrap();
    assert!(matches!(
        blocker
            .renew(
                &leasehold_test_support::grant(&middle.0, OWNER, middle.1),
                TTL
            )
            .unwrap(),
        Renewal::Renewed { .. }
    ));

    let spawn_batch = |reversed: bool| {
        let mut order = grants.clone();
        if reversed {
            order.reverse();
        }
        let url = db.url.clone();
        std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            conn.batch_execute("SET deadlock_timeout = '50ms'; SET lock_timeout = '60s'")
                .unwrap();
            let refs: Vec<(&str, leasehold::Epoch)> =
                order.iter().map(|(k, e)| (k.as_str(), *e)).collect();
            conn.renew_many(&leasehold_test_support::grants(OWNER, &refs), TTL)
        })
    };
    let forward = spawn_batch(false);
    let backward = spawn_batch(true);
    let mut observer = db.conn();
    wait_for_lock_waiters(&mut observer, &db.name, 2);
    blocker.batch_execute("COMMIT").unwrap();

    for batch in [forward, backward] {
        let answers = batch
            .join()
            .unwrap()
            .unwrap_or_else(|error| panic!("a batch failed (deadlock?): {error:?}"));
        assert_eq!(answers.len(), keys.len());
        assert!(answers
            .iter()
            .all(|answer| matches!(answer.renewal, Renewal::Renewed { .. })));
    }
}

/// A batch locks its rows in key_hash order whatever planner settings its
/// caller chose: here a session that leaves the planner only a hash join
/// over a sequential scan, which would meet the rows in the table's order.
/// The keys are written in neither order; the batch stops at the key in
/// the middle of key_hash order, which another transaction holds, and by
/// then holds exactly the keys before it in that order.
#[test]
fn a_batch_locks_in_key_hash_order_whatever_its_callers_planner_settings() {
    for release in [false, true] {
        let db = TestDb::new();
        let mut setup = db.conn();
        // Other keys make the table the bigger side of a join, so a hash
        // join would hash the batch's keys and scan the table.
        setup
            .batch_execute(
                "SELECT lease.acquire('other-' || i, 'x', interval '1 hour') FROM generate_series(1, 400) AS i;
                 ANALYZE lease.leases",
            )
            .unwrap();
        let mut grants = Vec::new();
        for i in 0..60 {
            let key = format!("k{}", (i * 37) % 61);
            let lease = granted(setup.acquire(&key, OWNER, TTL).unwrap());
            grants.push((key, lease.epoch()));
        }
        let in_hash_order = query_lines(
            &mut setup,
            &format!(
                "SELECT key AS line FROM lease.leases WHERE owner = '{OWNER}' ORDER BY key_hash"
            ),
        );
        let middle = in_hash_order[in_hash_order.len() / 2].clone();
        let mut blocker = db.conn();
        blocker.batch_execute("BEGIN").unwrap();
        let epoch = grants.iter().find(|(key, _)| *key == middle).unwrap().1;
        assert!(matches!(
            blocker
                .renew(&leasehold_test_support::grant(&middle, OWNER, epoch), TTL)
                .unwrap(),
            Renewal::Renewed { .. }
        ));
        let url = db.url.clone();
        let batch_grants = grants.clone();
        let batch = std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            conn.batch_execute(
                "SET enable_nestloop = off; SET enable_mergejoin = off; \
                 SET enable_indexscan = off; SET enable_bitmapscan = off",
            )
            .unwrap();
            let refs: Vec<(&str, leasehold::Epoch)> =
                batch_grants.iter().map(|(k, e)| (k.as_str(), *e)).collect();
            let grants = leasehold_test_support::grants(OWNER, &refs);
            if release {
                conn.release_many(&grants).map(|answers| answers.len())
            } else {
                conn.renew_many(&grants, TTL).map(|answers| answers.len())
            }
        });
        let mut observer = db.conn();
        wait_for_lock_waiters(&mut observer, &db.name, 1);
        observer.batch_execute("BEGIN").unwrap();
        let free = query_lines(
            &mut observer,
            &format!(
                "SELECT key AS line FROM lease.leases WHERE owner = '{OWNER}' \
                 ORDER BY key_hash FOR UPDATE SKIP LOCKED"
            ),
        );
        observer.batch_execute("ROLLBACK").unwrap();
        let held_by_batch: Vec<&String> = in_hash_order
            .iter()
            .filter(|key| **key != middle && !free.contains(key))
            .collect();
        let before_middle: Vec<&String> = in_hash_order[..in_hash_order.len() / 2].iter().collect();
        assert_eq!(
            held_by_batch, before_middle,
            "release {release}: the rows a batch holds while it waits for the middle key"
        );
        blocker.batch_execute("COMMIT").unwrap();
        assert_eq!(batch.join().unwrap().unwrap(), grants.len());
    }
}

/// Holds `key`'s row in an open transaction that renews it and, when
/// `then_release`, releases it too; a batch over it must wait, and then
/// answer as if it ran after that transaction committed.
fn batch_waits_for(then_release: bool) -> Vec<(String, &'static str)> {
    let db = TestDb::new();
    let mut setup = db.conn();
    let mut epochs = Vec::new();
    for key in ["w-0", "w-1", "w-2"] {
        epochs.push(granted(setup.acquire(key, OWNER, TTL).unwrap()).epoch());
    }
    let mut other = db.conn();
    other.batch_execute("BEGIN").unwrap();
    let _ = other
        .renew(&leasehold_test_support::grant("w-1", OWNER, epochs[1]), TTL)
        .unwrap();
    if then_release {
        assert_eq!(
            other
                .release(&leasehold_test_support::grant("w-1", OWNER, epochs[1]))
                .unwrap(),
            Release::Released
        );
    }
    let url = db.url.clone();
    let batch = std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).unwrap();
        let grants = [("w-0", epochs[0]), ("w-1", epochs[1]), ("w-2", epochs[2])];
        conn.renew_many(&leasehold_test_support::grants(OWNER, &grants), TTL)
    });
    let mut observer = db.conn();
    wait_for_lock_waiters(&mut observer, &db.name, 1);
    other.batch_execute("COMMIT").unwrap();
    batch
        .join()
        .unwrap()
        .unwrap()
        .into_iter()
        .map(|answer| (answer.key, renewal_status(answer.renewal)))
        .collect()
}

#[test]
fn a_batch_that_waited_answers_as_if_it_ran_after_the_transaction_it_waited_for() {
    let expect = |middle: &'static str| {
        vec![
            ("w-0".to_owned(), "ok"),
            ("w-1".to_owned(), middle),
            ("w-2".to_owned(), "ok"),
        ]
    };
    // Renewed meanwhile: still the caller's grant.
    assert_eq!(batch_waits_for(false), expect("ok"));
    // Released meanwhile: gone, for that key only.
    assert_eq!(batch_waits_for(true), expect("not_owner"));
}

#[test]
fn release_many_wakes_the_waiters_of_every_key_it_releases() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let keys = ["r-1", "r-2"];
    let grants: Vec<(&str, leasehold::Epoch)> = keys
        .iter()
        .map(|key| {
            (
                *key,
                granted(conn.acquire(key, OWNER, NEVER_LAPSES).unwrap()).epoch(),
            )
        })
        .collect();
    let waiter = strict_waiter_at(&db.url);
    let waits: Vec<_> = keys
        .iter()
        .map(|key| {
            let (waiter, key) = (waiter.clone(), (*key).to_owned());
            std::thread::spawn(move || waiter.acquire(&key, "next", TTL, LONG_WAIT))
        })
        .collect();
    for key in keys {
        wait_armed(&waiter, key, 1);
    }
    let released_at = Instant::now();
    let released = conn
        .release_many(&leasehold_test_support::grants(OWNER, &grants))
        .unwrap();
    assert!(released
        .iter()
        .all(|answer| answer.release == Release::Released));
    for wait in waits {
        let lease = wait.join().unwrap().expect("woken by the release");
        assert_eq!(lease.owner(), "next");
    }
    // Without a notification the waiters would only try again at the end
    // of their wait (LONG_WAIT), and find the keys free then.
    assert!(
        released_at.elapsed() < IN_TIME,
        "woken only after {:?}",
        released_at.elapsed()
    );
}

/// A holder's ttl far beyond [`LONG_WAIT`]: only a release frees the key
/// in time.
const NEVER_LAPSES: Duration = Duration::from_secs(600);

#[test]
fn an_applied_batch_is_durable_and_a_refused_one_leaves_synchronous_commit_alone() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("k", OWNER, TTL).unwrap());
    let setting = |conn: &mut PgConnection| {
        query_lines(conn, "SELECT current_setting('synchronous_commit') AS line").remove(0)
    };
    conn.batch_execute("BEGIN; SET LOCAL synchronous_commit = off")
        .unwrap();
    let _ = conn
        .renew_many(
            &leasehold_test_support::grants("x", &[("k", lease.epoch())]),
            TTL,
        )
        .unwrap();
    let _ = conn
        .release_many(&leasehold_test_support::grants(
            "x",
            &[("k", lease.epoch())],
        ))
        .unwrap();
    assert_eq!(setting(&mut conn), "off");
    let _ = conn
        .renew_many(
            &leasehold_test_support::grants(OWNER, &[("k", lease.epoch())]),
            TTL,
        )
        .unwrap();
    assert_eq!(setting(&mut conn), "on");
    conn.batch_execute("ROLLBACK; BEGIN; SET LOCAL synchronous_commit = local")
        .unwrap();
    let _ = conn
        .release_many(&leasehold_test_support::grants(
            OWNER,
            &[("k", lease.epoch())],
        ))
        .unwrap();
    assert_eq!(setting(&mut conn), "on");
    conn.batch_execute("COMMIT").unwrap();
}

// ---- the keeper set ----

/// "Promptly", for a heartbeat every 100 ms.
const IN_TIME: Duration = Duration::from_secs(15);

fn acquire_all(db: &TestDb, keys: &[&str], ttl: Duration) -> Vec<leasehold::Lease> {
    let mut conn = db.conn();
    keys.iter()
        .map(|key| granted(conn.acquire(key, "w", ttl).unwrap()))
        .collect()
}

#[test]
fn a_keeper_set_reports_the_loss_of_one_key_only_and_keeps_the_rest() {
    let db = TestDb::new();
    let keys = ["t-1", "t-2", "t-3", "t-4", "t-5"];
    let leases = acquire_all(&db, &keys, Duration::from_secs(20));
    let (events_tx, events_rx) = mpsc::channel();
    let events_tx = std::sync::Mutex::new(events_tx);
    let keepers = KeeperSet::builder(&client(&db.url), leases)
        .renew_every(Duration::from_millis(100))
        .on_event(move |event| {
            let _ = events_tx.lock().unwrap().send(event.clone());
        })
        .start()
        .unwrap();
    let mut admin = db.conn();
    assert!(
        keepers
            .wait_for_loss("t-3", Duration::from_millis(50))
            .is_none(),
        "lost while held"
    );
    admin.force_release("t-3").unwrap();

    assert!(matches!(
        keepers.wait_for_loss("t-3", IN_TIME),
        Some(LeaseLoss::Refused(Refusal::ForceReleased))
    ));
    assert!(keepers.wait_for_loss("nobody", IN_TIME).is_none());
    let losses = keepers.wait_for_losses(0, IN_TIME);
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(losses[0].0, "t-3");
    assert!(matches!(
        losses[0].1,
        LeaseLoss::Refused(Refusal::ForceReleased)
    ));
    assert!(!keepers.is_valid("t-3"));
    // Two more heartbeats renew the four others, and only them.
    let mut after_loss = 0;
    let until = Instant::now() + IN_TIME;
    let mut lost_seen = false;
    while after_loss < 2 {
        let event = events_rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .expect("no heartbeat after the loss");
        match event {
            KeeperSetEvent::Lost { key, .. } => {
                assert_eq!(key, "t-3");
                lost_seen = true;
            }
            KeeperSetEvent::Renewed { renewed, .. } if lost_seen => {
                assert_eq!(renewed, 4);
                after_loss += 1;
            }
            _ => {}
        }
    }
    assert_eq!(keepers.kept_keys(), vec!["t-1", "t-2", "t-4", "t-5"]);
    let mut conn = db.conn();
    for key in ["t-1", "t-2", "t-4", "t-5"] {
        assert!(keepers.is_valid(key), "{key}");
        assert!(conn.inspect(key).unwrap().unwrap().is_held(), "{key}");
    }
    assert_eq!(keepers.losses().len(), 1);

    let released = keepers.stop().unwrap();
    let answers: Vec<(&str, Release)> = released
        .iter()
        .map(|answer| (answer.key.as_str(), answer.release))
        .collect();
    assert_eq!(
        answers,
        vec![
            ("t-1", Release::Released),
            ("t-2", Release::Released),
            ("t-3", Release::Refused(Refusal::ForceReleased)),
            ("t-4", Release::Released),
            ("t-5", Release::Released),
        ]
    );
    for key in keys {
        assert!(!conn.inspect(key).unwrap().unwrap().is_held(), "{key}");
    }
}

#[test]
fn a_stalled_heartbeat_loses_every_kept_key_at_the_deadline() {
    let db = TestDb::new();
    let keys = ["s-1", "s-2", "s-3"];
    let leases = acquire_all(&db, &keys, Duration::from_secs(3));
    let keepers = KeeperSet::builder(&client(&db.url), leases)
        .ttl(Duration::from_secs(3))
        .renew_every(Duration::from_millis(200))
        .margin(Duration::from_millis(500))
        .start()
        .unwrap();
    // Another transaction locks the set's heartbeat group (its one row):
    // the next heartbeat waits for it, past the set's deadline.
    let mut blocker = db.conn();
    blocker
        .batch_execute("BEGIN; SELECT 1 FROM lease.groups FOR UPDATE")
        .unwrap();
    let mut losses = Vec::new();
    let until = Instant::now() + IN_TIME;
    while losses.len() < keys.len() {
        assert!(Instant::now() < until, "only {losses:?} lost");
        losses = keepers.wait_for_losses(losses.len(), IN_TIME);
    }
    let mut lost: Vec<&str> = losses.iter().map(|(key, _)| key.as_str()).collect();
    lost.sort_unstable();
    assert_eq!(lost, keys);
    assert!(losses
        .iter()
        .all(|(_, loss)| matches!(loss, LeaseLoss::DeadlinePassed { .. })));
    assert!(keys.iter().all(|key| !keepers.is_valid(key)));
    blocker.batch_execute("ROLLBACK").unwrap();
    drop(keepers);
}

#[test]
fn a_keeper_set_refuses_what_one_call_cannot_keep() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let a = granted(conn.acquire("a", "w", TTL).unwrap());
    let b = granted(conn.acquire("b", "v", TTL).unwrap());
    for (leases, says) in [
        (vec![], "at least one lease"),
        (vec![a.clone(), b], "one owner"),
        (vec![a.clone(), a.clone()], "twice"),
    ] {
        match KeeperSet::start(&client(&db.url), leases) {
            Err(e) if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
                let violations = e.violations();
                assert!(violations.join("; ").contains(says), "{violations:?}");
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }
    // Every key already lost: nothing to keep.
    let _ = conn
        .release(&leasehold_test_support::grant("a", "w", a.epoch()))
        .unwrap();
    match KeeperSet::start(&client(&db.url), vec![a]) {
        Err(e) if e.kind() == ErrorKind::Fenced && e.table().is_none() && e.owner().is_some() => {
            assert_eq!((e.key(), e.refusal()), (Some("a"), Some(Refusal::Released)));
        }
        other => panic!("expected NotHeld, got {other:?}"),
    }
}

/// A batch acts for one owner (the SQL functions take one): leases of two
/// owners in one call are refused before anything is sent, naming both, and
/// every key keeps its grant.
#[test]
fn a_batch_of_two_owners_is_refused_and_changes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let a = granted(conn.acquire("mixed/a", "owner-a", TTL).unwrap());
    let b = granted(conn.acquire("mixed/b", "owner-b", TTL).unwrap());
    for error in [
        conn.renew_many(&[&a, &b], TTL).unwrap_err(),
        conn.release_many(&[&a, &b]).unwrap_err(),
        conn.join_group(&[&a, &b], TTL).unwrap_err(),
    ] {
        match error {
            e if e.kind() == ErrorKind::InvalidInput && !e.violations().is_empty() => {
                let violations = e.violations();
                assert_eq!(violations.len(), 1, "{violations:?}");
                assert!(
                    violations[0].contains("\"owner-a\"") && violations[0].contains("\"owner-b\""),
                    "{violations:?}"
                );
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }
    for lease in [&a, &b] {
        assert_eq!(
            conn.inspect(lease.key()).unwrap(),
            Some(LeaseState::Held {
                owner: lease.owner().to_owned(),
                epoch: lease.epoch(),
                expires_at: lease.expires_at(),
            })
        );
    }
    // Each owner's own batch goes through.
    for lease in [&a, &b] {
        let answers = conn.release_many(&[lease]).unwrap();
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].release, Release::Released);
    }
}
