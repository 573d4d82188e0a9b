//! Security: SECURITY DEFINER functions with a pinned search_path, tables
//! closed to callers, no hijacking through `public`, awkward names.

use diesel::connection::SimpleConnection;
use diesel_migrations::MigrationHarness;
use leasehold::{
    admin::installed_versions, error::LeaseError, install, Acquisition, ErrorKind, LeaseState,
    Leases, Release, Renewal,
};

use crate::common::*;

#[test]
fn every_api_function_that_reads_the_tables_is_security_definer_with_search_path_pinned() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let functions = query_lines(
        &mut conn,
        "SELECT format('%s|%s|%s', p.proname, p.prosecdef, array_to_string(p.proconfig, ',')) AS line \
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = 'lease' AND p.proname NOT LIKE '\\_%' ORDER BY p.proname",
    );
    assert_eq!(
        functions,
        [
            "acquire|t|search_path=pg_catalog, pg_temp",
            "admit|t|search_path=pg_catalog, pg_temp",
            "admit_held|t|search_path=pg_catalog, pg_temp",
            "bind_namespace|t|search_path=pg_catalog, pg_temp",
            "check_held|t|search_path=pg_catalog, pg_temp",
            "fence|t|search_path=pg_catalog, pg_temp",
            // A table's fence is changed with the caller's own rights (the
            // table owner's create and drop the triggers), and reading the
            // catalog needs none.
            "fenced_tables|f|search_path=pg_catalog, pg_temp",
            "force_release|t|search_path=pg_catalog, pg_temp",
            "force_release|t|search_path=pg_catalog, pg_temp",
            "generation|t|search_path=pg_catalog, pg_temp",
            "inspect|t|search_path=pg_catalog, pg_temp",
            "inspect_guard|t|search_path=pg_catalog, pg_temp",
            "join_group|t|search_path=pg_catalog, pg_temp",
            "key_state|t|search_path=pg_catalog, pg_temp",
            "list_leases|t|search_path=pg_catalog, pg_temp",
            "list_namespaces|t|search_path=pg_catalog, pg_temp",
            "present|t|search_path=pg_catalog, pg_temp",
            "protect_rows|f|search_path=pg_catalog, pg_temp",
            "protect_table|f|search_path=pg_catalog, pg_temp",
            "prune_guards|t|search_path=pg_catalog, pg_temp",
            "prune_keys|t|search_path=pg_catalog, pg_temp",
            "raise_generation|t|search_path=pg_catalog, pg_temp",
            "release|t|search_path=pg_catalog, pg_temp",
            // The batch calls also fix their plan for their own duration
            // (migration 2026-11-30-000006: the lock order rests on it).
            "release_many|t|search_path=pg_catalog, pg_temp",
            "renew|t|search_path=pg_catalog, pg_temp",
            "renew_admit|t|search_path=pg_catalog, pg_temp",
            "renew_group|t|search_path=pg_catalog, pg_temp",
            "renew_many|t|search_path=pg_catalog, pg_temp",
            "unbind_namespace|t|search_path=pg_catalog, pg_temp",
            "unprotect_table|f|search_path=pg_catalog, pg_temp",
            "why_refused|t|search_path=pg_catalog, pg_temp",
        ]
    );
}

#[test]
fn a_plain_role_can_call_the_functions_but_cannot_touch_the_tables() {
    let db = TestDb::new();
    let role = app_role(&db, "caller");
    {
        let mut conn = db.conn_as(&role);
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
        assert_eq!(
            conn.inspect("k").unwrap(),
            Some(LeaseState::Free {
                epoch: 2.into(),
                force_released: false
            })
        );
        for sql in [
            "SELECT * FROM lease.leases",
            "UPDATE lease.leases SET epoch = 1",
            "DELETE FROM lease.leases",
            "INSERT INTO lease.leases (key, owner, epoch, expires_at) VALUES ('x', 'y', 1, now())",
            "SELECT * FROM lease.schema_migrations",
            "SELECT lease._key_hash('k')",
            "CREATE TABLE lease.mine (x int)",
        ] {
            assert_eq!(
                sqlstate_of(&mut conn, sql),
                "42501",
                "{sql} must be refused"
            );
        }
    }
    assert_eq!(
        db.conn().inspect("k").unwrap(),
        Some(LeaseState::Free {
            epoch: 2.into(),
            force_released: false
        })
    );
    drop_role(&db, &role);
}

#[test]
fn shadowing_functions_and_operators_in_public_change_nothing() {
    let db = TestDb::new();
    let role = app_role(&db, "hijacker");
    db.conn()
        .batch_execute(&format!("GRANT CREATE ON SCHEMA public TO {role}"))
        .unwrap();
    let mut conn = db.conn_as(&role);
    granted(conn.acquire("k", "holder", TTL).unwrap());
    conn.batch_execute(
        "CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT now() + interval '100 years' $$;
         CREATE FUNCTION public.text_always_equal(text, text) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
         CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.text_always_equal);
         CREATE FUNCTION public.sha256(bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT '\\x00'::bytea $$;
         CREATE TEMP TABLE leases (key text, owner text, epoch bigint, expires_at timestamptz);
         SET search_path = public, pg_temp, pg_catalog;",
    )
    .unwrap();
    // With the clock shadowed the lease would look lapsed; with `=` shadowed
    // any owner would match. Neither may happen.
    assert_eq!(
        conn.acquire("k", "thief", TTL).unwrap(),
        Acquisition::Denied
    );
    assert_eq!(
        conn.renew(&leasehold_test_support::grant("k", "thief", 1), TTL)
            .unwrap(),
        Renewal::Refused(leasehold::Refusal::NeverHeld)
    );
    assert_eq!(
        conn.release(&leasehold_test_support::grant("k", "thief", 1))
            .unwrap(),
        Release::Refused(leasehold::Refusal::NeverHeld)
    );
    assert!(conn.inspect("k").unwrap().unwrap().is_held());
    assert_eq!(granted(conn.acquire("other", "a", TTL).unwrap()).epoch(), 1);
    drop(conn);
    drop_role(&db, &role);
}

#[test]
fn keys_and_owners_with_quotes_unicode_and_10_kb_lengths_work() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let long_key: String = (0..10_240)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let long_owner = "ø".repeat(5_120);
    let names = [
        (
            "it's \"quoted\"; DROP TABLE lease.leases; --".to_owned(),
            "o'wner".to_owned(),
        ),
        ("ключ-🔑-鍵".to_owned(), "владелец 🦀".to_owned()),
        (long_key, long_owner),
        ("%s %d \\ \\\\".to_owned(), "$1".to_owned()),
    ];
    for (key, owner) in &names {
        let lease = granted(conn.acquire(key, owner, TTL).unwrap());
        assert_eq!(
            (lease.key(), lease.owner(), lease.epoch()),
            (key.as_str(), owner.as_str(), leasehold::Epoch::new(1))
        );
        assert_eq!(
            conn.acquire(key, "someone else", TTL).unwrap(),
            Acquisition::Denied
        );
        assert!(matches!(
            conn.renew(&leasehold_test_support::grant(key, owner, 1), TTL)
                .unwrap(),
            Renewal::Renewed { .. }
        ));
        assert_eq!(
            conn.inspect(key).unwrap(),
            Some(LeaseState::Held {
                owner: owner.clone(),
                epoch: 1.into(),
                expires_at: conn
                    .inspect(key)
                    .unwrap()
                    .map(|s| match s {
                        LeaseState::Held { expires_at, .. } => expires_at,
                        LeaseState::Lapsed { .. } | LeaseState::Free { .. } => unreachable!(),
                    })
                    .unwrap()
            })
        );
        assert_eq!(
            conn.release(&leasehold_test_support::grant(key, owner, 1))
                .unwrap(),
            Release::Released
        );
        let token = lease.token();
        assert_eq!(
            token
                .to_string()
                .parse::<leasehold::FencingToken>()
                .unwrap(),
            *token
        );
    }
    // Keys differing only in the last byte of 10 KB are distinct keys.
    let a = format!("{}a", "x".repeat(10_000));
    let b = format!("{}b", "x".repeat(10_000));
    granted(conn.acquire(&a, "one", TTL).unwrap());
    granted(conn.acquire(&b, "two", TTL).unwrap());
}

/// The objects in schema `lease` (tables, sequences, functions), as seen by
/// the superuser: what "nothing was created" compares.
fn objects_in_lease(conn: &mut diesel::PgConnection) -> Vec<String> {
    query_lines(
        conn,
        "SELECT c.relname::text AS line FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'lease' \
         UNION ALL SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'lease' \
         ORDER BY 1",
    )
}

/// §4: a role with only CREATE on the database creates schema `lease`
/// before the database owner installs. Adopting it would let that role
/// replace an internal helper and run code as the installer through the
/// next SECURITY DEFINER call, so every install path refuses, naming the
/// schema's owner, and creates nothing. Once the schema is gone, the
/// installer installs, and installs again idempotently.
#[test]
fn install_refuses_a_lease_schema_owned_by_another_role_on_every_path_and_creates_nothing() {
    let db = TestDb::empty();
    let installer = format!("{}_installer", db.name);
    let squatter = format!("{}_squatter", db.name);
    let mut admin = db.conn();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {installer} LOGIN; CREATE ROLE {squatter} LOGIN;
             ALTER DATABASE {db} OWNER TO {installer};
             GRANT CREATE ON DATABASE {db} TO {squatter};",
            db = db.name
        ))
        .unwrap();
    // The squatter opens its schema to everybody, so that without the rule
    // the installer could create leasehold's objects in it.
    db.conn_as(&squatter)
        .batch_execute("CREATE SCHEMA lease; GRANT ALL ON SCHEMA lease TO PUBLIC;")
        .unwrap();
    let mut conn = db.conn_as(&installer);

    // leasehold::install: a typed refusal naming the owner.
    let error = install(&mut conn).unwrap_err();
    match &error {
        e if e.kind() == ErrorKind::Forbidden
            && e.operation() == Some(leasehold::error::Operation::INSTALL)
            && e.to_string().starts_with("schema lease already exists") =>
        {
            assert_eq!(e.role(), Some(squatter.as_str()))
        }
        other => panic!("expected SchemaNotOwned, got {other:?}"),
    }
    assert!(error.to_string().contains(&squatter), "{error}");
    assert!(installed_versions(&mut conn).unwrap().is_empty());

    // Migration 1's up.sql run as plain SQL (the vendored path): 42501 with
    // the stable constraint name and the owner in the message.
    let up = include_str!("../../migrations/2026-12-01-000001_tables/up.sql");
    assert_eq!(sqlstate_of(&mut conn, up), "42501");
    let error = conn.batch_execute(up).unwrap_err();
    let diesel::result::Error::DatabaseError(_, info) = &error else {
        panic!("{error:?}")
    };
    assert_eq!(info.constraint_name(), Some("lease_schema_not_owned"));
    assert!(info.message().contains(&squatter), "{}", info.message());

    // diesel's own harness with the vendored migrations.
    assert!(conn
        .run_pending_migrations(leasehold::admin::MIGRATIONS)
        .is_err());

    assert_eq!(objects_in_lease(&mut admin), Vec::<String>::new());
    assert_eq!(
        query_lines(
            &mut admin,
            "SELECT pg_get_userbyid(nspowner)::text AS line FROM pg_namespace WHERE nspname = 'lease'"
        ),
        [squatter.as_str()]
    );

    // Without the squatter's schema the same installer installs, and again.
    admin.batch_execute("DROP SCHEMA lease").unwrap();
    assert!(!install(&mut conn).unwrap().applied.is_empty());
    assert!(install(&mut conn).unwrap().applied.is_empty());
    granted(conn.acquire("k", "a", TTL).unwrap());
    drop(conn);
    let _ = admin.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS lease CASCADE; ALTER DATABASE {db} OWNER TO CURRENT_USER;
         DROP OWNED BY {installer}; DROP OWNED BY {squatter}; DROP ROLE {installer}; DROP ROLE {squatter};",
        db = db.name
    ));
}

/// §4, install: a superuser's install never runs code another role put
/// into schema `lease`. The migrations run as the installer and evaluate
/// leasehold's functions and tables, so a schema into which another role
/// can put code (an object of its own, CREATE on the schema, TRIGGER on a
/// table) is refused before anything runs, on a first install and on an
/// upgrade, naming the object and the role.
#[test]
fn a_superusers_install_refuses_a_schema_another_role_can_put_code_into() {
    let db = TestDb::empty();
    let planter = format!("{}_planter", db.name);
    let mut admin = db.conn();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {planter} LOGIN;
             CREATE SCHEMA lease; GRANT CREATE, USAGE ON SCHEMA lease TO {planter};"
        ))
        .unwrap();
    db.conn_as(&planter)
        .batch_execute(
            "CREATE FUNCTION lease._drop_default_grants() RETURNS void LANGUAGE sql AS $$ SELECT $$",
        )
        .unwrap();

    let error = install(&mut admin).unwrap_err();
    match &error {
        e if is_schema_not_private(e) => {
            let what = e.to_string();
            assert!(
                what.contains("lease._drop_default_grants()") && what.contains(&planter),
                "{what}"
            )
        }
        other => panic!("expected SchemaNotPrivate, got {other:?}"),
    }
    assert!(installed_versions(&mut admin).unwrap().is_empty());
    admin
        .batch_execute("DROP FUNCTION lease._drop_default_grants()")
        .unwrap();
    let error = install(&mut admin).unwrap_err();
    assert!(
        is_schema_not_private(&error) && error.to_string().contains("CREATE on schema lease"),
        "{error:?}"
    );
    admin
        .batch_execute(&format!("REVOKE CREATE ON SCHEMA lease FROM {planter}"))
        .unwrap();
    assert!(!install(&mut admin).unwrap().applied.is_empty());

    // An upgrade (here: an install with nothing left to apply) checks again.
    admin
        .batch_execute(&format!("GRANT TRIGGER ON lease.lineage TO {planter}"))
        .unwrap();
    let error = install(&mut admin).unwrap_err();
    assert!(
        is_schema_not_private(&error)
            && error.to_string().contains("TRIGGER on table lease.lineage")
            && error.to_string().contains(&planter),
        "{error:?}"
    );
    admin
        .batch_execute(&format!("REVOKE TRIGGER ON lease.lineage FROM {planter}"))
        .unwrap();
    assert!(install(&mut admin).unwrap().applied.is_empty());
    let _ = admin.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS lease CASCADE; DROP OWNED BY {planter}; DROP ROLE {planter};"
    ));
}

/// The old `LeaseError::SchemaNotPrivate`: what another role can do in
/// schema `lease` is in its message.
fn is_schema_not_private(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Forbidden
        && error.operation() == Some(leasehold::error::Operation::INSTALL)
        && error
            .to_string()
            .starts_with("another role can put code into schema lease")
}
