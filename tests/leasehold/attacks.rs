//! Attacks from other roles on a shared deployment (docs/SPECIFICATION.md
//! §1.3–§1.5, G7): a non-superuser database owner installed leasehold, the
//! application holds leases, and an attacker with nothing but CONNECT and
//! what `inspect` tells everyone tries to stall, outwait or fence it out.
//! One test per hole the security review found; each failed before the fix.

use std::sync::mpsc;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::PgConnection;
use leasehold::{
    error::{LeaseError, LOCK_WAIT_BOUND},
    guard::GuardRecord,
    Acquisition, ErrorKind, FencingToken, LeaseState, Leases, Refusal, Release, Renewal,
};
use leasehold_test_support::Deployment;

use crate::common::*;
use leasehold::guard::Check;
use leasehold::guard::Fencing;

fn pid_of(conn: &mut PgConnection) -> i32 {
    query_lines(conn, "SELECT pg_backend_pid()::text AS line")[0]
        .parse()
        .expect("a pid")
}

/// Waits until backend `pid` waits for a lock another transaction holds.
fn wait_until_blocked(observer: &mut PgConnection, pid: i32) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Lock') AS flag"
    );
    for _ in 0..4_000 {
        if query_bool(observer, &sql) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("backend {pid} never waited on a lock");
}

/// Runs `call` on its own thread and returns its result, failing the test
/// (instead of hanging it) if the call has not returned after a minute: for
/// calls that must return while another transaction keeps a lock.
fn returns<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(call());
    });
    receiver
        .recv_timeout(Duration::from_secs(60))
        .expect("the call did not return while another transaction kept the row locked")
}

/// What anybody learns from `inspect`: enough to present the holder's token.
fn public_token(conn: &mut PgConnection, key: &str) -> FencingToken {
    match conn.inspect(key).unwrap() {
        Some(LeaseState::Held { owner, epoch, .. }) => {
            FencingToken::new(key, &owner, epoch).unwrap()
        }
        other => panic!("expected a held key, got {other:?}"),
    }
}

/// Hole 2 (§1.5, I14): calls that check the lease or are refused, made by
/// somebody who does not hold it and kept in an open transaction, do not
/// hold up the holder's renew or release.
#[test]
fn an_attackers_open_transaction_never_holds_up_the_holders_renew_or_release() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("jobs/1", "app-1", TTL).unwrap());
    let mut attacker = deployment.conn_as(&deployment.attacker);
    let token = public_token(&mut attacker, "jobs/1");
    attacker.batch_execute("BEGIN").unwrap();
    attacker.check_held(&token).unwrap();
    attacker
        .admit("attacker/resource", &token, Check::LeaseHeld)
        .unwrap();
    let again = granted(attacker.acquire("jobs/1", "app-1", TTL).unwrap());
    assert_eq!(
        again.epoch(),
        lease.epoch(),
        "a same-owner acquire is idempotent"
    );
    assert_eq!(
        attacker
            .renew(
                &leasehold_test_support::grant("jobs/1", "nobody", lease.epoch()),
                TTL
            )
            .unwrap(),
        Renewal::Refused(Refusal::NeverHeld)
    );
    assert_eq!(
        attacker
            .release(&leasehold_test_support::grant(
                "jobs/1",
                "nobody",
                lease.epoch()
            ))
            .unwrap(),
        Release::Refused(Refusal::NeverHeld)
    );
    // Were the holder's calls to wait for the attacker, lock_timeout would
    // fail them instead of hanging the test.
    app.batch_execute("SET lock_timeout = '10s'").unwrap();
    assert!(matches!(
        app.renew(
            &leasehold_test_support::grant("jobs/1", "app-1", lease.epoch()),
            TTL
        )
        .unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        app.release(&leasehold_test_support::grant(
            "jobs/1",
            "app-1",
            lease.epoch()
        ))
        .unwrap(),
        Release::Released
    );
    attacker.batch_execute("ROLLBACK").unwrap();
}

/// Hole 3 (§1.3, §1.5, I14): a row another transaction keeps locked — here
/// the holder's lease-checked transaction, still open after its grant
/// lapsed — never keeps an acquire past its wait, nor one without a wait
/// past LOCK_WAIT_BOUND. Both give up with TimedOut (57014) while the lock
/// is still held; after it ends, the key is granted.
#[test]
fn a_row_kept_locked_by_another_transaction_never_keeps_an_acquire_past_its_wait() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(
        app.acquire("jobs/2", "app-1", STILL_HELD_NEXT_STEP)
            .unwrap(),
    );
    app.batch_execute("BEGIN").unwrap();
    app.check_held(&lease).unwrap();
    wait_until_server_time_passes(&mut app, lease.expires_at());

    let url = deployment.url_as(&deployment.worker);
    let (no_wait, with_wait, sqlstate, messages) = returns(move || {
        let mut worker: diesel::PgConnection = diesel::Connection::establish(&url).unwrap();
        let no_wait = worker.acquire("jobs/2", "worker-1", TTL);
        let with_wait = worker.acquire_waiting("jobs/2", "worker-1", TTL, Duration::from_secs(1));
        let sqlstate = sqlstate_of(
            &mut worker,
            "SELECT * FROM lease.acquire('jobs/2', 'worker-1', '1 min', '300 ms')",
        );
        let messages = ["0", "300 ms"].map(|wait| {
            let call =
                format!("SELECT * FROM lease.acquire('jobs/2', 'worker-1', '1 min', '{wait}')");
            match diesel::RunQueryDsl::execute(diesel::sql_query(&call), &mut worker) {
                Err(diesel::result::Error::DatabaseError(_, info)) => info.message().to_owned(),
                other => panic!("{call}: expected an error, got {other:?}"),
            }
        });
        (no_wait, with_wait, sqlstate, messages)
    });
    match no_wait {
        Err(error) if error.kind() == ErrorKind::TimedOut => {
            assert_eq!(
                (error.key(), error.waited()),
                (Some("jobs/2"), Some(LOCK_WAIT_BOUND))
            )
        }
        other => panic!("expected TimedOut, got {other:?}"),
    }
    match with_wait {
        Err(error) if error.kind() == ErrorKind::TimedOut && error.key().is_some() => {
            assert_eq!(error.waited(), Some(Duration::from_secs(1)))
        }
        other => panic!("expected TimedOut, got {other:?}"),
    }
    assert_eq!(sqlstate, "57014");
    // The message names the bound that ran out: the 1 second of a call
    // without a wait, or the caller's wait.
    assert!(
        messages[0].ends_with(
            "stayed locked by another transaction for 1 second (the bound of a call without a wait)"
        ),
        "{}",
        messages[0]
    );
    assert!(
        messages[1]
            .ends_with("stayed locked by another transaction for the whole wait of 00:00:00.3"),
        "{}",
        messages[1]
    );

    app.batch_execute("COMMIT").unwrap();
    let mut worker = deployment.conn_as(&deployment.worker);
    assert_eq!(
        granted(worker.acquire("jobs/2", "worker-1", TTL).unwrap()).epoch(),
        2
    );
}

/// Hole 4 (§1.3): the expiry of a grant that had to wait for a row lock is
/// computed from the clock after the wait, so with a ttl shorter than the
/// wait the grant is still live on arrival.
#[test]
fn a_grant_that_waited_for_a_row_lock_is_not_expired_on_arrival() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let mut app = deployment.conn_as(&deployment.app);
    let first = granted(
        app.acquire("jobs/3", "app-1", Duration::from_millis(200))
            .unwrap(),
    );
    wait_until_server_time_passes(&mut admin, first.expires_at());
    // The worker takes the lapsed key over in a transaction it keeps open.
    let mut taker = deployment.conn_as(&deployment.worker);
    taker.batch_execute("BEGIN").unwrap();
    granted(taker.acquire("jobs/3", "worker-1", TTL).unwrap());

    let mut waiter = deployment.conn_as(&deployment.app);
    let pid = pid_of(&mut waiter);
    let ttl = Duration::from_secs(1);
    let racer = std::thread::spawn(move || {
        waiter.acquire_waiting("jobs/3", "app-2", ttl, Duration::from_secs(30))
    });
    wait_until_blocked(&mut admin, pid);
    let blocked_at = server_now(&mut admin);
    // Keep it waiting for longer than its ttl, then give the key up.
    wait_until_server_time_passes(
        &mut admin,
        blocked_at + chrono::Duration::milliseconds(1_500),
    );
    let rolled_back_at = server_now(&mut admin);
    taker.batch_execute("ROLLBACK").unwrap();
    let lease = racer.join().unwrap().unwrap();
    assert_eq!(lease.epoch(), 2);
    assert!(
        lease.expires_at() >= rolled_back_at + chrono::Duration::from_std(ttl).unwrap(),
        "grant expires at {} although the wait ended after {rolled_back_at}",
        lease.expires_at()
    );
}

/// Hole 6 (G7): an epoch the key never granted fences nothing — not above
/// the counter, not for a key never leased — so nobody can make a resource
/// refuse its real holders; `fence` is an operator action PUBLIC cannot
/// run, and refuses an `up_to` that would overflow or was never granted.
#[test]
fn forged_epochs_cannot_fence_out_the_real_holders() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("jobs/4", "app-1", TTL).unwrap());
    let mut attacker = deployment.conn_as(&deployment.attacker);
    for (key, epoch, counter) in [
        ("jobs/4", i64::MAX, 1),
        ("jobs/4", 2, 1),
        ("jobs/never-leased", 1, 0),
    ] {
        let forged = FencingToken::new(key, "app-1", leasehold::Epoch::from(epoch)).unwrap();
        match attacker.admit("orders", &forged, Check::Token) {
            Err(error)
                if error.kind() == ErrorKind::Fenced
                    && matches!(error.refusal(), Some(Refusal::EpochNotGranted { .. })) =>
            {
                assert_eq!(
                    (error.epoch(), error.refusal()),
                    (
                        Some(leasehold::Epoch::new(epoch)),
                        Some(Refusal::EpochNotGranted {
                            counter: leasehold::Epoch::new(counter)
                        })
                    )
                )
            }
            other => panic!("{key} {epoch}: expected EpochNotGranted, got {other:?}"),
        }
    }
    assert_eq!(
        sqlstate_of(&mut attacker, "SELECT lease.fence('orders', 'jobs/4', 1)"),
        "42501",
        "fence is not granted to PUBLIC"
    );
    assert!(matches!(
        attacker.fence("orders", "jobs/4", leasehold::Epoch::from(1)),
        Err(ref error) if database_error(error).is_some()
    ));
    assert_eq!(attacker.inspect_guard("orders").unwrap(), None);

    // The real holder writes.
    app.admit("orders", &lease, Check::Token).unwrap();

    // An operator the owner granted fence to: overflow and never-granted
    // epochs are refused; the counter itself fences.
    deployment
        .conn_as(&deployment.owner)
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION lease.fence(text, text, bigint) TO {}",
            deployment.operator
        ))
        .unwrap();
    let mut operator = deployment.conn_as(&deployment.operator);
    match operator.fence("orders", "jobs/4", leasehold::Epoch::from(i64::MAX)) {
        Err(error) if error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty() => {
            assert_eq!(
                error.violations(),
                ["up_to must be below 9223372036854775807"]
            )
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert!(matches!(
        operator.fence("orders", "jobs/4", leasehold::Epoch::from(2)),
        Err(error) if error.kind() == ErrorKind::Fenced
            && error.refusal()
                == Some(Refusal::EpochNotGranted {
                    counter: leasehold::Epoch(1)
                })
    ));
    assert_eq!(
        operator
            .fence("orders", "jobs/4", leasehold::Epoch::from(1))
            .unwrap(),
        2
    );
    assert_eq!(
        app.inspect_guard("orders").unwrap(),
        Some(GuardRecord {
            lease_key: "jobs/4".into(),
            accepted_epoch: 2.into()
        })
    );
}

/// Hole 7 (§1.5): `fence` then `admit_held` in one transaction, against a
/// concurrent `renew_and_admit` of the same key and resource, used to lock
/// guard row then lease row on one side and the reverse on the other, and
/// deadlock. Now the lease row is always locked first, in modes that let
/// the renewal through: the renewal waits for the guard row and completes
/// after the commit.
#[test]
fn fence_then_admit_held_against_a_concurrent_renew_and_admit_does_not_deadlock() {
    let deployment = Deployment::new();
    deployment
        .conn_as(&deployment.owner)
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION lease.fence(text, text, bigint) TO {}",
            deployment.operator
        ))
        .unwrap();
    let mut admin = deployment.admin();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("jobs/5", "app-1", TTL).unwrap());
    let mut operator = deployment.conn_as(&deployment.operator);
    operator.batch_execute("BEGIN").unwrap();
    assert_eq!(
        operator
            .fence("orders", "jobs/5", leasehold::Epoch::from(0))
            .unwrap(),
        1
    );

    let pid = pid_of(&mut app);
    let token = lease.token().clone();
    let renewing =
        std::thread::spawn(move || app.admit("orders", &token, Check::RenewAndAdmit(TTL)));
    wait_until_blocked(&mut admin, pid);
    operator.admit("orders", &lease, Check::LeaseHeld).unwrap();
    operator.batch_execute("COMMIT").unwrap();
    renewing.join().unwrap().unwrap();
    assert_eq!(
        admin
            .inspect_guard("orders")
            .unwrap()
            .unwrap()
            .accepted_epoch,
        1
    );
}

/// Hole 9 (§1.3): keys, owners and resource names are capped at 16 KiB
/// (16384 bytes, counted in UTF-8); a name one byte longer, or a 20 MiB one,
/// is refused with 22023 naming the cap, and nothing is stored.
#[test]
fn names_are_capped_at_16_kib_and_longer_ones_are_refused_storing_nothing() {
    let deployment = Deployment::new();
    let mut admin = deployment.admin();
    let mut app = deployment.conn_as(&deployment.app);
    let longest = "k".repeat(16_384);
    let lease = granted(app.acquire(&longest, &"o".repeat(16_384), TTL).unwrap());
    app.admit(&"r".repeat(16_384), &lease.token(), Check::Token)
        .unwrap();
    assert!(app.inspect(&longest).unwrap().unwrap().is_held());
    let before = table_snapshot(&mut admin);

    let too_long = "k".repeat(16_385);
    let multibyte = "é".repeat(8_193); // 16386 bytes in 8193 characters
    let huge = "k".repeat(20 << 20);
    for key in [&too_long, &multibyte, &huge] {
        match app.acquire(key, "o", TTL) {
            Err(error)
                if error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty() =>
            {
                assert_eq!(error.violations(), ["key must be at most 16384 bytes"])
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }
    match app.acquire("k", &too_long, TTL) {
        Err(error) if error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty() => {
            assert_eq!(error.violations(), ["owner must be at most 16384 bytes"])
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    match app.admit(&too_long, &lease, Check::Token) {
        Err(error) if error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty() => {
            assert_eq!(error.violations(), ["resource must be at most 16384 bytes"])
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert_eq!(table_snapshot(&mut admin), before, "nothing stored");
}

/// Hole 12, the decision (docs/SPECIFICATION.md §1.2): a grant made inside
/// a transaction that rolls back never happened, so the next grant gets the
/// same epoch — and an admission made with it in the same transaction rolls
/// back with it. A token is a token only once its grant committed: the
/// library's `acquire` on a connection outside a transaction commits before
/// it returns; inside one, use the token only for writes in that same
/// transaction (the guards in the database), never for files or objects
/// before the commit.
#[test]
fn a_grant_rolled_back_gives_its_epoch_to_the_next_grant_and_takes_its_admissions_with_it() {
    let deployment = Deployment::new();
    let mut app = deployment.conn_as(&deployment.app);
    app.batch_execute("BEGIN").unwrap();
    let uncommitted = granted(app.acquire("jobs/6", "app-1", TTL).unwrap());
    app.admit("orders", &uncommitted, Check::Token).unwrap();
    app.batch_execute("ROLLBACK").unwrap();

    let mut worker = deployment.conn_as(&deployment.worker);
    let next = granted(worker.acquire("jobs/6", "worker-1", TTL).unwrap());
    assert_eq!(next.epoch(), uncommitted.epoch(), "the epoch is reused");
    assert_eq!(worker.inspect_guard("orders").unwrap(), None);
    assert_eq!(
        app.acquire("jobs/6", "app-1", TTL).unwrap(),
        Acquisition::Denied
    );
}

/// docs/guide/security.md "Security model", hardening checklist: with EXECUTE on the whole
/// schema revoked from PUBLIC and the API granted to the application role
/// alone, the application keeps working (leases, guards) and any other role
/// is refused by PostgreSQL itself (42501) before leasehold runs at all.
#[test]
fn the_api_revoked_from_public_and_granted_to_the_application_alone_works_for_it_only() {
    let deployment = Deployment::new();
    deployment
        .conn_as(&deployment.owner)
        .batch_execute(&format!(
            "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA lease FROM PUBLIC;
             GRANT EXECUTE ON FUNCTION lease.acquire(text, text, interval, interval),
                   lease.renew(text, text, bigint, interval), lease.release(text, text, bigint),
                   lease.inspect(text), lease.admit(text, text, bigint),
                   lease.check_held(text, text, bigint), lease.admit_held(text, text, text, bigint),
                   lease.renew_admit(text, text, text, bigint, interval), lease.inspect_guard(text),
                   lease._waiter_watch(text), lease._waiter_unwatch(text), lease._waiter_reset()
                TO {app};",
            app = deployment.app
        ))
        .unwrap();
    let mut app = deployment.conn_as(&deployment.app);
    let lease = granted(app.acquire("jobs/7", "app-1", TTL).unwrap());
    app.admit("orders", &lease, Check::Token).unwrap();
    app.admit("orders", &lease, Check::RenewAndAdmit(TTL))
        .unwrap();
    assert_eq!(
        app.release(&leasehold_test_support::grant(
            "jobs/7",
            "app-1",
            lease.epoch()
        ))
        .unwrap(),
        Release::Released
    );
    let mut attacker = deployment.conn_as(&deployment.attacker);
    for sql in [
        "SELECT * FROM lease.acquire('jobs/7', 'x', interval '1 min')",
        "SELECT * FROM lease.inspect('jobs/7')",
        "SELECT lease._waiter_watch('jobs/7')",
    ] {
        assert_eq!(sqlstate_of(&mut attacker, sql), "42501", "{sql}");
    }
}

/// The database's own error under `error`, if it is one leasehold has no
/// kind for (what was `LeaseError::Database`).
fn database_error(error: &LeaseError) -> Option<&diesel::result::Error> {
    if error.kind() != ErrorKind::Other {
        return None;
    }
    std::error::Error::source(error)?.downcast_ref()
}
