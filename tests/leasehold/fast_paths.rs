//! The fast paths (migration 2026-11-30-000007): the `lease.fast_*` views
//! whose rewrite rules run the API functions' common paths without a
//! function call. The whole suite exercises the API through them; these
//! tests pin what is theirs alone: the common calls really take them, every
//! other case really reaches the SQL functions, and a role that writes the
//! views by hand gets nothing the functions would refuse it.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::{acquire, release, renew, Acquisition, Refusal, Release, Renewal};

use crate::common::*;

/// How many rows a statement wrote (its command tag's count).
fn written(conn: &mut PgConnection, sql: &str) -> usize {
    diesel::sql_query(sql)
        .execute(conn)
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
}

/// Calls of the named `lease` function in the current transaction, as
/// `track_functions` counts them.
fn calls_of(conn: &mut PgConnection, function: &str) -> i64 {
    query_lines(
        conn,
        &format!(
            "SELECT coalesce(sum(calls), 0)::text AS line FROM pg_stat_xact_user_functions \
             WHERE schemaname = 'lease' AND funcname = {}",
            quote(function)
        ),
    )
    .remove(0)
    .parse()
    .unwrap()
}

#[test]
fn common_calls_take_the_fast_path_and_every_other_case_the_function() {
    let db = TestDb::new();
    let mut conn = db.conn();
    conn.batch_execute("SET track_functions = 'pl'; BEGIN")
        .unwrap();

    // A never-seen key: only lease.acquire inserts a row.
    let first = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(calls_of(&mut conn, "acquire"), 1);
    // A live grant renewed and released: the fast paths.
    assert!(matches!(
        renew(&mut conn, "k", "a", first.epoch(), TTL).unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(
        release(&mut conn, "k", "a", first.epoch()).unwrap(),
        Release::Released
    );
    // A FREE key granted again: the fast path.
    let second = granted(acquire(&mut conn, "k", "b", TTL).unwrap());
    assert_eq!(second.epoch(), first.epoch() + 2);
    assert_eq!(
        (
            calls_of(&mut conn, "acquire"),
            calls_of(&mut conn, "renew"),
            calls_of(&mut conn, "release")
        ),
        (1, 0, 0),
        "the common calls call no function"
    );
    // Held by another owner, the same owner again, a stale epoch, the wrong
    // owner: the functions decide, with their answers.
    assert_eq!(
        acquire(&mut conn, "k", "c", TTL).unwrap(),
        Acquisition::Denied
    );
    assert_eq!(
        granted(acquire(&mut conn, "k", "b", TTL).unwrap()).epoch(),
        second.epoch()
    );
    assert_eq!(
        renew(&mut conn, "k", "b", first.epoch(), TTL).unwrap(),
        Renewal::Refused(Refusal::EpochMismatch)
    );
    assert_eq!(
        release(&mut conn, "k", "a", second.epoch()).unwrap(),
        Release::Refused(Refusal::NotOwner)
    );
    assert_eq!(
        (
            calls_of(&mut conn, "acquire"),
            calls_of(&mut conn, "renew"),
            calls_of(&mut conn, "release")
        ),
        (3, 1, 1)
    );
    conn.batch_execute("COMMIT").unwrap();
}

#[test]
fn a_role_writing_the_views_by_hand_gets_nothing_the_functions_would_refuse() {
    let db = TestDb::new();
    let role = app_role(&db, "direct");
    let mut admin = db.conn();
    let mut conn = db.conn_as(&role);
    let held = granted(acquire(&mut conn, "held", "a", TTL).unwrap());
    let freed = granted(acquire(&mut conn, "free", "a", TTL).unwrap());
    assert_eq!(
        release(&mut conn, "free", "a", freed.epoch()).unwrap(),
        Release::Released
    );
    let before = table_snapshot(&mut admin);
    let e = held.epoch();
    // Only the input columns may be set: no expiry, epoch or outcome.
    for sql in [
        "UPDATE lease.fast_renew SET expires_at = now() + interval '1 year'".to_owned(),
        "UPDATE lease.fast_acquire SET key = 'free', owner = 'x', ttl = '1 hour', epoch = 99"
            .to_owned(),
        "UPDATE lease.fast_release SET released = true".to_owned(),
    ] {
        assert_eq!(
            sqlstate_of(&mut conn, &sql),
            "42501",
            "{sql} must be refused"
        );
    }
    // No rule for INSERT or DELETE: the views refuse them outright.
    for sql in [
        "INSERT INTO lease.fast_renew VALUES ('held', 'a', 1, '1 hour', now())",
        "DELETE FROM lease.fast_release",
    ] {
        assert_ne!(
            sqlstate_of(&mut conn, sql),
            "00000",
            "{sql} must be refused"
        );
    }
    // What the functions refuse, the views do not write.
    for sql in [
        format!(
            "UPDATE lease.fast_renew SET key = 'held', owner = 'b', epoch = {e}, ttl = '1 hour'"
        ),
        format!(
            "UPDATE lease.fast_renew SET key = 'held', owner = 'a', epoch = {}, ttl = '1 hour'",
            e + 1
        ),
        format!(
            "UPDATE lease.fast_renew SET key = 'held', owner = 'a', epoch = {e}, ttl = '-1 hour'"
        ),
        format!("UPDATE lease.fast_renew SET key = 'held', owner = 'a', epoch = {e}, ttl = '0'"),
        format!(
            "UPDATE lease.fast_renew SET key = 'held', owner = 'a', epoch = {e}, ttl = '1 day'"
        ),
        format!(
            "UPDATE lease.fast_renew SET key = 'held', owner = 'a', epoch = {e}, ttl = '200 years'"
        ),
        format!("UPDATE lease.fast_renew SET key = 'held', owner = 'a', epoch = {e}, ttl = NULL"),
        format!("UPDATE lease.fast_release SET key = 'held', owner = 'b', epoch = {e}"),
        format!(
            "UPDATE lease.fast_release SET key = 'held', owner = 'a', epoch = {}",
            e - 1
        ),
        "UPDATE lease.fast_acquire SET key = 'held', owner = 'b', ttl = '1 hour'".to_owned(),
        "UPDATE lease.fast_acquire SET key = 'free', owner = '', ttl = '1 hour'".to_owned(),
        format!(
            "UPDATE lease.fast_acquire SET key = 'free', owner = {}, ttl = '1 hour'",
            quote(&"o".repeat(16_385))
        ),
        "UPDATE lease.fast_acquire SET key = 'free', owner = 'b', ttl = '1 mon'".to_owned(),
        "UPDATE lease.fast_acquire SET key = 'free', owner = 'b', ttl = '-1 second'".to_owned(),
        "UPDATE lease.fast_acquire SET key = 'never-seen', owner = 'b', ttl = '1 hour'".to_owned(),
    ] {
        assert_eq!(written(&mut conn, &sql), 0, "{sql} must write nothing");
    }
    assert_eq!(table_snapshot(&mut admin), before);
    // And what they allow, the views do, with the functions' effects.
    assert_eq!(
        written(
            &mut conn,
            "UPDATE lease.fast_acquire SET key = 'free', owner = 'b', ttl = '1 hour'"
        ),
        1
    );
    assert_eq!(
        raw_row(&mut admin, "free").unwrap(),
        format!("b|{}|t|", freed.epoch() + 2)
    );
    drop(conn);
    drop_role(&db, &role);
}

#[test]
fn a_fast_acquire_never_waits_and_a_denied_one_keeps_no_lock() {
    let db = TestDb::new();
    let mut admin = db.conn();
    let mut other = db.conn();
    let mut conn = db.conn();
    granted(acquire(&mut conn, "held", "a", TTL).unwrap());
    let freed = granted(acquire(&mut conn, "free", "a", TTL).unwrap());
    assert_eq!(
        release(&mut conn, "free", "a", freed.epoch()).unwrap(),
        Release::Released
    );

    // A denied fast acquire, in an open transaction, locks nothing: another
    // session locks the row at once.
    conn.batch_execute("BEGIN").unwrap();
    assert_eq!(
        written(
            &mut conn,
            "UPDATE lease.fast_acquire SET key = 'held', owner = 'b', ttl = '1 hour'"
        ),
        0
    );
    assert_eq!(
        sqlstate_of(
            &mut other,
            "SELECT 1 FROM lease.leases WHERE key = 'held' FOR UPDATE NOWAIT"
        ),
        "00000"
    );
    conn.batch_execute("COMMIT").unwrap();

    // A FREE row another transaction has locked: no row back, at once
    // (lock_timeout would turn a wait into an error).
    admin
        .batch_execute("BEGIN; SELECT 1 FROM lease.leases WHERE key = 'free' FOR UPDATE")
        .unwrap();
    conn.batch_execute("SET lock_timeout = '200ms'").unwrap();
    assert_eq!(
        written(
            &mut conn,
            "UPDATE lease.fast_acquire SET key = 'free', owner = 'b', ttl = '1 hour'"
        ),
        0
    );
    admin.batch_execute("ROLLBACK").unwrap();
    assert_eq!(
        written(
            &mut conn,
            "UPDATE lease.fast_acquire SET key = 'free', owner = 'b', ttl = '1 hour'"
        ),
        1
    );
}

#[test]
fn a_fast_path_that_writes_makes_its_transaction_durable_even_without_returning() {
    let db = TestDb::new();
    let role = app_role(&db, "nosync");
    let mut conn = db.conn_as(&role);
    let held = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    let durability = |conn: &mut PgConnection| -> String {
        query_lines(conn, "SELECT current_setting('synchronous_commit') AS line").remove(0)
    };
    conn.batch_execute("SET synchronous_commit = off").unwrap();
    for sql in [
        format!(
            "UPDATE lease.fast_renew SET key = 'k', owner = 'a', epoch = {}, ttl = '1 hour'",
            held.epoch()
        ),
        format!(
            "UPDATE lease.fast_release SET key = 'k', owner = 'a', epoch = {}",
            held.epoch()
        ),
        "UPDATE lease.fast_acquire SET key = 'k', owner = 'b', ttl = '1 hour'".to_owned(),
    ] {
        conn.batch_execute("BEGIN").unwrap();
        assert_eq!(written(&mut conn, &sql), 1, "{sql}");
        assert_eq!(durability(&mut conn), "on", "{sql}");
        conn.batch_execute("COMMIT").unwrap();
        assert_eq!(durability(&mut conn), "off", "only for the transaction");
    }
    drop(conn);
    drop_role(&db, &role);
}

#[test]
fn the_fast_paths_refuse_keys_under_another_roles_namespace() {
    let db = TestDb::new();
    let owner_role = app_role(&db, "team");
    let outsider = app_role(&db, "outsider");
    let mut admin = db.conn();
    let mut conn = db.conn_as(&outsider);
    let held = granted(acquire(&mut conn, "team/held", "o", TTL).unwrap());
    let freed = granted(acquire(&mut conn, "team/free", "o", TTL).unwrap());
    assert_eq!(
        release(&mut conn, "team/free", "o", freed.epoch()).unwrap(),
        Release::Released
    );
    admin
        .batch_execute(&format!(
            "SELECT lease.bind_namespace('team/', {})",
            quote(&owner_role)
        ))
        .unwrap();
    let before = table_snapshot(&mut admin);
    for sql in [
        "UPDATE lease.fast_acquire SET key = 'team/free', owner = 'o', ttl = '1 hour'".to_owned(),
        format!(
            "UPDATE lease.fast_renew SET key = 'team/held', owner = 'o', epoch = {}, ttl = '1 hour'",
            held.epoch()
        ),
        format!(
            "UPDATE lease.fast_release SET key = 'team/held', owner = 'o', epoch = {}",
            held.epoch()
        ),
    ] {
        assert_eq!(written(&mut conn, &sql), 0, "{sql} must write nothing");
    }
    assert_eq!(table_snapshot(&mut admin), before);
    // Through the API the functions then name the refusal.
    assert!(matches!(
        renew(&mut conn, "team/held", "o", held.epoch(), TTL),
        Err(leasehold::LeaseError::Forbidden { .. })
    ));
    drop(conn);
    drop_role(&db, &outsider);
    drop_role(&db, &owner_role);
}

#[test]
fn fast_wake_wakes_only_the_waiters_of_a_free_key() {
    let db = TestDb::new();
    let mut listener = db.conn();
    let mut conn = db.conn();
    let held = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    listener
        .batch_execute("LISTEN lease_released; SELECT lease._waiter_watch('k')")
        .unwrap();
    let digest = query_lines(
        &mut conn,
        "SELECT encode(sha256(convert_to('k', 'UTF8')), 'hex') AS line",
    )
    .remove(0);
    // Called by hand on a held key: nobody is woken. The marker, sent after
    // it, bounds what the listener must have received.
    conn.batch_execute(
        "SELECT lease._fast_wake(sha256(convert_to('k', 'UTF8'))); \
         SELECT pg_notify('lease_released', 'marker')",
    )
    .unwrap();
    let received = |listener: &mut PgConnection, until: &str| -> Vec<String> {
        let mut payloads = Vec::new();
        for _ in 0..1_000 {
            listener.batch_execute("SELECT 1").unwrap();
            for notification in listener.notifications_iter() {
                payloads.push(notification.unwrap().payload);
            }
            if payloads.iter().any(|p| p == until) {
                return payloads;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{until} never arrived; got {payloads:?}");
    };
    assert_eq!(received(&mut listener, "marker"), ["marker"]);
    // A release through the fast path wakes the registered listener.
    assert_eq!(
        release(&mut conn, "k", "a", held.epoch()).unwrap(),
        Release::Released
    );
    assert_eq!(received(&mut listener, &digest), vec![digest]);
}

/// Whether the lineage row's `checked_start` is this server's start time.
fn lineage_checked_here(conn: &mut PgConnection) -> bool {
    query_lines(
        conn,
        "SELECT (checked_start IS NOT DISTINCT FROM pg_postmaster_start_time())::text AS line \
         FROM lease.lineage",
    )
    .remove(0)
        == "true"
}

#[test]
fn a_lineage_row_this_server_has_not_checked_sends_the_grant_to_the_function() {
    let db = TestDb::new();
    let mut conn = db.conn();
    assert!(lineage_checked_here(&mut conn), "install checks the row");
    let first = granted(acquire(&mut conn, "k", "a", TTL).unwrap());
    assert_eq!(
        release(&mut conn, "k", "a", first.epoch()).unwrap(),
        Release::Released
    );
    let generation = first.epoch() >> 40;

    // This server restarted since the row was checked (same system
    // identifier, another start time): the grant goes to lease.acquire,
    // which compares the identifiers, keeps the generation and records
    // this server's start time; the next grant takes the fast path again.
    conn.batch_execute(
        "UPDATE lease.lineage SET checked_start = '2000-01-01 00:00:00+00'; \
         SET track_functions = 'pl'; BEGIN",
    )
    .unwrap();
    // Counts not yet flushed from earlier transactions show in the view
    // too, so each check counts from here.
    let before = calls_of(&mut conn, "acquire");
    let second = granted(acquire(&mut conn, "k", "b", TTL).unwrap());
    assert_eq!(calls_of(&mut conn, "acquire") - before, 1);
    assert_eq!(second.epoch() >> 40, generation);
    assert!(lineage_checked_here(&mut conn));
    assert_eq!(
        release(&mut conn, "k", "b", second.epoch()).unwrap(),
        Release::Released
    );
    let third = granted(acquire(&mut conn, "k", "c", TTL).unwrap());
    assert_eq!(
        calls_of(&mut conn, "acquire") - before,
        1,
        "the fast path again"
    );
    assert_eq!(third.epoch(), second.epoch() + 2);
    assert_eq!(
        release(&mut conn, "k", "c", third.epoch()).unwrap(),
        Release::Released
    );
    conn.batch_execute("COMMIT").unwrap();

    // The row of another cluster (a dump restored here carries the other
    // server's system identifier and start time): the grant goes to
    // lease.acquire, which starts a new lineage one generation up.
    conn.batch_execute(
        "UPDATE lease.lineage SET system_identifier = system_identifier + 1, \
                                  checked_start = '2000-01-01 00:00:00+00'; \
         BEGIN",
    )
    .unwrap();
    let before = calls_of(&mut conn, "acquire");
    let fourth = granted(acquire(&mut conn, "k", "d", TTL).unwrap());
    assert_eq!(calls_of(&mut conn, "acquire") - before, 1);
    assert_eq!(fourth.epoch() >> 40, generation + 1);
    assert!(lineage_checked_here(&mut conn));
    conn.batch_execute("COMMIT").unwrap();
}
