//! Wake-on-release under several roles (docs/SPECIFICATION.md §1.5, §4):
//! registering never holds up a holder, waiting works for every role and
//! says when it has fallen back to polling, one session cannot store
//! unbounded registrations, and notifications name no key.
//!
//! Every test runs in a [`Deployment`]: leasehold installed by a
//! non-superuser owner, and the application, a worker and an attacker as
//! separate login roles. Nothing here waits for time to pass: each step
//! waits for state it can observe (listener status, armed waiters, the
//! server's answers).

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::wait::{LeaseWaiter, ListenerStatus, PollingReason, WakeMode, WAITER_LIMIT};
use leasehold_test_support::Deployment;

use crate::common::*;
use crate::holders::{client, held_by, strict_waiter_at, wait_armed, LONG_WAIT, NEVER};
use leasehold::Leases;

/// hex(sha256(UTF-8 of `key`)), computed by the server.
fn digest_of(conn: &mut PgConnection, key: &str) -> String {
    query_lines(
        conn,
        &format!(
            "SELECT encode(sha256(convert_to({}, 'UTF8')), 'hex') AS line",
            quote(key)
        ),
    )
    .remove(0)
}

/// `lease._waiter_watch(key)`'s answer (the digest, or "NULL").
fn watch(conn: &mut PgConnection, key: &str) -> String {
    query_lines(
        conn,
        &format!(
            "SELECT coalesce(lease._waiter_watch({}), 'NULL') AS line",
            quote(key)
        ),
    )
    .remove(0)
}

/// Polls the listener's status until `done` holds for it.
fn wait_status(waiter: &LeaseWaiter, what: &str, done: impl Fn(&ListenerStatus) -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let status = waiter.listener_status();
        if done(&status) {
            return;
        }
        assert!(Instant::now() < until, "{what} never happened: {status:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The error of a statement that must fail: (constraint, message).
fn refused(conn: &mut PgConnection, sql: &str) -> (Option<String>, String) {
    match conn.batch_execute(sql) {
        Err(diesel::result::Error::DatabaseError(_, info)) => (
            info.constraint_name().map(str::to_owned),
            info.message().to_owned(),
        ),
        other => panic!("{sql}: expected a database error, got {other:?}"),
    }
}

/// §1.5, I14: a registration inside a transaction the caller keeps open
/// locks nothing the holder needs. Checked for the installing role (for
/// which registration has always worked) and for a role with nothing but
/// CONNECT. Were the lease row locked, the holder's calls would fail on the
/// lock timeout; without a lock wait, the timeout never fires.
#[test]
fn waiter_registration_in_an_open_transaction_does_not_block_the_holder() {
    let d = Deployment::new();
    let mut holder = d.conn_as(&d.app);
    let mut next = d.conn_as(&d.worker);
    holder.batch_execute("SET lock_timeout = '3s'").unwrap();
    next.batch_execute("SET lock_timeout = '3s'").unwrap();
    for role in [d.owner.clone(), d.attacker.clone()] {
        let key = format!("k-{role}");
        let lease = granted(holder.acquire(&key, "holder", TTL).unwrap());
        let mut registrant = d.conn_as(&role);
        registrant.batch_execute("BEGIN").unwrap();
        let digest = digest_of(&mut holder, &key);
        assert_eq!(watch(&mut registrant, &key), digest, "{role}");
        assert!(
            matches!(
                holder
                    .renew(
                        &leasehold_test_support::grant(&key, "holder", lease.epoch()),
                        TTL
                    )
                    .unwrap(),
                leasehold::Renewal::Renewed { .. }
            ),
            "{role}"
        );
        assert_eq!(
            holder
                .release(&leasehold_test_support::grant(
                    &key,
                    "holder",
                    lease.epoch()
                ))
                .unwrap(),
            leasehold::Release::Released,
            "{role}"
        );
        let taken = granted(next.acquire(&key, "next", TTL).unwrap());
        assert_eq!(taken.epoch(), lease.epoch().get() + 2);
        registrant.batch_execute("COMMIT").unwrap();
    }
}

/// §1.5, I14: a registration never waits for a release in flight either: it
/// answers NULL at once (the caller re-checks and calls again), and
/// registers once the release has ended.
#[test]
fn waiter_registration_never_waits_for_a_release_in_flight() {
    let d = Deployment::new();
    let mut holder = d.conn_as(&d.app);
    let mut registrant = d.conn_as(&d.attacker);
    registrant.batch_execute("SET lock_timeout = '3s'").unwrap();
    let lease = granted(holder.acquire("k", "holder", TTL).unwrap());
    holder.batch_execute("BEGIN").unwrap();
    assert_eq!(
        holder
            .release(&leasehold_test_support::grant("k", "holder", lease.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    assert_eq!(watch(&mut registrant, "k"), "NULL");
    holder.batch_execute("COMMIT").unwrap();
    let digest = digest_of(&mut holder, "k");
    assert_eq!(watch(&mut registrant, "k"), digest);
}

/// §4: waiting is woken by the release notification for a role that did
/// not install leasehold (sessions are identified by pid, which every role
/// may see), and the status says so.
#[test]
fn waiter_of_an_application_role_is_woken_by_the_release_notification() {
    let d = Deployment::new();
    let url = d.url_as(&d.app);
    let mut conn = d.conn_as(&d.app);
    let holder = granted(conn.acquire("k", "holder", TTL).unwrap());
    let waiter = strict_waiter_at(&url);
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("k", "waiter", TTL, LONG_WAIT))
    };
    wait_armed(&waiter, "k", 1);
    let before = waiter.listener_status();
    assert_eq!(before.wake_mode, WakeMode::Notifications, "{before:?}");
    assert_eq!(before.failed_registrations, 0, "{before:?}");
    assert_eq!(before.polled_keys, 0, "{before:?}");
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "k",
            "holder",
            holder.epoch()
        ))
        .unwrap(),
        leasehold::Release::Released
    );
    // Fallback and re-check are a minute away: only the notification can
    // wake the waiter within the wait.
    let lease = waiting.join().unwrap().unwrap();
    assert_eq!(lease.epoch(), holder.epoch().get() + 2);
    let after = waiter.listener_status();
    assert!(
        after.notification_wakeups > before.notification_wakeups,
        "{after:?}"
    );
    assert_eq!(after.failed_registrations, 0, "{after:?}");
}

/// A waiter whose registration the server refuses (here: EXECUTE revoked)
/// is reported as polling, counted once (no retry loop), and still gets
/// the lease by polling.
#[test]
fn waiter_whose_registration_is_refused_reports_polling_and_still_gets_the_lease() {
    let d = Deployment::new();
    d.conn_as(&d.owner)
        .batch_execute("REVOKE EXECUTE ON FUNCTION lease._waiter_watch(text) FROM PUBLIC")
        .unwrap();
    let url = d.url_as(&d.app);
    let mut conn = d.conn_as(&d.app);
    let holder = granted(conn.acquire("k", "holder", TTL).unwrap());
    let waiter = LeaseWaiter::builder(&client(&url))
        .recheck_every(NEVER)
        .fallback_poll(Duration::from_millis(20))
        .build();
    assert!(waiter.wait_until_listening(Duration::from_secs(10)));
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("k", "waiter", TTL, LONG_WAIT))
    };
    wait_status(&waiter, "the refusal", |s| s.failed_registrations == 1);
    let status = waiter.listener_status();
    assert!(status.connected, "{status:?}");
    assert_eq!(status.polled_keys, 1, "{status:?}");
    assert!(
        matches!(
            &status.wake_mode,
            WakeMode::Polling(PollingReason::RegistrationFailed { sqlstate, .. }) if sqlstate == "42501"
        ),
        "{status:?}"
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "k",
            "holder",
            holder.epoch()
        ))
        .unwrap(),
        leasehold::Release::Released
    );
    let lease = waiting.join().unwrap().unwrap();
    assert_eq!(lease.epoch(), holder.epoch().get() + 2);
    let after = waiter.listener_status();
    assert_eq!(after.failed_registrations, 1, "{after:?}");
    assert_eq!(after.notification_wakeups, 0, "{after:?}");
}

/// §4, storage bound: one session holds at most WAITER_LIMIT
/// registrations; the next is refused with 22023 lease_waiter_limit naming
/// the cap, and re-registering a key it holds still works. The listener
/// treats a key beyond the cap as polled, visibly, and the wait succeeds.
#[test]
fn waiter_registrations_per_session_are_capped_and_a_key_beyond_the_cap_is_polled() {
    let d = Deployment::new();
    let mut admin = d.admin();
    let mut app = d.conn_as(&d.app);
    let limit = WAITER_LIMIT;
    assert_eq!(
        query_lines(&mut admin, "SELECT lease._waiter_limit()::text AS line"),
        [limit.to_string()]
    );
    // The session registers in one SQL loop up to one below the cap...
    app.batch_execute(&format!(
        "DO $$ BEGIN FOR i IN 1..{} LOOP PERFORM lease._waiter_watch('filler-' || i); END LOOP; END $$",
        limit - 1
    ))
    .unwrap();
    // ...the last registration still fits, the next does not.
    let last = digest_of(&mut app, "last");
    assert_eq!(watch(&mut app, "last"), last);
    let (constraint, message) = refused(&mut app, "SELECT lease._waiter_watch('one-too-many')");
    assert_eq!(constraint.as_deref(), Some("lease_waiter_limit"));
    assert!(message.contains(&limit.to_string()), "{message}");
    assert_eq!(
        sqlstate_of(&mut app, "SELECT lease._waiter_watch('one-too-many')"),
        "22023"
    );
    assert_eq!(watch(&mut app, "filler-1"), digest_of(&mut app, "filler-1"));
    // Withdrawing one makes room again.
    app.batch_execute("SELECT lease._waiter_unwatch('filler-1')")
        .unwrap();
    assert_eq!(
        watch(&mut app, "one-too-many"),
        digest_of(&mut app, "one-too-many")
    );
    drop(app);

    // The listener: its session is filled up to the cap (rows written as
    // the superuser, for speed), then a waiter comes.
    let url = d.url_as(&d.app);
    let mut conn = d.conn_as(&d.app);
    let holder = granted(conn.acquire("k", "holder", TTL).unwrap());
    let waiter = LeaseWaiter::builder(&client(&url))
        .recheck_every(NEVER)
        .fallback_poll(Duration::from_millis(20))
        .build();
    assert!(waiter.wait_until_listening(Duration::from_secs(10)));
    let pid = waiter.listener_status().backend_pid.unwrap();
    admin
        .batch_execute(&format!(
            "INSERT INTO lease.waiters (key_hash, backend_pid) \
             SELECT sha256(convert_to('fill-' || i, 'UTF8')), {pid} FROM generate_series(1, {limit}) AS i"
        ))
        .unwrap();
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("k", "waiter", TTL, LONG_WAIT))
    };
    wait_status(&waiter, "the refusal", |s| s.failed_registrations == 1);
    let status = waiter.listener_status();
    assert_eq!(
        status.wake_mode,
        WakeMode::Polling(PollingReason::WaiterLimit),
        "{status:?}"
    );
    assert_eq!(status.polled_keys, 1, "{status:?}");
    assert!(status.connected, "{status:?}");
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "k",
            "holder",
            holder.epoch()
        ))
        .unwrap(),
        leasehold::Release::Released
    );
    let lease = waiting.join().unwrap().unwrap();
    assert_eq!(lease.epoch(), holder.epoch().get() + 2);
    assert_eq!(waiter.listener_status().failed_registrations, 1);
}

/// §4: a session that listens on the release channel learns digests, never
/// key names: the payload is hex(sha256(key)).
#[test]
fn release_notifications_carry_the_keys_digest_and_never_its_name() {
    let d = Deployment::new();
    let key = "payroll/employee-4711";
    let mut spy = d.conn_as(&d.attacker);
    spy.batch_execute("LISTEN lease_released").unwrap();
    let url = d.url_as(&d.app);
    let mut conn = d.conn_as(&d.app);
    let holder = granted(conn.acquire(key, "holder", TTL).unwrap());
    let waiter = strict_waiter_at(&url);
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire(key, "waiter", TTL, LONG_WAIT))
    };
    wait_armed(&waiter, key, 1);
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            key,
            "holder",
            holder.epoch()
        ))
        .unwrap(),
        leasehold::Release::Released
    );
    waiting.join().unwrap().unwrap();
    // The notification reaches the spy's connection when it next talks to
    // the server; ask until it is there.
    let until = Instant::now() + Duration::from_secs(10);
    let mut payloads = Vec::new();
    while payloads.is_empty() {
        assert!(Instant::now() < until, "the spy never got the notification");
        spy.batch_execute("SELECT 1").unwrap();
        payloads.extend(spy.notifications_iter().map(|n| n.unwrap().payload));
    }
    assert_eq!(payloads, [digest_of(&mut conn, key)]);
    assert!(payloads.iter().all(|p| !p.contains("payroll")));
}

/// Anyone may NOTIFY the channel: a forged notification with a waiter's
/// digest wakes the waiter, which checks again, is denied, and waits on.
#[test]
fn a_forged_release_notification_only_makes_the_waiter_check_again() {
    let d = Deployment::new();
    let url = d.url_as(&d.app);
    let mut conn = d.conn_as(&d.app);
    let holder = granted(conn.acquire("k", "holder", TTL).unwrap());
    let waiter = strict_waiter_at(&url);
    let waiting = {
        let waiter = waiter.clone();
        std::thread::spawn(move || waiter.acquire("k", "waiter", TTL, LONG_WAIT))
    };
    wait_armed(&waiter, "k", 1);
    let before = waiter.listener_status().notification_wakeups;
    let digest = digest_of(&mut conn, "k");
    d.conn_as(&d.attacker)
        .batch_execute(&format!("NOTIFY lease_released, '{digest}'"))
        .unwrap();
    wait_status(&waiter, "the forged wake-up", |s| {
        s.notification_wakeups > before
    });
    // Woken (armed_waiters dropped to 0 at the wake-up), checked again, and
    // asleep again: the lease stayed with its holder.
    wait_armed(&waiter, "k", 1);
    assert!(!waiting.is_finished());
    assert_eq!(
        held_by(&mut conn, "k"),
        Some(("holder".into(), holder.epoch().get()))
    );
    // A real release still wakes it.
    assert_eq!(
        conn.release(&leasehold_test_support::grant(
            "k",
            "holder",
            holder.epoch()
        ))
        .unwrap(),
        leasehold::Release::Released
    );
    let lease = waiting.join().unwrap().unwrap();
    assert_eq!(lease.epoch(), holder.epoch().get() + 2);
}

/// §4: registration respects key namespaces (42501 lease_namespace_denied
/// for a key bound to a role the caller is not a member of) and keeps the
/// input rules of keys (22023).
#[test]
fn waiter_registration_respects_key_namespaces_and_key_rules() {
    let d = Deployment::new();
    d.admin_exec(&format!(
        "INSERT INTO lease.namespaces (prefix, role_oid, role_name, created_at, system_identifier) \
         SELECT 'billing/', oid, rolname, now(), (pg_control_system()).system_identifier \
           FROM pg_roles WHERE rolname = '{}'",
        d.worker
    ));
    let mut app = d.conn_as(&d.app);
    let (constraint, message) = refused(&mut app, "SELECT lease._waiter_watch('billing/x')");
    assert_eq!(constraint.as_deref(), Some("lease_namespace_denied"));
    assert!(message.contains("_waiter_watch"), "{message}");
    assert_eq!(
        sqlstate_of(&mut app, "SELECT lease._waiter_watch('billing/x')"),
        "42501"
    );
    let mut worker = d.conn_as(&d.worker);
    assert_eq!(
        watch(&mut worker, "billing/x"),
        digest_of(&mut worker, "billing/x")
    );
    assert_eq!(watch(&mut app, "other/x"), digest_of(&mut app, "other/x"));
    for bad in ["''", "NULL"] {
        let (constraint, _) = refused(&mut app, &format!("SELECT lease._waiter_watch({bad})"));
        assert_eq!(constraint.as_deref(), Some("lease_invalid_input"), "{bad}");
    }
    assert_eq!(
        query_lines(
            &mut d.admin(),
            "SELECT count(*)::text AS line FROM lease.waiters"
        ),
        ["2"]
    );
}

/// §4: every role's reset prunes rows of sessions that are gone, whoever
/// registered them, and never a live session's rows.
#[test]
fn waiter_reset_by_any_role_prunes_dead_sessions_rows_and_keeps_live_ones() {
    let d = Deployment::new();
    let mut app = d.conn_as(&d.app);
    let mut worker = d.conn_as(&d.worker);
    let mut attacker = d.conn_as(&d.attacker);
    watch(&mut app, "a");
    watch(&mut worker, "w");
    let count = |conn: &mut PgConnection| {
        query_lines(conn, "SELECT count(*)::text AS line FROM lease.waiters").remove(0)
    };
    // A stale pg_stat_activity copy of the caller's transaction must not
    // make live sessions look gone.
    attacker
        .batch_execute("BEGIN; SELECT count(*) FROM pg_stat_activity")
        .unwrap();
    let mut late = d.conn_as(&d.app);
    watch(&mut late, "late");
    query_lines(&mut attacker, "SELECT lease._waiter_reset()::text AS line");
    attacker.batch_execute("COMMIT").unwrap();
    assert_eq!(count(&mut d.admin()), "3");
    drop(worker);
    let until = Instant::now() + Duration::from_secs(10);
    while count(&mut d.admin()) != "2" {
        assert!(
            Instant::now() < until,
            "the dead session's row was never pruned"
        );
        query_lines(&mut attacker, "SELECT lease._waiter_reset()::text AS line");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The caller's own reset drops its own rows.
    query_lines(&mut app, "SELECT lease._waiter_reset()::text AS line");
    assert_eq!(count(&mut d.admin()), "1");
}

/// The race the advisory lock closes: a release while a registration is
/// still uncommitted (its row invisible to the release) notifies anyway,
/// and so does a release under REPEATABLE READ (whose snapshot may predate
/// a registration).
#[test]
fn a_release_racing_an_uncommitted_registration_or_in_an_old_snapshot_notifies() {
    let d = Deployment::new();
    let mut holder = d.conn_as(&d.app);
    holder.batch_execute("LISTEN lease_released").unwrap();
    let mut registrant = d.conn_as(&d.worker);
    let lease = granted(holder.acquire("k", "holder", TTL).unwrap());
    registrant.batch_execute("BEGIN").unwrap();
    watch(&mut registrant, "k");
    assert_eq!(
        holder
            .release(&leasehold_test_support::grant("k", "holder", lease.epoch()))
            .unwrap(),
        leasehold::Release::Released
    );
    registrant.batch_execute("ROLLBACK").unwrap();
    let digest = digest_of(&mut holder, "k");
    let payloads: Vec<String> = holder
        .notifications_iter()
        .map(|n| n.unwrap().payload)
        .collect();
    assert_eq!(payloads, [digest]);

    // Nobody registered: a READ COMMITTED release stays silent, a
    // REPEATABLE READ one notifies.
    for (isolation, expected) in [("READ COMMITTED", 0), ("REPEATABLE READ", 1)] {
        let lease = granted(holder.acquire("k", "holder", TTL).unwrap());
        holder
            .batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}"))
            .unwrap();
        assert_eq!(
            holder
                .release(&leasehold_test_support::grant("k", "holder", lease.epoch()))
                .unwrap(),
            leasehold::Release::Released
        );
        holder.batch_execute("COMMIT").unwrap();
        let payloads: Vec<String> = holder
            .notifications_iter()
            .map(|n| n.unwrap().payload)
            .collect();
        assert_eq!(payloads.len(), expected, "{isolation}: {payloads:?}");
    }
}

/// The same for a grant of a new term, on `lease_granted` (what an
/// election's observer listens for): a grant racing an uncommitted
/// registration notifies, one in REPEATABLE READ notifies, one in READ
/// COMMITTED with nobody registered stays silent, and one with a
/// committed registration notifies. A denied acquire notifies nothing.
#[test]
fn a_grant_racing_a_registration_in_an_old_snapshot_or_watched_notifies_its_channel() {
    let d = Deployment::new();
    let mut holder = d.conn_as(&d.app);
    holder.batch_execute("LISTEN lease_granted").unwrap();
    let mut registrant = d.conn_as(&d.worker);
    let digest = digest_of(&mut holder, "k");
    let grant_in = |holder: &mut PgConnection, isolation: &str| -> Vec<String> {
        holder
            .batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}"))
            .unwrap();
        let lease = granted(holder.acquire("k", "holder", TTL).unwrap());
        holder.batch_execute("COMMIT").unwrap();
        let payloads = holder
            .notifications_iter()
            .map(|n| n.unwrap())
            .map(|n| format!("{}:{}", n.channel, n.payload))
            .collect();
        let released = holder
            .release(&leasehold_test_support::grant("k", "holder", lease.epoch()))
            .unwrap();
        assert_eq!(released, leasehold::Release::Released);
        payloads
    };
    registrant.batch_execute("BEGIN").unwrap();
    watch(&mut registrant, "k");
    let racing = grant_in(&mut holder, "READ COMMITTED");
    registrant.batch_execute("ROLLBACK").unwrap();
    assert_eq!(racing, [format!("lease_granted:{digest}")]);
    assert_eq!(
        grant_in(&mut holder, "READ COMMITTED"),
        Vec::<String>::new()
    );
    assert_eq!(
        grant_in(&mut holder, "REPEATABLE READ"),
        [format!("lease_granted:{digest}")]
    );
    watch(&mut registrant, "k");
    assert_eq!(
        grant_in(&mut holder, "READ COMMITTED"),
        [format!("lease_granted:{digest}")]
    );
    // Held by another owner: denied, and silent.
    let _held = granted(registrant.acquire("k", "other", TTL).unwrap());
    holder.batch_execute("SELECT 1").unwrap();
    holder.notifications_iter().for_each(drop);
    assert!(matches!(
        holder.acquire("k", "holder", TTL).unwrap(),
        leasehold::Acquisition::Denied
    ));
    assert_eq!(holder.notifications_iter().count(), 0, "a denial notifies");
}
