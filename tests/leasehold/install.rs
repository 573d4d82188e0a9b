//! Installation: idempotent, concurrent-safe, isolated from the application's
//! own Diesel migrations, usable by a role that does not own `public`.

use std::sync::{Arc, Barrier};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use diesel_migrations::{FileBasedMigrations, MigrationHarness};
use leasehold::{
    admin::{installed_versions, uninstall},
    error::Operation,
    install, ErrorKind, Leases,
};

use crate::common::*;
use leasehold::guard::Check;
use leasehold::guard::Fencing;

/// Every migration's version, then the functions step's.
fn expected_versions() -> Vec<String> {
    let mut versions: Vec<String> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
            .unwrap()
            .map(|entry| {
                entry
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .split('_')
                    .next()
                    .unwrap()
                    .replace('-', "")
            })
            .collect();
    versions.sort();
    versions.push(leasehold::__private::sql_files::functions_version());
    versions
}

#[test]
fn install_applies_every_migration_once_then_is_a_no_op() {
    let db = TestDb::empty();
    let mut conn = db.conn();
    assert!(installed_versions(&mut conn).unwrap().is_empty());
    let first = install(&mut conn).unwrap();
    assert_eq!(first.applied, expected_versions());
    assert_eq!(installed_versions(&mut conn).unwrap(), expected_versions());
    let second = install(&mut conn).unwrap();
    assert!(second.applied.is_empty(), "{second:?}");
    granted(conn.acquire("k", "a", TTL).unwrap());
}

#[test]
fn concurrent_installers_all_succeed_and_exactly_one_installs() {
    let db = TestDb::empty();
    const INSTALLERS: usize = 6;
    let barrier = Arc::new(Barrier::new(INSTALLERS));
    let handles: Vec<_> = (0..INSTALLERS)
        .map(|_| {
            let (url, barrier) = (db.url.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = PgConnection::establish(&url).unwrap();
                barrier.wait();
                install(&mut conn)
            })
        })
        .collect();
    let reports: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().unwrap().expect("install failed"))
        .collect();
    let installing: Vec<_> = reports.iter().filter(|r| !r.applied.is_empty()).collect();
    assert_eq!(installing.len(), 1, "{reports:?}");
    assert_eq!(
        installed_versions(&mut db.conn()).unwrap(),
        expected_versions()
    );
}

#[test]
fn install_leaves_the_applications_own_diesel_migrations_intact() {
    let db = TestDb::empty();
    let mut conn = db.conn();
    let app_dir =
        std::env::temp_dir().join(format!("leasehold-app-migrations-{}", std::process::id()));
    let migration_dir = app_dir.join("2020-01-01-000000_app_table");
    std::fs::create_dir_all(&migration_dir).unwrap();
    std::fs::write(
        migration_dir.join("up.sql"),
        "CREATE TABLE app_things (id int PRIMARY KEY);",
    )
    .unwrap();
    std::fs::write(migration_dir.join("down.sql"), "DROP TABLE app_things;").unwrap();
    let app_migrations = FileBasedMigrations::from_path(&app_dir).unwrap();
    conn.run_pending_migrations(app_migrations.clone()).unwrap();

    install(&mut conn).unwrap();

    let app_versions = query_lines(
        &mut conn,
        "SELECT version AS line FROM public.__diesel_schema_migrations ORDER BY 1",
    );
    assert_eq!(
        app_versions,
        ["20200101000000"],
        "leasehold must not record in the app's table"
    );
    assert!(!conn.has_pending_migration(app_migrations.clone()).unwrap());
    conn.batch_execute("INSERT INTO app_things VALUES (1)")
        .unwrap();
    granted(conn.acquire("k", "a", TTL).unwrap());
    // Reverting the app's migration touches nothing of leasehold's.
    conn.revert_last_migration(app_migrations).unwrap();
    granted(conn.acquire("k", "a", TTL).unwrap());
    std::fs::remove_dir_all(app_dir).unwrap();
}

#[test]
fn vendored_migrations_run_under_diesels_own_harness() {
    let db = TestDb::empty();
    let mut conn = db.conn();
    conn.run_pending_migrations(leasehold::admin::MIGRATIONS)
        .unwrap();
    let lease = granted(conn.acquire("k", "a", TTL).unwrap());
    assert_eq!(lease.epoch(), 1);
    // down.sql removes everything again.
    conn.revert_all_migrations(leasehold::admin::MIGRATIONS)
        .unwrap();
    assert!(!query_bool(
        &mut conn,
        "SELECT to_regnamespace('lease') IS NOT NULL AS flag"
    ));
}

#[test]
fn uninstall_removes_everything_and_a_reinstall_starts_at_epoch_1() {
    let db = TestDb::empty();
    let mut conn = db.conn();
    install(&mut conn).unwrap();
    granted(conn.acquire("k", "a", TTL).unwrap());
    uninstall(&mut conn).unwrap();
    assert!(!query_bool(
        &mut conn,
        "SELECT to_regnamespace('lease') IS NOT NULL AS flag"
    ));
    assert!(installed_versions(&mut conn).unwrap().is_empty());
    install(&mut conn).unwrap();
    assert_eq!(granted(conn.acquire("k", "b", TTL).unwrap()).epoch(), 1);
}

#[test]
fn install_works_for_a_role_that_does_not_own_public() {
    let db = TestDb::empty();
    let role = format!("{}_installer", db.name);
    let mut admin = db.conn();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT CREATE ON DATABASE {} TO {role}; REVOKE CREATE ON SCHEMA public FROM PUBLIC;",
            db.name
        ))
        .unwrap();
    let mut conn = db.conn_as(&role);
    let report = install(&mut conn).unwrap();
    assert_eq!(report.applied, expected_versions());
    granted(conn.acquire("k", "a", TTL).unwrap());
    let in_public = query_lines(
        &mut admin,
        "SELECT c.relname::text AS line FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' \
         UNION ALL SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'",
    );
    assert!(
        in_public.is_empty(),
        "install created objects in public: {in_public:?}"
    );
    drop(conn);
    admin
        .batch_execute(&format!(
            "DROP SCHEMA lease CASCADE; DROP OWNED BY {role}; DROP ROLE {role}"
        ))
        .unwrap();
}

#[test]
fn install_without_create_privilege_fails_with_advice_and_leaves_nothing() {
    let db = TestDb::empty();
    let role = format!("{}_weak", db.name);
    let mut admin = db.conn();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; REVOKE CREATE ON DATABASE {} FROM PUBLIC;",
            db.name
        ))
        .unwrap();
    let mut conn = db.conn_as(&role);
    let error = install(&mut conn).unwrap_err();
    // Typed, naming the role and the database, and saying what to do, in
    // the message itself (not only in a source behind it).
    match &error {
        error
            if error.kind() == ErrorKind::Forbidden
                && error.operation() == Some(Operation::INSTALL)
                && error
                    .to_string()
                    .contains("may not create schema lease in database") =>
        {
            assert_eq!(error.role(), Some(role.as_str()));
            // The database is named only in the message.
            assert!(
                error
                    .to_string()
                    .contains(&format!("in database {:?}", db.name)),
                "{error}"
            );
        }
        other => panic!("expected NotPermitted, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("may not create schema lease")
            && message.contains("GRANT CREATE ON DATABASE"),
        "{message}"
    );
    assert!(!query_bool(
        &mut admin,
        "SELECT to_regnamespace('lease') IS NOT NULL AS flag"
    ));
    drop(conn);
    admin.batch_execute(&format!("DROP ROLE {role}")).unwrap();
}

/// The version check migration 1 opens with (and `install` runs first), as
/// it would fire on PostgreSQL 13: no PostgreSQL 13 server is at hand, so
/// the same block with its minimum raised to 99 runs on this server instead,
/// which is below that. It must refuse with SQLSTATE 0A000, the stable
/// constraint name and a DETAIL `minimum=<major> server_version=<version>`
/// that `LeaseError::UnsupportedVersion` is read from (the mapping itself
/// is unit-tested in src/error.rs), and this server must pass the real one.
#[test]
fn the_version_check_refuses_a_server_below_the_minimum() {
    let up = include_str!("../../migrations/2026-12-01-000001_tables/up.sql");
    let start = up.find("DO $$").expect("migration 1 opens with a DO block");
    let end = start + up[start..].find("$$;").expect("its end") + "$$;".len();
    let check = &up[start..end];
    assert!(check.contains("lease_unsupported_version"), "{check}");
    assert!(
        check.contains("OPERATOR(pg_catalog.<) 140000 THEN"),
        "{check}"
    );

    let db = TestDb::empty();
    let mut conn = db.conn();
    conn.batch_execute(check)
        .expect("this server is PostgreSQL 14 or newer");

    let raised = check
        .replace("140000", "990000")
        .replace("minimum=14", "minimum=99")
        .replace("PostgreSQL 14 or newer", "PostgreSQL 99 or newer");
    assert_eq!(sqlstate_of(&mut conn, &raised), "0A000");
    let error = conn.batch_execute(&raised).unwrap_err();
    let diesel::result::Error::DatabaseError(_, info) = &error else {
        panic!("{error:?}")
    };
    let version = query_lines(
        &mut conn,
        "SELECT current_setting('server_version') AS line",
    );
    assert_eq!(info.constraint_name(), Some("lease_unsupported_version"));
    assert_eq!(
        info.details(),
        Some(format!("minimum=99 server_version={}", version[0]).as_str())
    );
    assert!(
        info.message().contains(&format!(
            "needs PostgreSQL 99 or newer; this server is PostgreSQL {}",
            version[0]
        )),
        "{}",
        info.message()
    );
    assert!(installed_versions(&mut conn).unwrap().is_empty());
}

/// A version matrix run (`.ci/pg-matrix`) names the major it tests in
/// `LEASEHOLD_EXPECT_PG_MAJOR`; the server these tests use must run it.
#[test]
fn the_test_server_runs_the_expected_major() {
    let version =
        leasehold_test_support::server::check_expected_major(&TestServer::from_env().admin_url());
    eprintln!("the tests run on PostgreSQL {version}");
}

/// On a database where leasehold was never installed, lease and guard
/// calls say so, typed, with the advice in the message: not an internal
/// name that does not exist.
#[test]
fn calls_on_a_database_without_leasehold_say_it_is_not_installed() {
    let db = TestDb::empty();
    let mut conn = db.conn();
    let error = conn.acquire("k", "o", TTL).unwrap_err();
    assert!(
        error.kind() == ErrorKind::NotInstalled && error.operation() == Some(Operation::ACQUIRE),
        "{error:?}"
    );
    assert!(error.to_string().contains("leasehold install"), "{error}");
    let error = conn.inspect("k").unwrap_err();
    assert!(
        error.kind() == ErrorKind::NotInstalled && error.operation() == Some(Operation::INSPECT),
        "{error:?}"
    );
    let token = leasehold::FencingToken::new("k", "o", leasehold::Epoch::from(1)).expect("token");
    let error = conn.admit("r", &token, Check::Token).unwrap_err();
    assert!(
        error.kind() == ErrorKind::NotInstalled && error.operation() == Some(Operation::ADMIT),
        "{error:?}"
    );
    assert!(error.to_string().contains("not installed"), "{error}");
}
