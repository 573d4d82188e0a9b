//! docs/SPECIFICATION.md §1.5 under interleavings: several real sessions racing on one key,
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
use leasehold::{
    error::LeaseError, Acquisition, ErrorKind, FencingToken, LeaseState, Leases, Refusal, Release,
    Renewal,
};

use crate::common::*;
use leasehold::admin::Operator;
use leasehold::guard::Check;
use leasehold::guard::Fencing;

/// A pid-tagged session: its backend pid lets the test observe exactly
/// this session waiting.
fn session(db: &TestDb) -> (PgConnection, i32) {
    let mut conn = db.conn();
    let pid = query_lines(&mut conn, "SELECT pg_backend_pid()::text AS line")[0]
        .parse()
        .unwrap();
    (conn, pid)
}

/// How long a helper below watches a backend before it gives up. Generous:
/// the suite shares two cores with other suites' servers.
const OBSERVE_FOR: Duration = Duration::from_secs(60);

/// Polls `condition` (one boolean query about backend `pid`) until it holds;
/// on timeout, panics with what pg_stat_activity last said of the backend,
/// so a failure tells a slow machine from a backend that finished or hung.
fn observe(observer: &mut PgConnection, pid: i32, condition: &str, what: &str) {
    let sql = format!("SELECT ({condition}) AS flag");
    let started = std::time::Instant::now();
    while started.elapsed() < OBSERVE_FOR {
        if query_bool(observer, &sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let last = query_lines(
        observer,
        &format!(
            "SELECT coalesce((SELECT format('state=%s wait=%s/%s query=%s', state, wait_event_type, wait_event, left(query, 120)) \
               FROM pg_stat_activity WHERE pid = {pid}), 'gone') AS line"
        ),
    );
    panic!("backend {pid} never {what} within {OBSERVE_FOR:?}; last seen: {last:?}");
}

/// Waits until backend `pid` waits for a row/transaction lock held by
/// another transaction (pg_stat_activity: wait_event_type = 'Lock').
fn wait_until_blocked_on_lock(observer: &mut PgConnection, pid: i32) {
    observe(
        observer,
        pid,
        &format!(
            "EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Lock') \
             AND EXISTS (SELECT 1 FROM pg_locks WHERE pid = {pid} AND NOT granted)"
        ),
        "waited on a lock",
    );
}

/// Waits until backend `pid` polls inside a blocking acquire.
fn wait_until_polling(observer: &mut PgConnection, pid: i32) {
    observe(
        observer,
        pid,
        &format!(
            "EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event = 'PgSleep')"
        ),
        "polled",
    );
}

/// Waits until backend `pid` waits inside a blocking acquire, either
/// polling or queued on a lock.
fn wait_until_waiting(observer: &mut PgConnection, pid: i32) {
    observe(
        observer,
        pid,
        &format!(
            "EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} \
             AND (wait_event = 'PgSleep' OR wait_event_type = 'Lock'))"
        ),
        "waited",
    );
}

fn in_thread<T: Send + 'static>(
    mut conn: PgConnection,
    call: impl FnOnce(&mut PgConnection) -> T + Send + 'static,
) -> JoinHandle<T> {
    std::thread::spawn(move || call(&mut conn))
}

/// `a` holds `k` with a short ttl that has run out (server time).
fn lapsed_grant(conn: &mut PgConnection) -> leasehold::Lease {
    let lease = granted(conn.acquire("k", "a", Duration::from_millis(150)).unwrap());
    wait_until_server_time_passes(conn, lease.expires_at());
    lease
}

fn holder(conn: &mut PgConnection) -> Option<(String, i64)> {
    match conn.inspect("k").unwrap() {
        Some(LeaseState::Held { owner, epoch, .. }) => Some((owner, epoch.get())),
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
    assert_eq!(granted(first.acquire("k", "b", TTL).unwrap()).epoch(), 2);
    let racer = in_thread(second, |c| c.acquire("k", "c", TTL));
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
    let lease = granted(
        holder_conn
            .acquire("k", "a", Duration::from_secs(2))
            .unwrap(),
    );
    holder_conn.batch_execute("BEGIN").unwrap();
    assert!(matches!(
        holder_conn
            .renew(&leasehold_test_support::grant("k", "a", 1), TTL)
            .unwrap(),
        Renewal::Renewed { .. }
    ));
    wait_until_server_time_passes(&mut observer, lease.expires_at());
    let racer = in_thread(competitor, |c| c.acquire("k", "b", TTL));
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
            holder_conn
                .renew(&leasehold_test_support::grant("k", "a", 1), TTL)
                .unwrap(),
            Renewal::Refused(Refusal::Lapsed {
                taken_over_by: Some(2.into())
            })
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

/// The lapsed holder's renew and release do not wait for an uncommitted
/// takeover: a refusal reads the committed state and locks nothing
/// (docs/SPECIFICATION.md §1.5), and that state already says `lapsed`.
/// They answer `lapsed` — a status, never an error — while the takeover is
/// still open, and whichever way it ends they never disturb it.
fn stale_holder_races_takeover(commit: bool) {
    let db = TestDb::new();
    let (mut taker, _) = session(&db);
    let (mut stale, _) = session(&db);
    let mut observer = db.conn();
    lapsed_grant(&mut taker);
    taker.batch_execute("BEGIN").unwrap();
    granted(taker.acquire("k", "b", TTL).unwrap());
    stale.batch_execute("SET lock_timeout = '10s'").unwrap();
    assert_eq!(
        stale
            .renew(&leasehold_test_support::grant("k", "a", 1), TTL)
            .unwrap(),
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    assert_eq!(
        stale
            .release(&leasehold_test_support::grant("k", "a", 1))
            .unwrap(),
        Release::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    taker
        .batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
        .unwrap();
    if commit {
        assert_eq!(holder(&mut observer), Some(("b".into(), 2)));
        assert_eq!(
            stale
                .renew(&leasehold_test_support::grant("k", "a", 1), TTL)
                .unwrap(),
            Renewal::Refused(Refusal::Lapsed {
                taken_over_by: Some(2.into())
            })
        );
    } else {
        assert_eq!(
            observer
                .inspect("k")
                .unwrap()
                .map(|state| (state.as_str(), state.epoch())),
            Some(("lapsed", 1.into()))
        );
    }
}

#[test]
fn lapsed_holders_renew_and_release_answer_lapsed_without_waiting_for_a_takeover_that_commits() {
    stale_holder_races_takeover(true);
}

#[test]
fn lapsed_holders_renew_and_release_answer_lapsed_without_waiting_for_a_takeover_that_rolls_back() {
    stale_holder_races_takeover(false);
}

// ---- release vs acquire ----

/// An uncommitted release frees nothing: a blocking acquire keeps waiting
/// (polling, or queued on the row lock) until the release commits — then it wins with the next
/// epoch — or, after a rollback, times out with TimedOut (57014).
fn release_races_acquire(commit: bool) {
    let db = TestDb::new();
    let (mut releaser, _) = session(&db);
    let (waiter, pid) = session(&db);
    let mut observer = db.conn();
    granted(releaser.acquire("k", "a", TTL).unwrap());
    releaser.batch_execute("BEGIN").unwrap();
    assert_eq!(
        releaser
            .release(&leasehold_test_support::grant("k", "a", 1))
            .unwrap(),
        Release::Released
    );
    let wait = Duration::from_secs(if commit { 30 } else { 1 });
    let racer = in_thread(waiter, move |c| c.acquire_waiting("k", "b", TTL, wait));
    wait_until_waiting(&mut observer, pid);
    if commit {
        releaser.batch_execute("COMMIT").unwrap();
        let lease = racer.join().unwrap().unwrap();
        assert_eq!(
            (lease.owner(), lease.epoch()),
            ("b", leasehold::Epoch::new(3))
        );
    } else {
        releaser.batch_execute("ROLLBACK").unwrap();
        let error = racer.join().unwrap().unwrap_err();
        assert!(
            error.kind() == ErrorKind::TimedOut && error.key().is_some(),
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
    // A ttl no slow start of the waiters can outlast: the first grant must
    // end by its release below, never by lapsing while the test sets up.
    let lease = granted(
        first
            .acquire("k", "first", Duration::from_secs(3600))
            .unwrap(),
    );
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
                let lease = c
                    .acquire_waiting("k", &owner, TTL, Duration::from_secs(300))
                    .unwrap_or_else(|error| panic!("{owner}: {error}"));
                let previous = holding.lock().unwrap().replace(owner.clone());
                assert_eq!(previous, None, "{owner} granted while another held the key");
                assert_eq!(holder(c), Some((owner.clone(), lease.epoch().get())));
                holding.lock().unwrap().take();
                assert_eq!(
                    c.release(&leasehold_test_support::grant("k", &owner, lease.epoch()))
                        .unwrap(),
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
        first
            .release(&leasehold_test_support::grant("k", "first", lease.epoch()))
            .unwrap(),
        Release::Released
    );
    let mut epochs: Vec<leasehold::Epoch> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    epochs.sort_unstable();
    // Each grant is counter + 1 and each release adds one more.
    assert_eq!(epochs, [3, 5, 7, 9, 11]);
}

// ---- REPEATABLE READ / SERIALIZABLE ----

fn is_serialization_failure(error: &LeaseError) -> bool {
    // The database's own error, which leasehold has no kind for.
    error.kind() == ErrorKind::Other
        && matches!(
            std::error::Error::source(error)
                .and_then(|source| source.downcast_ref::<DieselError>()),
            Some(DieselError::DatabaseError(
                DatabaseErrorKind::SerializationFailure,
                _
            ))
        )
}

/// A guard's refusal of a writer whose lease ended: a stale epoch, a lease
/// not held, or an epoch never granted (not a token of another key).
fn is_ended_lease_refusal(error: &LeaseError) -> bool {
    if error.kind() != ErrorKind::Fenced || error.table().is_some() {
        return false;
    }
    match error.refusal() {
        Some(Refusal::StaleEpoch { .. }) | Some(Refusal::EpochNotGranted { .. }) => true,
        Some(Refusal::WrongKey) | None => false,
        // Lease not held: it names the owner of the refused token.
        Some(_) => error.owner().is_some(),
    }
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
            granted(other.acquire("k", "a", TTL).unwrap());
            snap.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
                .unwrap();
            assert!(snap.inspect("k").unwrap().unwrap().is_held()); // snapshot
            let Renewal::Renewed { expires_at } = other
                .renew(&leasehold_test_support::grant("k", "a", 1), TTL)
                .unwrap()
            else {
                panic!("renew failed");
            };
            let error = if operation == "renew" {
                snap.renew(&leasehold_test_support::grant("k", "a", 1), TTL)
                    .unwrap_err()
            } else {
                snap.release(&leasehold_test_support::grant("k", "a", 1))
                    .unwrap_err()
            };
            assert!(
                is_serialization_failure(&error),
                "{level} {operation}: {error:?}"
            );
            snap.batch_execute("ROLLBACK").unwrap();
            assert_eq!(
                snap.inspect("k").unwrap(),
                Some(LeaseState::Held {
                    owner: "a".into(),
                    epoch: 1.into(),
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
        let lease = granted(conn.acquire("k", "a", TTL).unwrap());
        assert!(matches!(
            conn.renew(&leasehold_test_support::grant("k", "a", lease.epoch()), TTL)
                .unwrap(),
            Renewal::Renewed { .. }
        ));
        assert_eq!(
            conn.release(&leasehold_test_support::grant("k", "a", lease.epoch()))
                .unwrap(),
            Release::Released
        );
        conn.batch_execute("COMMIT").unwrap();
        assert_eq!(
            other.inspect("k").unwrap(),
            Some(LeaseState::Free {
                epoch: 2.into(),
                force_released: false
            }),
            "{level}"
        );
    }
}

// ---- many sessions, few keys, mixed calls ----

#[derive(Debug)]
enum TxError {
    Guard(LeaseError),
    Db(DieselError),
}

impl From<LeaseError> for TxError {
    fn from(error: LeaseError) -> Self {
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
                        let lease = match c.acquire(key, &owner, ttl).unwrap() {
                            Acquisition::Granted(lease) => lease,
                            Acquisition::Denied => {
                                // A stale token: every epoch so far is fair game.
                                let epoch = c.inspect(key).unwrap().map_or(1, |s| s.epoch().into());
                                let token = FencingToken::new(
                                    key,
                                    &owner,
                                    leasehold::Epoch::from(epoch.max(1)),
                                )
                                .unwrap();
                                c.admit(&resource, &token, Check::Token)?;
                                return Ok(());
                            }
                        };
                        let token = lease.token();
                        match n % 3 {
                            0 => {
                                c.admit(&resource, &token, Check::Token)?;
                            }
                            1 => {
                                c.admit(&resource, &token, Check::LeaseHeld)?;
                            }
                            _ => {
                                c.admit(&resource, &token, Check::RenewAndAdmit(ttl))?;
                            }
                        }
                        diesel::sql_query("INSERT INTO items (resource, epoch) VALUES ($1, $2)")
                            .bind::<diesel::sql_types::Text, _>(&resource)
                            .bind::<diesel::sql_types::BigInt, _>(lease.epoch())
                            .execute(c)?;
                        if n % 2 == 0 {
                            let _ = c
                                .release(&leasehold_test_support::grant(key, &owner, lease.epoch()))
                                .unwrap();
                        }
                        Ok(())
                    });
                    match result {
                        Ok(()) => {}
                        // A key released between the denial and the
                        // inspect shows its counter, never granted (G7).
                        Err(TxError::Guard(error)) if is_ended_lease_refusal(&error) => {
                            refusals += 1
                        }
                        Err(TxError::Guard(other)) => panic!("{owner}: unexpected error {other:?}"),
                        Err(TxError::Db(error)) => panic!("{owner}: unexpected error {error}"),
                    }
                    let _ = conn
                        .renew(&leasehold_test_support::grant(key, &owner, 1), ttl)
                        .unwrap();
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
/// the order (docs/SPECIFICATION.md §1.5 promises this for one key; across keys in one
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
    let lease2 = granted(one.acquire("k", "b", TTL).unwrap());
    assert_eq!(lease2.epoch(), lease.epoch().get() + 1);
    let racer = in_thread(two, |c| {
        c.batch_execute("SET deadlock_timeout = '50ms'").unwrap();
        c.transaction::<_, DieselError, _>(|c| {
            let first = c
                .renew(&leasehold_test_support::grant("k", "a", 1), TTL)
                .unwrap();
            let second = c.acquire("k", "c", TTL).unwrap();
            let third = c
                .release(&leasehold_test_support::grant("k", "c", 2))
                .unwrap();
            Ok((first, second, third))
        })
    });
    wait_until_blocked_on_lock(&mut observer, pid);
    // Session one keeps using the key while two waits on it.
    assert!(matches!(
        one.renew(&leasehold_test_support::grant("k", "b", 2), TTL)
            .unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(one.inspect("k").unwrap().unwrap().epoch(), 2);
    one.batch_execute("COMMIT").unwrap();
    let (first, second, third) = racer.join().unwrap().unwrap();
    assert_eq!(
        first,
        Renewal::Refused(Refusal::Lapsed {
            taken_over_by: None
        })
    );
    assert_eq!(second, Acquisition::Denied);
    assert_eq!(third, Release::Refused(Refusal::NeverHeld));
    assert_eq!(holder(&mut observer), Some(("b".into(), 2)));
}

// ---- a refusal reads the committed state; expiry on the clock at the call (I6, I7, I14) ----

/// `a`'s grant of `k` lapsed; `txn` opens a transaction first, then `other`
/// re-grants `k` to `a` (epoch 2) with `ttl` in a transaction it leaves
/// open. Returns the new grant and `txn`'s start.
fn regrant_in_an_open_transaction_after_txn_began(
    txn: &mut PgConnection,
    other: &mut PgConnection,
    ttl: Duration,
) -> (leasehold::Lease, chrono::DateTime<chrono::Utc>) {
    lapsed_grant(other);
    txn.batch_execute("BEGIN").unwrap();
    let started = crate::spec_1_1_state::transaction_start(txn);
    other.batch_execute("BEGIN").unwrap();
    let lease = granted(other.acquire("k", "a", ttl).unwrap());
    assert_eq!(lease.epoch(), 2);
    assert!(started < lease.expires_at());
    (lease, started)
}

/// Renew (or release) of epoch 2, inside a transaction begun before the
/// uncommitted re-grant, after that re-grant's expiry: the call does not
/// wait for the re-grant's row lock (a refusal locks nothing and waits for
/// nothing, I14); the committed state says `a`'s grant lapsed, so it
/// answers `lapsed`. After the re-grant commits the answer is the same, and
/// nothing changed.
fn call_inside_a_transaction_begun_before_an_uncommitted_regrant_reports_lapsed(renewing: bool) {
    let db = TestDb::new();
    let (mut txn, _) = session(&db);
    let (mut other, _) = session(&db);
    let mut observer = db.conn();
    let (lease, started) = regrant_in_an_open_transaction_after_txn_began(
        &mut txn,
        &mut other,
        Duration::from_millis(200),
    );
    wait_until_server_time_passes(&mut observer, lease.expires_at());
    // Were the call to wait for `other`, this would fail it instead of
    // hanging the test.
    txn.batch_execute("SET LOCAL lock_timeout = '10s'").unwrap();
    let call = |txn: &mut PgConnection| {
        if renewing {
            match txn
                .renew(&leasehold_test_support::grant("k", "a", 2), TTL)
                .unwrap()
            {
                Renewal::Renewed { .. } => "ok".to_owned(),
                Renewal::Refused(why) => why.as_status().to_owned(),
            }
        } else {
            match txn
                .release(&leasehold_test_support::grant("k", "a", 2))
                .unwrap()
            {
                Release::Released => "ok".to_owned(),
                Release::Refused(why) => why.as_status().to_owned(),
            }
        }
    };
    assert_eq!(call(&mut txn), "lapsed", "while the re-grant is open");
    other.batch_execute("COMMIT").unwrap();
    let expected = table_snapshot(&mut observer);
    assert_eq!(call(&mut txn), "lapsed", "after the re-grant committed");
    assert_eq!(
        crate::spec_1_1_state::transaction_start(&mut txn),
        started,
        "still the same transaction"
    );
    txn.batch_execute("COMMIT").unwrap();
    assert_eq!(table_snapshot(&mut observer), expected, "nothing changed");
    assert_eq!(
        observer
            .inspect("k")
            .unwrap()
            .map(|state| (state.as_str(), state.epoch())),
        Some(("lapsed", 2.into()))
    );
}

#[test]
fn renew_inside_a_transaction_begun_before_an_uncommitted_regrant_reports_lapsed_without_waiting() {
    call_inside_a_transaction_begun_before_an_uncommitted_regrant_reports_lapsed(true);
}

#[test]
fn release_inside_a_transaction_begun_before_an_uncommitted_regrant_reports_lapsed_without_waiting()
{
    call_inside_a_transaction_begun_before_an_uncommitted_regrant_reports_lapsed(false);
}

/// A renew inside a long transaction, of a grant committed after that
/// transaction began, sets the expiry from the clock at the call, never
/// from the transaction start.
#[test]
fn renew_inside_a_long_transaction_sets_expiry_from_the_clock_at_the_call() {
    let db = TestDb::new();
    let (mut txn, _) = session(&db);
    let (mut other, _) = session(&db);
    let mut observer = db.conn();
    let (_, started) = regrant_in_an_open_transaction_after_txn_began(&mut txn, &mut other, TTL);
    other.batch_execute("COMMIT").unwrap();
    wait_until_server_time_passes(&mut observer, started + chrono::Duration::milliseconds(300));
    let before = server_now(&mut txn);
    let renewal = txn
        .renew(&leasehold_test_support::grant("k", "a", 2), TTL)
        .unwrap();
    let after = server_now(&mut txn);
    txn.batch_execute("COMMIT").unwrap();
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
        observer.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 2.into(),
            expires_at
        })
    );
}

// ---- idempotent acquire (I1, I5, I14) ----

/// `a` holds `k` (epoch 1, live for 30 s) and keeps a lease-checked
/// transaction open (check_held: FOR KEY SHARE on the row). A same-owner
/// acquire from another session does not wait for it: it is idempotent at
/// once (same epoch and expiry), and so is the holder's renew. Neither
/// takes a lock the other waits for (docs/SPECIFICATION.md §1.5).
#[test]
fn same_owner_acquire_and_renew_do_not_wait_for_the_holders_open_lease_checked_transaction() {
    let db = TestDb::new();
    let (mut holding, _) = session(&db);
    let (mut again, _) = session(&db);
    let lease = granted(holding.acquire("k", "a", TTL).unwrap());
    holding.batch_execute("BEGIN").unwrap();
    holding.check_held(&lease).unwrap();
    again.batch_execute("SET lock_timeout = '10s'").unwrap();
    let same = granted(again.acquire("k", "a", TTL).unwrap());
    assert_eq!(
        (same.epoch(), same.expires_at()),
        (leasehold::Epoch::new(1), lease.expires_at()),
        "idempotent"
    );
    assert!(matches!(
        again
            .renew(&leasehold_test_support::grant("k", "a", 1), TTL)
            .unwrap(),
        Renewal::Renewed { .. }
    ));
    holding.batch_execute("COMMIT").unwrap();
}

/// `a`'s grant lapsed and `b` is taking `k` over in an open transaction. A
/// same-owner acquire by `a` sees its lapsed grant, goes for the row lock
/// of a new grant and waits (observed in pg_locks). Commit: `a` is denied —
/// it must not report b's grant as its own. Rollback: `a` takes the key
/// with a new epoch — never the lapsed grant as live.
fn same_owner_acquire_racing_a_takeover(commit: bool) -> (Acquisition, Option<LeaseState>) {
    let db = TestDb::new();
    let (mut taker, _) = session(&db);
    let (again, pid) = session(&db);
    let mut observer = db.conn();
    lapsed_grant(&mut taker);
    taker.batch_execute("BEGIN").unwrap();
    assert_eq!(granted(taker.acquire("k", "b", TTL).unwrap()).epoch(), 2);
    let racer = in_thread(again, |c| c.acquire("k", "a", TTL));
    wait_until_blocked_on_lock(&mut observer, pid);
    taker
        .batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
        .unwrap();
    let outcome = racer.join().unwrap().unwrap();
    (outcome, observer.inspect("k").unwrap())
}

#[test]
fn same_owner_acquire_of_a_lapsed_grant_taken_over_while_it_waited_is_denied() {
    let (outcome, state) = same_owner_acquire_racing_a_takeover(true);
    assert_eq!(outcome, Acquisition::Denied);
    assert!(
        matches!(&state, Some(LeaseState::Held { owner, epoch: leasehold::Epoch(2), .. }) if owner == "b"),
        "{state:?}"
    );
}

#[test]
fn same_owner_acquire_of_a_lapsed_grant_whose_takeover_rolled_back_gets_a_new_epoch() {
    let (outcome, state) = same_owner_acquire_racing_a_takeover(false);
    let lease = granted(outcome);
    assert_eq!(
        (lease.owner(), lease.epoch()),
        ("a", leasehold::Epoch::new(2))
    );
    assert_eq!(
        state,
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 2.into(),
            expires_at: lease.expires_at()
        })
    );
}

// ---- operator force-release vs a regrant ----

/// An operator force-releases while another transaction has granted the
/// key again (epoch 3), uncommitted. The force-release locks the key's row
/// before it decides, so it waits for that transaction and then judges the
/// newest row: the epoch form, asked for grant 1, answers `NewerGrant`; the
/// key form, called on a key that was free when it looked, frees grant 3
/// (whatever grant the key has once the call can lock it). Neither decides
/// on a row version it did not lock.
fn force_release_races_a_regrant(by_epoch: bool) {
    let db = TestDb::new();
    let (mut regrant, _) = session(&db);
    let (operator, pid) = session(&db);
    let mut observer = db.conn();
    let first = granted(regrant.acquire("k", "a", TTL).unwrap());
    assert_eq!(first.epoch(), 1);
    // The epoch form: grant 1 is held when the operator looks, and released
    // and regranted uncommitted. The key form: the key is free when the
    // operator looks, and granted again uncommitted.
    if !by_epoch {
        assert_eq!(
            regrant
                .release(&leasehold_test_support::grant("k", "a", 1))
                .unwrap(),
            leasehold::Release::Released
        );
    }
    regrant.batch_execute("BEGIN").unwrap();
    if by_epoch {
        assert_eq!(
            regrant
                .release(&leasehold_test_support::grant("k", "a", 1))
                .unwrap(),
            leasehold::Release::Released
        );
    }
    assert_eq!(granted(regrant.acquire("k", "b", TTL).unwrap()).epoch(), 3);
    let racer = in_thread(operator, move |c| {
        if by_epoch {
            c.force_release_epoch("k", leasehold::Epoch::from(1))
                .map(|forced| format!("{forced:?}"))
        } else {
            c.force_release("k").map(|counter| format!("{counter:?}"))
        }
    });
    wait_until_blocked_on_lock(&mut observer, pid);
    regrant.batch_execute("COMMIT").unwrap();
    let answer = racer.join().unwrap().unwrap();
    if by_epoch {
        assert_eq!(answer, "NewerGrant { current_epoch: Epoch(3) }");
        assert_eq!(holder(&mut observer), Some(("b".into(), 3)));
    } else {
        assert_eq!(answer, "Some(Epoch(4))");
        assert_eq!(holder(&mut observer), None);
        assert_eq!(
            observer.inspect("k").unwrap(),
            Some(LeaseState::Free {
                epoch: 4.into(),
                force_released: true
            })
        );
    }
}

#[test]
fn force_release_of_an_epoch_waits_for_a_regrant_and_leaves_the_newer_grant_alone() {
    force_release_races_a_regrant(true);
}

#[test]
fn force_release_of_a_key_waits_for_a_regrant_and_frees_the_newest_grant() {
    force_release_races_a_regrant(false);
}
