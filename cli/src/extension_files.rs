//! Packaging the migrations as a PostgreSQL extension: `CREATE EXTENSION
//! leasehold` installs what `leasehold::install` installs, from the same SQL.
//! A build-time job, so it lives in the command, not in the library.
//!
//! [`extension_files`] generates the control file and one script per
//! migration from the files under `migrations/` (compiled into the library,
//! which hands their text over):
//! `leasehold--<v1>.sql` installs the first migration, and
//! `leasehold--<vN-1>--<vN>.sql` applies migration N, so `CREATE EXTENSION`
//! (PostgreSQL chains the steps up to `default_version`) and `ALTER
//! EXTENSION leasehold UPDATE` run exactly the migrations' statements in the
//! migrations' order. Versions are the migration versions
//! `leasehold::admin::installed_versions` reports (`20261201000001`, ...). The
//! command `leasehold extension generate --out DIR` writes them; the copies
//! committed under `extension/` are checked against this generator by a
//! test and are never edited by hand.
//!
//! What the generator changes in the migrations' SQL, and why:
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

use leasehold::__private::extension_inputs::{MIGRATION_SQL, SCHEMA_OWNER_CHECK};

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

/// Why the extension files could not be generated from the migrations: a
/// migration no longer has a shape the generator relies on. Fixed in the
/// generator, never by editing the generated files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExtensionError {
    /// A migration lacks a statement the generator rewrites.
    #[error("migration {migration}: expected {expected}")]
    Unexpected {
        /// The migration's directory name.
        migration: String,
        /// What was missing or not allowed.
        expected: String,
    },
}

/// The version of a migration directory `YYYY-MM-DD-NNNNNN_<what>`: its
/// digits, as `leasehold::admin::installed_versions` reports it.
fn version_of(dir: &str) -> String {
    dir.split('_')
        .next()
        .unwrap_or(dir)
        .chars()
        .filter(char::is_ascii_digit)
        .collect()
}

/// The extension version every `CREATE EXTENSION leasehold` installs: the
/// newest migration's version.
pub fn extension_version() -> String {
    MIGRATION_SQL
        .last()
        .map(|(dir, _)| version_of(dir))
        .unwrap_or_default()
}

/// Generates the control file and the scripts, in a stable order (control
/// file first, then the scripts oldest first).
pub fn extension_files() -> Result<Vec<ExtensionFile>, ExtensionError> {
    let mut files = vec![ExtensionFile {
        name: format!("{EXTENSION_NAME}.control"),
        contents: control_file(),
    }];
    let mut previous: Option<String> = None;
    for (index, (dir, up)) in MIGRATION_SQL.iter().enumerate() {
        let version = version_of(dir);
        let name = match &previous {
            None => format!("{EXTENSION_NAME}--{version}.sql"),
            Some(from) => format!("{EXTENSION_NAME}--{from}--{version}.sql"),
        };
        files.push(ExtensionFile {
            name,
            contents: script(dir, up, index == 0)?,
        });
        previous = Some(version);
    }
    Ok(files)
}

fn control_file() -> String {
    format!(
        "# Generated by `leasehold extension generate` from migrations/; do not edit.\n\
         comment = 'PostgreSQL-native leases with monotonic fencing epochs, and guards that reject writes from superseded holders'\n\
         default_version = '{}'\n\
         schema = lease\n\
         relocatable = false\n\
         superuser = true\n\
         trusted = true\n\
         requires = 'plpgsql'\n",
        extension_version()
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

fn script(dir: &str, up: &str, first: bool) -> Result<String, ExtensionError> {
    let unexpected = |expected: String| ExtensionError::Unexpected {
        migration: dir.to_owned(),
        expected,
    };
    let mut body = up.to_owned();
    if first {
        let create = "CREATE SCHEMA IF NOT EXISTS lease;\n";
        if !body.contains(create) {
            return Err(unexpected(format!("the statement {create:?}")));
        }
        body = body.replacen(create, "", 1);
        let check = format!("{};", SCHEMA_OWNER_CHECK);
        if !body.contains(&check) {
            return Err(unexpected("the schema-ownership check".to_owned()));
        }
        body = body.replacen(&check, EXTENSION_SCHEMA_OWNER_CHECK, 1);
    }
    let mut out = String::new();
    let mut dumped = Vec::new();
    for line in body.lines() {
        let statement = line.trim();
        let upper = statement.to_ascii_uppercase();
        if matches!(
            upper.trim_end_matches(';').trim(),
            "BEGIN" | "COMMIT" | "ROLLBACK" | "START TRANSACTION"
        ) && statement.ends_with(';')
        {
            return Err(unexpected(format!(
                "no transaction control, found {statement:?}"
            )));
        }
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
    let mut script = String::new();
    let _ = writeln!(
        script,
        "-- Generated by `leasehold extension generate` from migrations/{dir}/up.sql; do not edit."
    );
    script.push_str("\\echo Use \"CREATE EXTENSION leasehold\" to load this file. \\quit\n\n");
    if first {
        script.push_str(REFUSE_MIGRATIONS_INSTALL);
        script.push_str("\n\n");
    }
    script.push_str(&out);
    script.push('\n');
    script.push_str(REASSIGN_TO_EXTENSION_OWNER);
    script.push('\n');
    Ok(script)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_one_script_per_migration() {
        let files = extension_files().expect("generate");
        assert_eq!(files.len(), MIGRATION_SQL.len() + 1);
        assert_eq!(files[1].name, "leasehold--20261201000001.sql");
        assert_eq!(
            files[2].name,
            "leasehold--20261201000001--20261201000002.sql"
        );
        assert!(files[1]
            .contents
            .contains("pg_extension_config_dump('lease.lineage'"));
        assert!(!files[3].contents.contains("config_dump('lease.waiters'"));
        assert!(!files[1].contents.contains("CREATE SCHEMA"));
    }
}
