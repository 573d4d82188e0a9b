//! docs/SPECIFICATION.md §1.5: atomic, transactional with the caller, single winner, distinct
//! keys independent (I1, I8, I12), and the documented REPEATABLE READ
//! behaviour.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use leasehold::{Acquisition, LeaseState, Leases, Release, Renewal};

use crate::common::*;

#[test]
fn acquire_in_a_rolled_back_transaction_leaves_no_trace() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let result: Result<(), diesel::result::Error> = conn.transaction(|conn| {
        granted(conn.acquire("k", "a", TTL).unwrap());
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(result.is_err());
    assert_eq!(conn.inspect("k").unwrap(), None);
    assert_eq!(granted(conn.acquire("k", "b", TTL).unwrap()).epoch(), 1);
}

#[test]
fn renew_and_release_in_a_rolled_back_transaction_are_undone() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    let _ = conn.transaction::<(), _, _>(|conn| {
        assert!(matches!(
            conn.renew(
                &leasehold_test_support::grant("k", "a", 1),
                Duration::from_secs(600)
            )
            .unwrap(),
            Renewal::Renewed { .. }
        ));
        assert_eq!(
            conn.release(&leasehold_test_support::grant("k", "a", 1))
                .unwrap(),
            Release::Released
        );
        Err(diesel::result::Error::RollbackTransaction)
    });
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
fn concurrent_acquires_of_a_free_key_have_exactly_one_winner() {
    let db = TestDb::new();
    const CONTENDERS: usize = 16;
    for round in 0..5 {
        let key = format!("k{round}");
        let barrier = Arc::new(Barrier::new(CONTENDERS));
        let handles: Vec<_> = (0..CONTENDERS)
            .map(|i| {
                let (url, barrier, key) = (db.url.clone(), barrier.clone(), key.clone());
                std::thread::spawn(move || {
                    let mut conn = PgConnection::establish(&url).unwrap();
                    barrier.wait();
                    conn.acquire(&key, &format!("w{i}"), TTL).unwrap()
                })
            })
            .collect();
        let results: Vec<Acquisition> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners: Vec<_> = results
            .iter()
            .filter(|r| matches!(r, Acquisition::Granted(_)))
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
    }
}

#[test]
fn concurrent_takeovers_of_a_lapsed_key_have_one_winner_with_a_greater_epoch() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let old = granted(
        conn.acquire("k", "old", Duration::from_millis(200))
            .unwrap(),
    );
    wait_until_server_time_passes(&mut conn, old.expires_at());
    const CONTENDERS: usize = 12;
    let barrier = Arc::new(Barrier::new(CONTENDERS));
    let handles: Vec<_> = (0..CONTENDERS)
        .map(|i| {
            let (url, barrier) = (db.url.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).unwrap();
                barrier.wait();
                conn.acquire("k", &format!("w{i}"), TTL).unwrap()
            })
        })
        .collect();
    let winners: Vec<_> = handles
        .into_iter()
        .filter_map(|h| h.join().unwrap().granted())
        .collect();
    assert_eq!(winners.len(), 1);
    assert_eq!(winners[0].epoch(), 2);
}

fn acquire_blocks_competitor_until(commit: bool) {
    let db = TestDb::new();
    let mut holder = db.conn();
    let mut observer = db.conn();
    holder.batch_execute("BEGIN").unwrap();
    granted(holder.acquire("k", "a", TTL).unwrap());
    let url = db.url.clone();
    let competitor = std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).unwrap();
        conn.acquire("k", "b", TTL).unwrap()
    });
    wait_for_lock_waiter(&mut observer, &db.name);
    holder
        .batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
        .unwrap();
    let outcome = competitor.join().unwrap();
    if commit {
        assert_eq!(outcome, Acquisition::Denied);
    } else {
        let lease = granted(outcome);
        assert_eq!(
            (lease.owner(), lease.epoch()),
            ("b", leasehold::Epoch::new(1)),
            "rollback must leave no trace"
        );
    }
}

#[test]
fn acquire_in_an_open_transaction_blocks_a_competitor_until_commit() {
    acquire_blocks_competitor_until(true);
}

#[test]
fn acquire_in_an_open_transaction_blocks_a_competitor_until_rollback_which_leaves_no_trace() {
    acquire_blocks_competitor_until(false);
}

#[test]
fn a_denied_acquire_in_an_open_transaction_does_not_block_the_holder() {
    let db = TestDb::new();
    let mut holder = db.conn();
    let mut denied = db.conn();
    granted(holder.acquire("k", "a", TTL).unwrap());
    denied.batch_execute("BEGIN").unwrap();
    assert_eq!(denied.acquire("k", "b", TTL).unwrap(), Acquisition::Denied);
    // Were the row locked by the denial, these would fail on the lock timeout.
    holder.batch_execute("SET lock_timeout = '3s'").unwrap();
    assert!(matches!(
        holder
            .renew(&leasehold_test_support::grant("k", "a", 1), TTL)
            .unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        holder
            .release(&leasehold_test_support::grant("k", "a", 1))
            .unwrap(),
        Release::Released
    );
    denied.batch_execute("COMMIT").unwrap();
}

#[test]
fn distinct_keys_never_interact() {
    let db = TestDb::new();
    let mut a = db.conn();
    let mut b = db.conn();
    a.batch_execute("BEGIN").unwrap();
    granted(a.acquire("k1", "a", TTL).unwrap());
    b.batch_execute("SET lock_timeout = '3s'").unwrap();
    let other = granted(b.acquire("k2", "a", TTL).unwrap());
    assert_eq!(other.epoch(), 1);
    assert_eq!(
        b.release(&leasehold_test_support::grant("k2", "a", 1))
            .unwrap(),
        Release::Released
    );
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(b.inspect("k1").unwrap().unwrap().epoch(), 1);
    assert_eq!(b.inspect("k2").unwrap().unwrap().epoch(), 2);
}

/// Documented: under REPEATABLE READ a caller reads its snapshot. A key
/// whose row did not change since the snapshot behaves as under READ
/// COMMITTED; a key freed after the snapshot was taken is not granted: the
/// acquire fails with a serialization error (40001), never a double grant.
#[test]
fn repeatable_read_acquire_of_a_key_freed_after_the_snapshot_fails_with_serialization_error() {
    let db = TestDb::new();
    let mut holder = db.conn();
    let mut reader = db.conn();
    granted(holder.acquire("k", "a", TTL).unwrap());
    reader
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .unwrap();
    assert!(reader.inspect("k").unwrap().unwrap().is_held()); // snapshot taken
    assert_eq!(reader.acquire("k", "b", TTL).unwrap(), Acquisition::Denied);
    assert_eq!(
        holder
            .release(&leasehold_test_support::grant("k", "a", 1))
            .unwrap(),
        Release::Released
    );
    // The snapshot still shows "a" holding the key.
    assert!(reader.inspect("k").unwrap().unwrap().is_held());
    let error = reader.acquire("k", "b", TTL).unwrap_err();
    assert!(
        matches!(
            database_error(&error),
            Some(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::SerializationFailure,
                _
            ))
        ),
        "{error:?}"
    );
    reader.batch_execute("ROLLBACK").unwrap();
    assert_eq!(granted(reader.acquire("k", "b", TTL).unwrap()).epoch(), 3);
}

/// Documented: under REPEATABLE READ / SERIALIZABLE, an acquire racing a
/// grant committed after its snapshot fails with a serialization error
/// (SQLSTATE 40001) instead of granting twice.
#[test]
fn repeatable_read_acquire_racing_a_committed_grant_fails_with_serialization_error() {
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let db = TestDb::new();
        let mut first = db.conn();
        let mut late = db.conn();
        let lease = granted(first.acquire("k", "a", Duration::from_millis(200)).unwrap());
        wait_until_server_time_passes(&mut first, lease.expires_at());
        late.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .unwrap();
        assert!(!late.inspect("k").unwrap().unwrap().is_held()); // snapshot: lapsed
        granted(first.acquire("k", "b", TTL).unwrap()); // takeover commits
        let error = late.acquire("k", "c", TTL).unwrap_err();
        let Some(diesel::result::Error::DatabaseError(kind, _)) = database_error(&error) else {
            panic!("{level}: expected a database error, got {error:?}");
        };
        assert!(
            matches!(
                kind,
                diesel::result::DatabaseErrorKind::SerializationFailure
            ),
            "{level}: {error}"
        );
        late.batch_execute("ROLLBACK").unwrap();
        let state = late.inspect("k").unwrap().unwrap();
        assert!(
            matches!(state, LeaseState::Held { ref owner, epoch: leasehold::Epoch(2), .. } if owner == "b"),
            "{level}: {state:?}"
        );
    }
}

#[test]
fn mixed_operations_from_many_sessions_never_deadlock_or_fail_to_serialize() {
    let db = TestDb::new();
    const WORKERS: usize = 8;
    let barrier = Arc::new(Barrier::new(WORKERS));
    let handles: Vec<_> = (0..WORKERS)
        .map(|i| {
            let (url, barrier) = (db.url.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).unwrap();
                let owner = format!("w{i}");
                barrier.wait();
                let mut grants = 0;
                for n in 0..150 {
                    let key = ["a", "b", "c"][(n + i) % 3];
                    if let Acquisition::Granted(lease) = conn
                        .acquire(key, &owner, Duration::from_millis(50))
                        .unwrap()
                    {
                        grants += 1;
                        let _ = conn
                            .renew(
                                &leasehold_test_support::grant(key, &owner, lease.epoch()),
                                Duration::from_millis(50),
                            )
                            .unwrap();
                        if n % 2 == 0 {
                            let _ = conn
                                .release(&leasehold_test_support::grant(key, &owner, lease.epoch()))
                                .unwrap();
                        }
                    }
                    let _ = conn.inspect(key).unwrap();
                }
                grants
            })
        })
        .collect();
    let grants: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(grants > 0);
}

/// A same-owner acquire inside a transaction locks the row like a grant, so
/// a takeover after the grant lapses waits for that transaction; and lease
/// rows are locked before guard rows, so acquire → admit → release cannot
/// deadlock against a takeover that renews and admits.
#[test]
fn same_owner_reacquire_inside_a_transaction_holds_off_a_takeover_until_commit() {
    let db = TestDb::new();
    let mut holder = db.conn();
    let mut observer = db.conn();
    let lease = granted(holder.acquire("k", "a", STILL_HELD_NEXT_STEP).unwrap());
    holder.batch_execute("BEGIN").unwrap();
    assert_eq!(granted(holder.acquire("k", "a", TTL).unwrap()), lease);
    wait_until_server_time_passes(&mut observer, lease.expires_at());
    let url = db.url.clone();
    let taker = std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).unwrap();
        conn.acquire("k", "b", TTL).unwrap()
    });
    wait_for_lock_waiter(&mut observer, &db.name);
    holder.batch_execute("COMMIT").unwrap();
    let taken = granted(taker.join().unwrap());
    assert_eq!(
        (taken.owner(), taken.epoch()),
        ("b", leasehold::Epoch::new(2))
    );
}

/// An acquire that waited on a concurrent takeover and was then denied keeps
/// no lock on the key, even inside an open transaction: the new holder's
/// renew and release go through at once.
#[test]
fn an_acquire_denied_after_waiting_on_a_concurrent_takeover_keeps_no_lock() {
    let db = TestDb::new();
    let mut taker = db.conn();
    let mut observer = db.conn();
    let old = granted(
        taker
            .acquire("k", "old", Duration::from_millis(200))
            .unwrap(),
    );
    wait_until_server_time_passes(&mut observer, old.expires_at());
    taker.batch_execute("BEGIN").unwrap();
    let new = granted(taker.acquire("k", "new", TTL).unwrap());
    let url = db.url.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let loser = std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).unwrap();
        conn.batch_execute("BEGIN").unwrap();
        let outcome = conn.acquire("k", "loser", TTL).unwrap();
        tx.send(outcome).unwrap();
        // Keep the transaction open until the holder has renewed and released.
        done_rx.recv().unwrap();
        conn.batch_execute("COMMIT").unwrap();
    });
    wait_for_lock_waiter(&mut observer, &db.name);
    taker.batch_execute("COMMIT").unwrap();
    assert_eq!(rx.recv().unwrap(), Acquisition::Denied);
    // Were the loser still holding the row lock, these would hit the timeout.
    observer.batch_execute("SET lock_timeout = '3s'").unwrap();
    assert!(matches!(
        observer
            .renew(&leasehold_test_support::grant("k", "new", new.epoch()), TTL)
            .unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        observer
            .release(&leasehold_test_support::grant("k", "new", new.epoch()))
            .unwrap(),
        Release::Released
    );
    done_tx.send(()).unwrap();
    loser.join().unwrap();
}

/// The calls a refusal can follow a lock wait in: each is made, inside an
/// open transaction, on a grant whose row another transaction has locked,
/// and is refused once that transaction commits the grant's release.
#[derive(Clone, Copy, Debug)]
enum WaitingCall {
    Renew,
    Release,
    RenewMany,
    ReleaseMany,
}

impl WaitingCall {
    /// Makes the call on ("k", "a", `epoch`), with "k2" (held by "a" at
    /// `epoch2`) beside it in the batches; answers whether "k" was refused.
    fn refused(self, conn: &mut PgConnection, epoch: i64, epoch2: i64) -> bool {
        let batch = [("k", epoch), ("k2", epoch2)];
        match self {
            Self::Renew => matches!(
                conn.renew(&leasehold_test_support::grant("k", "a", epoch), TTL)
                    .unwrap(),
                Renewal::Refused(_)
            ),
            Self::Release => matches!(
                conn.release(&leasehold_test_support::grant("k", "a", epoch))
                    .unwrap(),
                Release::Refused(_)
            ),
            Self::RenewMany => {
                let answers = conn
                    .renew_many(&leasehold_test_support::grants("a", &batch), TTL)
                    .unwrap();
                assert!(
                    matches!(answers[1].renewal, Renewal::Renewed { .. }),
                    "{self:?}: the other key is renewed: {answers:?}"
                );
                matches!(answers[0].renewal, Renewal::Refused(_))
            }
            Self::ReleaseMany => {
                let answers = conn
                    .release_many(&leasehold_test_support::grants("a", &batch))
                    .unwrap();
                assert_eq!(
                    answers[1].release,
                    Release::Released,
                    "{self:?}: the other key is released"
                );
                matches!(answers[0].release, Release::Refused(_))
            }
        }
    }
}

/// A renew or release (single or in a batch) that waited for another
/// transaction's lock on the row, and is refused because that transaction
/// changed the grant, keeps no lock on the row, even inside an open
/// transaction: the next owner's grant, renew and release go through at
/// once. PostgreSQL locks the newest version of a row before it checks the
/// statement's conditions again, and keeps that lock when they fail; the
/// calls roll such a lock back.
#[test]
fn a_call_refused_after_waiting_on_a_concurrent_change_keeps_no_lock() {
    for call in [
        WaitingCall::Renew,
        WaitingCall::Release,
        WaitingCall::RenewMany,
        WaitingCall::ReleaseMany,
    ] {
        let db = TestDb::new();
        let mut changer = db.conn();
        let mut observer = db.conn();
        let lease = granted(changer.acquire("k", "a", TTL).unwrap());
        let other = granted(changer.acquire("k2", "a", TTL).unwrap());
        changer.batch_execute("BEGIN").unwrap();
        assert_eq!(
            changer
                .release(&leasehold_test_support::grant("k", "a", lease.epoch()))
                .unwrap(),
            Release::Released
        );
        let url = db.url.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let (epoch, epoch2) = (lease.epoch(), other.epoch());
        let caller = std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            conn.batch_execute("BEGIN").unwrap();
            tx.send(call.refused(&mut conn, epoch.get(), epoch2.get()))
                .unwrap();
            // Keep the transaction open until the next owner is done.
            done_rx.recv().unwrap();
            conn.batch_execute("COMMIT").unwrap();
        });
        wait_for_lock_waiter(&mut observer, &db.name);
        changer.batch_execute("COMMIT").unwrap();
        assert!(rx.recv().unwrap(), "{call:?}: refused");
        // Were the refused call still holding the row lock, the grant would
        // wait out its one-second bound and fail.
        let next = match observer.acquire("k", "b", TTL) {
            Ok(acquisition) => granted(acquisition),
            Err(error) => panic!("{call:?}: the next owner's grant failed: {error}"),
        };
        assert!(
            matches!(
                observer
                    .renew(&leasehold_test_support::grant("k", "b", next.epoch()), TTL)
                    .unwrap(),
                Renewal::Renewed { .. }
            ),
            "{call:?}"
        );
        assert_eq!(
            observer
                .release(&leasehold_test_support::grant("k", "b", next.epoch()))
                .unwrap(),
            Release::Released,
            "{call:?}"
        );
        done_tx.send(()).unwrap();
        caller.join().unwrap();
    }
}

/// The diesel error of the old `LeaseError::Database` (the database failed
/// the call otherwise): kind Other, or Unavailable when the connection died.
fn database_error(error: &leasehold::LeaseError) -> Option<&diesel::result::Error> {
    let operation = error.operation()?;
    let fits = matches!(
        error.kind(),
        leasehold::ErrorKind::Other | leasehold::ErrorKind::Unavailable
    ) && error
        .to_string()
        .starts_with(&format!("lease {operation} failed in the database"));
    if !fits {
        return None;
    }
    std::error::Error::source(error)?.downcast_ref::<diesel::result::Error>()
}
