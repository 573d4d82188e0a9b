//! The SQL laid out for releases (docs/ARCHITECTURE.md, "Where the SQL
//! lives"): tables in append-only migrations, every function in the files
//! of `sql/functions/`. `install()` and Diesel's runner leave the same
//! catalog; a database whose functions an earlier release installed
//! upgrades by the functions step alone, keeping its leases, epochs and
//! guard records, and ends with the catalog of a fresh install.

use diesel::connection::SimpleConnection;
use diesel::PgConnection;
use diesel_migrations::MigrationHarness;
use leasehold::guard::{Check, Fencing};
use leasehold::{admin::installed_versions, install, Leases};
use leasehold_test_support::catalog::{catalog, lease_state};
use leasehold_test_support::TestDb;

use crate::common::*;

/// Leases held and released, a guard record by `admit` and one by `fence`,
/// a heartbeat group: the state an upgrade must keep. Returns the lease
/// still held.
fn hold_a_lease(conn: &mut PgConnection) -> leasehold::Lease {
    let first = granted(conn.acquire("job-a", "w1", TTL).unwrap());
    conn.admit("res-a", &first, Check::Token).unwrap();
    assert_eq!(conn.release(&first).unwrap(), leasehold::Release::Released);
    let held = granted(conn.acquire("job-a", "w2", TTL).unwrap());
    conn.admit("res-a", &held, Check::Token).unwrap();
    conn.fence("res-b", "job-a", held.epoch()).unwrap();
    let other = granted(conn.acquire("job-b", "w1", TTL).unwrap());
    let joined = conn
        .join_group(
            &leasehold_test_support::grants("w1", &[("job-b", other.epoch())]),
            TTL,
        )
        .unwrap();
    assert!(joined.group.is_some());
    held
}

/// After the upgrade: the held lease renews and its guard admits it, a
/// superseded epoch is refused, and the next grant continues the epochs.
fn still_works(conn: &mut PgConnection, held: &leasehold::Lease) {
    assert!(matches!(
        conn.renew(held, TTL).unwrap(),
        leasehold::Renewal::Renewed { .. }
    ));
    conn.admit("res-a", held, Check::Token).unwrap();
    let stale = leasehold::FencingToken::new("job-a", "w1", leasehold::Epoch::from(1)).unwrap();
    assert!(
        conn.admit("res-a", &stale, Check::Token).is_err(),
        "a stale epoch is refused"
    );
    assert_eq!(conn.release(held).unwrap(), leasehold::Release::Released);
    let next = granted(conn.acquire("job-a", "w3", TTL).unwrap());
    assert_eq!(i64::from(next.epoch()), i64::from(held.epoch()) + 2);
}

/// What a function fixed after a release looks like to the upgrade: the
/// installed definitions differ from the files' in a body, a setting and a
/// grant, so that only applying the files again gives a fresh install's
/// catalog.
const DRIFT: &str = "CREATE OR REPLACE FUNCTION lease._max_batch() RETURNS integer
                     LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000 /* as released */ $$;
                     ALTER FUNCTION lease.renew(text, text, bigint, interval) SET work_mem = '64kB';
                     REVOKE EXECUTE ON FUNCTION lease.inspect_guard(text) FROM PUBLIC;";

fn fresh_install_catalog() -> (Vec<String>, Vec<String>) {
    let db = TestDb::empty();
    let mut conn = db.conn();
    install(&mut conn).unwrap();
    (catalog(&mut conn), installed_versions(&mut conn).unwrap())
}

#[test]
fn install_and_diesels_runner_leave_the_same_catalog() {
    let (by_install, _) = fresh_install_catalog();
    let db = TestDb::empty();
    let mut conn = db.conn();
    conn.run_pending_migrations(leasehold::admin::MIGRATIONS)
        .unwrap();
    assert!(by_install
        .iter()
        .any(|line| line.starts_with("function lease.acquire(")));
    assert!(by_install
        .iter()
        .any(|line| line.starts_with("function acl lease.acquire(")));
    assert_eq!(catalog(&mut conn), by_install);
}

#[test]
fn applying_the_files_of_functions_again_changes_nothing() {
    let db = TestDb::empty();
    let mut conn = db.conn();
    install(&mut conn).unwrap();
    let before = catalog(&mut conn);
    let held = hold_a_lease(&mut conn);
    let state = lease_state(&mut conn);
    conn.batch_execute(&format!(
        "BEGIN; {} COMMIT;",
        leasehold::__private::sql_files::functions_sql()
    ))
    .unwrap();
    assert_eq!(catalog(&mut conn), before);
    assert_eq!(lease_state(&mut conn), state);
    still_works(&mut conn, &held);
}

/// The version an earlier release recorded for its functions step: today's
/// migrations, other functions.
const EARLIER_FUNCTIONS: &str = "20261201000001.000000000000";

/// Makes the installed functions those of an earlier release: [`DRIFT`],
/// and the functions step recorded under [`EARLIER_FUNCTIONS`] in `table`.
fn as_an_earlier_release(conn: &mut PgConnection, table: &str) {
    conn.batch_execute(DRIFT).unwrap();
    conn.batch_execute(&format!(
        "UPDATE {table} SET version = '{EARLIER_FUNCTIONS}' WHERE version = '{}'",
        leasehold::__private::sql_files::functions_version()
    ))
    .unwrap();
}

#[test]
fn an_install_with_an_earlier_releases_functions_upgrades_by_install_keeping_its_leases() {
    let (fresh, fresh_versions) = fresh_install_catalog();
    let db = TestDb::empty();
    let mut conn = db.conn();
    install(&mut conn).unwrap();
    let held = hold_a_lease(&mut conn);
    as_an_earlier_release(&mut conn, "lease.schema_migrations");
    assert_ne!(catalog(&mut conn), fresh);
    let before = lease_state(&mut conn);
    assert!(before
        .iter()
        .any(|line| line.starts_with("guard res-a job-a ")));
    assert!(before
        .iter()
        .any(|line| line.starts_with("guard res-b job-a ")));
    let report = install(&mut conn).unwrap();
    assert_eq!(
        report.applied,
        [leasehold::__private::sql_files::functions_version()],
        "only the functions step runs"
    );
    assert_eq!(
        lease_state(&mut conn),
        before,
        "the upgrade changed no lease, epoch or guard record"
    );
    assert_eq!(
        catalog(&mut conn),
        fresh,
        "the upgraded catalog is a fresh install's"
    );
    assert_eq!(
        installed_versions(&mut conn).unwrap(),
        fresh_versions,
        "the replaced functions step is forgotten"
    );
    assert!(install(&mut conn).unwrap().applied.is_empty());
    still_works(&mut conn, &held);
    // And it can be removed like a fresh install.
    leasehold::admin::uninstall(&mut conn).unwrap();
}

#[test]
fn an_install_with_an_earlier_releases_functions_upgrades_by_diesels_runner_keeping_its_leases() {
    let (fresh, _) = fresh_install_catalog();
    let db = TestDb::empty();
    let mut conn = db.conn();
    conn.run_pending_migrations(leasehold::admin::MIGRATIONS)
        .unwrap();
    let held = hold_a_lease(&mut conn);
    as_an_earlier_release(&mut conn, "__diesel_schema_migrations");
    let before = lease_state(&mut conn);
    let applied: Vec<String> = conn
        .run_pending_migrations(leasehold::admin::MIGRATIONS)
        .unwrap()
        .into_iter()
        .map(|version| version.to_string())
        .collect();
    assert_eq!(
        applied,
        [leasehold::__private::sql_files::functions_version()]
    );
    assert_eq!(lease_state(&mut conn), before);
    assert_eq!(catalog(&mut conn), fresh);
    still_works(&mut conn, &held);
    // Diesel's bookkeeping names only what the source has, so reverting
    // everything works after the upgrade.
    conn.revert_all_migrations(leasehold::admin::MIGRATIONS)
        .unwrap();
    assert!(!query_bool(
        &mut conn,
        "SELECT to_regnamespace('lease') IS NOT NULL AS flag"
    ));
}
