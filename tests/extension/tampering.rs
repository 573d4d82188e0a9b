//! A trusted extension's scripts run as the bootstrap superuser, while every
//! object of schema `lease` belongs to the extension's owner, an ordinary
//! role. Before each update step the owner plants code on everything it
//! owns: function bodies, row and statement triggers, column defaults,
//! table and domain CHECKs, expression and partial indexes, row-level
//! policies and rules. Each plant records `current_user` and whether that
//! role is a superuser. No plant may run as a superuser, whoever runs the
//! update, and every object must still belong to the owner afterwards
//! (docs/PRIVILEGES.md, "Install, update and restore").

use diesel::connection::SimpleConnection;
use diesel::PgConnection;

use super::privileges::{pg_restore, Restore};
use super::{app_conn, conn, database, owners, pg_dump_file, rows};

/// The owner's recorder, in a schema of its own: `attack.ran` gets one row
/// per plant that ran. `record_immutable` is the same recorder declared
/// IMMUTABLE, as an index expression requires (an owner may lie).
const RECORDER: &str = r#"
CREATE SCHEMA attack;
CREATE TABLE attack.ran (plant text NOT NULL, who name NOT NULL, superuser boolean NOT NULL);
GRANT INSERT ON attack.ran TO PUBLIC;
CREATE FUNCTION attack.record(plant text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO attack.ran
    SELECT plant, current_user, r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user;
    RETURN true;
END $$;
CREATE FUNCTION attack.record_immutable(plant text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM attack.record(plant);
    RETURN true;
END $$;
CREATE FUNCTION attack.on_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM attack.record(pg_catalog.format('trigger %s %s %s', TG_TABLE_NAME, TG_OP, TG_LEVEL));
    IF TG_LEVEL = 'STATEMENT' THEN
        RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA attack TO PUBLIC;
GRANT USAGE ON SCHEMA attack TO PUBLIC;
"#;

/// Plants code on every object of schema `lease` that the owner owns and
/// that has none yet; run as the owner before each update step. Function
/// bodies keep what they did and record first, and lose SECURITY DEFINER,
/// so that a call by a superuser would run as that superuser. Refuses to
/// pass over a function it cannot plant in.
const PLANT: &str = r#"
DO $plant$
DECLARE
    v record;
    v_def text;
    v_planted text;
    v_default text;
BEGIN
    FOR v IN SELECT p.oid, p.oid::regprocedure::text AS name, l.lanname
               FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang
              WHERE p.pronamespace = 'lease'::regnamespace AND p.prokind = 'f'
                AND p.proowner = current_user::regrole
                AND p.prosrc NOT LIKE '%attack.record%' LOOP
        v_def := replace(pg_get_functiondef(v.oid), E' SECURITY DEFINER\n', E'\n');
        IF v.lanname = 'plpgsql' THEN
            v_planted := regexp_replace(v_def, '\mBEGIN\M', format('BEGIN PERFORM attack.record(%L);', 'function ' || v.name));
        ELSE
            v_planted := replace(v_def, 'AS $function$', format('AS $function$ SELECT attack.record(%L);', 'function ' || v.name));
        END IF;
        IF v_planted = v_def THEN
            RAISE EXCEPTION 'cannot plant code in %', v.name;
        END IF;
        EXECUTE v_planted;
    END LOOP;

    FOR v IN SELECT c.oid::regclass::text AS name, c.relname
               FROM pg_class AS c
              WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind = 'r'
                AND c.relowner = current_user::regrole
                AND NOT EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgrelid = c.oid AND t.tgname = 'attack_row') LOOP
        EXECUTE format('CREATE TRIGGER attack_row BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION attack.on_change()', v.name);
        EXECUTE format('CREATE TRIGGER attack_statement AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION attack.on_change()', v.name);
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT attack_check CHECK (attack.record(%L)) NOT VALID', v.name, 'check ' || v.relname);
        EXECUTE format('CREATE INDEX ON %s ((attack.record_immutable(%L)))', v.name, 'index ' || v.relname);
        EXECUTE format('CREATE INDEX ON %s ((1)) WHERE attack.record_immutable(%L)', v.name, 'partial index ' || v.relname);
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY', v.name);
        EXECUTE format('CREATE POLICY attack_policy ON %s USING (attack.record(%L)) WITH CHECK (attack.record(%L))',
                       v.name, 'policy ' || v.relname, 'policy check ' || v.relname);
        EXECUTE format('CREATE RULE attack_insert AS ON INSERT TO %s DO ALSO SELECT attack.record(%L)', v.name, 'rule ' || v.relname);
        EXECUTE format('CREATE RULE attack_update AS ON UPDATE TO %s DO ALSO SELECT attack.record(%L)', v.name, 'rule ' || v.relname);
        EXECUTE format('CREATE RULE attack_delete AS ON DELETE TO %s DO ALSO SELECT attack.record(%L)', v.name, 'rule ' || v.relname);
    END LOOP;

    FOR v IN SELECT c.oid::regclass::text AS tab, c.relname, a.attname,
                    format_type(a.atttypid, a.atttypmod) AS type, pg_get_expr(d.adbin, d.adrelid) AS old
               FROM pg_class AS c
               JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
               LEFT JOIN pg_attrdef AS d ON d.adrelid = c.oid AND d.adnum = a.attnum
              WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind = 'r'
                AND c.relowner = current_user::regrole
                AND COALESCE(pg_get_expr(d.adbin, d.adrelid), '') NOT LIKE '%attack.record%' LOOP
        v_default := format('CAST(CASE WHEN attack.record(%L) THEN %s END AS %s)',
                            'default ' || v.relname || '.' || v.attname, COALESCE(v.old, 'NULL'), v.type);
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT %s', v.tab, v.attname, v_default);
    END LOOP;

    FOR v IN SELECT t.oid::regtype::text AS name
               FROM pg_type AS t
              WHERE t.typnamespace = 'lease'::regnamespace AND t.typtype = 'd'
                AND t.typowner = current_user::regrole
                AND NOT EXISTS (SELECT 1 FROM pg_constraint AS k WHERE k.contypid = t.oid AND k.conname = 'attack_check') LOOP
        EXECUTE format('ALTER DOMAIN %s ADD CONSTRAINT attack_check CHECK (attack.record(%L)) NOT VALID', v.name, 'domain ' || v.name);
    END LOOP;
END
$plant$;
"#;

/// The extension's versions, oldest first: an earlier release's (see
/// [`super::EARLIER_VERSION`]), then the one it installs.
fn versions() -> Vec<String> {
    vec![
        super::EARLIER_VERSION.to_owned(),
        leasehold::admin::extension_version(),
    ]
}

/// What ran since the recorder was last emptied: `plant | role |
/// SUPERUSER or ordinary`.
fn ran(c: &mut PgConnection) -> Vec<String> {
    rows(
        c,
        "SELECT DISTINCT format('%s | %s | %s', plant, who,
                                CASE WHEN superuser THEN 'SUPERUSER' ELSE 'ordinary' END) AS t
           FROM attack.ran ORDER BY 1",
    )
}

/// Who runs `ALTER EXTENSION leasehold UPDATE`.
#[derive(Clone, Copy, Debug)]
enum Updater {
    /// The extension's owner, `app`.
    Owner,
    /// The test server's superuser.
    Superuser,
}

/// A new database where `app` has its recorder and the extension's first
/// version; the extension's versions, oldest first.
fn first_version_with_recorder() -> (String, PgConnection, Vec<String>) {
    let db = database();
    let mut app = app_conn(&db);
    app.batch_execute(RECORDER).unwrap();
    let versions = versions();
    app.batch_execute(&format!(
        "CREATE EXTENSION leasehold VERSION '{}'",
        versions[0]
    ))
    .unwrap();
    (db, app, versions)
}

/// Installs the first version as `app`, then plants and updates one step at
/// a time; returns the database. Panics when a plant ran as a superuser or
/// an object of the schema is not `app`'s after a step.
fn update_chain_with_plants(updater: Updater) -> String {
    let (db, mut app, versions) = first_version_with_recorder();
    let mut fired = Vec::new();
    for version in &versions[1..] {
        app.batch_execute(PLANT).unwrap();
        app.batch_execute("TRUNCATE attack.ran").unwrap();
        let update = format!("ALTER EXTENSION leasehold UPDATE TO '{version}'");
        match updater {
            Updater::Owner => app.batch_execute(&update),
            Updater::Superuser => conn(&db).batch_execute(&update),
        }
        .unwrap_or_else(|error| panic!("{updater:?}: {update}: {error}"));
        let step = ran(&mut app);
        let as_superuser: Vec<&String> =
            step.iter().filter(|r| r.ends_with("| SUPERUSER")).collect();
        assert!(
            as_superuser.is_empty(),
            "{updater:?}, update to {version}: planted code ran as a superuser: {as_superuser:#?}"
        );
        assert_eq!(
            owners(&mut app),
            ["app"],
            "{updater:?}, update to {version}: an object of schema lease is not the owner's"
        );
        fired.extend(step);
    }
    // The plants did fire, as the owner: the update calls
    // lease._drop_default_grants() in its owner part. (An update without
    // migrations adds no table and writes no row, so the table plants
    // stay silent; an update whose migrations write rows runs them in the
    // same owner part, which the install's own data changes exercise.)
    let expected = "function lease._drop_default_grants() | app | ordinary".to_owned();
    assert!(
        fired.contains(&expected),
        "{updater:?}: expected {expected:?} among what ran: {fired:#?}"
    );
    db
}

#[test]
fn an_update_run_by_the_owner_runs_no_planted_code_as_a_superuser() {
    update_chain_with_plants(Updater::Owner);
}

#[test]
fn an_update_run_by_a_superuser_runs_no_planted_code_as_a_superuser() {
    update_chain_with_plants(Updater::Superuser);
}

/// The objects of schema `lease` that carry planted code.
fn planted_in_lease(c: &mut PgConnection) -> Vec<String> {
    rows(
        c,
        "SELECT format('trigger %s on %s', t.tgname, t.tgrelid::regclass) AS t FROM pg_trigger AS t
          WHERE t.tgname LIKE 'attack%' AND t.tgrelid::regclass::text LIKE 'lease.%'
         UNION ALL SELECT format('policy %s on %s', p.polname, p.polrelid::regclass) FROM pg_policy AS p
          WHERE p.polrelid::regclass::text LIKE 'lease.%'
         UNION ALL SELECT format('rule %s', r.rulename) FROM pg_rules AS r
          WHERE r.schemaname = 'lease' AND r.rulename LIKE 'attack%'
         UNION ALL SELECT format('index %s', i.indexname) FROM pg_indexes AS i
          WHERE i.schemaname = 'lease' AND i.indexdef LIKE '%attack%'
         UNION ALL SELECT format('function %s', p.oid::regprocedure) FROM pg_proc AS p
          WHERE p.pronamespace = 'lease'::regnamespace AND p.prosrc LIKE '%attack.record%'
         UNION ALL SELECT format('default %s.%s', d.adrelid::regclass, d.adnum) FROM pg_attrdef AS d
          WHERE d.adrelid::regclass::text LIKE 'lease.%' AND pg_get_expr(d.adbin, d.adrelid) LIKE '%attack%'
         UNION ALL SELECT format('check %s', k.conname) FROM pg_constraint AS k
          WHERE k.connamespace = 'lease'::regnamespace AND k.conname LIKE 'attack%'
         ORDER BY 1",
    )
}

/// The dump of a database whose owner planted code on every object of
/// schema `lease`, restored each way docs/PRIVILEGES.md offers for that
/// install path: no planted code runs as a superuser. An extension's dump
/// keeps none of it (pg_dump writes `CREATE EXTENSION` and the tables'
/// rows, and the scripts create every object afresh); a migrations
/// install's dump keeps all of it, and restored as the owner it runs as the
/// owner.
fn a_tampered_dump_runs_nothing_as_a_superuser(use_extension: bool) {
    let db = database();
    let mut app = app_conn(&db);
    app.batch_execute(RECORDER).unwrap();
    if use_extension {
        app.batch_execute("CREATE EXTENSION leasehold").unwrap();
    } else {
        leasehold::install(&mut app).unwrap();
    }
    app.batch_execute(
        "SELECT * FROM lease.acquire('job', 'w', interval '1 hour');
         SELECT lease.bind_namespace('team/', 'app');",
    )
    .unwrap();
    app.batch_execute(PLANT).unwrap();
    assert!(!planted_in_lease(&mut app).is_empty());
    app.batch_execute("TRUNCATE attack.ran").unwrap();
    let file = pg_dump_file(&db);
    let ways: &[Restore] = if use_extension {
        &[
            Restore::AsOwner,
            Restore::ConnectedAsOwner,
            Restore::NoOwner,
        ]
    } else {
        &[Restore::AsOwner, Restore::ConnectedAsOwner]
    };
    for &how in ways {
        let restored = pg_restore(&file, how, false);
        let mut c = conn(&restored);
        let restore_ran = ran(&mut c);
        let as_superuser: Vec<&String> = restore_ran
            .iter()
            .filter(|r| r.ends_with("| SUPERUSER"))
            .collect();
        assert!(
            as_superuser.is_empty(),
            "{how:?}: planted code ran as a superuser: {as_superuser:#?}"
        );
        if use_extension {
            assert_eq!(planted_in_lease(&mut c), Vec::<String>::new(), "{how:?}");
        } else {
            assert!(
                restore_ran.contains(&"index leases | app | ordinary".to_owned()),
                "{how:?}: the restored index ran as its owner: {restore_ran:#?}"
            );
        }
        if !matches!(how, Restore::NoOwner) {
            assert_eq!(owners(&mut c), ["app"], "{how:?}");
        }
    }
}

#[test]
fn pg_dump_a_tampered_extension_dump_runs_nothing_as_a_superuser() {
    a_tampered_dump_runs_nothing_as_a_superuser(true);
}

#[test]
fn pg_dump_a_tampered_migrations_dump_restored_as_the_owner_runs_nothing_as_a_superuser() {
    a_tampered_dump_runs_nothing_as_a_superuser(false);
}

/// `CREATE EXTENSION` never adopts objects in schema `lease` that it did
/// not create: a schema the owner prepared with anything in it is refused,
/// naming the object, and installs once it is empty.
#[test]
fn create_extension_refuses_a_schema_that_already_holds_objects() {
    let db = database();
    let mut app = app_conn(&db);
    app.batch_execute("CREATE SCHEMA lease; CREATE TABLE lease.planted (x int);")
        .unwrap();
    let message = match app.batch_execute("CREATE EXTENSION leasehold") {
        Ok(()) => panic!("CREATE EXTENSION adopted a schema holding lease.planted"),
        Err(error) => error.to_string(),
    };
    assert!(
        message.contains("already holds objects") && message.contains("table planted"),
        "{message}"
    );
    app.batch_execute("DROP TABLE lease.planted; CREATE EXTENSION leasehold")
        .unwrap();
    assert_eq!(owners(&mut app), ["app"]);
}

/// The owner part is called by name, so the owner may try to put its own
/// function in the call's place: an overload that takes defaults (or a
/// variadic one) and runs as its caller. PostgreSQL never picks it over the
/// exact match: the call is ambiguous, the update fails and changes
/// nothing, and no planted code ran as a superuser.
#[test]
fn an_overload_of_the_owner_part_fails_the_update_and_runs_nothing() {
    let (db, mut app, versions) = first_version_with_recorder();
    app.batch_execute(
        "CREATE FUNCTION lease._extension_step_as_owner(planted integer DEFAULT 1) RETURNS void
         LANGUAGE plpgsql AS $$ BEGIN PERFORM attack.record('overload'); END $$;",
    )
    .unwrap();
    let update = format!("ALTER EXTENSION leasehold UPDATE TO '{}'", versions[1]);
    let message = match conn(&db).batch_execute(&update) {
        Ok(()) => panic!("the update ran beside a planted overload of its owner part"),
        Err(error) => error.to_string(),
    };
    assert!(message.contains("is not unique"), "{message}");
    assert_eq!(ran(&mut app), Vec::<String>::new());
    assert_eq!(
        rows(
            &mut app,
            "SELECT extversion AS t FROM pg_extension WHERE extname = 'leasehold'"
        ),
        [versions[0].clone()]
    );
}
