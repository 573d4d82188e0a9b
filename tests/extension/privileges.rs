//! Install, dump and restore never hand out power (docs/PRIVILEGES.md):
//! every object of schema `lease` carries exactly the documented grants
//! after each install path and each documented restore, default privileges
//! leave nothing behind, a `--no-owner` restore gives the former owner no
//! way to run code as the superuser, the lineage row is merged and never
//! lowered, namespace rules fail closed when their role cannot be matched,
//! and no function can be made to run an object from `public` or `pg_temp`
//! in place of a built-in.

use std::collections::BTreeSet;
use std::process::Command;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use leasehold::install;
use leasehold_local::LocalPostgres;

use super::{
    app_conn, conn, create_login_role_once, database, dump_tool, owners, pg_dump_file, rows, seed,
    seed_checks, server, state,
};

/// The grants besides the owner's that docs/PRIVILEGES.md lists.
fn documented_acl() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PRIVILEGES.md"))
        .expect("docs/PRIVILEGES.md");
    let start = doc.find("<!-- acl-list: begin -->").expect("begin marker");
    let end = doc.find("<!-- acl-list: end -->").expect("end marker");
    doc[start..end]
        .lines()
        .filter(|line| line.contains(": ") && !line.starts_with("<!--"))
        .map(str::to_owned)
        .collect()
}

/// Every grant on every object of schema `lease` except the owner's own,
/// one line per object and grantee: `kind name: grantee PRIVILEGES` (a
/// NULL ACL read as PostgreSQL's default for the owner). Also fails when
/// the owner lacks a privilege it should hold.
fn granted_acl(conn: &mut PgConnection) -> Vec<String> {
    let missing = rows(
        conn,
        "WITH objects AS (
             SELECT n.nspname::text AS name, n.nspowner AS owner, n.nspacl AS acl, 'n' AS t
               FROM pg_namespace n WHERE n.nspname = 'lease'
             UNION ALL
             SELECT c.oid::regclass::text, c.relowner, c.relacl, CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END
               FROM pg_class c
              WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
             UNION ALL
             SELECT p.oid::regprocedure::text, p.proowner, p.proacl, 'f'
               FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace
         )
         SELECT o.name || ' ' || d.privilege_type AS t
           FROM objects o, aclexplode(acldefault(o.t::\"char\", o.owner)) d
          WHERE d.grantee = o.owner
            AND NOT EXISTS (SELECT 1 FROM aclexplode(COALESCE(o.acl, acldefault(o.t::\"char\", o.owner))) a
                             WHERE a.grantee = o.owner AND a.privilege_type = d.privilege_type)
          ORDER BY 1",
    );
    assert!(missing.is_empty(), "the owner lacks: {missing:?}");
    rows(
        conn,
        "WITH objects AS (
             SELECT 'schema' AS kind, n.nspname::text AS name, n.nspowner AS owner, n.nspacl AS acl, 'n' AS t
               FROM pg_namespace n WHERE n.nspname = 'lease'
             UNION ALL
             SELECT CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' ELSE 'table' END,
                    c.oid::regclass::text, c.relowner, c.relacl, CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END
               FROM pg_class c
              WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
             UNION ALL
             SELECT 'function', p.oid::regprocedure::text, p.proowner, p.proacl, 'f'
               FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace
             UNION ALL
             SELECT CASE t.typtype WHEN 'd' THEN 'domain' ELSE 'type' END, t.oid::regtype::text, t.typowner,
                    t.typacl, 'T'
               FROM pg_type t
              WHERE t.typnamespace = 'lease'::regnamespace AND t.typtype IN ('b', 'd', 'e', 'r', 'm')
                AND t.typcategory <> 'A'
         )
         SELECT o.kind || ' ' || o.name || ': '
                || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee)::text END || ' '
                || string_agg(a.privilege_type || CASE WHEN a.is_grantable THEN '*' ELSE '' END, ','
                              ORDER BY a.privilege_type) AS t
           FROM objects o, aclexplode(COALESCE(o.acl, acldefault(o.t::\"char\", o.owner))) a
          WHERE a.grantee <> o.owner
          GROUP BY o.kind, o.name, a.grantee
          ORDER BY 1",
    )
}

fn assert_documented(conn: &mut PgConnection, what: &str) {
    assert_eq!(
        granted_acl(conn),
        documented_acl(),
        "{what}: the grants differ from docs/PRIVILEGES.md"
    );
}

/// A login role of the whole cluster, created once.
fn role(name: &str) {
    let mut admin = PgConnection::establish(&server().pg.url()).unwrap();
    create_login_role_once(&mut admin, name);
}

pub(super) fn conn_as(database: &str, role: &str) -> PgConnection {
    conn_as_on(&server().pg, database, role)
}

/// `role`'s connection to `database` of the cluster `pg`.
pub(super) fn conn_as_on(pg: &LocalPostgres, database: &str, role: &str) -> PgConnection {
    let url = pg
        .url_for(database)
        .replacen("postgres@", &format!("{role}@"), 1);
    assert!(url.contains(&format!("{role}@")), "{url}");
    PgConnection::establish(&url).unwrap()
}

/// The error a statement fails with; panics when it succeeds.
pub(super) fn refused(conn: &mut PgConnection, sql: &str) -> String {
    match conn.batch_execute(sql) {
        Ok(()) => panic!("{sql}: succeeded, should have been refused"),
        Err(error) => error.to_string(),
    }
}

/// Installs leasehold as `app`, by the extension or by the migrations.
pub(super) fn install_as_app(db: &str, use_extension: bool) -> PgConnection {
    let mut c = app_conn(db);
    if use_extension {
        c.batch_execute("CREATE EXTENSION leasehold").unwrap();
    } else {
        install(&mut c).unwrap();
    }
    c
}

/// Default privileges a careful superuser sets for a monitoring role, for
/// itself (a trusted extension's script runs as the bootstrap superuser,
/// `postgres` here) and for `app`, in this database; and a careless one's
/// for PUBLIC.
const MONITOR_DEFAULTS: &str = "
    ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT SELECT, TRIGGER ON TABLES TO lh_monitor;
    ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT EXECUTE ON FUNCTIONS TO lh_monitor;
    ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT USAGE ON TYPES TO lh_monitor;
    ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT CREATE ON SCHEMAS TO lh_monitor;
    ALTER DEFAULT PRIVILEGES FOR ROLE app GRANT SELECT, TRIGGER ON TABLES TO lh_monitor;
    ALTER DEFAULT PRIVILEGES FOR ROLE app GRANT EXECUTE ON FUNCTIONS TO lh_monitor;
    ALTER DEFAULT PRIVILEGES FOR ROLE app GRANT USAGE ON TYPES TO lh_monitor;
    ALTER DEFAULT PRIVILEGES FOR ROLE app GRANT CREATE ON SCHEMAS TO lh_monitor;
    ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT SELECT ON TABLES TO PUBLIC;
    ALTER DEFAULT PRIVILEGES FOR ROLE app GRANT SELECT ON TABLES TO PUBLIC;
    ALTER DEFAULT PRIVILEGES FOR ROLE app GRANT CREATE ON SCHEMAS TO PUBLIC;";

/// What a monitoring role that default privileges were meant for tries:
/// each must be refused.
fn monitor_is_refused(db: &str) {
    let mut m = conn_as(db, "lh_monitor");
    for sql in [
        "SELECT lease.bind_namespace('lh_monitor/', 'lh_monitor')",
        "SELECT * FROM lease.leases",
        "SELECT * FROM lease.namespaces",
        "SELECT lease.force_release('lh_monitor/x')",
        "SELECT * FROM lease.list_leases('', NULL, '{}', 'key', 10)",
        "CREATE TRIGGER t BEFORE UPDATE ON lease.leases FOR EACH ROW \
         EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        "CREATE TABLE lease.planted (x int)",
    ] {
        let message = refused(&mut m, sql);
        assert!(message.contains("permission denied"), "{sql}: {message}");
    }
}

fn defaults_leave_nothing_behind(use_extension: bool) {
    role("lh_monitor");
    let db = database();
    conn(&db).batch_execute(MONITOR_DEFAULTS).unwrap();
    let mut c = install_as_app(&db, use_extension);
    assert_documented(&mut c, "install with default privileges");
    assert_eq!(owners(&mut c), ["app"]);
    monitor_is_refused(&db);
    // Still a working install.
    seed(&mut c);
    seed_checks(&mut c);
}

#[test]
fn default_privileges_leave_nothing_in_an_extension_install() {
    defaults_leave_nothing_behind(true);
}

#[test]
fn default_privileges_leave_nothing_in_a_migrations_install() {
    defaults_leave_nothing_behind(false);
}

#[test]
fn each_install_path_grants_exactly_the_documented_privileges() {
    for use_extension in [true, false] {
        let db = database();
        let mut c = install_as_app(&db, use_extension);
        assert_documented(
            &mut c,
            if use_extension {
                "extension"
            } else {
                "migrations"
            },
        );
        assert_eq!(owners(&mut c), ["app"]);
    }
}

/// How a dump is restored (docs/PRIVILEGES.md, "Restoring a dump").
#[derive(Clone, Copy, Debug)]
pub(super) enum Restore {
    /// `pg_restore --role=app`, connected as the superuser.
    AsOwner,
    /// `pg_restore` connected as `app` itself.
    ConnectedAsOwner,
    /// `pg_restore --no-owner`, by the superuser.
    NoOwner,
    /// `pg_restore` by the superuser, owners as dumped (a migrations
    /// install only; the extension refuses it, see docs/PRIVILEGES.md).
    Plain,
}

/// Restores `file` into a new database; `defaults` first sets
/// [`MONITOR_DEFAULTS`] there, as a database that a superuser prepared.
pub(super) fn pg_restore(file: &std::path::Path, how: Restore, defaults: bool) -> String {
    let to = database();
    if defaults {
        conn(&to).batch_execute(MONITOR_DEFAULTS).unwrap();
    }
    pg_restore_into(&server().pg, &to, file, how);
    to
}

/// Restores `file` into the existing database `to` of the cluster `pg`.
pub(super) fn pg_restore_into(pg: &LocalPostgres, to: &str, file: &std::path::Path, how: Restore) {
    let (option, url) = match how {
        Restore::AsOwner => (Some("--role=app"), pg.url_for(to)),
        Restore::ConnectedAsOwner => (None, pg.url_for(to).replacen("postgres@", "app@", 1)),
        Restore::NoOwner => (Some("--no-owner"), pg.url_for(to)),
        Restore::Plain => (None, pg.url_for(to)),
    };
    let out = Command::new(dump_tool("pg_restore"))
        .args(option)
        .args(["--exit-on-error", "-d"])
        .arg(url)
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_restore {how:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The attack of a former owner after a restore: a trigger on the table
/// that every acquire writes, whose function makes its creator a
/// superuser. It must be refused, and `app` must stay what it was.
fn former_owner_cannot_escalate(db: &str) {
    let mut a = app_conn(db);
    a.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS app_own;
         CREATE OR REPLACE FUNCTION app_own.escalate() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN EXECUTE 'ALTER ROLE app SUPERUSER'; RETURN NEW; END $$;",
    )
    .unwrap();
    let message = refused(
        &mut a,
        "CREATE TRIGGER escalate BEFORE INSERT OR UPDATE ON lease.leases \
         FOR EACH ROW EXECUTE FUNCTION app_own.escalate()",
    );
    assert!(message.contains("permission denied"), "{message}");
    a.batch_execute("SELECT * FROM lease.acquire('escalate/probe', 'app', interval '1 minute')")
        .unwrap();
    assert_eq!(
        rows(
            &mut a,
            "SELECT rolsuper::text AS t FROM pg_roles WHERE rolname = 'app'"
        ),
        ["false"]
    );
}

/// Each documented restore of a dump: into a fresh database, and, for an
/// extension install (whose restore runs the extension's scripts), into
/// one where default privileges would give a monitoring role rights. A
/// migrations install is restored by pg_restore's own CREATE statements,
/// to which PostgreSQL applies the target's default privileges; the docs
/// say to restore it into a database without them.
fn restores_keep_power_where_it_was(use_extension: bool) {
    role("lh_monitor");
    let db = database();
    let mut c = install_as_app(&db, use_extension);
    seed(&mut c);
    let before = state(&mut c);
    let file = pg_dump_file(&db);
    let targets: &[bool] = if use_extension {
        &[false, true]
    } else {
        &[false]
    };
    for &defaults in targets {
        let ways: &[Restore] = if use_extension {
            &[
                Restore::AsOwner,
                Restore::ConnectedAsOwner,
                Restore::NoOwner,
            ]
        } else {
            &[
                Restore::AsOwner,
                Restore::ConnectedAsOwner,
                Restore::NoOwner,
                Restore::Plain,
            ]
        };
        for &how in ways {
            let what = format!("restore {how:?}, default privileges {defaults}");
            let restored = pg_restore(&file, how, defaults);
            let mut r = conn(&restored);
            assert_eq!(state(&mut r), before, "{what}: the rows");
            match how {
                Restore::AsOwner | Restore::ConnectedAsOwner | Restore::Plain => {
                    assert_eq!(owners(&mut r), ["app"], "{what}")
                }
                Restore::NoOwner => {
                    assert_eq!(owners(&mut r), ["postgres"], "{what}");
                    former_owner_cannot_escalate(&restored);
                }
            }
            assert_documented(&mut r, &what);
            monitor_is_refused(&restored);
            seed_checks(&mut r);
        }
    }
}

#[test]
fn pg_dump_restores_of_an_extension_install_keep_power_where_it_was() {
    restores_keep_power_where_it_was(true);
}

#[test]
fn pg_dump_restores_of_a_migrations_install_keep_power_where_it_was() {
    restores_keep_power_where_it_was(false);
}

/// A lineage row inserted outside a restore (by the owner, the only role
/// that may write the table) lowers neither the generation nor the
/// pruning watermark: the extension's restore trigger merges.
#[test]
fn a_lineage_row_inserted_outside_a_restore_lowers_nothing() {
    let db = database();
    let mut c = install_as_app(&db, true);
    c.batch_execute(
        "SELECT lease.raise_generation(3); UPDATE lease.lineage SET pruned_through = 42",
    )
    .unwrap();
    let generation =
        |c: &mut PgConnection| rows(c, "SELECT generation::text AS t FROM lease.generation()");
    assert_eq!(generation(&mut c), ["3"]);
    c.batch_execute(
        "INSERT INTO lease.lineage (system_identifier, base, last_timeline)
         VALUES ((pg_control_system()).system_identifier, 0, 1)",
    )
    .unwrap();
    assert_eq!(generation(&mut c), ["3"], "the generation was not lowered");
    assert_eq!(
        rows(
            &mut c,
            "SELECT pruned_through::text AS t FROM lease.lineage"
        ),
        ["42"],
        "the pruning watermark was not lowered"
    );
}

/// A role name unique to one test: roles belong to the whole cluster and
/// the tests of this binary run in parallel.
pub(super) fn fresh_role(stem: &str) -> String {
    let db = database();
    let name = format!("{stem}_{db}");
    role(&name);
    name
}

/// A namespace rule whose role cannot be matched any more admits nobody
/// but superusers until it is bound again: the role renamed (its oid now
/// names another role), and the role dropped and created again
/// before a restore into the same cluster (the dump's oid names no role;
/// across clusters rules follow names, see namespaces_restore.rs).
#[test]
fn namespace_rules_fail_closed_when_their_role_cannot_be_matched() {
    let team = fresh_role("lh_team");
    let db = database();
    let mut c = install_as_app(&db, true);
    conn(&db)
        .batch_execute(&format!("GRANT {team} TO app"))
        .unwrap();
    c.batch_execute(&format!("SELECT lease.bind_namespace('team/', '{team}')"))
        .unwrap();
    let acquire = "SELECT * FROM lease.acquire('team/job', 'w', interval '1 minute')";
    conn_as(&db, &team).batch_execute(acquire).unwrap();

    // Renamed: the rule's oid now names a role with another name.
    let intruder = format!("{team}_intruder");
    let mut admin = PgConnection::establish(&server().pg.url()).unwrap();
    admin
        .batch_execute(&format!("ALTER ROLE {team} RENAME TO {intruder}"))
        .unwrap();
    let message = refused(
        &mut conn_as(&db, &intruder),
        "SELECT * FROM lease.acquire('team/other', 'w', interval '1 minute')",
    );
    assert!(message.contains("may not act on"), "{message}");
    let listed = rows(
        &mut c,
        "SELECT role AS t FROM lease.list_namespaces() WHERE prefix = 'team/'",
    );
    assert!(listed[0].starts_with("pg_dropped_role("), "{listed:?}");
    admin
        .batch_execute(&format!("ALTER ROLE {intruder} RENAME TO {team}"))
        .unwrap();
    conn_as(&db, &team)
        .batch_execute("SELECT * FROM lease.acquire('team/back', 'w', interval '1 minute')")
        .unwrap();
}

/// A rule restored into a cluster where its role has another oid (here the
/// role dropped and created again between dump and restore) admits nobody
/// until it is bound again.
#[test]
fn pg_dump_namespace_rules_fail_closed_after_a_restore_where_the_role_has_another_oid() {
    let team = fresh_role("lh_moved");
    let db = database();
    let mut c = install_as_app(&db, true);
    let mut admin = PgConnection::establish(&server().pg.url()).unwrap();
    admin
        .batch_execute(&format!("GRANT {team} TO app"))
        .unwrap();
    c.batch_execute(&format!("SELECT lease.bind_namespace('team/', '{team}')"))
        .unwrap();
    conn_as(&db, &team)
        .batch_execute("SELECT * FROM lease.acquire('team/job', 'w', interval '1 minute')")
        .unwrap();
    let file = pg_dump_file(&db);
    admin
        .batch_execute(&format!(
            "DROP ROLE {team}; CREATE ROLE {team} LOGIN; GRANT {team} TO app"
        ))
        .unwrap();
    let restored = pg_restore(&file, Restore::AsOwner, false);
    let message = refused(
        &mut conn_as(&restored, &team),
        "SELECT * FROM lease.acquire('team/next', 'w', interval '1 minute')",
    );
    assert!(message.contains("may not act on"), "{message}");
    app_conn(&restored)
        .batch_execute(&format!("SELECT lease.bind_namespace('team/', '{team}')"))
        .unwrap();
    conn_as(&restored, &team)
        .batch_execute("SELECT * FROM lease.acquire('team/next', 'w', interval '1 minute')")
        .unwrap();
}

/// The words of a SQL body outside comments and string literals, with
/// each word's preceding non-space character; `''` inside a literal and
/// `"..."` identifiers are handled.
fn tokens(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = body.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '-' && chars.get(i + 1) == Some(&'-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '\'' {
            i += 1;
            while i < chars.len() {
                if chars[i] == '\'' && chars.get(i + 1) == Some(&'\'') {
                    i += 2;
                } else if chars[i] == '\'' {
                    break;
                } else {
                    i += 1;
                }
            }
            out.push("'literal'".to_owned());
            i += 1;
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
            out.push(chars[start..=i.min(chars.len() - 1)].iter().collect());
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$')
            {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c.is_whitespace() {
            i += 1;
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            // Operators: a run of operator characters is one token.
            let ops = "+-*/<>=~!@#%^&|`?";
            if ops.contains(c) {
                let start = i;
                while i < chars.len() && ops.contains(chars[i]) {
                    i += 1;
                }
                out.push(chars[start..i].iter().collect());
            } else {
                out.push(c.to_string());
                i += 1;
            }
        }
    }
    out
}

/// Why a SQL function body without a pinned search_path could resolve an
/// object from `public` (or another schema a caller puts first) in place
/// of a built-in: an unqualified function call, an operator not written
/// `OPERATOR(pg_catalog.x)`, or a cast to a type that is not a keyword.
fn unqualified(body: &str) -> Vec<String> {
    // Syntax that looks like a call but is resolved without the search
    // path (SQL keywords), and type names the grammar maps to pg_catalog.
    const SYNTAX: &[&str] = &[
        "select", "case", "when", "then", "else", "end", "coalesce", "greatest", "least", "nullif",
        "array", "any", "all", "exists", "in", "and", "or", "not", "is", "null", "true", "false",
        "operator", "row", "values", "as", "from", "where", "distinct",
    ];
    const KEYWORD_TYPES: &[&str] = &[
        "bigint",
        "integer",
        "int",
        "smallint",
        "boolean",
        "interval",
        "numeric",
        "real",
        "bit",
        "varchar",
        "timestamp",
        "time",
        "double",
        "char",
        "character",
        "decimal",
    ];
    let t = tokens(body);
    let mut problems = Vec::new();
    for (i, token) in t.iter().enumerate() {
        let lower = token.to_ascii_lowercase();
        let qualified = i >= 2 && t[i - 1] == ".";
        // `AS alias(column, ...)` names columns; it calls nothing.
        let alias = i >= 1 && t[i - 1].eq_ignore_ascii_case("as");
        let next = t.get(i + 1).map(String::as_str);
        let starts_word = token
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_');
        if starts_word
            && next == Some("(")
            && !qualified
            && !alias
            && !SYNTAX.contains(&lower.as_str())
            && !KEYWORD_TYPES.contains(&lower.as_str())
        {
            problems.push(format!("unqualified call {token}("));
        }
        // `alias.*` is every column of a row, not an operator.
        let all_columns = token == "*" && i >= 1 && t[i - 1] == ".";
        if token.chars().all(|c| "+-*/<>=~!@#%^&|`?".contains(c))
            && !token.is_empty()
            && !all_columns
        {
            // Inside OPERATOR(pg_catalog.x): the token is preceded by "pg_catalog" ".".
            let in_operator =
                i >= 2 && t[i - 1] == "." && t[i - 2].eq_ignore_ascii_case("pg_catalog");
            if !in_operator {
                problems.push(format!("unqualified operator {token}"));
            }
        }
        if token == "::" {
            let type_name = t
                .get(i + 1)
                .map(|s| s.to_ascii_lowercase())
                .unwrap_or_default();
            let schema_qualified = t.get(i + 2).map(String::as_str) == Some(".");
            if !schema_qualified && !KEYWORD_TYPES.contains(&type_name.as_str()) {
                problems.push(format!("cast to unqualified type {type_name}"));
            }
        }
    }
    problems
}

#[test]
fn the_qualification_check_sees_what_it_must() {
    assert!(unqualified(
        "SELECT pg_catalog.sha256(pg_catalog.convert_to(key, 'UTF8'::pg_catalog.name))"
    )
    .is_empty());
    assert!(
        !unqualified("SELECT sha256(pg_catalog.convert_to(key, 'UTF8'::pg_catalog.name))")
            .is_empty()
    );
    assert!(!unqualified("SELECT pg_catalog.convert_to(key, 'UTF8')::text").is_empty());
    assert!(!unqualified("SELECT a = b").is_empty());
    assert!(unqualified("SELECT a OPERATOR(pg_catalog.=) b AND c IS NULL -- a = b\n").is_empty());
    assert!(unqualified("SELECT 'a = b(' OPERATOR(pg_catalog.||) x::bigint").is_empty());
    assert!(unqualified("SELECT r.* FROM pg_catalog.unnest(x) AS r(v)").is_empty());
    assert!(!unqualified("SELECT 2 * r.v FROM pg_catalog.unnest(x) AS r(v)").is_empty());
    assert!(!unqualified("SELECT f(x) AS r").is_empty());
}

/// Every function in schema `lease`, after each install path: PL/pgSQL
/// and every other function pins `search_path = pg_catalog, pg_temp`; a
/// SQL function without the pin (so the planner can inline it) qualifies
/// every call, operator and cast, so no object in `public` or `pg_temp`
/// can stand in for a built-in when a superuser calls it directly.
#[test]
fn every_function_pins_its_search_path_or_qualifies_everything() {
    for use_extension in [true, false] {
        let db = database();
        let mut c = install_as_app(&db, use_extension);
        let functions = rows(
            &mut c,
            "SELECT format('%s|%s|%s', p.oid::regprocedure, l.lanname,
                           COALESCE((SELECT s FROM unnest(p.proconfig) s WHERE s LIKE 'search_path=%'), '')) AS t
               FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
              WHERE p.pronamespace = 'lease'::regnamespace ORDER BY 1",
        );
        assert!(functions.len() > 50, "{functions:?}");
        let mut problems = BTreeSet::new();
        for line in functions {
            let mut parts = line.splitn(3, '|');
            let (name, language, path) = (
                parts.next().unwrap_or_default().to_owned(),
                parts.next().unwrap_or_default().to_owned(),
                parts.next().unwrap_or_default().to_owned(),
            );
            if path == "search_path=pg_catalog, pg_temp" {
                continue;
            }
            if language != "sql" {
                problems.insert(format!(
                    "{name}: {language} without a pinned search_path ({path:?})"
                ));
                continue;
            }
            let body = rows(
                &mut c,
                &format!("SELECT prosrc AS t FROM pg_proc WHERE oid = '{name}'::regprocedure"),
            );
            for problem in unqualified(&body[0]) {
                problems.insert(format!("{name}: {problem}"));
            }
        }
        assert!(
            problems.is_empty(),
            "extension={use_extension}: {problems:#?}"
        );
    }
}

/// The qualification is enough in practice: a superuser whose search_path
/// puts `public` first, where a role planted functions and an operator
/// that would win over the built-ins, calls each unpinned helper it can
/// call with simple arguments, and none of the planted objects runs.
#[test]
fn planted_objects_in_public_never_run_inside_a_helper() {
    let db = database();
    let _installed = install_as_app(&db, false);
    let mut admin = conn(&db);
    admin
        .batch_execute(
            "CREATE TABLE public.planted_ran (what text);
             GRANT INSERT ON public.planted_ran TO PUBLIC;
             CREATE FUNCTION public.convert_to(text, text) RETURNS bytea LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO public.planted_ran VALUES ('convert_to'); RETURN '\\x00'; END $$;
             CREATE FUNCTION public.sha256(bytea) RETURNS bytea LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO public.planted_ran VALUES ('sha256'); RETURN '\\x00'; END $$;
             CREATE FUNCTION public.octet_length(text) RETURNS integer LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO public.planted_ran VALUES ('octet_length'); RETURN 1; END $$;
             CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO public.planted_ran VALUES ('clock_timestamp'); RETURN now(); END $$;
             CREATE FUNCTION public.planted_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO public.planted_ran VALUES ('='); RETURN true; END $$;
             CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.planted_eq);",
        )
        .unwrap();
    admin
        .batch_execute(
            "SET search_path = public, pg_catalog;
             SELECT lease._key_hash('k');
             SELECT lease._name_ok('k');
             SELECT lease._expires_in(interval '1 minute');
             SELECT lease._make_durable();
             SELECT lease._ttl_ok(interval '1 minute');
             SELECT lease._wait_ok(interval '0');
             SELECT lease._waiter_lock_id(lease._key_hash('k'));
             SELECT lease._allowed('k');
             SELECT lease._timeline();",
        )
        .unwrap();
    assert!(
        rows(&mut admin, "SELECT what AS t FROM public.planted_ran").is_empty(),
        "a planted object ran"
    );
}

/// The initial privileges PostgreSQL recorded for the extension's objects
/// (`pg_init_privs`, what `pg_dump` compares against) name the extension's
/// owner, never the superuser the trusted script ran as, and equal the
/// objects' privileges now. Needs no `pg_dump`, so it runs on every major
/// of the matrix, where the recording differs (PostgreSQL 17 also updates
/// it on a change of owner).
#[test]
fn initial_privileges_of_the_extension_name_its_owner() {
    let db = database();
    let mut c = install_as_app(&db, true);
    let stale = rows(
        &mut c,
        "SELECT format('%s %s', i.classoid::regclass, i.objoid) AS t
           FROM pg_init_privs i
           JOIN pg_depend d ON d.classid = i.classoid AND d.objid = i.objoid AND d.deptype = 'e'
           JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'leasehold'
          WHERE i.objsubid = 0
            AND (EXISTS (SELECT 1 FROM aclexplode(i.initprivs) a
                          WHERE pg_get_userbyid(a.grantor) <> 'app'
                             OR (a.grantee <> 0 AND pg_get_userbyid(a.grantee) <> 'app'))
                 OR i.initprivs IS DISTINCT FROM (
                        SELECT COALESCE(p.proacl, c.relacl, t.typacl)
                          FROM (SELECT 1) AS one
                          LEFT JOIN pg_proc p ON i.classoid = 'pg_proc'::regclass AND p.oid = i.objoid
                          LEFT JOIN pg_class c ON i.classoid = 'pg_class'::regclass AND c.oid = i.objoid
                          LEFT JOIN pg_type t ON i.classoid = 'pg_type'::regclass AND t.oid = i.objoid))
          ORDER BY 1",
    );
    assert!(
        stale.is_empty(),
        "initial privileges not the owner's: {stale:?}"
    );
    let recorded = rows(
        &mut c,
        "SELECT count(*)::text AS t FROM pg_init_privs i
           JOIN pg_depend d ON d.classid = i.classoid AND d.objid = i.objoid AND d.deptype = 'e'
           JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'leasehold'",
    );
    assert_ne!(
        recorded,
        ["0"],
        "nothing recorded: the check would see nothing"
    );
}
