//! Shared setup: one PostgreSQL server per test binary, a fresh database per
//! test (both from `leasehold-test-support`), and the assertions only these
//! tests use.
//!
//! Without `DATABASE_URL` the server is a throwaway `LocalPostgres` (fsync
//! off: these tests prove semantics, not durability). With `DATABASE_URL`
//! the same tests run against that server; its role needs CREATEDB (and
//! CREATEROLE for the security tests).

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
pub use leasehold_test_support::{
    query_bool, query_lines, quote, server_now, wait_for_lock_waiter,
    wait_until_server_time_passes, TestDb, TestServer,
};

pub const TTL: Duration = Duration::from_secs(30);

/// A ttl for a grant that a test needs held for its next step or two, and
/// then lapsed (it waits for the lapse on the server's clock). Long enough
/// that a machine busy with other suites cannot let it run out between two
/// consecutive calls; short enough to wait for.
pub const STILL_HELD_NEXT_STEP: Duration = Duration::from_secs(2);

pub fn granted(acquisition: leasehold::Acquisition) -> leasehold::Lease {
    match acquisition {
        leasehold::Acquisition::Granted(lease) => lease,
        leasehold::Acquisition::Denied => panic!("expected a grant, got a denial"),
    }
}

/// The raw row of a key, for checks that go below the API (superuser only).
pub fn raw_row(conn: &mut PgConnection, key: &str) -> Option<String> {
    query_lines(
        conn,
        &format!(
            "SELECT format('%s|%s|%s|%s', owner, epoch, expires_at IS NOT NULL, lapsed_owner) AS line \
             FROM lease.leases WHERE key = {}",
            quote(key)
        ),
    )
    .into_iter()
    .next()
}

/// The SQLSTATE a statement fails with, or "00000". Runs it through a
/// temporary plpgsql function because diesel does not expose SQLSTATE.
pub fn sqlstate_of(conn: &mut PgConnection, sql: &str) -> String {
    conn.batch_execute(
        "CREATE OR REPLACE FUNCTION pg_temp.sqlstate_of(statement text) RETURNS text
         LANGUAGE plpgsql AS $f$
         BEGIN
             EXECUTE statement;
             RETURN '00000';
         EXCEPTION WHEN OTHERS OR query_canceled THEN
             RETURN SQLSTATE;
         END $f$;",
    )
    .expect("create sqlstate_of");
    query_lines(
        conn,
        &format!("SELECT pg_temp.sqlstate_of({}) AS line", quote(sql)),
    )
    .remove(0)
}

/// A snapshot of the whole lease table, for "nothing changed" checks.
pub fn table_snapshot(conn: &mut PgConnection) -> Vec<String> {
    query_lines(
        conn,
        "SELECT format('%s|%s|%s|%s|%s', key, owner, epoch, expires_at, lapsed_owner) AS line \
         FROM lease.leases ORDER BY key",
    )
}

/// Makes `epoch` the newest grant of `key` unless the key is already at or
/// past it, as if that many grants had come and gone and the last one had
/// lapsed: owner `pretend`, expired, so a real acquire takes it over. A
/// guard test can then present that epoch: guards refuse epochs a key never
/// granted (G7) and, as stale, epochs below its newest grant (G2). Raw SQL
/// as the superuser; for tests whose subject is the guard, not the grants.
pub fn pretend_granted(conn: &mut PgConnection, key: &str, epoch: i64) {
    let covered = format!(
        "SELECT EXISTS (SELECT 1 FROM lease.leases WHERE key = {} AND epoch >= {epoch}) AS flag",
        quote(key)
    );
    if query_bool(conn, &covered) {
        return; // no write, so no lock for concurrent tests to queue on
    }
    conn.batch_execute(&format!(
        "INSERT INTO lease.leases AS l (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch) \
         VALUES ({k}, lease._key_hash({k}), 'pretend', {epoch}, now() - interval '1 second', NULL, 1) \
         ON CONFLICT (key_hash) DO UPDATE \
            SET epoch = excluded.epoch, owner = excluded.owner, expires_at = excluded.expires_at, \
                lapsed_owner = NULL, group_id = NULL \
          WHERE l.epoch < excluded.epoch",
        k = quote(key)
    ))
    .expect("raise the key's counter");
}

/// A login role of this test's own (named after its database), for tests
/// that act as an ordinary role. Drop it with [`drop_role`].
pub fn app_role(db: &TestDb, suffix: &str) -> String {
    let role = format!("{}_{suffix}", db.name);
    db.conn()
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .unwrap();
    role
}

/// Drops a role made by [`app_role`] and everything it owns.
pub fn drop_role(db: &TestDb, role: &str) {
    let _ = db
        .conn()
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"));
}
