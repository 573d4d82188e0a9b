//! SPEC §1.5 under interleavings: several real sessions racing on one key,
//! made deterministic by holding the row lock in an open transaction on one
//! session, starting the competitor, *observing* it wait (pg_stat_activity
//! wait events, pg_locks), then committing or rolling back. Complements
//! `spec_1_5_transactions.rs` (single winner of free and lapsed keys, open
//! transaction vs. competitor on a fresh key, REPEATABLE READ acquire) with
//! the races that decide between two existing grants.

use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::{Connection, PgConnection, RunQueryDsl};
use leasehold::guards::{admit, admit_held, renew_and_admit};
use leasehold::{
    acquire, acquire_waiting_in_sql, inspect, release, renew, Acquisition, FencingToken,
    GuardError, LeaseError, LeaseState, LostLease, Release, Renewal,
};

use crate::common::*;

/// A pid-tagged session: its backend pid lets the test observe exactly
/// this session waiting.
fn session(db: &TestDb) -> (PgConnection, i32) {
    let mut conn = db.conn();
    let pid = query_lines(&mut conn, "SELECT pg_backend_pid()::text AS line")[0]
        .parse()
        .unwrap();
    (conn, pid)
}

/// Waits until backend `pid` waits for a row/transaction lock held by
/// another transaction (pg_stat_activity: wait_event_type = 'Lock').
fn wait_until_blocked_on_lock(observer: &mut PgConnection, pid: i32) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Lock') \
         AND EXISTS (SELECT 1 FROM pg_locks WHERE pid = {pid} AND NOT granted) AS flag"
    );
    for _ in 0..4_000 {
        if query_bool(observer, &sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("backend {pid} never waited on a lock");
}

/// Waits until backend `pid` polls inside a blocking acquire.
fn wait_until_polling(observer: &mut PgConnection, pid: i32) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event = 'PgSleep') AS flag"
    );
    for _ in 0..4_000 {
        if query_bool(observer, &sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("backend {pid} never polled");
}

/// Waits until backend `pid` waits inside a blocking acquire, either
/// polling or queued on a lock.
fn wait_until_waiting(observer: &mut PgConnection, pid: i32) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} \
         AND (wait_event = 'PgSleep' OR wait_event_type = 'Lock')) AS flag"
    );
    for _ in 0..4_000 {
        if query_bool(observer, &sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("backend {pid} never waited");
}

fn in_thread<T: Send + 'static>(
    mut conn: PgConnection,
    call: impl FnOnce(&mut PgConnection) -> T + Send + 'static,
) -> JoinHandle<T> {
    std::thread::spawn(move || call(&mut conn))
}

/// `a` holds `k` with a short ttl that has run out (server time).
fn lapsed_grant(conn: &mut PgConnection) -> leasehold::Lease {
    let lease = granted(acquire(conn, "k", "a", Duration::from_millis(150)).unwrap());
    wait_until_server_time_passes(conn, lease.expires_at());
    lease
}

fn holder(conn: &mut PgConnection) -> Option<(String, i64)> {
    match inspect(conn, "k").unwrap() {
        Some(LeaseState::Held { owner, epoch, .. }) => Some((owner, epoch)),
        _ => None,
    }
}

// ---- takeover vs takeover ----

/// Two takeovers of one lapsed grant: the second waits for the first's
/// transaction. Commit: the second is denied. Rollback: the second wins
/// with the epoch the first would have had — the rollback left no trace.
fn takeover_races_takeover(commit: bool) {
    let db = TestDb::new();
    let (mut first, _) = session(&db);
    let (second, pid) = session(&db);
    let mut observer = db.conn();
    lapsed_grant(&mut first);
    first.batch_execute("BEGIN").unwrap();
    assert_eq!(
        granted(acquire(&mut first, "k", "b", TTL).unwrap()).epoch(),
        2
    );
    let racer = in_thread(second, |c| acquire(c, "k", "c", TTL));
    wait_until_blocked_on_lock(&mut observer, pid);
    first
        .batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
        .unwrap();
    let outcome = racer.join().unwrap().unwrap();
    if commit {
        assert_eq!(outcome, Acquisition::Denied);
        assert_eq!(holder(&mut observer), Some(("b".into(), 2)));
    } else {
        assert_eq!(granted(outcome).epoch(), 2);
        assert_eq!(holder(&mut observer), Some(("c".into(), 2)));
    }
}

#[test]
fn takeover_waiting_on_an_uncommitted_takeover_is_denied_after_commit() {
    takeover_races_takeover(true);
}

#[test]
fn takeover_waiting_on_an_uncommitted_takeover_wins_after_rollback_with_the_same_epoch() {
    takeover_races_takeover(false);
}

// ---- renew vs takeover ----

/// The holder renews just before expiry inside a transaction; by the time
/// a competitor tries, the committed expiry has passed, so its takeover
/// must wait for the renewal's outcome. Commit: the renewal stands and the
/// competitor is denied. Rollback: the grant had lapsed, the competitor
/// takes over, and the holder then hears `lapsed`.
fn renewal_races_takeover(commit: bool) {
    let db = TestDb::new();
    let (mut holder_conn, _) = session(&db);
    let (competitor, pid) = session(&db);
    let mut observer = db.conn();
    let lease = granted(acquire(&mut holder_conn, "k", "a", Duration::from_secs(2)).unwrap());
    holder_conn.batch_execute("BEGIN").unwrap();
    assert!(matches!(
        renew(&mut holder_conn, "k", "a", 1, TTL).unwrap(),
        Renewal::Renewed { .. }
    ));
    wait_until_server_time_passes(&mut observer, lease.expires_at());
    let racer = in_thread(competitor, |c| acquire(c, "k", "b", TTL));
    wait_until_blocked_on_lock(&mut observer, pid);
    holder_conn
        .batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
        .unwrap();
    let outcome = racer.join().unwrap().unwrap();
    if commit {
        assert_eq!(outcome, Acquisition::Denied);
        assert_eq!(holder(&mut observer), Some(("a".into(), 1)));
    } else {
        assert_eq!(granted(outcome).epoch(), 2);
        assert_eq!(
            renew(&mut holder_conn, "k", "a", 1, TTL).unwrap(),
            Renewal::Lost(LostLease::Lapsed)
        );
        assert_eq!(holder(&mut observer), Some(("b".into(), 2)));
    }
}

#[test]
fn takeover_racing_a_renewal_is_denied_when_the_renewal_commits() {
    renewal_races_takeover(true);
}

#[test]
fn takeover_racing_a_renewal_wins_when_the_renewal_rolls_back() {
    renewal_races_takeover(false);
}

/// The lapsed holder's renew and release wait behind an uncommitted
/// takeover; whichever way it ends they answer `lapsed` — a status, never
/// an error — and never disturb the new holder.
fn stale_holder_races_takeover(commit: bool) {
    let db = TestDb::new();
    let (mut taker, _) = session(&db);
    let (stale, pid) = session(&db);
    let mut observer = db.conn();
    lapsed_grant(&mut taker);
    taker.batch_execute("BEGIN").unwrap();
    granted(acquire(&mut taker, "k", "b", TTL).unwrap());
    let racer = in_thread(stale, |c| {
        let renewal = renew(c, "k", "a", 1, TTL).unwrap();
        let release = release(c, "k", "a", 1).unwrap();
        (renewal, release)
    });
    wait_until_blocked_on_lock(&mut observer, pid);
    taker
        .batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
        .unwrap();
    let (renewal, released) = racer.join().unwrap();
    assert_eq!(renewal, Renewal::Lost(LostLease::Lapsed));
    assert_eq!(released, Release::Lost(LostLease::Lapsed));
    if commit {
        assert_eq!(holder(&mut observer), Some(("b".into(), 2)));
    } else {
        assert_eq!(
            inspect(&mut observer, "k").unwrap(),
            Some(LeaseState::Unowned { epoch: 1 })
        );
    }
}

#[test]
fn lapsed_holders_renew_and_release_waiting_on_a_takeover_that_commits_report_lapsed() {
    stale_holder_races_takeover(true);
}

#[test]
fn lapsed_holders_renew_and_release_waiting_on_a_takeover_that_rolls_back_report_lapsed() {
    stale_holder_races_takeover(false);
}

// ---- release vs acquire ----

/// An uncommitted release frees nothing: a blocking acquire keeps waiting
/// (polling, or queued on the row lock) until the release commits — then it wins with the next
/// epoch — or, after a rollback, times out with WaitTimedOut (57014).
fn release_races_acquire(commit: bool) {
    let db = TestDb::new();
    let (mut releaser, _) = session(&db);
    let (waiter, pid) = session(&db);
    let mut observer = db.conn();
    granted(acquire(&mut releaser, "k", "a", TTL).unwrap());
    releaser.batch_execute("BEGIN").unwrap();
    assert_eq!(
        release(&mut releaser, "k", "a", 1).unwrap(),
        Release::Released
    );
    let wait = Duration::from_secs(if commit { 30 } else { 1 });
    let racer = in_thread(waiter, move |c| {
        acquire_waiting_in_sql(c, "k", "b", TTL, wait)
    });
    wait_until_waiting(&mut observer, pid);
    if commit {
        releaser.batch_execute("COMMIT").unwrap();
        let lease = racer.join().unwrap().unwrap();
        assert_eq!((lease.owner(), lease.epoch()), ("b", 3));
    } else {
        releaser.batch_execute("ROLLBACK").unwrap();
        let error = racer.join().unwrap().unwrap_err();
        assert!(
            matches!(error, LeaseError::WaitTimedOut { .. }),
            "{error:?}"
        );
        assert_eq!(holder(&mut observer), Some(("a".into(), 1)));
    }
}

#[test]
fn blocking_acquire_wakes_when_a_release_commits_with_the_next_epoch() {
    release_races_acquire(true);
}

#[test]
fn blocking_acquire_times_out_with_57014_when_the_release_rolls_back() {
    release_races_acquire(false);
}

/// Blocking waiters on one key are served one at a time: each is granted
/// only after the previous holder released (never two holders), with
/// strictly increasing epochs.
#[test]
fn blocking_waiters_are_granted_one_at_a_time_with_increasing_epochs() {
    let db = TestDb::new();
    let (mut first, _) = session(&db);
    let mut observer = db.conn();
    let lease = granted(acquire(&mut first, "k", "first", TTL).unwrap());
    const WAITERS: usize = 5;
    let holding: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let mut pids = Vec::new();
    let handles: Vec<_> = (0..WAITERS)
        .map(|i| {
            let (conn, pid) = session(&db);
            pids.push(pid);
            let holding = holding.clone();
            in_thread(conn, move |c| {
                let owner = format!("w{i}");
                let lease =
                    acquire_waiting_in_sql(c, "k", &owner, TTL, Duration::from_secs(60)).unwrap();
                let previous = holding.lock().unwrap().replace(owner.clone());
                assert_eq!(previous, None, "{owner} granted while another held the key");
                assert_eq!(holder(c), Some((owner.clone(), lease.epoch())));
                holding.lock().unwrap().take();
                assert_eq!(
                    release(c, "k", &owner, lease.epoch()).unwrap(),
                    Release::Released
                );
                lease.epoch()
            })
        })
        .collect();
    for pid in pids {
        wait_until_polling(&mut observer, pid);
    }
    assert_eq!(
        release(&mut first, "k", "first", lease.epoch()).unwrap(),
        Release::Released
    );
    let mut epochs: Vec<i64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    epochs.sort_unstable();
    // Each grant is counter + 1 and each release adds one more.
    assert_eq!(epochs, [3, 5, 7, 9, 11]);
}

// ---- REPEATABLE READ / SERIALIZABLE ----

fn is_serialization_failure(error: &LeaseError) -> bool {
    matches!(
        error,
        LeaseError::Database {
            source: DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _),
            ..
        }
    )
}

/// Documented: under REPEATABLE READ / SERIALIZABLE, renew and release of
/// a lease whose row changed after the transaction's snapshot fail with
/// 40001 (serialization_failure); nothing changes and the retry, in a new
/// transaction, sees the new state.
#[test]
fn under_snapshot_isolation_renew_and_release_of_a_row_changed_after_the_snapshot_fail_with_40001()
{
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        for operation in ["renew", "release"] {
            let db = TestDb::new();
            let mut other = db.conn();
            let mut snap = db.conn();
            granted(acquire(&mut other, "k", "a", TTL).unwrap());
            snap.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
                .unwrap();
            assert!(inspect(&mut snap, "k").unwrap().unwrap().is_held()); // snapshot
            let Renewal::Renewed { expires_at } = renew(&mut other, "k", "a", 1, TTL).unwrap()
            else {
                panic!("renew failed");
            };
            let error = if operation == "renew" {
                renew(&mut snap, "k", "a", 1, TTL).unwrap_err()
            } else {
                release(&mut snap, "k", "a", 1).unwrap_err()
            };
            assert!(
                is_serialization_failure(&error),
                "{level} {operation}: {error:?}"
            );
            snap.batch_execute("ROLLBACK").unwrap();
            assert_eq!(
                inspect(&mut snap, "k").unwrap(),
                Some(LeaseState::Held {
                    owner: "a".into(),
                    epoch: 1,
                    expires_at
                }),
                "{level} {operation}"
            );
        }
    }
}

/// Documented: under REPEATABLE READ / SERIALIZABLE, calls on rows that did
/// not change since the snapshot behave as under READ COMMITTED, and their
/// effects commit with the transaction.
#[test]
fn under_snapshot_isolation_calls_on_unchanged_rows_act_on_the_snapshot_and_commit() {
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let db = TestDb::new();
        let mut conn = db.conn();
        let mut other = db.conn();
        conn.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .unwrap();
        let lease = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
        assert!(matches!(
            renew(&mut conn, "k", "a", lease.epoch(), TTL).unwrap(),
            Renewal::Renewed { .. }
        ));
        assert_eq!(
            release(&mut conn, "k", "a", lease.epoch()).unwrap(),
            Release::Released
        );
        conn.batch_execute("COMMIT").unwrap();
        assert_eq!(
            inspect(&mut other, "k").unwrap(),
            Some(LeaseState::Unowned { epoch: 2 }),
            "{level}"
        );
    }
}

// ---- many sessions, few keys, mixed calls ----

#[derive(Debug)]
enum TxError {
    Guard(GuardError),
    Db(DieselError),
}

impl From<GuardError> for TxError {
    fn from(error: GuardError) -> Self {
        TxError::Guard(error)
    }
}

impl From<DieselError> for TxError {
    fn from(error: DieselError) -> Self {
        TxError::Db(error)
    }
}

/// Many sessions hammer three keys with every lease and guard call, some
/// autocommitted and some several to a transaction, under READ COMMITTED:
/// no deadlock (40P01), no serialization failure (40001), no error at all
/// except the guards' documented refusals; every committed write's epoch
/// is non-decreasing per resource in commit order (G4), and no key ever
/// has two holders at once.
#[test]
fn mixed_lease_and_guard_calls_from_many_sessions_never_deadlock_or_fail_to_serialize() {
    let db = TestDb::new();
    db.conn()
        .batch_execute(
            "CREATE TABLE items (seq bigserial PRIMARY KEY, resource text NOT NULL, epoch bigint NOT NULL)",
        )
        .unwrap();
    const WORKERS: usize = 8;
    let barrier = Arc::new(Barrier::new(WORKERS));
    let handles: Vec<_> = (0..WORKERS)
        .map(|i| {
            let (url, barrier) = (db.url.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).unwrap();
                conn.batch_execute("SET deadlock_timeout = '100ms'")
                    .unwrap();
                let owner = format!("w{i}");
                let ttl = Duration::from_millis(40);
                barrier.wait();
                let mut refusals = 0;
                for n in 0..120usize {
                    let key = ["a", "b", "c"][(n * 7 + i) % 3];
                    let resource = format!("r-{key}");
                    let result: Result<(), TxError> = conn.transaction(|c| {
                        let lease = match acquire(c, key, &owner, ttl).unwrap() {
                            Acquisition::Granted(lease) => lease,
                            Acquisition::Denied => {
                                // A stale token: every epoch so far is fair game.
                                let epoch = inspect(c, key).unwrap().map_or(1, |s| s.epoch());
                                let token = FencingToken::new(key, &owner, epoch.max(1)).unwrap();
                                return Ok(admit(c, &resource, &token)?);
                            }
                        };
                        let token = lease.token();
                        match n % 3 {
                            0 => admit(c, &resource, &token)?,
                            1 => {
                                admit_held(c, &resource, &token)?;
                            }
                            _ => {
                                renew_and_admit(c, &resource, &token, ttl)?;
                            }
                        }
                        diesel::sql_query("INSERT INTO items (resource, epoch) VALUES ($1, $2)")
                            .bind::<diesel::sql_types::Text, _>(&resource)
                            .bind::<diesel::sql_types::BigInt, _>(lease.epoch())
                            .execute(c)?;
                        if n % 2 == 0 {
                            let _ = release(c, key, &owner, lease.epoch()).unwrap();
                        }
                        Ok(())
                    });
                    match result {
                        Ok(()) => {}
                        Err(TxError::Guard(
                            GuardError::StaleEpoch { .. } | GuardError::LeaseNotHeld { .. },
                        )) => refusals += 1,
                        Err(TxError::Guard(other)) => panic!("{owner}: unexpected error {other:?}"),
                        Err(TxError::Db(error)) => panic!("{owner}: unexpected error {error}"),
                    }
                    let _ = renew(&mut conn, key, &owner, 1, ttl).unwrap();
                }
                refusals
            })
        })
        .collect();
    let refusals: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let mut conn = db.conn();
    let regressions = query_lines(
        &mut conn,
        "SELECT format('%s seq %s epoch %s after %s', resource, seq, epoch, prev) AS line FROM (
           SELECT resource, seq, epoch, max(epoch) OVER (PARTITION BY resource ORDER BY seq
             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM items) t
         WHERE epoch < prev",
    );
    assert!(regressions.is_empty(), "G4 broken: {regressions:?}");
    let written = query_lines(&mut conn, "SELECT count(*)::text AS line FROM items");
    assert!(written[0].parse::<usize>().unwrap() > 0);
    let _ = refusals;
}

/// Two sessions each running acquire, renew, inspect and release of ONE
/// key inside their own transactions, interleaved so that each transaction
/// holds the row lock while the other waits: never a deadlock, whatever
/// the order (SPEC §1.5 promises this for one key; across keys in one
/// application transaction, lock ordering is the application's business).
#[test]
fn lease_calls_on_one_key_in_two_open_transactions_never_deadlock() {
    let db = TestDb::new();
    let (mut one, _) = session(&db);
    let (two, pid) = session(&db);
    let mut observer = db.conn();
    let lease = lapsed_grant(&mut one);
    one.batch_execute("SET deadlock_timeout = '50ms'; BEGIN")
        .unwrap();
    let lease2 = granted(acquire(&mut one, "k", "b", TTL).unwrap());
    assert_eq!(lease2.epoch(), lease.epoch() + 1);
    let racer = in_thread(two, |c| {
        c.batch_execute("SET deadlock_timeout = '50ms'").unwrap();
        c.transaction::<_, DieselError, _>(|c| {
            let first = renew(c, "k", "a", 1, TTL).unwrap();
            let second = acquire(c, "k", "c", TTL).unwrap();
            let third = release(c, "k", "c", 2).unwrap();
            Ok((first, second, third))
        })
    });
    wait_until_blocked_on_lock(&mut observer, pid);
    // Session one keeps using the key while two waits on it.
    assert!(matches!(
        renew(&mut one, "k", "b", 2, TTL).unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(inspect(&mut one, "k").unwrap().unwrap().epoch(), 2);
    one.batch_execute("COMMIT").unwrap();
    let (first, second, third) = racer.join().unwrap().unwrap();
    assert_eq!(first, Renewal::Lost(LostLease::Lapsed));
    assert_eq!(second, Acquisition::Denied);
    assert_eq!(third, Release::Lost(LostLease::NotOwner));
    assert_eq!(holder(&mut observer), Some(("b".into(), 2)));
}

// ---- expiry on the clock at the call, on the path where the row changed (I6, I7) ----

/// `a`'s grant of `k` lapsed; `txn` opens a transaction first, then `other`
/// re-grants `k` to `a` (epoch 2) with `ttl` in a transaction it leaves
/// open. A renew or release of epoch 2 in `txn` then finds no matching row
/// in its snapshot (epoch 1 is committed) and waits for `other`'s row lock:
/// it decides on the row that changed under it. Returns the new grant and
/// `txn`'s start.
fn regrant_in_an_open_transaction_after_txn_began(
    txn: &mut PgConnection,
    other: &mut PgConnection,
    ttl: Duration,
) -> (leasehold::Lease, chrono::DateTime<chrono::Utc>) {
    lapsed_grant(other);
    txn.batch_execute("BEGIN").unwrap();
    let started = crate::spec_1_1_state::transaction_start(txn);
    other.batch_execute("BEGIN").unwrap();
    let lease = granted(acquire(other, "k", "a", ttl).unwrap());
    assert_eq!(lease.epoch(), 2);
    assert!(started < lease.expires_at());
    (lease, started)
}

/// Renew (or release) of a grant that lapsed after the caller's transaction
/// began, reached on the path where the row changed between the caller's
/// first look and its row lock: `lapsed`, nothing changed.
fn call_on_a_changed_row_inside_a_transaction_begun_before_expiry_reports_lapsed(renewing: bool) {
    let db = TestDb::new();
    let (mut txn, pid) = session(&db);
    let (mut other, _) = session(&db);
    let mut observer = db.conn();
    let (lease, started) = regrant_in_an_open_transaction_after_txn_began(
        &mut txn,
        &mut other,
        Duration::from_millis(200),
    );
    wait_until_server_time_passes(&mut observer, lease.expires_at());
    let racer = std::thread::spawn(move || {
        let status = if renewing {
            match renew(&mut txn, "k", "a", 2, TTL).unwrap() {
                Renewal::Renewed { .. } => "ok".to_owned(),
                Renewal::Lost(why) => why.as_status().to_owned(),
            }
        } else {
            match release(&mut txn, "k", "a", 2).unwrap() {
                Release::Released => "ok".to_owned(),
                Release::Lost(why) => why.as_status().to_owned(),
            }
        };
        (status, txn)
    });
    wait_until_blocked_on_lock(&mut observer, pid);
    other.batch_execute("COMMIT").unwrap();
    let expected = table_snapshot(&mut observer);
    let (status, mut txn) = racer.join().unwrap();
    assert_eq!(
        crate::spec_1_1_state::transaction_start(&mut txn),
        started,
        "still the same transaction"
    );
    txn.batch_execute("COMMIT").unwrap();
    assert_eq!(status, "lapsed");
    assert_eq!(table_snapshot(&mut observer), expected, "nothing changed");
    assert_eq!(
        inspect(&mut observer, "k").unwrap(),
        Some(LeaseState::Unowned { epoch: 2 })
    );
}

#[test]
fn renew_of_a_row_changed_under_it_inside_a_transaction_begun_before_expiry_reports_lapsed() {
    call_on_a_changed_row_inside_a_transaction_begun_before_expiry_reports_lapsed(true);
}

#[test]
fn release_of_a_row_changed_under_it_inside_a_transaction_begun_before_expiry_reports_lapsed() {
    call_on_a_changed_row_inside_a_transaction_begun_before_expiry_reports_lapsed(false);
}

/// A renew inside a long transaction that reaches its grant only after the
/// row changed under it sets the expiry from the clock at the call, never
/// from the transaction start.
#[test]
fn renew_of_a_row_changed_under_it_inside_a_long_transaction_sets_expiry_from_the_clock_at_the_call(
) {
    let db = TestDb::new();
    let (mut txn, pid) = session(&db);
    let (mut other, _) = session(&db);
    let mut observer = db.conn();
    let (_, started) = regrant_in_an_open_transaction_after_txn_began(&mut txn, &mut other, TTL);
    wait_until_server_time_passes(&mut observer, started + chrono::Duration::milliseconds(300));
    let racer = std::thread::spawn(move || {
        let before = server_now(&mut txn);
        let renewal = renew(&mut txn, "k", "a", 2, TTL).unwrap();
        let after = server_now(&mut txn);
        txn.batch_execute("COMMIT").unwrap();
        (before, renewal, after)
    });
    wait_until_blocked_on_lock(&mut observer, pid);
    other.batch_execute("COMMIT").unwrap();
    let (before, renewal, after) = racer.join().unwrap();
    let Renewal::Renewed { expires_at } = renewal else {
        panic!("renew of a live grant failed: {renewal:?}");
    };
    let ttl = chrono::Duration::from_std(TTL).unwrap();
    assert!(
        expires_at >= before + ttl,
        "expiry {expires_at} earlier than the call's clock {before} + ttl (transaction began {started})"
    );
    assert!(
        expires_at <= after + ttl,
        "expiry later than server now + ttl"
    );
    assert_eq!(
        inspect(&mut observer, "k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 2,
            expires_at
        })
    );
}

// ---- idempotent acquire re-checks under the lock (I1, I5) ----

#[derive(Clone, Copy, Debug)]
enum Change {
    /// The grant runs out (a renewal to a tiny ttl), nothing else.
    Lapse,
    /// The grant runs out and `b` takes the key over.
    Takeover,
    /// The holder releases.
    Release,
}

/// `a` holds `k` (epoch 1, live for 30 s) and keeps its row locked in an
/// open transaction (a lease check, which writes nothing). A same-owner
/// acquire from another session sees the live grant, so it goes for the
/// row lock and waits (observed in pg_locks). Only then does the holding
/// transaction change the grant — `change` — and commit, so the acquire
/// gets the lock on a row other than the one it first looked at. Returns
/// its outcome.
fn same_owner_acquire_racing(change: Change) -> (Acquisition, Option<LeaseState>) {
    let db = TestDb::new();
    let (mut holding, _) = session(&db);
    let (again, pid) = session(&db);
    let mut observer = db.conn();
    let lease = granted(acquire(&mut holding, "k", "a", TTL).unwrap());
    holding.batch_execute("BEGIN").unwrap();
    leasehold::guards::check_held(&mut holding, &lease.token()).unwrap();
    let racer = in_thread(again, |c| acquire(c, "k", "a", TTL));
    wait_until_blocked_on_lock(&mut observer, pid);
    assert_eq!(
        raw_row(&mut observer, "k").unwrap(),
        "a|1|t|",
        "the row is unchanged"
    );
    match change {
        Change::Lapse | Change::Takeover => {
            let Renewal::Renewed { expires_at } =
                renew(&mut holding, "k", "a", 1, Duration::from_millis(1)).unwrap()
            else {
                panic!("renew failed");
            };
            wait_until_server_time_passes(&mut observer, expires_at);
            if let Change::Takeover = change {
                let taken = granted(acquire(&mut holding, "k", "b", TTL).unwrap());
                assert_eq!(taken.epoch(), 2);
            }
        }
        Change::Release => assert_eq!(
            release(&mut holding, "k", "a", 1).unwrap(),
            Release::Released
        ),
    }
    holding.batch_execute("COMMIT").unwrap();
    let outcome = racer.join().unwrap().unwrap();
    (outcome, inspect(&mut observer, "k").unwrap())
}

/// The grant lapsed and was taken over while the acquire waited for the
/// lock: it must not report b's grant as its own (two holders).
#[test]
fn same_owner_acquire_of_a_grant_taken_over_before_it_got_the_row_lock_is_denied() {
    let (outcome, state) = same_owner_acquire_racing(Change::Takeover);
    assert_eq!(outcome, Acquisition::Denied);
    assert!(
        matches!(&state, Some(LeaseState::Held { owner, epoch: 2, .. }) if owner == "b"),
        "{state:?}"
    );
}

/// The grant was released while the acquire waited for the lock: the
/// acquire must not return the released epoch; it gets a new grant.
#[test]
fn same_owner_acquire_of_a_grant_released_before_it_got_the_row_lock_gets_a_new_grant() {
    let (outcome, state) = same_owner_acquire_racing(Change::Release);
    let lease = granted(outcome);
    assert_eq!((lease.owner(), lease.epoch()), ("a", 3));
    assert_eq!(
        state,
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 3,
            expires_at: lease.expires_at()
        })
    );
}

/// The grant lapsed while the acquire waited for the lock: the acquire must
/// not return the lapsed grant as live; it takes the key with a new epoch.
#[test]
fn same_owner_acquire_of_a_grant_that_lapsed_before_it_got_the_row_lock_gets_a_new_epoch() {
    let (outcome, state) = same_owner_acquire_racing(Change::Lapse);
    let lease = granted(outcome);
    assert_eq!((lease.owner(), lease.epoch()), ("a", 2));
    assert_eq!(
        state,
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 2,
            expires_at: lease.expires_at()
        })
    );
}
