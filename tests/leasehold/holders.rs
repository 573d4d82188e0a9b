//! Holders that behave: client-side waiting woken by release notifications
//! or the holder's expiry, the heartbeat keeper and its safe deadline, the
//! worker loop.
//!
//! Every waiter here is configured so that only the mechanism under test can
//! wake it in time (re-check and fallback intervals of a minute, waits of
//! 20 s): a broken mechanism shows up as a timeout, not as a slow pass.
//! Bounds on how soon something happened are [`IN_TIME`], a third of those
//! intervals: far below what a broken mechanism would take, far above what
//! a machine busy with other suites adds (latency targets live in
//! `benches/wake_latency.rs`, not here). Keepers renew many times per ttl
//! so that a scheduling stall of a second or more cannot lapse a lease the
//! test expects to stay held.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::{
    error::ErrorKind,
    hold::{run_while_held, CancelToken, KeeperEvent, LeaseLoss, WorkOutcome},
    wait::{LeaseWaiter, Wait},
    Keeper, LeaseClient, LeaseState, Leases, Refusal, Release,
};
use leasehold_local::{LocalPostgres, StopMode};

use crate::common::*;

pub(crate) const NEVER: Duration = Duration::from_secs(60);
pub(crate) const LONG_WAIT: Duration = Duration::from_secs(20);
/// "Promptly", for a mechanism whose absence would take [`LONG_WAIT`] or
/// [`NEVER`].
const IN_TIME: Duration = Duration::from_secs(15);

pub(crate) fn client(url: &str) -> LeaseClient {
    LeaseClient::builder(url)
        .max_size(4)
        .checkout_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// A waiter that wakes only by notification, expiry or reconnect.
fn strict_waiter(db: &TestDb) -> LeaseWaiter {
    strict_waiter_at(&db.url)
}

/// [`strict_waiter`] for the database and role of `url`.
pub(crate) fn strict_waiter_at(url: &str) -> LeaseWaiter {
    let waiter = LeaseWaiter::builder(&client(url))
        .recheck_every(NEVER)
        .fallback_poll(NEVER)
        .build();
    assert!(
        waiter.wait_until_listening(Duration::from_secs(10)),
        "listener never connected: {:?}",
        waiter.listener_status()
    );
    waiter
}

/// Blocks until `count` waiters of this process are armed on `key`.
pub(crate) fn wait_armed(waiter: &LeaseWaiter, key: &str, count: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while waiter.armed_waiters(key) != count {
        assert!(Instant::now() < until, "waiters on {key} never armed");
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub(crate) fn held_by(conn: &mut PgConnection, key: &str) -> Option<(String, i64)> {
    match conn.inspect(key).unwrap() {
        Some(LeaseState::Held { owner, epoch, .. }) => Some((owner, epoch.get())),
        _ => None,
    }
}

#[test]
fn waiter_wakes_on_release_holding_no_connection_or_transaction_while_waiting() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let holder = granted(conn.acquire("k", "holder", TTL).unwrap());
    let waiter = strict_waiter(&db);
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("k", "waiter", TTL, LONG_WAIT))
    };
    wait_armed(&waiter, "k", 1);

    // While waiting: every pooled connection is back in the pool, and no
    // session of the database (listener included) runs a statement or has
    // a transaction open.
    let pool_state = waiter.client().pool().state();
    assert_eq!(pool_state.connections, pool_state.idle_connections);
    let busy = query_lines(
        &mut conn,
        &format!(
            "SELECT format('%s %s', application_name, state) AS line FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid() AND state <> 'idle'",
            db.name
        ),
    );
    assert_eq!(busy, Vec::<String>::new());

    let released_at = Instant::now();
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "k",
            "holder",
            holder.epoch()
        ))
        .unwrap(),
        Release::Released
    );
    let lease = waiting.join().unwrap().unwrap();
    assert!(released_at.elapsed() < IN_TIME);
    assert_eq!(lease.epoch(), holder.epoch().get() + 2);
    assert_eq!(
        held_by(&mut conn, "k"),
        Some(("waiter".into(), lease.epoch().get()))
    );
}

#[test]
fn waiter_wakes_at_the_holders_expiry_when_the_lease_lapses() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let short = Duration::from_millis(800);
    let holder = granted(conn.acquire("k", "holder", short).unwrap());
    let waiter = strict_waiter(&db);
    let lease = waiter.acquire("k", "waiter", TTL, LONG_WAIT).unwrap();
    // Server clock only: the new grant started (expires_at - ttl) after the
    // lapse, and not long after it.
    let granted_at = lease.expires_at() - chrono::Duration::from_std(TTL).unwrap();
    assert!(
        granted_at >= holder.expires_at(),
        "granted before the lapse"
    );
    let late = (granted_at - holder.expires_at()).to_std().unwrap();
    assert!(late < IN_TIME, "woke {late:?} after the lapse");
    assert_eq!(lease.epoch(), holder.epoch().get() + 1);
}

#[test]
fn waiter_recovers_a_release_notification_missed_during_a_listener_reconnect() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let holder = granted(conn.acquire("k", "holder", TTL).unwrap());
    let waiter = strict_waiter(&db);
    let first_pid = waiter.listener_status().backend_pid.unwrap();
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("k", "waiter", TTL, LONG_WAIT))
    };
    wait_armed(&waiter, "k", 1);
    let started = Instant::now();

    // One transaction: kill the listener's session (waiting until it is
    // gone), and release. The lock on lease.waiters keeps the reconnecting
    // listener from registering (and so from listening) until after the
    // commit, so no session of this process can receive the notification:
    // only the re-check after the reconnect can find the release.
    conn.batch_execute(&format!(
        "BEGIN;
         LOCK TABLE lease.waiters IN EXCLUSIVE MODE;
         SELECT pg_terminate_backend({first_pid}, 10000);
         SELECT * FROM lease.release('k', 'holder', {});
         COMMIT;",
        holder.epoch()
    ))
    .unwrap();

    let lease = waiting.join().unwrap().unwrap();
    assert!(
        started.elapsed() < IN_TIME,
        "woke by the deadline, not the re-check"
    );
    assert_eq!(
        held_by(&mut conn, "k"),
        Some(("waiter".into(), lease.epoch().get()))
    );
    // The wake may come from the poll while the listener is down or from
    // the re-check after it is back; either way the listener must come back
    // on a new session.
    let reconnected = Instant::now();
    while waiter.listener_status().sessions < 2 && reconnected.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = waiter.listener_status();
    assert!(status.sessions >= 2, "{status:?}");
    assert_ne!(status.backend_pid, Some(first_pid));
}

#[test]
fn waiter_can_be_cancelled_from_another_thread_and_changes_nothing() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let holder = granted(conn.acquire("k", "holder", TTL).unwrap());
    let waiter = strict_waiter(&db);
    let cancel = CancelToken::new();
    let waiting = {
        let (waiter, cancel) = (waiter.clone(), cancel.clone());
        std::thread::spawn(move || {
            waiter.acquire_cancellable("k", "waiter", TTL, Wait::UntilCancelled, &cancel)
        })
    };
    wait_armed(&waiter, "k", 1);
    let cancelled_at = Instant::now();
    cancel.cancel();
    let result = waiting.join().unwrap();
    assert!(
        matches!(&result, Err(error) if error.kind() == ErrorKind::Cancelled && error.key() == Some("k")),
        "{result:?}"
    );
    assert!(cancelled_at.elapsed() < IN_TIME);
    assert_eq!(
        held_by(&mut conn, "k"),
        Some(("holder".into(), holder.epoch().get()))
    );
    // A cancelled token stops the next wait before it starts.
    assert!(matches!(
        waiter.acquire_cancellable("k", "waiter", TTL, LONG_WAIT, &cancel),
        Err(error) if error.kind() == ErrorKind::Cancelled
    ));
}

#[test]
fn waiter_timeout_is_a_typed_error_distinct_from_failures() {
    let db = TestDb::new();
    let mut conn = db.conn();
    granted(conn.acquire("k", "holder", TTL).unwrap());
    let waiter = strict_waiter(&db);
    let started = Instant::now();
    let wait = Duration::from_millis(300);
    match waiter.acquire("k", "waiter", TTL, wait) {
        Err(error) if error.kind() == ErrorKind::TimedOut => {
            assert_eq!(error.key(), Some("k"));
            let waited = error.waited().expect("a timeout says how long it waited");
            assert!(waited >= wait && started.elapsed() >= wait);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    // Invalid input is a failure of another kind, reported at once.
    assert!(matches!(
        waiter.acquire("", "waiter", TTL, wait),
        Err(error) if error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty()
    ));
    // Nobody waits any more: the registration is withdrawn.
    let until = Instant::now() + Duration::from_secs(10);
    while query_lines(
        &mut conn,
        "SELECT count(*)::text AS line FROM lease.waiters",
    ) != ["0"]
    {
        assert!(Instant::now() < until, "registration never withdrawn");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn releases_notify_only_keys_somebody_waits_for() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("LISTEN lease_released").unwrap();
    let a = granted(conn.acquire("unwatched", "o", TTL).unwrap());
    let _ = conn
        .release(&leasehold_test_support::grant("unwatched", "o", a.epoch()))
        .unwrap();
    let b = granted(conn.acquire("watched", "o", TTL).unwrap());
    let digest = query_lines(
        &mut conn,
        "SELECT encode(sha256(convert_to('watched', 'UTF8')), 'hex') AS line",
    );
    // Registration answers the digest its release notification will carry.
    assert_eq!(
        query_lines(&mut conn, "SELECT lease._waiter_watch('watched') AS line"),
        digest
    );
    let _ = conn
        .release(&leasehold_test_support::grant("watched", "o", b.epoch()))
        .unwrap();
    query_lines(
        &mut conn,
        "SELECT lease._waiter_unwatch('watched')::text AS line",
    );
    let c = granted(conn.acquire("watched", "o", TTL).unwrap());
    let _ = conn
        .release(&leasehold_test_support::grant("watched", "o", c.epoch()))
        .unwrap();
    let payloads: Vec<String> = conn
        .notifications_iter()
        .map(|n| n.unwrap().payload)
        .collect();
    assert_eq!(payloads, digest);
}

#[test]
fn waiter_functions_are_security_definer_and_touch_only_the_callers_rows() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let functions = query_lines(
        &mut conn,
        "SELECT format('%s|%s|%s', p.proname, p.prosecdef, array_to_string(p.proconfig, ',')) AS line \
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = 'lease' AND p.proname LIKE '\\_waiter%' ORDER BY p.proname",
    );
    assert_eq!(
        functions,
        [
            "_waiter_class|f|",
            "_waiter_limit|f|",
            "_waiter_lock_id|f|",
            "_waiter_reset|t|search_path=pg_catalog, pg_temp",
            "_waiter_unwatch|t|search_path=pg_catalog, pg_temp",
            "_waiter_watch|t|search_path=pg_catalog, pg_temp",
        ]
    );
    let mut other = db.conn();
    query_lines(&mut other, "SELECT lease._waiter_watch('k') AS line");
    query_lines(&mut conn, "SELECT lease._waiter_watch('k') AS line");
    // Reset removes the caller's rows and rows of dead sessions only.
    query_lines(&mut conn, "SELECT lease._waiter_reset()::text AS line");
    assert_eq!(
        query_lines(
            &mut conn,
            "SELECT count(*)::text AS line FROM lease.waiters"
        ),
        ["1"]
    );
    drop(other);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        query_lines(&mut conn, "SELECT lease._waiter_reset()::text AS line");
        if query_lines(
            &mut conn,
            "SELECT count(*)::text AS line FROM lease.waiters",
        ) == ["0"]
        {
            break;
        }
        assert!(Instant::now() < until, "dead session's row never pruned");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn events(
    builder: leasehold::hold::KeeperBuilder,
) -> (leasehold::hold::KeeperBuilder, mpsc::Receiver<KeeperEvent>) {
    let (tx, rx) = mpsc::channel();
    let builder = builder.on_event(move |event| {
        let _ = tx.send(event.clone());
    });
    (builder, rx)
}

fn next_renewal(
    rx: &mpsc::Receiver<KeeperEvent>,
) -> (Instant, chrono::DateTime<chrono::Utc>, Instant) {
    loop {
        match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            KeeperEvent::Renewed {
                sent_at,
                expires_at,
                safe_until,
            } => return (sent_at, expires_at, safe_until),
            KeeperEvent::RenewFailed { .. } => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn keeper_renews_in_the_background_and_releases_on_stop() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ttl = Duration::from_secs(3);
    let lease = granted(conn.acquire("k", "a", ttl).unwrap());
    let (builder, rx) = events(
        Keeper::builder(&client(&db.url), lease.clone()).renew_every(Duration::from_millis(150)),
    );
    let keeper = builder.start().unwrap();
    assert_eq!(keeper.token(), lease.token());
    // Renewals carry the lease past its original expiry, on the server's clock.
    let mut last = next_renewal(&rx).1;
    while last <= lease.expires_at() {
        last = next_renewal(&rx).1;
    }
    wait_until_server_time_passes(&mut conn, lease.expires_at());
    assert_eq!(
        held_by(&mut conn, "k"),
        Some(("a".into(), lease.epoch().get()))
    );
    assert!(keeper.is_valid());
    assert!(keeper.loss().is_none());
    assert_eq!(keeper.stop().unwrap(), Release::Released);
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Free {
            epoch: leasehold::Epoch::new(lease.epoch().get() + 1),
            force_released: false,
        })
    );
}

/// `stop_renewing` ends the renewals and keeps the grant: nothing is
/// released, no renew follows, and the grant lapses at the expiry of the
/// last renew.
#[test]
fn keeper_stop_renewing_keeps_the_grant_until_it_lapses() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ttl = Duration::from_secs(2);
    let lease = granted(conn.acquire("k", "a", ttl).unwrap());
    let (builder, rx) = events(
        Keeper::builder(&client(&db.url), lease.clone()).renew_every(Duration::from_millis(100)),
    );
    let keeper = builder.start().unwrap();
    next_renewal(&rx);
    let kept = keeper.stop_renewing();
    assert_eq!(kept, lease);
    // The last renew's expiry stands: held now, and nothing renews it.
    let Some(LeaseState::Held {
        owner,
        epoch,
        expires_at,
    }) = conn.inspect("k").unwrap()
    else {
        panic!("released by stop_renewing");
    };
    assert_eq!((owner.as_str(), epoch), ("a", lease.epoch()));
    while let Ok(event) = rx.try_recv() {
        // Renewals sent before the stop may still report; none after.
        assert!(matches!(event, KeeperEvent::Renewed { .. }), "{event:?}");
    }
    wait_until_server_time_passes(&mut conn, expires_at);
    assert_eq!(
        conn.inspect("k")
            .unwrap()
            .map(|state| (state.as_str(), state.epoch())),
        Some(("lapsed", lease.epoch())),
        "renewed after stop_renewing"
    );
    assert!(rx.try_recv().is_err(), "an event after stop_renewing");
}

#[test]
fn keeper_releases_on_drop() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    drop(
        Keeper::builder(&client(&db.url), lease.clone())
            .start()
            .unwrap(),
    );
    assert_eq!(
        conn.inspect("k").unwrap(),
        Some(LeaseState::Free {
            epoch: leasehold::Epoch::new(lease.epoch().get() + 1),
            force_released: false,
        })
    );
}

#[test]
fn keeper_reports_loss_when_a_renew_is_refused_after_takeover() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // A long ttl with frequent renews: the next renew (refused) comes long
    // before the deadline could pass, however busy the machine.
    let ttl = Duration::from_secs(30);
    let lease = granted(conn.acquire("k", "a", ttl).unwrap());
    let (builder, rx) = events(
        Keeper::builder(&client(&db.url), lease.clone()).renew_every(Duration::from_millis(100)),
    );
    let keeper = builder.start().unwrap();
    // Someone else ends the grant and takes the key over.
    let _ = conn
        .release(&leasehold_test_support::grant("k", "a", lease.epoch()))
        .unwrap();
    let b = granted(conn.acquire("k", "b", TTL).unwrap());
    assert!(matches!(
        keeper.wait_for_loss(Duration::from_secs(10)),
        Some(LeaseLoss::Refused(
            Refusal::Released | Refusal::Superseded { .. }
        ))
    ));
    assert!(!keeper.is_valid());
    let lost = rx
        .iter()
        .find(|e| matches!(e, KeeperEvent::Lost(_)))
        .unwrap();
    assert!(matches!(
        lost,
        KeeperEvent::Lost(LeaseLoss::Refused(
            Refusal::Released | Refusal::Superseded { .. }
        ))
    ));
    // Stopping does not disturb the new holder.
    assert_eq!(
        keeper.stop().unwrap(),
        Release::Refused(Refusal::Superseded { by: b.epoch() })
    );
    assert_eq!(held_by(&mut conn, "k"), Some(("b".into(), b.epoch().get())));
}

#[test]
fn keeper_survives_a_terminated_connection() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ttl = Duration::from_secs(3);
    let lease = granted(conn.acquire("k", "a", ttl).unwrap());
    let (builder, rx) = events(
        Keeper::builder(&client(&db.url), lease.clone())
            .renew_every(Duration::from_millis(200))
            .retry_every(Duration::from_millis(20)),
    );
    let keeper = builder.start().unwrap();
    next_renewal(&rx);
    query_lines(
        &mut conn,
        &format!(
            "SELECT pg_terminate_backend(pid, 10000)::text AS line FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            db.name
        ),
    );
    // The next renew fails on the dead connection; the retry gets a new one.
    loop {
        match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            KeeperEvent::RenewFailed { .. } => break,
            KeeperEvent::Renewed { .. } => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
    next_renewal(&rx);
    assert!(keeper.is_valid());
    assert_eq!(keeper.stop().unwrap(), Release::Released);
}

#[test]
fn keeper_safe_until_ends_before_the_servers_expiry() {
    let db = TestDb::new();
    let mut conn = db.conn();
    // Long enough that the deadline cannot pass while the test sets up the
    // freeze on a busy machine; the wait for it is then ttl - margin.
    let ttl = Duration::from_secs(4);
    let margin = Duration::from_millis(300);
    let lease = granted(conn.acquire("k", "a", ttl).unwrap());
    let (builder, rx) = events(
        Keeper::builder(&client(&db.url), lease.clone())
            .renew_every(Duration::from_millis(300))
            .margin(margin),
    );
    let before_start = Instant::now();
    let keeper = builder.start().unwrap();
    let after_start = Instant::now();
    // Each deadline is the renew's send instant + ttl - margin.
    let (sent_at, _, safe_until) = next_renewal(&rx);
    assert!(before_start <= sent_at && sent_at <= after_start);
    assert_eq!(safe_until, sent_at + ttl - margin);
    for _ in 0..2 {
        let (sent_at, _, safe_until) = next_renewal(&rx);
        assert_eq!(safe_until, sent_at + ttl - margin);
    }

    // Freeze renewals: hold the lease row's lock, so every renew blocks.
    let mut locker = db.conn();
    locker
        .batch_execute("BEGIN; SELECT 1 FROM lease.leases WHERE key = 'k' FOR UPDATE;")
        .unwrap();
    let frozen_deadline = {
        // A renew in flight before the lock may still land: take the last.
        wait_for_lock_waiter(&mut conn, &db.name);
        keeper.safe_until()
    };
    assert!(keeper.is_valid());
    while Instant::now() < frozen_deadline {
        std::thread::sleep(frozen_deadline - Instant::now());
    }
    // The deadline has passed on the client's clock: the server, asked only
    // now, must still report the grant held.
    let state = conn.inspect("k").unwrap();
    assert!(
        matches!(&state, Some(LeaseState::Held { owner, epoch, .. }) if owner == "a" && *epoch == lease.epoch()),
        "{state:?}"
    );
    assert!(!keeper.is_valid());
    assert!(matches!(
        keeper.wait_for_loss(Duration::from_secs(10)),
        Some(LeaseLoss::DeadlinePassed { .. })
    ));
    locker.batch_execute("ROLLBACK").unwrap();
    drop(keeper);
}

#[test]
fn keeper_reports_loss_when_the_server_goes_away() {
    let server = LocalPostgres::builder().durable(false).start().unwrap();
    let url = server.url();
    let mut conn = PgConnection::establish(&url).unwrap();
    leasehold::install(&mut conn).unwrap();
    let ttl = Duration::from_secs(3);
    let lease = granted(conn.acquire("k", "a", ttl).unwrap());
    drop(conn);
    let (builder, rx) = events(
        Keeper::builder(&client(&url), lease)
            .renew_every(Duration::from_millis(150))
            .retry_every(Duration::from_millis(50)),
    );
    let keeper = builder.start().unwrap();
    next_renewal(&rx);
    server.stop(StopMode::Immediate).unwrap();
    let loss = keeper.wait_for_loss(Duration::from_secs(20));
    let noticed = Instant::now();
    assert!(
        matches!(
            &loss,
            Some(LeaseLoss::DeadlinePassed {
                last_error: Some(_)
            })
        ),
        "{loss:?}"
    );
    assert!(noticed >= keeper.safe_until());
    // Noticed at the deadline by the monitor thread, not at the next renew
    // attempt or the 20 s wait: the slack is thread scheduling only.
    assert!(noticed - keeper.safe_until() < Duration::from_secs(5));
    assert!(!keeper.is_valid());
    // The loss is recorded (waking wait_for_loss) before the event handler
    // runs on the keeper's thread: wait for the event, do not peek.
    let lost = std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(10)).ok())
        .find(|e| matches!(e, KeeperEvent::Lost(_)));
    assert!(
        matches!(
            lost,
            Some(KeeperEvent::Lost(LeaseLoss::DeadlinePassed { .. }))
        ),
        "{lost:?}"
    );
    drop(keeper);
}

#[test]
fn worker_loop_stops_when_the_lease_is_lost_and_reports_why() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let ttl = Duration::from_secs(30);
    let lease = granted(conn.acquire("k", "a", ttl).unwrap());
    let keeper = Keeper::builder(&client(&db.url), lease.clone())
        .renew_every(Duration::from_millis(100))
        .start()
        .unwrap();
    let cancel = CancelToken::new();
    let (started_tx, started_rx) = mpsc::channel();
    let worker = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            run_while_held(keeper, &cancel, |ctx| {
                started_tx.send(ctx.token().clone()).unwrap();
                while !ctx.should_stop() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err::<(), _>(ctx.stop_reason())
            })
        })
    };
    assert_eq!(&started_rx.recv().unwrap(), lease.token());
    let _ = conn
        .release(&leasehold_test_support::grant("k", "a", lease.epoch()))
        .unwrap();
    granted(conn.acquire("k", "b", TTL).unwrap());
    match worker.join().unwrap() {
        WorkOutcome::LeaseLost(LeaseLoss::Refused(
            Refusal::Released | Refusal::Superseded { .. },
        )) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn worker_loop_reports_finished_cancelled_and_failed() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let start = |key: &str| {
        let lease = granted(db.conn().acquire(key, "a", TTL).unwrap());
        Keeper::builder(&client(&db.url), lease).start().unwrap()
    };
    let cancel = CancelToken::new();
    let finished = run_while_held(start("f"), &cancel, |ctx| Ok::<_, ()>(ctx.token().epoch()));
    assert!(matches!(
        finished,
        WorkOutcome::Finished(leasehold::Epoch(1))
    ));
    let failed = run_while_held(start("e"), &cancel, |_| Err::<(), _>("boom"));
    assert!(matches!(failed, WorkOutcome::Failed("boom")));
    let cancelled = run_while_held(start("c"), &cancel, |ctx| {
        cancel.cancel();
        if ctx.should_stop() {
            return Err(());
        }
        Ok(())
    });
    assert!(matches!(cancelled, WorkOutcome::Cancelled));
    // Every run released its lease.
    for key in ["f", "e", "c"] {
        assert_eq!(
            conn.inspect(key).unwrap(),
            Some(LeaseState::Free {
                epoch: 2.into(),
                force_released: false
            })
        );
    }
}

/// Keepers, keeper sets and waiters may be shared across threads and tasks
/// (an `Arc` beside the work); this fails to compile if one stops being so.
#[test]
fn holders_are_send_and_sync() {
    fn shareable<T: Send + Sync>() {}
    shareable::<leasehold::Keeper>();
    shareable::<leasehold::hold::KeeperSet>();
    shareable::<leasehold::wait::LeaseWaiter>();
    shareable::<leasehold::aio::Keeper>();
    shareable::<leasehold::aio::KeeperSet>();
    shareable::<leasehold::aio::LeaseWaiter>();
}

/// A work's sleep wakes at once when it must stop: with the loss (a forced
/// release, seen by the next renew), and with a cancellation from another
/// thread; otherwise it sleeps its whole duration. `NEVER` would be the
/// wait without the wake-up.
#[test]
fn a_works_sleep_wakes_on_loss_and_on_cancellation() {
    let db = TestDb::new();
    let start = |key: &str| {
        let lease = granted(db.conn().acquire(key, "a", TTL).unwrap());
        Keeper::builder(&client(&db.url), lease)
            .renew_every(Duration::from_millis(100))
            .start()
            .unwrap()
    };
    let cancel = CancelToken::new();
    let short = run_while_held(start("s"), &cancel, |ctx| {
        let started = Instant::now();
        ctx.sleep(Duration::from_millis(50))?;
        Ok::<_, leasehold::hold::StopReason>(started.elapsed())
    });
    assert!(
        matches!(short, WorkOutcome::Finished(slept) if slept >= Duration::from_millis(50)),
        "{short:?}"
    );

    use leasehold::admin::Operator;
    let mut admin = db.conn();
    let (slept, woke) = mpsc::channel();
    let lost = run_while_held(start("l"), &cancel, |ctx| {
        admin.force_release("l").unwrap();
        let started = Instant::now();
        slept.send((ctx.sleep(NEVER), started.elapsed())).unwrap();
        Err::<(), _>(())
    });
    assert!(
        matches!(
            lost,
            WorkOutcome::LeaseLost(LeaseLoss::Refused(Refusal::ForceReleased))
        ),
        "{lost:?}"
    );
    let (reason, took) = woke.recv_timeout(IN_TIME).unwrap();
    assert!(
        matches!(reason, Err(leasehold::hold::StopReason::LeaseLost(_))),
        "{reason:?}"
    );
    assert!(took < IN_TIME, "slept {took:?}");

    let (slept, woke) = mpsc::channel();
    let cancelled = run_while_held(start("c"), &cancel, |ctx| {
        let canceller = cancel.clone();
        let (sleeping, asleep) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            asleep.recv().unwrap();
            canceller.cancel();
        });
        sleeping.send(()).unwrap();
        let started = Instant::now();
        let reason = ctx.sleep(NEVER);
        slept.send((reason, started.elapsed())).unwrap();
        Err::<(), _>(())
    });
    assert!(matches!(cancelled, WorkOutcome::Cancelled), "{cancelled:?}");
    let (reason, took) = woke.recv_timeout(IN_TIME).unwrap();
    assert!(
        matches!(reason, Err(leasehold::hold::StopReason::Cancelled)),
        "{reason:?}"
    );
    assert!(took < IN_TIME, "slept {took:?}");
}
