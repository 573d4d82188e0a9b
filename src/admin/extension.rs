//! Packaging leasehold's SQL as a PostgreSQL extension: `CREATE EXTENSION
//! leasehold` installs what [`crate::install()`] installs, from the same
//! sources compiled into the crate (src/sql_files.rs).
//!
//! [`extension_files`] generates the control file and the scripts:
//! `leasehold--<V>.sql` runs every migration and then every file of
//! functions, in the order [`crate::install()`] applies them, and
//! `leasehold--<P>--<V>.sql`, for each earlier version `P` of
//! [`EXTENSION_UPGRADES_FROM`], runs the migrations newer than `P` and then
//! every file of functions (written `CREATE OR REPLACE`), so that `ALTER
//! EXTENSION leasehold UPDATE` brings an older install to `V`. `V` is the
//! version of the functions step ([`crate::sql_files::functions_version`]):
//! the newest migration's version, a dot and a digest of the files of
//! functions. The command `leasehold extension generate --out DIR` writes
//! the files, and `leasehold extension install` writes them into the
//! server's extension directory; nothing generated is committed.
//!
//! What the generator changes in the SQL, and why:
//!
//! - Every script opens with the `\echo ... \quit` guard, so feeding it to
//!   psql does nothing.
//! - The control file says `schema = lease`: `CREATE EXTENSION` creates the
//!   schema (owned by the calling role) before the script runs, so the
//!   script's own `CREATE SCHEMA IF NOT EXISTS lease` is dropped (PostgreSQL
//!   refuses `IF NOT EXISTS` on an object that is not the extension's own).
//!   The schema is not a member of the extension: `DROP EXTENSION` leaves it.
//! - The schema-ownership check asks that the extension's owner (the role
//!   that ran `CREATE EXTENSION`) own schema `lease`, not the role running
//!   the script: a trusted extension's script runs as the bootstrap
//!   superuser. A schema another role created beforehand is still refused.
//! - The first script refuses to run when a migrations install exists
//!   (`lease.schema_migrations`): the two install paths are never mixed.
//! - Every table except `lease.waiters` (backend pids of live sessions,
//!   meaningless in another server) is marked with
//!   `pg_extension_config_dump`, so `pg_dump` keeps every lease, epoch,
//!   guard record, namespace rule and the lineage row.
//! - `lease.lineage` gets one object the migrations do not have: a BEFORE
//!   INSERT trigger that merges the row already there into the new one and
//!   removes it. On restore, `CREATE EXTENSION` inserts a fresh lineage row
//!   and the dump's row then arrives by COPY; without the trigger the
//!   dump's row (the lineage that orders epochs across clusters) would be
//!   refused as a duplicate. The merge never lowers the generation or the
//!   pruning watermark, so an INSERT outside a restore loses nothing.
//! - No statement that reads or writes leasehold's tables, calls its
//!   functions or alters a table runs as the superuser. The script runs as
//!   the bootstrap superuser, but from the second script on every object it
//!   meets belongs to the extension's owner, who may have replaced a
//!   function's body or put a trigger, default, CHECK, index expression,
//!   policy or rule on a table. Such statements (the migrations' data
//!   changes, `ALTER TABLE`, `CREATE INDEX` and the closing `SELECT
//!   lease._drop_default_grants()`) move to the end of the script and run
//!   inside a SECURITY DEFINER function the script creates, hands to the
//!   owner, calls and drops: whatever the owner planted runs with the
//!   owner's rights. What stays with the superuser is DDL that evaluates
//!   nothing (`CREATE FUNCTION`, `GRANT`, `REVOKE`, `COMMENT`) and DO
//!   blocks that name only catalog objects; the generator refuses a
//!   migration whose DO block calls a `lease.` function.
//! - The first script refuses a schema `lease` that already holds objects:
//!   every object the scripts meet is one they created.
//! - Every script ends by giving the extension's tables and functions to
//!   the extension's owner (the role that ran `CREATE EXTENSION`), as the
//!   installing role owns them with the migrations, and by recording each
//!   moved object's privileges again as its initial privileges
//!   (`pg_init_privs`), now under that owner. A trusted extension's script
//!   runs as the bootstrap superuser, and SECURITY DEFINER functions owned
//!   by a superuser in a schema the installing role owns would let that
//!   role run code as the superuser (by renaming the schema and putting its
//!   own `lease._allowed` in place, say). Initial privileges left naming the
//!   superuser would make `pg_dump` grant ALL on every object to the owner,
//!   and after a `--no-owner` restore that owner could put a trigger on a
//!   table that superuser-owned definer functions write. Default privileges
//!   are taken back by the migrations themselves
//!   (`lease._drop_default_grants`). A dump is restored as the role that
//!   should own leasehold (`pg_restore --role=<owner>`), or with
//!   `--no-owner` by a superuser who is to own everything; a superuser
//!   restoring the dump as is would own the extension while the installing
//!   role owns the schema, which the ownership check refuses.

use std::fmt::Write as _;

use crate::error::LeaseError;
use crate::sql::install::schema_owner_check;
use crate::sql_files::{self, statements, FUNCTION_SQL, MIGRATION_SQL};

/// The extension's name (`CREATE EXTENSION leasehold`).
const EXTENSION_NAME: &str = "leasehold";

/// Tables that `pg_dump` does not keep: session state of a running server,
/// and the namespace-change marker, whose value means nothing elsewhere.
const NOT_DUMPED: &[&str] = &["waiters", "namespace_changes"];

/// One generated file: its name in the server's `extension` directory and
/// its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionFile {
    /// File name, e.g. `leasehold.control`.
    pub name: String,
    /// The file's text.
    pub contents: String,
}

/// The earlier versions of the extension that `ALTER EXTENSION leasehold
/// UPDATE` upgrades from, oldest first: each gets a script
/// `leasehold--<P>--<V>.sql`. `20261201000008` is what the layout with one
/// migration per concern installed (before the functions moved to
/// `sql/functions/`). A release adds its own version here, so the next one
/// upgrades from it.
pub const EXTENSION_UPGRADES_FROM: &[&str] = &["20261201000008"];

/// The extension version every `CREATE EXTENSION leasehold` installs: the
/// version of the functions step, as [`crate::admin::installed_versions`]
/// reports it last for an install by [`crate::install()`].
pub fn extension_version() -> String {
    sql_files::functions_version()
}

/// One source of a script: its path (for messages), its text and whether
/// it is the install's first migration.
struct Source<'a> {
    path: String,
    sql: &'a str,
    first: bool,
}

/// The migrations newer than `after` (all when `None`), then every file of
/// functions.
fn sources(after: Option<&str>) -> Vec<Source<'static>> {
    let mut sources: Vec<Source<'static>> = MIGRATION_SQL
        .iter()
        .enumerate()
        .filter(|(_, (dir, _, _))| {
            after.is_none_or(|after| sql_files::version_of(dir).as_str() > after)
        })
        .map(|(index, (dir, up, _))| Source {
            path: format!("migrations/{dir}/up.sql"),
            sql: up,
            first: after.is_none() && index == 0,
        })
        .collect();
    sources.extend(FUNCTION_SQL.iter().map(|(file, sql)| Source {
        path: format!("sql/functions/{file}"),
        sql,
        first: false,
    }));
    sources
}

/// Generates the control file, the install script and the update scripts,
/// in a stable order (control file, install script, update scripts in the
/// order of [`EXTENSION_UPGRADES_FROM`]).
pub fn extension_files() -> Result<Vec<ExtensionFile>, LeaseError> {
    let version = extension_version();
    let mut files = vec![
        ExtensionFile {
            name: format!("{EXTENSION_NAME}.control"),
            contents: control_file(&version),
        },
        ExtensionFile {
            name: format!("{EXTENSION_NAME}--{version}.sql"),
            contents: script(&sources(None), true)?,
        },
    ];
    for from in EXTENSION_UPGRADES_FROM {
        if *from == version {
            continue;
        }
        let after = from.split('.').next().unwrap_or(from);
        files.push(ExtensionFile {
            name: format!("{EXTENSION_NAME}--{from}--{version}.sql"),
            contents: script(&sources(Some(after)), false)?,
        });
    }
    Ok(files)
}

/// The install script of an extension made of `migrations` alone
/// (directory name and `up.sql`, oldest first), as this generator writes
/// it: for tests that install the layout of an earlier version.
pub fn install_script_of(migrations: &[(String, String)]) -> Result<String, LeaseError> {
    let sources: Vec<Source<'_>> = migrations
        .iter()
        .enumerate()
        .map(|(index, (dir, up))| Source {
            path: format!("migrations/{dir}/up.sql"),
            sql: up,
            first: index == 0,
        })
        .collect();
    script(&sources, true)
}

fn control_file(version: &str) -> String {
    format!(
        "# Generated by `leasehold extension generate` from migrations/ and sql/functions/; do not edit.\n\
         comment = 'PostgreSQL-native leases with monotonic fencing epochs, and guards that reject writes from superseded holders'\n\
         default_version = '{version}'\n\
         schema = lease\n\
         relocatable = false\n\
         superuser = true\n\
         trusted = true\n\
         requires = 'plpgsql'\n"
    )
}

/// The check the first script runs in place of migration 1's: schema
/// `lease` must be owned by the extension's owner.
const EXTENSION_SCHEMA_OWNER_CHECK: &str = "DO $$
DECLARE
    v_owner text;
    v_installer text;
BEGIN
    SELECT pg_catalog.pg_get_userbyid(e.extowner) INTO v_installer
      FROM pg_catalog.pg_extension AS e
     WHERE e.extname OPERATOR(pg_catalog.=) 'leasehold';
    SELECT pg_catalog.pg_get_userbyid(n.nspowner) INTO v_owner
      FROM pg_catalog.pg_namespace AS n
     WHERE n.nspname OPERATOR(pg_catalog.=) 'lease'
       AND n.nspowner OPERATOR(pg_catalog.<>)
           (SELECT e.extowner FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'leasehold');
    IF v_owner IS NOT NULL THEN
        RAISE EXCEPTION 'schema lease already exists and is owned by role %, not by the installing role %', v_owner, v_installer
            USING ERRCODE = '42501',
                  CONSTRAINT = 'lease_schema_not_owned',
                  DETAIL = 'owner=' OPERATOR(pg_catalog.||) v_owner,
                  HINT = 'The owner of schema lease could replace leasehold''s functions. Have that role or a superuser drop the schema, or install as that role.';
    END IF;
END
$$;";

/// The first script's refusal of a schema `lease` that already holds
/// objects (see the module documentation): the scripts then meet only
/// objects they created themselves.
const EXTENSION_SCHEMA_EMPTY_CHECK: &str = "DO $$
DECLARE
    v_object text;
BEGIN
    SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) INTO v_object
      FROM pg_catalog.pg_depend AS d
     WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
       AND d.refobjid OPERATOR(pg_catalog.=) (SELECT n.oid FROM pg_catalog.pg_namespace AS n
                                               WHERE n.nspname OPERATOR(pg_catalog.=) 'lease')
       AND d.classid OPERATOR(pg_catalog.<>) 'pg_catalog.pg_extension'::pg_catalog.regclass
     LIMIT 1;
    IF v_object IS NOT NULL THEN
        RAISE EXCEPTION 'schema lease already holds objects that CREATE EXTENSION leasehold did not create (%)', v_object
            USING ERRCODE = '42P07',
                  CONSTRAINT = 'lease_schema_not_empty',
                  DETAIL = 'object=' OPERATOR(pg_catalog.||) v_object,
                  HINT = 'Drop those objects or the schema first: the extension creates every object of schema lease itself, so that its scripts never run code another role put there.';
    END IF;
END
$$;";

/// The first script's refusal to join a migrations install.
const REFUSE_MIGRATIONS_INSTALL: &str = "DO $$
BEGIN
    IF pg_catalog.to_regclass('lease.schema_migrations') IS NOT NULL THEN
        RAISE EXCEPTION 'leasehold is already installed in this database by its migrations (lease.schema_migrations exists); CREATE EXTENSION leasehold cannot take over that install'
            USING ERRCODE = '55000',
                  CONSTRAINT = 'lease_installed_by_migrations',
                  HINT = 'Keep upgrading with leasehold::install (or `leasehold install`), or uninstall it first; the two install paths are never mixed in one database.';
    END IF;
END
$$;";

/// After `lease.lineage` is marked for dumping: the restore trigger (see
/// the module documentation).
const LINEAGE_RESTORE: &str = "
-- Extension only (generated): on restore, the dump's lineage row replaces
-- the one CREATE EXTENSION inserted, so the dump keeps its lineage. It
-- merges, never lowers: the generation floor becomes at least the
-- generation the row already there gives now, and the pruning watermark
-- the higher of the two, so an INSERT outside a restore loses nothing.
CREATE FUNCTION lease._lineage_restore()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_old lease.lineage;
BEGIN
    SELECT g.* INTO v_old FROM lease.lineage AS g WHERE g.singleton FOR UPDATE;
    IF FOUND THEN
        NEW.external_floor := LEAST(lease._max_generation(),
                                    GREATEST(NEW.external_floor, v_old.external_floor,
                                             lease._lineage_generation(v_old, lease._timeline())));
        NEW.pruned_through := GREATEST(NEW.pruned_through, v_old.pruned_through);
        DELETE FROM lease.lineage AS g WHERE g.singleton;
    END IF;
    RETURN NEW;
END;
$$;
REVOKE ALL ON FUNCTION lease._lineage_restore() FROM PUBLIC;
CREATE TRIGGER lineage_restore
BEFORE INSERT ON lease.lineage
FOR EACH ROW
EXECUTE FUNCTION lease._lineage_restore();";

/// Ends every script: the extension's owner owns every table, domain and
/// function of the extension (see the module documentation).
const REASSIGN_TO_EXTENSION_OWNER: &str =
    "-- Extension only (generated): the role that owns the extension owns its
-- tables, domains and functions, as the installing role owns them with the
-- migrations. A trusted extension's script runs as the bootstrap superuser,
-- whose SECURITY DEFINER functions in a schema the installing role owns
-- would let that role run code as the superuser. Ownership moves with the
-- privileges: REVOKE ALL ... FROM PUBLIC stays as the migrations leave it,
-- and the initial privileges pg_dump compares against name the new owner.
DO $$
DECLARE
    v_extension oid;
    v_owner oid;
    v_object record;
BEGIN
    SELECT e.oid, e.extowner INTO v_extension, v_owner
      FROM pg_catalog.pg_extension AS e
     WHERE e.extname OPERATOR(pg_catalog.=) 'leasehold';
    FOR v_object IN
        SELECT 'FUNCTION' AS kind, p.oid::pg_catalog.regprocedure::pg_catalog.text AS name
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_proc AS p ON p.oid OPERATOR(pg_catalog.=) d.objid
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) v_extension
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND p.proowner OPERATOR(pg_catalog.<>) v_owner
        UNION ALL
        SELECT 'TABLE', c.oid::pg_catalog.regclass::pg_catalog.text
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) d.objid
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) v_extension
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND (c.relkind OPERATOR(pg_catalog.=) 'r' OR c.relkind OPERATOR(pg_catalog.=) 'v')
           AND c.relowner OPERATOR(pg_catalog.<>) v_owner
        UNION ALL
        SELECT 'DOMAIN', t.oid::pg_catalog.regtype::pg_catalog.text
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_type AS t ON t.oid OPERATOR(pg_catalog.=) d.objid
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) v_extension
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND t.typtype OPERATOR(pg_catalog.=) 'd'
           AND t.typowner OPERATOR(pg_catalog.<>) v_owner
    LOOP
        EXECUTE pg_catalog.format('ALTER %s %s OWNER TO %I', v_object.kind, v_object.name,
                                  pg_catalog.pg_get_userbyid(v_owner));
        -- Records the object's privileges again, now under its new owner, as
        -- its initial privileges (pg_init_privs): ALTER ... OWNER does not
        -- update them before PostgreSQL 17, and pg_dump compares against
        -- them, so a dump would otherwise GRANT ALL to the owner. Revoking a
        -- grant option PUBLIC cannot hold changes nothing else.
        EXECUTE pg_catalog.format('REVOKE GRANT OPTION FOR ALL ON %s %s FROM PUBLIC', v_object.kind, v_object.name);
    END LOOP;
END
$$;";

/// The function that runs a script's owner statements (see the module
/// documentation). Created, handed to the owner, called and dropped by the
/// same script, inside the script's own transaction, so no other session
/// ever sees it.
const OWNER_STEP: &str = "lease._extension_step_as_owner()";

/// The dollar-quote tags around the owner part's body and each statement;
/// a statement that contains either is refused by the generator.
const OWNER_STEP_TAG: &str = "$extension_step$";
const OWNER_STATEMENT_TAG: &str = "$owner_statement$";

/// Leading words of the statements that run as the owner: they read or
/// write leasehold's tables, call its functions, or change a table or
/// domain in a way that evaluates its defaults, CHECKs, index expressions
/// or triggers.
const OWNER_STATEMENTS: &[&str] = &[
    "INSERT",
    "UPDATE",
    "DELETE",
    "MERGE",
    "SELECT",
    "WITH",
    "VALUES",
    "TABLE",
    "TRUNCATE",
    "COPY",
    "CALL",
    "ALTER TABLE",
    "ALTER DOMAIN",
    "CREATE INDEX",
    "CREATE UNIQUE INDEX",
    "REINDEX",
    "CLUSTER",
    "ANALYZE",
    "REFRESH",
];

/// Leading words of the statements that stay with the superuser: they
/// evaluate nothing an owner could have changed. A `CREATE TABLE` must
/// define its columns (not `AS` a query), and a `DO` block may not call a
/// `lease.` function. Anything in neither list is refused by the
/// generator until someone decides where it runs.
const SUPERUSER_STATEMENTS: &[&str] = &[
    "SET",
    "DO",
    "CREATE FUNCTION",
    "CREATE TABLE",
    "CREATE DOMAIN",
    "CREATE TYPE",
    "CREATE TRIGGER",
    "GRANT",
    "REVOKE",
    "COMMENT",
    "ALTER FUNCTION",
    "CREATE OR REPLACE FUNCTION",
    "DROP FUNCTION",
];

/// Who runs a migration's statement in the extension's scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunsAs {
    /// The superuser running the script.
    Superuser,
    /// The extension's owner, in the script's owner part.
    Owner,
}

/// Where `statement` runs, or why it may not be generated.
fn runs_as(statement: &str) -> Result<RunsAs, String> {
    let upper = statement.to_ascii_uppercase();
    let words: Vec<&str> = upper.split_ascii_whitespace().collect();
    let starts_with = |list: &[&str]| {
        list.iter().any(|lead| {
            let lead: Vec<&str> = lead.split(' ').collect();
            words.len() >= lead.len()
                && words
                    .iter()
                    .zip(&lead)
                    .all(|(word, lead)| word == lead || word.starts_with(&format!("{lead}(")))
        })
    };
    if starts_with(OWNER_STATEMENTS) {
        return Ok(RunsAs::Owner);
    }
    if !starts_with(SUPERUSER_STATEMENTS) {
        return Err(format!(
            "every statement in a list of the generator; add {:?} to OWNER_STATEMENTS or SUPERUSER_STATEMENTS after deciding whether it can evaluate the owner's code",
            words.iter().take(3).copied().collect::<Vec<_>>().join(" ")
        ));
    }
    if words.first() == Some(&"DO") && calls_a_lease_function(statement) {
        return Err(
            "no DO block that calls a lease. function (it would run the owner's code as the superuser); write it as a SELECT, which runs as the owner"
                .to_owned(),
        );
    }
    if words.starts_with(&["CREATE", "TABLE"])
        && !words.get(2).is_some_and(|name| {
            name.contains('(') || words.get(3).is_some_and(|w| w.starts_with('('))
        })
    {
        return Err("CREATE TABLE with its columns (not AS a query)".to_owned());
    }
    Ok(RunsAs::Superuser)
}

/// The owner part that ends a script whose migration has owner statements.
fn owner_part(statements: &[String]) -> String {
    let mut body = String::new();
    for statement in statements {
        let _ = writeln!(
            body,
            "    EXECUTE {OWNER_STATEMENT_TAG}{statement}{OWNER_STATEMENT_TAG};"
        );
    }
    format!(
        "-- Extension only (generated): this migration's statements that read or
-- write leasehold's tables, call its functions or alter a table run here,
-- as the extension's owner. The script itself runs as the bootstrap
-- superuser, and the owner may have replaced any function body or put a
-- trigger, default, CHECK, index expression, policy or rule on any table;
-- run as the owner, that code has no more rights than the role that wrote
-- it. The function below exists only inside this script's transaction.
CREATE FUNCTION {OWNER_STEP}
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS {OWNER_STEP_TAG}
BEGIN
{body}END
{OWNER_STEP_TAG};
DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION {OWNER_STEP} OWNER TO %I',
        (SELECT pg_catalog.pg_get_userbyid(e.extowner) FROM pg_catalog.pg_extension AS e
          WHERE e.extname OPERATOR(pg_catalog.=) 'leasehold'));
END
$$;
SELECT {OWNER_STEP};
DROP FUNCTION {OWNER_STEP};
"
    )
}

/// Whether a DO block calls a function of schema `lease` (`lease.name(`),
/// which would run the owner's code as the superuser.
fn calls_a_lease_function(statement: &str) -> bool {
    let lower = statement.to_ascii_lowercase();
    lower.match_indices("lease.").any(|(at, _)| {
        let before_ok = lower[..at]
            .chars()
            .next_back()
            .is_none_or(|ch| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '.'));
        let name: String = lower[at + "lease.".len()..]
            .chars()
            .take_while(|ch| ch.is_ascii_alphanumeric() || *ch == '_')
            .collect();
        let after = lower[at + "lease.".len() + name.len()..].trim_start();
        before_ok && !name.is_empty() && after.starts_with('(')
    })
}

/// One source's statements: those that stay with the superuser, in the
/// source's order (with the extension's own additions), and those that run
/// as the owner.
fn split_source(source: &Source<'_>) -> Result<(String, Vec<String>), LeaseError> {
    let unexpected = |expected: String| LeaseError::EmbeddedSql {
        reason: format!("{}: expected {expected}", source.path),
    };
    let up = source.sql;
    let mut body = up.to_owned();
    if source.first {
        let create = "CREATE SCHEMA IF NOT EXISTS lease;\n";
        if !body.contains(create) {
            return Err(unexpected(format!("the statement {create:?}")));
        }
        body = body.replacen(create, "", 1);
        let Some(check) = schema_owner_check().map(|check| format!("{check};")) else {
            return Err(unexpected("the schema-ownership check".to_owned()));
        };
        if !body.contains(&check) {
            return Err(unexpected("the schema-ownership check".to_owned()));
        }
        body = body.replacen(
            &check,
            &format!("{EXTENSION_SCHEMA_OWNER_CHECK}\n{EXTENSION_SCHEMA_EMPTY_CHECK}"),
            1,
        );
    }
    // The statements that stay with the superuser, in the source's order;
    // the owner's are collected for the owner part.
    let mut kept = String::new();
    let mut as_owner = Vec::new();
    for statement in statements(&body) {
        kept.push_str(statement.preamble);
        let text = statement.text;
        if text.is_empty() {
            continue;
        }
        let upper = text.to_ascii_uppercase();
        if matches!(
            upper.trim(),
            "BEGIN" | "COMMIT" | "ROLLBACK" | "START TRANSACTION"
        ) {
            return Err(unexpected(format!(
                "no transaction control, found {text:?}"
            )));
        }
        match runs_as(text).map_err(&unexpected)? {
            RunsAs::Superuser => {
                kept.push_str(text);
                kept.push(';');
            }
            RunsAs::Owner => {
                if text.contains(OWNER_STEP_TAG) || text.contains(OWNER_STATEMENT_TAG) {
                    return Err(unexpected(format!(
                        "no {OWNER_STEP_TAG} or {OWNER_STATEMENT_TAG} in a statement"
                    )));
                }
                let first_line = text.lines().next().unwrap_or(text);
                let _ = write!(
                    kept,
                    "-- (runs as the extension's owner, at the end of this script)\n-- {first_line} ..."
                );
                as_owner.push(text.to_owned());
            }
        }
    }
    let mut out = String::new();
    let mut dumped = Vec::new();
    for line in kept.lines() {
        let statement = line.trim();
        out.push_str(line);
        out.push('\n');
        if let Some(table) = statement
            .strip_prefix("REVOKE ALL ON TABLE lease.")
            .and_then(|rest| rest.strip_suffix(" FROM PUBLIC;"))
        {
            if !NOT_DUMPED.contains(&table) {
                let _ = writeln!(
                    out,
                    "SELECT pg_catalog.pg_extension_config_dump('lease.{table}', '');"
                );
                dumped.push(table.to_owned());
                if table == "lineage" {
                    out.push_str(LINEAGE_RESTORE);
                    out.push('\n');
                }
            }
        }
    }
    for line in up.lines() {
        if let Some(rest) = line.trim().strip_prefix("CREATE TABLE lease.") {
            let table = rest.split([' ', '(']).next().unwrap_or(rest);
            if !NOT_DUMPED.contains(&table) && !dumped.iter().any(|t| t == table) {
                return Err(unexpected(format!(
                    "\"REVOKE ALL ON TABLE lease.{table} FROM PUBLIC;\" on a line of its own"
                )));
            }
        }
    }
    Ok((out, as_owner))
}

/// A script of `sources`, in order: an install script (`install`: it opens
/// by refusing a migrations install) or an update script.
fn script(sources: &[Source<'_>], install: bool) -> Result<String, LeaseError> {
    let mut script = String::new();
    let _ = writeln!(
        script,
        "-- Generated by `leasehold extension generate` from {}; do not edit.",
        sources
            .iter()
            .map(|source| source.path.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    script.push_str("\\echo Use \"CREATE EXTENSION leasehold\" to load this file. \\quit\n\n");
    if install {
        script.push_str(REFUSE_MIGRATIONS_INSTALL);
        script.push_str("\n\n");
    }
    let mut as_owner = Vec::new();
    for source in sources {
        let (kept, owner) = split_source(source)?;
        let _ = writeln!(script, "-- From {}:", source.path);
        script.push_str(&kept);
        script.push('\n');
        as_owner.extend(owner);
    }
    script.push_str(REASSIGN_TO_EXTENSION_OWNER);
    script.push('\n');
    if !as_owner.is_empty() {
        script.push('\n');
        script.push_str(&owner_part(&as_owner));
    }
    Ok(script)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_an_install_script_and_one_update_script_per_earlier_version() {
        let files = extension_files().expect("generate");
        let version = extension_version();
        assert_eq!(files.len(), 2 + EXTENSION_UPGRADES_FROM.len());
        assert_eq!(files[0].name, "leasehold.control");
        assert!(files[0]
            .contents
            .contains(&format!("default_version = '{version}'")));
        assert_eq!(files[1].name, format!("leasehold--{version}.sql"));
        assert_eq!(
            files[2].name,
            format!("leasehold--20261201000008--{version}.sql")
        );
        let install = &files[1].contents;
        assert!(install.contains("pg_extension_config_dump('lease.lineage'"));
        assert!(!install.contains("config_dump('lease.waiters'"));
        assert!(!install.contains("CREATE SCHEMA"));
        assert!(install.contains("lease_installed_by_migrations"));
        // Every function of every file, once, in the install script and in
        // the update script; the update creates no table.
        let update = &files[2].contents;
        for (_, sql) in FUNCTION_SQL {
            for line in sql
                .lines()
                .filter(|l| l.starts_with("CREATE OR REPLACE FUNCTION"))
            {
                assert_eq!(install.matches(line).count(), 1, "{line}");
                assert_eq!(update.matches(line).count(), 1, "{line}");
            }
        }
        assert!(!update.contains("CREATE TABLE"));
        assert!(!update.contains("lease_installed_by_migrations"));
        assert!(update.contains("REVOKE GRANT OPTION FOR ALL"));
    }

    /// Every data change and every call of a lease function runs inside the
    /// owner part; none is left with the superuser.
    #[test]
    fn data_changes_and_lease_calls_run_only_in_the_owner_part() {
        for file in extension_files().expect("generate").iter().skip(1) {
            let (superuser, owner) = file
                .contents
                .split_once("CREATE FUNCTION lease._extension_step_as_owner()")
                .unwrap_or_else(|| panic!("{}: no owner part", file.name));
            for statement in statements(superuser) {
                let text = statement.text;
                assert!(
                    !text.starts_with("INSERT") && !text.starts_with("SELECT lease."),
                    "{}: runs as the superuser: {text}",
                    file.name
                );
            }
            assert!(owner.contains("SELECT lease._drop_default_grants()"));
        }
        let install = &extension_files().expect("generate")[1].contents;
        let owner = install.split_once("_extension_step_as_owner()").unwrap().1;
        assert!(owner.contains("INSERT INTO lease.lineage"));
    }

    #[test]
    fn statements_split_outside_quotes_and_comments() {
        let sql = "-- a; comment\nSELECT 'x;y', \"a;b\";\nDO $$ BEGIN PERFORM 1; END $$;\n/* c; */ CREATE TABLE t (a int);\n-- tail";
        let texts: Vec<&str> = statements(sql).iter().map(|s| s.text).collect();
        assert_eq!(
            texts,
            [
                "SELECT 'x;y', \"a;b\"",
                "DO $$ BEGIN PERFORM 1; END $$",
                "CREATE TABLE t (a int)",
                ""
            ]
        );
    }

    #[test]
    fn every_statement_is_placed_or_refused() {
        assert_eq!(runs_as("INSERT INTO lease.x VALUES (1)"), Ok(RunsAs::Owner));
        assert_eq!(
            runs_as("ALTER TABLE lease.x ADD COLUMN y int"),
            Ok(RunsAs::Owner)
        );
        assert_eq!(runs_as("CREATE INDEX i ON lease.x (y)"), Ok(RunsAs::Owner));
        assert_eq!(runs_as("SELECT lease.f()"), Ok(RunsAs::Owner));
        assert_eq!(
            runs_as("CREATE FUNCTION lease.f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$"),
            Ok(RunsAs::Superuser)
        );
        assert_eq!(
            runs_as("CREATE TABLE lease.t (a int)"),
            Ok(RunsAs::Superuser)
        );
        assert_eq!(
            runs_as("REVOKE ALL ON TABLE lease.t FROM PUBLIC"),
            Ok(RunsAs::Superuser)
        );
        assert_eq!(
            runs_as("DO $$ BEGIN EXECUTE 'REVOKE ALL ON SCHEMA lease FROM PUBLIC'; END $$"),
            Ok(RunsAs::Superuser)
        );
        assert!(runs_as("DO $$ BEGIN PERFORM lease._drop_default_grants(); END $$").is_err());
        assert!(runs_as("CREATE TABLE lease.t AS SELECT lease.f()").is_err());
        assert!(runs_as("CREATE MATERIALIZED VIEW lease.v AS SELECT 1").is_err());
        assert!(runs_as("VACUUM lease.t").is_err());
    }
}
