//! docs/SPECIFICATION.md §2: guards, G1–G6, against real transactions.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use leasehold::guard::{Check, GuardRecord};
use leasehold::{
    error::LeaseError, guard::FencedError, Epoch, ErrorKind, FencingToken, LeaseState, Leases,
    Refusal,
};

use crate::common::*;
use leasehold::guard::Fencing;

fn setup(db: &TestDb) -> PgConnection {
    let mut conn = db.conn();
    conn.batch_execute(
        "CREATE TABLE items (seq bigserial PRIMARY KEY, resource text, writer text, epoch bigint)",
    )
    .unwrap();
    conn
}

fn token(key: &str, owner: &str, epoch: i64) -> FencingToken {
    FencingToken::new(key, owner, leasehold::Epoch::from(epoch)).unwrap()
}

fn write(
    conn: &mut PgConnection,
    resource: &str,
    writer: &str,
    epoch: i64,
) -> Result<(), diesel::result::Error> {
    conn.batch_execute(&format!(
        "INSERT INTO items (resource, writer, epoch) VALUES ({}, {}, {epoch})",
        quote(resource),
        quote(writer)
    ))
}

fn items(conn: &mut PgConnection) -> Vec<String> {
    query_lines(
        conn,
        "SELECT format('%s|%s|%s', resource, writer, epoch) AS line FROM items ORDER BY seq",
    )
}

fn fenced_write(
    conn: &mut PgConnection,
    resource: &str,
    token: &FencingToken,
    check: Check,
) -> Result<(), FencedError<diesel::result::Error>> {
    let writer = token.owner().to_owned();
    let epoch = token.epoch();
    // These tests present epochs of their choosing; guards admit only
    // epochs the key has granted (G7, tested on its own).
    pretend_granted(conn, token.key(), epoch.get());
    conn.run_fenced(resource, token, check, |conn| {
        write(conn, resource, &writer, epoch.get())
    })
}

fn stale(error: FencedError<diesel::result::Error>) -> (String, i64, i64) {
    match error {
        FencedError::Guard(e) if stale_epoch_of(&e).is_some() => {
            let (resource, presented, accepted) = stale_epoch_of(&e).unwrap();
            (resource.to_owned(), presented.get(), accepted.get())
        }
        other => panic!("expected StaleEpoch, got {other:?}"),
    }
}

#[test]
fn g1_record_is_the_highest_accepted_epoch_and_never_decreases() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    assert_eq!(conn.inspect_guard("r").unwrap(), None);
    fenced_write(&mut conn, "r", &token("k", "a", 1), Check::Token).unwrap();
    assert_eq!(
        conn.inspect_guard("r").unwrap(),
        Some(GuardRecord {
            lease_key: "k".into(),
            accepted_epoch: 1.into()
        })
    );
    fenced_write(&mut conn, "r", &token("k", "b", 3), Check::Token).unwrap();
    let _ = fenced_write(&mut conn, "r", &token("k", "a", 2), Check::Token).unwrap_err();
    assert_eq!(
        conn.fence("r", "k", leasehold::Epoch::from(1)).unwrap(),
        3,
        "a lower fence must not lower the record"
    );
    assert_eq!(conn.inspect_guard("r").unwrap().unwrap().accepted_epoch, 3);
}

#[test]
fn g2_stale_epoch_is_refused_with_a_typed_error_and_nothing_of_the_write_is_visible() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    fenced_write(&mut conn, "r", &token("k", "new", 2), Check::Token).unwrap();
    let error = fenced_write(&mut conn, "r", &token("k", "old", 1), Check::Token).unwrap_err();
    assert!(error.to_string().contains("stale epoch 1"), "{error}");
    assert_eq!(stale(error), ("r".to_owned(), 1, 2));
    assert_eq!(items(&mut conn), ["r|new|2"]);
    assert_eq!(
        sqlstate_of(&mut conn, "SELECT lease.admit('r', 'k', 1)"),
        "55000"
    );
}

#[test]
fn g3_a_write_rolled_back_by_the_callers_own_error_does_not_raise_the_record() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    fenced_write(&mut conn, "r", &token("k", "a", 1), Check::Token).unwrap();
    pretend_granted(&mut conn, "k", 5);
    let result: Result<(), FencedError<&str>> =
        conn.run_fenced("r", &token("k", "b", 5), Check::Token, |conn| {
            write(conn, "r", "b", 5).unwrap();
            Err("caller changed its mind")
        });
    assert!(matches!(
        result,
        Err(FencedError::Work("caller changed its mind"))
    ));
    assert_eq!(conn.inspect_guard("r").unwrap().unwrap().accepted_epoch, 1);
    assert_eq!(items(&mut conn), ["r|a|1"]);
    // The key's grant 5 is still the one the resource admits.
    fenced_write(&mut conn, "r", &token("k", "c", 5), Check::Token).unwrap();
    assert_eq!(conn.inspect_guard("r").unwrap().unwrap().accepted_epoch, 5);
}

#[test]
fn g3_equal_epochs_are_admitted_again() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    for _ in 0..3 {
        fenced_write(&mut conn, "r", &token("k", "a", 4), Check::Token).unwrap();
    }
    assert_eq!(items(&mut conn).len(), 3);
}

#[test]
fn g5_a_token_of_another_lease_key_is_refused_as_misuse_even_with_a_higher_epoch() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    fenced_write(&mut conn, "r", &token("k", "a", 1), Check::Token).unwrap();
    let error = fenced_write(
        &mut conn,
        "r",
        &token("other-key", "a", 1_000),
        Check::Token,
    )
    .unwrap_err();
    match error {
        FencedError::Guard(e) if wrong_key_of(&e).is_some() => {
            assert_eq!(wrong_key_of(&e), Some(("r", "k", "other-key")));
        }
        other => panic!("expected WrongLeaseKey, got {other:?}"),
    }
    assert_eq!(
        conn.inspect_guard("r").unwrap().unwrap(),
        GuardRecord {
            lease_key: "k".into(),
            accepted_epoch: 1.into()
        }
    );
    assert_eq!(items(&mut conn), ["r|a|1"]);
    let error = conn
        .fence("r", "other-key", leasehold::Epoch::from(5))
        .unwrap_err();
    assert!(
        wrong_key_of(&error) == Some(("r", "k", "other-key")),
        "{error:?}"
    );
}

#[test]
fn g6_lease_checked_write_is_refused_for_a_lapsed_or_superseded_holder_with_its_reason() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    // Held for the first write even on a busy machine; lapsed after the wait.
    let old = granted(conn.acquire("k", "a", STILL_HELD_NEXT_STEP).unwrap());
    fenced_write(&mut conn, "r", old.token(), Check::LeaseHeld).unwrap();
    wait_until_server_time_passes(&mut conn, old.expires_at());
    let lapsed = fenced_write(&mut conn, "r", old.token(), Check::LeaseHeld).unwrap_err();
    assert!(
        matches!(
            lapsed.guard().and_then(not_held_of),
            Some((
                leasehold::Epoch(1),
                Refusal::Lapsed {
                    taken_over_by: None
                }
            ))
        ),
        "{lapsed:?}"
    );
    let new = granted(conn.acquire("k", "b", TTL).unwrap());
    let superseded =
        fenced_write(&mut conn, "r", old.token(), Check::RenewAndAdmit(TTL)).unwrap_err();
    assert!(
        matches!(
            superseded.guard().and_then(not_held_of),
            Some((
                _,
                Refusal::Lapsed {
                    taken_over_by: Some(leasehold::Epoch(2))
                }
            ))
        ),
        "{superseded:?}"
    );
    let stranger = fenced_write(&mut conn, "r", &token("k", "c", 2), Check::LeaseHeld).unwrap_err();
    assert!(
        matches!(
            stranger.guard().and_then(not_held_of),
            Some((_, Refusal::NeverHeld))
        ),
        "{stranger:?}"
    );
    fenced_write(&mut conn, "r", new.token(), Check::LeaseHeld).unwrap();
    assert_eq!(items(&mut conn), ["r|a|1", "r|b|2"]);
}

/// G6: once a lease-checked transaction has checked, a takeover issued while
/// it is open waits for it to end: observed as a lock wait, not by timing.
#[test]
fn g6_takeover_waits_until_an_open_lease_checked_transaction_ends() {
    let db = TestDb::new();
    let mut holder = setup(&db);
    let mut observer = db.conn();
    let lease = granted(holder.acquire("k", "a", STILL_HELD_NEXT_STEP).unwrap());
    holder.batch_execute("BEGIN").unwrap();
    holder.admit("r", &lease, Check::LeaseHeld).unwrap();
    // The lease lapses while the transaction is open.
    wait_until_server_time_passes(&mut observer, lease.expires_at());
    let url = db.url.clone();
    let taker = std::thread::spawn(move || {
        let mut conn = PgConnection::establish(&url).unwrap();
        conn.acquire("k", "b", TTL).unwrap()
    });
    wait_for_lock_waiter(&mut observer, &db.name);
    // Still blocked: the takeover has not happened.
    assert!(matches!(raw_row(&mut observer, "k").as_deref(), Some(row) if row.starts_with("a|1|")));
    write(&mut holder, "r", "a", 1).unwrap();
    holder.batch_execute("COMMIT").unwrap();
    let taken = granted(taker.join().unwrap());
    assert_eq!(
        (taken.owner(), taken.epoch()),
        ("b", leasehold::Epoch::new(2))
    );
    assert_eq!(items(&mut holder), ["r|a|1"]);
}

#[test]
fn g6_acquire_admit_and_write_in_one_transaction_commit_together() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    let result: Result<(), FencedError<diesel::result::Error>> = conn.transaction(|conn| {
        let lease = granted(conn.acquire("k", "a", TTL).unwrap());
        conn.admit("r", &lease, Check::Token)
            .map_err(FencedError::Guard)?;
        write(conn, "r", "a", lease.epoch().get())?;
        Err(FencedError::Work(
            diesel::result::Error::RollbackTransaction,
        ))
    });
    assert!(result.is_err());
    assert_eq!(
        conn.inspect("k").unwrap(),
        None,
        "the acquire rolled back with the write"
    );
    assert_eq!(conn.inspect_guard("r").unwrap(), None);
    assert!(items(&mut conn).is_empty());
}

#[test]
fn renew_and_write_commit_together_or_not_at_all() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    let _ = conn.transaction::<(), diesel::result::Error, _>(|conn| {
        conn.admit(
            "r",
            &lease,
            Check::RenewAndAdmit(Duration::from_secs(3_600)),
        )
        .unwrap();
        write(conn, "r", "a", 1)?;
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Held {
            owner: "a".into(),
            epoch: 1.into(),
            expires_at: lease.expires_at()
        }),
        "a rolled-back renew must not extend the lease"
    );
    assert!(items(&mut conn).is_empty());
    fenced_write(
        &mut conn,
        "r",
        lease.token(),
        Check::RenewAndAdmit(Duration::from_secs(3_600)),
    )
    .unwrap();
    let LeaseState::Held { expires_at, .. } = conn.inspect("k").unwrap().unwrap() else {
        panic!()
    };
    assert!(expires_at > lease.expires_at());
    assert_eq!(conn.check_held(&lease).unwrap(), expires_at);
}

/// G4: many threads write one resource with interleaved epochs. Writers
/// serialise on the guard row, so the sequence taken inside the fenced
/// transaction is the commit order; committed epochs never decrease in it.
#[test]
fn g4_concurrent_writers_with_interleaved_epochs_commit_in_non_decreasing_epoch_order() {
    let db = TestDb::new();
    const WRITERS: usize = 8;
    const WRITES: usize = 40;
    // Each write makes its epoch the key's newest grant unless the key is
    // past it already (fenced_write), so writers that fall behind are
    // refused as superseded or as below the record.
    setup(&db);
    let barrier = Arc::new(Barrier::new(WRITERS));
    let handles: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (url, barrier) = (db.url.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).unwrap();
                barrier.wait();
                let mut refused = 0;
                for n in 0..WRITES {
                    // Epochs climb overall but interleave between writers.
                    let epoch = 1 + ((n * 3 + w * 7) % 11) as i64 + (n / 4) as i64;
                    match fenced_write(
                        &mut conn,
                        "shared",
                        &token("k", &format!("w{w}"), epoch),
                        Check::Token,
                    ) {
                        Ok(()) => {}
                        Err(FencedError::Guard(e)) if stale_epoch_of(&e).is_some() => {
                            let (_, presented, accepted) = stale_epoch_of(&e).unwrap();
                            assert!(presented < accepted);
                            refused += 1;
                        }
                        Err(other) => panic!("unexpected error {other:?}"),
                    }
                }
                refused
            })
        })
        .collect();
    let refused: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let mut conn = db.conn();
    let epochs: Vec<i64> = items(&mut conn)
        .iter()
        .map(|line| line.rsplit('|').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(epochs.len() + refused, WRITERS * WRITES);
    assert!(
        refused > 0 && !epochs.is_empty(),
        "the mix must both admit and refuse ({} admitted, {refused} refused)",
        epochs.len()
    );
    for pair in epochs.windows(2) {
        assert!(
            pair[0] <= pair[1],
            "a write with epoch {} committed after epoch {}",
            pair[1],
            pair[0]
        );
    }
    assert_eq!(
        conn.inspect_guard("shared")
            .unwrap()
            .unwrap()
            .accepted_epoch,
        *epochs.last().unwrap()
    );
}

/// Renew-plus-write racing a takeover: exactly one side writes.
#[test]
fn renew_plus_write_racing_a_takeover_has_exactly_one_winner() {
    let db = TestDb::new();
    drop(setup(&db));
    let mut conn = db.conn();
    let mut holder_wins = 0;
    for round in 0..12 {
        let key = format!("k{round}");
        let resource = format!("r{round}");
        let lease = granted(conn.acquire(&key, "a", Duration::from_millis(150)).unwrap());
        let barrier = Arc::new(Barrier::new(2));
        let holder = {
            let (url, barrier, resource, token) = (
                db.url.clone(),
                barrier.clone(),
                resource.clone(),
                lease.token().clone(),
            );
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).unwrap();
                barrier.wait();
                // Heartbeat late, near expiry, varying per round.
                std::thread::sleep(Duration::from_millis(110 + (round % 6) * 10));
                fenced_write(
                    &mut conn,
                    &resource,
                    &token,
                    Check::RenewAndAdmit(Duration::from_secs(60)),
                )
                .is_ok()
            })
        };
        let taker = {
            let (url, barrier, resource, key, old_expiry) = (
                db.url.clone(),
                barrier.clone(),
                resource.clone(),
                key.clone(),
                lease.expires_at(),
            );
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).unwrap();
                barrier.wait();
                for _ in 0..10_000 {
                    match conn.acquire(&key, "b", TTL).unwrap() {
                        leasehold::Acquisition::Granted(new) => {
                            return fenced_write(
                                &mut conn,
                                &resource,
                                new.token(),
                                Check::LeaseHeld,
                            )
                            .is_ok();
                        }
                        leasehold::Acquisition::Denied => {
                            if let Some(LeaseState::Held { expires_at, .. }) =
                                conn.inspect(&key).unwrap()
                            {
                                if expires_at > old_expiry {
                                    return false; // the holder renewed: it won
                                }
                            }
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                }
                panic!("taker never resolved");
            })
        };
        let (holder_won, taker_won) = (holder.join().unwrap(), taker.join().unwrap());
        assert!(
            holder_won ^ taker_won,
            "round {round}: holder {holder_won}, taker {taker_won}"
        );
        let writers: Vec<String> = items(&mut conn)
            .into_iter()
            .filter(|l| l.starts_with(&format!("{resource}|")))
            .collect();
        assert_eq!(
            writers,
            [if holder_won {
                format!("{resource}|a|1")
            } else {
                format!("{resource}|b|2")
            }]
        );
        holder_wins += usize::from(holder_won);
    }
    eprintln!("holder won {holder_wins} of 12 rounds");
}

#[test]
fn fenced_work_in_a_savepoint_rolls_back_alone_inside_an_outer_transaction() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    fenced_write(&mut conn, "r", &token("k", "new", 2), Check::Token).unwrap();
    conn.transaction::<(), diesel::result::Error, _>(|conn| {
        write(conn, "outer", "me", 0)?;
        let refused = fenced_write(conn, "r", &token("k", "old", 1), Check::Token).unwrap_err();
        assert!(matches!(
            refused,
            FencedError::Guard(ref e) if stale_epoch_of(e).is_some()
        ));
        fenced_write(conn, "r", &token("k", "new", 2), Check::Token).unwrap();
        Ok(())
    })
    .unwrap();
    assert_eq!(items(&mut conn), ["r|new|2", "outer|me|0", "r|new|2"]);
}

#[test]
fn fenced_writes_work_through_the_pool_client() {
    let db = TestDb::new();
    drop(setup(&db));
    let mut client = leasehold::LeaseClient::connect(&db.url, 2).unwrap();
    let lease = client.acquire("k", "a", TTL).unwrap().granted().unwrap();
    client
        .run_fenced("r", &lease, Check::LeaseHeld, |conn| {
            write(conn, "r", "a", 1)
        })
        .unwrap();
    let stale = client.run_fenced("r", &token("k", "z", 1), Check::Token, |conn| {
        write(conn, "r", "z", 1)
    });
    assert!(stale.is_ok(), "equal epoch is admitted: {stale:?}");
    assert_eq!(items(&mut db.conn()), ["r|a|1", "r|z|1"]);
}

#[test]
fn operator_fence_after_a_lapse_refuses_the_old_holder_before_the_next_one_writes() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    let old = granted(conn.acquire("k", "a", Duration::from_millis(200)).unwrap());
    fenced_write(&mut conn, "r", old.token(), Check::Token).unwrap();
    wait_until_server_time_passes(&mut conn, old.expires_at());
    let counter = conn.inspect("k").unwrap().unwrap().epoch();
    assert_eq!(conn.fence("r", "k", counter).unwrap(), counter.get() + 1);
    let error = fenced_write(&mut conn, "r", old.token(), Check::Token).unwrap_err();
    assert_eq!(stale(error), ("r".to_owned(), 1, 2));
    let next = granted(conn.acquire("k", "b", TTL).unwrap());
    fenced_write(&mut conn, "r", next.token(), Check::Token).unwrap();
    // Fencing a brand-new resource registers it.
    assert_eq!(next.epoch(), 2);
    assert_eq!(
        conn.fence("fresh", "k", leasehold::Epoch::from(2)).unwrap(),
        3
    );
    assert_eq!(
        conn.inspect_guard("fresh").unwrap(),
        Some(GuardRecord {
            lease_key: "k".into(),
            accepted_epoch: 3.into()
        })
    );
}

#[test]
fn invalid_guard_input_is_refused_with_every_violation_and_changes_nothing() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    fenced_write(&mut conn, "r", &token("k", "a", 1), Check::Token).unwrap();
    let error = conn
        .admit("", &token("k", "a", 1), Check::Token)
        .unwrap_err();
    assert!(
        error.kind() == ErrorKind::InvalidInput
            && error.violations() == ["resource must not be empty"],
        "{error:?}"
    );
    let error = conn.fence("", "", leasehold::Epoch::from(-1)).unwrap_err();
    assert!(
        error.kind() == ErrorKind::InvalidInput
            && error.violations()
                == [
                    "resource must not be empty",
                    "key must not be empty",
                    "up_to must not be negative"
                ],
        "{error:?}"
    );
    for sql in [
        "SELECT lease.admit(NULL, 'k', 1)",
        "SELECT lease.admit('r', 'k', 0)",
        "SELECT lease.admit_held('r', 'k', NULL, 1)",
        "SELECT lease.renew_admit('r', 'k', 'a', 1, interval '0')",
        "SELECT lease.fence('r', 'k', NULL)",
        "SELECT * FROM lease.inspect_guard('')",
    ] {
        assert_eq!(sqlstate_of(&mut conn, sql), "22023", "{sql}");
    }
    assert_eq!(conn.inspect_guard("r").unwrap().unwrap().accepted_epoch, 1);
    assert_eq!(items(&mut conn), ["r|a|1"]);
}

#[test]
fn a_plain_role_can_use_guards_but_cannot_touch_the_guard_table() {
    let db = TestDb::new();
    let role = format!("{}_guard_user", db.name);
    db.conn()
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .unwrap();
    pretend_granted(&mut db.conn(), "k", 1);
    {
        let mut conn = db.conn_as(&role);
        conn.batch_execute("BEGIN").unwrap();
        conn.admit("r", &token("k", "a", 1), Check::Token).unwrap();
        conn.batch_execute("COMMIT").unwrap();
        for sql in [
            "SELECT * FROM lease.guards",
            "UPDATE lease.guards SET accepted_epoch = 0",
            "DELETE FROM lease.guards",
        ] {
            assert_eq!(sqlstate_of(&mut conn, sql), "42501", "{sql}");
        }
    }
    db.conn()
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .unwrap();
}

// ---- fence bounds (G1) ----

/// `up_to = 0` is a valid fence that refuses nothing new: epochs start at 1,
/// so a fresh resource's record becomes 1 (every real epoch is admitted) and
/// an existing record stays where it is.
#[test]
fn fence_up_to_zero_is_accepted_and_refuses_nothing_new() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    pretend_granted(&mut conn, "k", 1);
    assert_eq!(
        conn.fence("fresh", "k", leasehold::Epoch::from(0)).unwrap(),
        1
    );
    assert_eq!(
        conn.inspect_guard("fresh").unwrap(),
        Some(GuardRecord {
            lease_key: "k".into(),
            accepted_epoch: 1.into()
        })
    );
    fenced_write(&mut conn, "fresh", &token("k", "a", 1), Check::Token).unwrap();
    fenced_write(&mut conn, "r", &token("k", "a", 2), Check::Token).unwrap();
    assert_eq!(
        conn.fence("r", "k", leasehold::Epoch::from(0)).unwrap(),
        2,
        "fencing through 0 must not move a record"
    );
    fenced_write(&mut conn, "r", &token("k", "b", 2), Check::Token).unwrap();
    assert_eq!(
        sqlstate_of(&mut conn, "SELECT lease.fence('r', 'k', 0)"),
        "00000"
    );
    assert_eq!(items(&mut conn), ["fresh|a|1", "r|a|2", "r|b|2"]);
}

/// A negative `up_to` is invalid input: 22023 naming `up_to`, and nothing
/// is registered or moved.
#[test]
fn fence_with_a_negative_up_to_raises_22023_naming_up_to_and_changes_nothing() {
    let db = TestDb::new();
    let mut conn = setup(&db);
    fenced_write(&mut conn, "r", &token("k", "a", 3), Check::Token).unwrap();
    for up_to in [-1, i64::MIN] {
        for resource in ["r", "fresh"] {
            let error = conn
                .fence(resource, "k", leasehold::Epoch::from(up_to))
                .unwrap_err();
            assert!(
                error.kind() == ErrorKind::InvalidInput
                    && error.violations() == ["up_to must not be negative"],
                "{resource} {up_to}: {error:?}"
            );
            assert_eq!(
                sqlstate_of(
                    &mut conn,
                    &format!(
                        "SELECT lease.fence({}, 'k', CAST({up_to} AS bigint))",
                        quote(resource)
                    )
                ),
                "22023",
                "{resource} {up_to}"
            );
        }
    }
    assert_eq!(conn.inspect_guard("fresh").unwrap(), None);
    assert_eq!(
        conn.inspect_guard("r").unwrap(),
        Some(GuardRecord {
            lease_key: "k".into(),
            accepted_epoch: 3.into()
        })
    );
    fenced_write(&mut conn, "r", &token("k", "b", 3), Check::Token).unwrap();
}

/// The old `LeaseError::StaleEpoch`: its resource, presented epoch and
/// the resource's accepted epoch.
fn stale_epoch_of(error: &LeaseError) -> Option<(&str, Epoch, Epoch)> {
    match (error.kind(), error.refusal()) {
        (ErrorKind::Fenced, Some(Refusal::StaleEpoch { accepted })) => {
            Some((error.resource()?, error.epoch()?, accepted))
        }
        _ => None,
    }
}

/// The old `LeaseError::WrongLeaseKey`: its resource, the key fencing it
/// and the presented token's key.
fn wrong_key_of(error: &LeaseError) -> Option<(&str, &str, &str)> {
    match (error.kind(), error.refusal()) {
        (ErrorKind::Fenced, Some(Refusal::WrongKey)) => {
            Some((error.resource()?, error.fenced_by()?, error.key()?))
        }
        _ => None,
    }
}

/// The old `LeaseError::LeaseNotHeld`: its epoch and reason.
fn not_held_of(error: &LeaseError) -> Option<(Epoch, Refusal)> {
    let held_check = error.kind() == ErrorKind::Fenced
        && error.table().is_none()
        && error.key().is_some()
        && error.owner().is_some();
    held_check.then_some((error.epoch()?, error.refusal()?))
}
