//! Fenced tables attacked by ordinary login roles of a non-superuser
//! deployment (docs/SPECIFICATION.md §2.1, F6 and F7; §4.2): the trigger
//! function aimed at an attacker's own table, keys that are equal but
//! print differently, refusals read as an oracle, namespaces, the owner's
//! later DDL, and keys with spaces. Each test failed on the fence as first
//! shipped.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::admin::Operator;
use leasehold::guard::Fencing;
use leasehold::{ErrorKind, FencingToken, LeaseError, Leases};
use leasehold_test_support::Deployment;

use crate::common::*;
use crate::fenced_tables::{fenced, is_no_token, is_not_held, refusal, rows, write};

/// The lease row of `key` as `owner,epoch`, read by the installing role.
fn holder_of(d: &Deployment, key: &str) -> String {
    query_lines(
        &mut d.conn_as(&d.owner),
        &format!(
            "SELECT owner || ',' || epoch AS line FROM lease.leases WHERE key = {}",
            quote(key)
        ),
    )
    .remove(0)
}

/// The message, DETAIL and constraint name of the error `sql` raises, as psql would show them.
fn refused(conn: &mut PgConnection, sql: &str) -> String {
    match conn.batch_execute(sql).expect_err(sql) {
        diesel::result::Error::DatabaseError(_, info) => format!(
            "{} DETAIL: {} CONSTRAINT: {}",
            info.message(),
            info.details().unwrap_or(""),
            info.constraint_name().unwrap_or("")
        ),
        other => panic!("{sql}: {other}"),
    }
}

#[test]
fn a_role_that_aims_the_fence_trigger_at_its_own_table_runs_its_code_only_as_itself() {
    let d = fenced();
    let mut app = d.conn_as(&d.app);
    granted(app.acquire("team/hj", "alice", TTL).unwrap());
    let before = holder_of(&d, "team/hj");
    let mut attacker = d.conn_as(&d.attacker);
    // The temp view stands where the trigger's transition tables would be;
    // its function takes the lease over, which only the installing role may.
    attacker
        .batch_execute(
            "CREATE TEMP TABLE hj (k text);
             CREATE FUNCTION pg_temp.evil() RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN
               UPDATE lease.leases SET owner = 'mallory', epoch = epoch + 1,
                      expires_at = clock_timestamp() + interval '1 day' WHERE key = 'team/hj';
               RETURN false; END $$;
             CREATE TEMP VIEW lease_new AS SELECT 'x'::text AS k WHERE pg_temp.evil();
             CREATE TEMP VIEW lease_old AS SELECT 'x'::text AS k WHERE pg_temp.evil();
             GRANT SELECT ON lease_new, lease_old TO PUBLIC;",
        )
        .unwrap();
    for trigger in [
        "lease._fence('rows', '', 'k')",
        "lease._fence('table', 'team/hj')",
        "lease._fence_table('team/hj')",
    ] {
        attacker
            .batch_execute(&format!(
                "DROP TRIGGER IF EXISTS hijack ON pg_temp.hj;
                 CREATE TRIGGER hijack AFTER INSERT ON pg_temp.hj FOR EACH STATEMENT EXECUTE FUNCTION {trigger}"
            ))
            .unwrap();
        let outcome = attacker.batch_execute("INSERT INTO hj VALUES ('a')");
        assert!(outcome.is_err(), "{trigger}: the write went through");
        assert_eq!(
            holder_of(&d, "team/hj"),
            before,
            "{trigger} ran the attacker's code as the installer"
        );
    }
}

#[test]
fn values_that_are_equal_but_print_differently_are_checked_under_their_own_keys() {
    let d = fenced();
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(&format!(
            "CREATE TABLE acct (id numeric NOT NULL, body text);
             CREATE TABLE codes (code bpchar NOT NULL, body text);
             GRANT ALL ON acct, codes TO {app}, {attacker};",
            app = d.app,
            attacker = d.attacker
        ))
        .unwrap();
    owner.protect_rows("acct", "acct/", &["id"]).unwrap();
    owner.protect_rows("codes", "code/", &["code"]).unwrap();
    let mut app = d.conn_as(&d.app);
    let mut attacker = d.conn_as(&d.attacker);
    let mine = granted(app.acquire("acct/1", "app", TTL).unwrap());
    let code = granted(app.acquire("code/acme", "app", TTL).unwrap());
    let theirs = granted(attacker.acquire("acct/1.0", "attacker", TTL).unwrap());
    let their_code = granted(attacker.acquire("code/acme ", "attacker", TTL).unwrap());
    // The attacker's own keys write their own rows (first, so a check that
    // took one value per set of equal ones would take the attacker's)...
    write(
        &mut attacker,
        Some(theirs.token()),
        "INSERT INTO acct VALUES (1.0, 'attacker')",
    )
    .unwrap();
    write(
        &mut attacker,
        Some(their_code.token()),
        "INSERT INTO codes VALUES ('acme ', 'attacker')",
    )
    .unwrap();
    write(
        &mut app,
        Some(mine.token()),
        "INSERT INTO acct VALUES (1, 'app')",
    )
    .unwrap();
    write(
        &mut app,
        Some(code.token()),
        "INSERT INTO codes VALUES ('acme', 'app')",
    )
    .unwrap();
    // ...but a statement that also reaches a row of the application's key
    // needs its token: numeric 1.0 = 1, and bpchar 'acme ' = 'acme'.
    for (token, statement, key) in [
        (
            theirs.token(),
            "UPDATE acct SET body = 'pwned' WHERE id = 1.0",
            "acct/1",
        ),
        (theirs.token(), "DELETE FROM acct WHERE id = 1", "acct/1"),
        (
            their_code.token(),
            "UPDATE codes SET body = 'pwned' WHERE code = 'acme '",
            "code/acme",
        ),
        (
            their_code.token(),
            "DELETE FROM codes WHERE code = 'acme'",
            "code/acme",
        ),
    ] {
        match refusal(write(&mut attacker, Some(token), statement).unwrap_err()) {
            error if is_no_token(&error) => assert_eq!(error.key(), Some(key), "{statement}"),
            other => panic!("{statement}: {other:?}"),
        }
    }
    assert_eq!(
        rows(&mut app, "SELECT id::text || ':' || body FROM acct"),
        vec!["(1.0:attacker),(1:app)".to_owned()]
    );
    assert_eq!(
        rows(&mut app, "SELECT body FROM codes"),
        vec!["(app),(attacker)".to_owned()]
    );
    // A case-insensitive collation, where ICU is built in: 'A' and 'a' are
    // equal, yet each row is checked under its own key.
    if query_bool(
        &mut owner,
        "SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collprovider = 'i') AS flag",
    ) {
        owner
            .batch_execute(&format!(
                "CREATE COLLATION nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
                 CREATE TABLE names (name text COLLATE nocase NOT NULL);
                 GRANT ALL ON names TO {app}, {attacker};",
                app = d.app,
                attacker = d.attacker
            ))
            .unwrap();
        owner.protect_rows("names", "name/", &["name"]).unwrap();
        let upper = granted(app.acquire("name/A", "app", TTL).unwrap());
        let lower = granted(attacker.acquire("name/a", "attacker", TTL).unwrap());
        write(
            &mut attacker,
            Some(lower.token()),
            "INSERT INTO names VALUES ('a')",
        )
        .unwrap();
        write(
            &mut app,
            Some(upper.token()),
            "INSERT INTO names VALUES ('A')",
        )
        .unwrap();
        match refusal(
            write(
                &mut attacker,
                Some(lower.token()),
                "DELETE FROM names WHERE name = 'a'",
            )
            .unwrap_err(),
        ) {
            error if is_no_token(&error) => assert_eq!(error.key(), Some("name/A")),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            rows(&mut app, "SELECT count(*) FROM names"),
            vec!["(2)".to_owned()]
        );
    }
}

/// A deployment whose prefix `team/` is bound to the application's role,
/// with `team/held` held by the application, `team/free` released and
/// `team/never` never leased.
fn team() -> Deployment {
    let d = fenced();
    let mut owner = d.conn_as(&d.owner);
    owner.bind_namespace("team/", &d.app).unwrap();
    let mut app = d.conn_as(&d.app);
    granted(app.acquire("team/held", "app", TTL).unwrap());
    let free = granted(app.acquire("team/free", "app", TTL).unwrap());
    assert_eq!(app.release(&free).unwrap(), leasehold::Release::Released);
    d
}

#[test]
fn an_outsider_of_a_namespace_learns_nothing_from_a_fence_of_its_own() {
    let d = team();
    let mut attacker = d.conn_as(&d.attacker);
    attacker
        .batch_execute("CREATE TEMP TABLE probe (k text NOT NULL)")
        .unwrap();
    // Protecting by a prefix whose keys may land under the bound one, or
    // by any prefix under no rule of its own: the same refusal whether a
    // rule extends the prefix or not, so the refusals spell out no rule.
    for prefix in ["", "t", "tea", "team/", "zzz/"] {
        match attacker.protect_rows("pg_temp.probe", prefix, &["k"]) {
            Err(error) if is_namespace_refusal(&error) => {
                assert_eq!(error.key(), Some(prefix));
                // The argument is named only in the message.
                assert!(
                    error
                        .to_string()
                        .contains(&format!(" key_prefix {prefix:?}:")),
                    "{error}"
                );
            }
            other => panic!("prefix {prefix:?}: {other:?}"),
        }
    }
    // Aimed by hand, with a forged claim: the same refusal for a held, a
    // released and a never-leased key, naming only the key.
    attacker
        .batch_execute(
            "CREATE TRIGGER probe AFTER INSERT ON pg_temp.probe REFERENCING NEW TABLE AS lease_new
             FOR EACH STATEMENT EXECUTE FUNCTION lease._fence('rows', '', 'k')",
        )
        .unwrap();
    let mut answers = Vec::new();
    for key in ["team/held", "team/free", "team/never"] {
        let error = attacker
            .transaction(|conn| {
                conn.batch_execute(&format!(
                    "SELECT set_config('lease.presented', pg_current_xact_id()::text || ' {}:{key}:3:app:1;', true);
                     INSERT INTO probe VALUES ({})",
                    key.len(),
                    quote(key)
                ))
            })
            .unwrap_err();
        let error = LeaseError::from(error);
        assert_eq!(error.kind(), ErrorKind::Forbidden, "{key}: {error}");
        answers.push(error.to_string().replace(key, "<key>"));
    }
    assert!(
        answers.windows(2).all(|pair| pair[0] == pair[1]),
        "{answers:#?}"
    );
}

#[test]
fn namespace_rules_hold_for_presenting_and_for_the_tables_check() {
    let d = fenced();
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(&format!(
            "CREATE TABLE team_jobs (id int PRIMARY KEY); GRANT ALL ON team_jobs TO {app}, {attacker};",
            app = d.app,
            attacker = d.attacker
        ))
        .unwrap();
    owner.protect_table("team_jobs", "team/jobs").unwrap();
    owner.bind_namespace("team/", &d.app).unwrap();
    let mut app = d.conn_as(&d.app);
    let lease = granted(app.acquire("team/jobs", "app", TTL).unwrap());
    write(
        &mut app,
        Some(lease.token()),
        "INSERT INTO team_jobs VALUES (1)",
    )
    .unwrap();
    // The attacker learned the live token.
    let mut attacker = d.conn_as(&d.attacker);
    match attacker.transaction(|conn| conn.present(lease.token())) {
        Err(error) if is_namespace_refusal(&error) => assert_eq!(error.key(), Some("team/jobs")),
        other => panic!("present: {other:?}"),
    }
    let forged = attacker
        .transaction(|conn| {
            conn.batch_execute(&format!(
                "SELECT set_config('lease.presented', pg_current_xact_id()::text || ' 9:team/jobs:3:app:{}:', true);
                 INSERT INTO team_jobs VALUES (2)",
                lease.epoch()
            ))
        })
        .unwrap_err();
    assert_eq!(LeaseError::from(forged).kind(), ErrorKind::Forbidden);
    let claims = format!(
        "SELECT set_config('lease.presented', pg_current_xact_id()::text || ' 9:team/jobs:3:app:{};', true)",
        lease.epoch()
    );
    let forged = attacker
        .transaction(|conn| {
            conn.batch_execute(&claims)?;
            conn.batch_execute("DELETE FROM team_jobs")
        })
        .unwrap_err();
    match LeaseError::from(forged) {
        error if is_namespace_refusal(&error) => {
            assert_eq!(
                (error.key(), error.role()),
                (Some("team/jobs"), Some(d.attacker.as_str()))
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rows(&mut app, "SELECT id FROM team_jobs"),
        vec!["(1)".to_owned()]
    );
}

#[test]
fn the_owners_later_ddl_cannot_undo_a_fence() {
    let d = fenced();
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(
            "CREATE TABLE parted (tenant int NOT NULL, id int NOT NULL, body text) PARTITION BY LIST (tenant);
             CREATE TABLE jobs_parted (id int NOT NULL, state text NOT NULL) PARTITION BY LIST (id);
             CREATE TABLE jobs_base (id int NOT NULL, state text NOT NULL);
             CREATE TABLE base (tenant int NOT NULL, id int NOT NULL, body text);
             CREATE TABLE loose (tenant int NOT NULL, id int NOT NULL, body text);",
        )
        .unwrap();
    for (table, change) in [
        ("items", "ALTER TABLE items ALTER COLUMN tenant TYPE text"),
        ("items", "ALTER TABLE items DROP COLUMN tenant"),
        (
            "items",
            "ALTER TABLE parted ATTACH PARTITION items FOR VALUES IN (7)",
        ),
        ("items", "ALTER TABLE items INHERIT base"),
        ("items", "ALTER TABLE loose INHERIT items"),
        ("jobs", "ALTER TABLE jobs INHERIT jobs_base"),
        (
            "jobs",
            "ALTER TABLE jobs_parted ATTACH PARTITION jobs FOR VALUES IN (7)",
        ),
    ] {
        let error = refused(&mut owner, change);
        assert!(
            error.contains("lease.unprotect_table first"),
            "{change}: the refusal does not say to unprotect {table} first: {error}"
        );
    }
    // A child made with INHERITS can hold no row, so the fenced table
    // never shows one written past its fence.
    owner
        .batch_execute("CREATE TABLE kid () INHERITS (items); GRANT ALL ON kid TO PUBLIC")
        .unwrap();
    let error = refused(
        &mut d.conn_as(&d.attacker),
        "INSERT INTO kid VALUES (7, 1, 'unfenced')",
    );
    assert!(error.contains("lease.unprotect_table first"), "{error}");
    owner.batch_execute("DROP TABLE kid").unwrap();
    // A key column renamed away and replaced by one whose text follows
    // DateStyle: every write refuses until the fence is made again.
    owner
        .batch_execute("ALTER TABLE items RENAME COLUMN tenant TO old_tenant; ALTER TABLE items ADD COLUMN tenant date")
        .unwrap();
    let mut app = d.conn_as(&d.app);
    let lease = granted(app.acquire("tenant/2024-01-02", "app", TTL).unwrap());
    let error = write(
        &mut app,
        Some(lease.token()),
        "INSERT INTO items (old_tenant, id, tenant) VALUES (1, 1, '2024-01-02')",
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("_fence_key_text(date)"),
        "{error}"
    );
    assert_eq!(
        rows(&mut app, "SELECT count(*) FROM items"),
        vec!["(0)".to_owned()]
    );
    // Unprotected, the same changes are the owner's to make.
    assert!(owner.unprotect_table("items").unwrap());
    owner
        .batch_execute(
            "ALTER TABLE items ALTER COLUMN old_tenant TYPE text;
             CREATE TABLE kid () INHERITS (items); INSERT INTO kid (old_tenant, id) VALUES ('7', 1);",
        )
        .unwrap();
}

#[test]
fn a_key_or_owner_with_spaces_comes_back_whole() {
    let d = fenced();
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(&format!(
            "CREATE TABLE spaced (id int); GRANT ALL ON spaced TO {};",
            d.app
        ))
        .unwrap();
    let key = "jobs leader key=x table=y";
    owner.protect_table("spaced", key).unwrap();
    let mut app = d.conn_as(&d.app);
    match refusal(write(&mut app, None, "INSERT INTO spaced VALUES (1)").unwrap_err()) {
        error if is_no_token(&error) => assert_eq!(error.key(), Some(key)),
        other => panic!("{other:?}"),
    }
    let lease = granted(app.acquire(key, "worker one owner=z", TTL).unwrap());
    assert_eq!(app.release(&lease).unwrap(), leasehold::Release::Released);
    match write(
        &mut app,
        Some(lease.token()),
        "INSERT INTO spaced VALUES (1)",
    )
    .unwrap_err()
    {
        error if is_not_held(&error) => {
            assert_eq!(error.table(), Some("public.spaced"));
            assert_eq!(
                (error.key(), error.owner()),
                (Some(key), Some("worker one owner=z"))
            );
            assert_eq!(error.epoch(), Some(lease.epoch()));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn present_refuses_a_token_without_an_epoch() {
    let d = fenced();
    let mut app = d.conn_as(&d.app);
    for sql in [
        "SELECT lease.present('jobs-leader', 'w1', NULL)",
        "SELECT lease.present('jobs-leader', NULL, 1)",
        "SELECT lease.present(NULL, 'w1', 1)",
    ] {
        let error = refused(&mut app, sql);
        assert!(
            error.contains("must not be NULL")
                && error.ends_with("CONSTRAINT: lease_invalid_input"),
            "{sql}: {error}"
        );
    }
}

#[test]
fn protecting_again_keeps_the_fence_or_asks_to_unprotect_first() {
    let d = fenced();
    let mut owner = d.conn_as(&d.owner);
    // The same fence again: accepted, nothing changes.
    owner.protect_table("jobs", "jobs-leader").unwrap();
    owner.protect_rows("items", "tenant/", &["tenant"]).unwrap();
    for (outcome, what) in [
        (owner.protect_table("jobs", "another-key"), "another key"),
        (
            owner.protect_rows("jobs", "jobs/", &["id"]),
            "a row fence over a table fence",
        ),
        (
            owner.protect_rows("items", "tenant/", &["tenant", "id"]),
            "other columns",
        ),
        (
            owner.protect_table("items", "items-key"),
            "a table fence over a row fence",
        ),
    ] {
        match outcome {
            Err(error)
                if error.kind() == ErrorKind::InvalidInput && !error.violations().is_empty() =>
            {
                let violations = error.violations();
                assert!(
                    violations[0].contains("already fenced"),
                    "{what}: {violations:?}"
                )
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    let listed: Vec<_> = owner
        .fenced_tables()
        .unwrap()
        .into_iter()
        .map(|fenced| format!("{} {:?}", fenced.table, fenced.fence))
        .collect();
    assert_eq!(
        listed,
        vec![
            r#"public.items Rows { key_prefix: "tenant/", key_columns: ["tenant"] }"#.to_owned(),
            r#"public.jobs Table { key: "jobs-leader" }"#.to_owned(),
        ]
    );
    // Unprotect then protect, in one transaction: no write slips between.
    owner
        .transaction(|conn| {
            conn.unprotect_table("jobs")?;
            conn.protect_table("jobs", "another-key")
        })
        .unwrap();
    let token = FencingToken::new("jobs-leader", "w1", 1.into()).unwrap();
    let mut app = d.conn_as(&d.app);
    match refusal(write(&mut app, Some(&token), "INSERT INTO jobs VALUES (1, 'a')").unwrap_err()) {
        error if is_no_token(&error) => assert_eq!(error.key(), Some("another-key")),
        other => panic!("{other:?}"),
    }
}

/// A session's `standard_conforming_strings` shapes how the bodies of the
/// functions it calls are parsed: every literal in them must read the same
/// under either setting, so the caller changes no answer.
#[test]
fn standard_conforming_strings_off_changes_no_answer() {
    let d = fenced();
    let mut app = d.conn_as(&d.app);
    app.batch_execute("SET standard_conforming_strings = off")
        .unwrap();
    let lease = granted(app.acquire("jobs-leader", "w1", TTL).unwrap());
    assert!(matches!(
        app.acquire_waiting(
            "jobs-leader",
            "w2",
            TTL,
            std::time::Duration::from_millis(1)
        ),
        Err(ref error) if error.kind() == ErrorKind::TimedOut && error.key().is_some()
    ));
    write(
        &mut app,
        Some(lease.token()),
        "INSERT INTO jobs VALUES (1, 'a')",
    )
    .unwrap();
    assert_eq!(app.fenced_tables().unwrap().len(), 2);
}

/// In a key of several columns, the `/` between columns is the only one:
/// every column but the last escapes `%` and `/`, so rows of different
/// values never share a key (`('x/y', 'z')` and `('x', 'y/z')` would both
/// have been `p/x/y/z`).
#[test]
fn rows_of_different_values_never_share_a_key() {
    let d = fenced();
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(&format!(
            "CREATE TABLE paths (dir text NOT NULL, file text NOT NULL); GRANT ALL ON paths TO {};",
            d.app
        ))
        .unwrap();
    owner.protect_rows("paths", "p/", &["dir", "file"]).unwrap();
    let mut app = d.conn_as(&d.app);
    let lease = granted(app.acquire("p/x/y/z", "app", TTL).unwrap());
    write(
        &mut app,
        Some(lease.token()),
        "INSERT INTO paths VALUES ('x', 'y/z')",
    )
    .unwrap();
    for (row, key) in [
        ("('x/y', 'z')", "p/x%2Fy/z"),
        ("('x%2Fy', 'z')", "p/x%252Fy/z"),
    ] {
        match refusal(
            write(
                &mut app,
                Some(lease.token()),
                &format!("INSERT INTO paths VALUES {row}"),
            )
            .unwrap_err(),
        ) {
            error if is_no_token(&error) => assert_eq!(error.key(), Some(key), "{row}"),
            other => panic!("{row}: {other:?}"),
        }
    }
    let escaped = granted(app.acquire("p/x%2Fy/z", "app", TTL).unwrap());
    write(
        &mut app,
        Some(escaped.token()),
        "INSERT INTO paths VALUES ('x/y', 'z')",
    )
    .unwrap();
}

/// A refusal names the key of a written row only to a role that may read
/// that row's key columns: a writer granted UPDATE of other columns, or
/// behind row security, learns no key value it could not SELECT.
#[test]
fn a_refusal_shows_no_key_the_writer_may_not_read() {
    let d = fenced();
    let mut owner = d.conn_as(&d.owner);
    owner
        .batch_execute(&format!(
            "CREATE TABLE deals (id int PRIMARY KEY, code text NOT NULL, v int);
             INSERT INTO deals VALUES (1, 'acme-merger-2027', 0);
             GRANT SELECT (id, v), UPDATE (v), DELETE ON deals TO {attacker};
             CREATE TABLE projects (id int PRIMARY KEY);
             CREATE TABLE notes (project int REFERENCES projects ON DELETE CASCADE, code text NOT NULL);
             INSERT INTO projects VALUES (7);
             INSERT INTO notes VALUES (7, 'project-nightingale');
             ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
             CREATE POLICY nobody ON notes USING (false);
             GRANT ALL ON projects, notes TO {attacker};",
            attacker = d.attacker
        ))
        .unwrap();
    owner.protect_rows("deals", "deal/", &["code"]).unwrap();
    owner.protect_rows("notes", "note/", &["code"]).unwrap();
    let mut attacker = d.conn_as(&d.attacker);
    for statement in ["UPDATE deals SET v = 1 WHERE id = 1", "DELETE FROM deals"] {
        let error = refused(&mut attacker, statement);
        assert!(!error.contains("acme-merger"), "{statement}: {error}");
        assert!(error.contains("may not read"), "{statement}: {error}");
    }
    // A cascade deletes a row that row security hides from the writer.
    let error = refused(&mut attacker, "DELETE FROM projects WHERE id = 7");
    assert!(!error.contains("nightingale"), "{error}");
    assert!(error.contains("may not read"), "{error}");
    // The owner, who may read every row, is told the key.
    let error = refused(&mut owner, "DELETE FROM deals");
    assert!(error.contains("deal/acme-merger-2027"), "{error}");
    // Behind a namespace, too.
    owner.bind_namespace("deal/", &d.app).unwrap();
    let error = refused(&mut attacker, "UPDATE deals SET v = 1 WHERE id = 1");
    assert!(
        !error.contains("acme-merger") && error.contains("lease_namespace_denied"),
        "{error}"
    );
}

/// A claim counts only in the form `lease.present` writes: the refusal
/// path, which reads the claims to say why, admits nothing the admission
/// itself would not (an epoch written ` 1` once passed there).
#[test]
fn a_claim_not_in_presents_form_authorises_nothing() {
    let d = fenced();
    let mut app = d.conn_as(&d.app);
    let lease = granted(app.acquire("jobs-leader", "w1", TTL).unwrap());
    for epoch in [
        format!(" {}", lease.epoch()),
        format!("+{}", lease.epoch()),
        format!("0{}", lease.epoch()),
    ] {
        let forged = app
            .transaction(|conn| {
                conn.batch_execute(&format!(
                    "SELECT set_config('lease.presented', pg_current_xact_id()::text || ' 11:jobs-leader:2:w1:{epoch};', true);
                     INSERT INTO jobs VALUES (1, 'forged')"
                ))
            })
            .unwrap_err();
        assert!(
            matches!(refusal(forged), ref e if is_no_token(e)),
            "epoch {epoch:?}"
        );
    }
    assert_eq!(
        rows(&mut app, "SELECT count(*) FROM jobs"),
        vec!["(0)".to_owned()]
    );
}

/// Whether `error` is a namespace rule's refusal of a key or key prefix
/// (forbidden, but not a table's refusal); `key()` names what was refused.
fn is_namespace_refusal(error: &LeaseError) -> bool {
    error.kind() == ErrorKind::Forbidden && error.table().is_none() && error.refusal().is_none()
}
