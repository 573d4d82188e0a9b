//! The installer's statements: its lock, bookkeeping (`lease.schema_migrations`)
//! and the checks it shares with migration 1.

/// The install transaction's lock_timeout, as every migration sets: a blocked
/// install fails instead of queueing and holding up lease calls behind it.
pub(crate) const SET_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '5s'";

/// How long an install waits for a lock before `ErrorKind::TimedOut`.
pub const INSTALL_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serialises installers of one database (`$1`: the lock key).
pub(crate) const LOCK: &str = "SELECT pg_catalog.pg_advisory_xact_lock($1)";

/// The oldest major version installed into (`140000`, `minimum=14` in the SQL).
#[cfg(test)]
pub(crate) const MINIMUM_MAJOR: u32 = 14;

/// Refuses a server older than `MINIMUM_MAJOR` (constraint `lease_unsupported_version`).
/// Migration 1 opens with the same block, so Diesel's runner refuses too: keep them equal.
pub(crate) const VERSION_CHECK: &str = "DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog.<) 140000 THEN
        RAISE EXCEPTION 'leasehold needs PostgreSQL 14 or newer; this server is PostgreSQL %', pg_catalog.current_setting('server_version')
            USING ERRCODE = '0A000',
                  CONSTRAINT = 'lease_unsupported_version',
                  DETAIL = 'minimum=14 server_version=' OPERATOR(pg_catalog.||) pg_catalog.current_setting('server_version'),
                  HINT = 'Upgrade the server to PostgreSQL 14 or newer; nothing was installed.';
    END IF;
END
$$";

/// Refuses a role that may not create schema `lease` (`lease_install_not_permitted`).
pub(crate) const CREATE_PERMITTED_CHECK: &str = "DO $$
BEGIN
    IF pg_catalog.to_regnamespace('lease') IS NULL
       AND NOT pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE') THEN
        RAISE EXCEPTION 'role % may not create schema lease in database %', current_user, pg_catalog.current_database()
            USING ERRCODE = '42501',
                  CONSTRAINT = 'lease_install_not_permitted',
                  DETAIL = 'role=' OPERATOR(pg_catalog.||) current_user
                           OPERATOR(pg_catalog.||) ' database=' OPERATOR(pg_catalog.||) pg_catalog.current_database(),
                  HINT = 'GRANT CREATE ON DATABASE to the installing role, or install as the database owner; nothing was installed.';
    END IF;
END
$$";

/// The schema the migrations install into.
pub(crate) const CREATE_SCHEMA: &str = "CREATE SCHEMA IF NOT EXISTS lease";

/// Migration 1's `lease_schema_not_owned` statement, run by `install` before its
/// bookkeeping and after `CREATE SCHEMA`, so a concurrently created schema is judged too.
pub(crate) fn schema_owner_check() -> Option<&'static str> {
    crate::sql_files::migration_1_check(super::names::SCHEMA_NOT_OWNED)
}

/// Refuses a schema `lease` another role can put code into (an object, CREATE, or
/// TRIGGER): the migrations would run it as the installer. A schema this
/// transaction created is skipped (`lease_schema_not_private`).
pub(crate) const SCHEMA_PRIVATE_CHECK: &str = "DO $$
DECLARE
    v_schema oid := pg_catalog.to_regnamespace('lease');
    v_me oid := (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) current_user);
    v_what text;
BEGIN
    IF (SELECT n.xmin FROM pg_catalog.pg_namespace AS n WHERE n.oid OPERATOR(pg_catalog.=) v_schema)
       OPERATOR(pg_catalog.=) pg_catalog.xid(pg_catalog.pg_current_xact_id()) THEN
        RETURN;
    END IF;
    SELECT x.what INTO v_what FROM (
        SELECT pg_catalog.format('%s is owned by role %s',
                                 pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid),
                                 pg_catalog.pg_get_userbyid(s.refobjid)) AS what
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_shdepend AS s
            ON s.classid OPERATOR(pg_catalog.=) d.classid AND s.objid OPERATOR(pg_catalog.=) d.objid
           AND s.deptype OPERATOR(pg_catalog.=) 'o'
           AND s.dbid OPERATOR(pg_catalog.=) (SELECT b.oid FROM pg_catalog.pg_database AS b
                                               WHERE b.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
         WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) v_schema
           AND d.deptype OPERATOR(pg_catalog.=) 'n'
           AND s.refobjid OPERATOR(pg_catalog.<>) v_me
        UNION ALL
        SELECT pg_catalog.format('role %s holds CREATE on schema lease',
                                 COALESCE(pg_catalog.pg_get_userbyid(NULLIF(a.grantee, 0)), 'PUBLIC'))
          FROM pg_catalog.pg_namespace AS n, pg_catalog.aclexplode(n.nspacl) AS a
         WHERE n.oid OPERATOR(pg_catalog.=) v_schema
           AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
           AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
        UNION ALL
        SELECT pg_catalog.format('role %s holds TRIGGER on table %s',
                                 COALESCE(pg_catalog.pg_get_userbyid(NULLIF(a.grantee, 0)), 'PUBLIC'),
                                 c.oid::pg_catalog.regclass)
          FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
         WHERE c.relnamespace OPERATOR(pg_catalog.=) v_schema
           AND a.privilege_type OPERATOR(pg_catalog.=) 'TRIGGER'
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    ) AS x
    LIMIT 1;
    IF v_what IS NOT NULL THEN
        RAISE EXCEPTION 'another role can put code into schema lease (%), which the install would run as role %', v_what, current_user
            USING ERRCODE = '42501',
                  CONSTRAINT = 'lease_schema_not_private',
                  DETAIL = 'what=' OPERATOR(pg_catalog.||) v_what,
                  HINT = 'Drop that object or revoke that privilege, or install as the role that owns the schema; nothing was installed.';
    END IF;
END
$$";

/// The bookkeeping table, readable by nobody but its owner.
pub(crate) const CREATE_BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS lease.schema_migrations (
     version      text        PRIMARY KEY,
     name         text        NOT NULL,
     installed_at timestamptz NOT NULL DEFAULT pg_catalog.now()
 );
 REVOKE ALL ON TABLE lease.schema_migrations FROM PUBLIC;";

/// Records one applied migration: `$1` version, `$2` name.
pub(crate) const RECORD_VERSION: &str =
    "INSERT INTO lease.schema_migrations (version, name) VALUES ($1, $2)";

/// Whether the bookkeeping table exists (column `present`).
pub(crate) const BOOKKEEPING_PRESENT: &str =
    "SELECT to_regclass('lease.schema_migrations') IS NOT NULL AS present";

/// Whether `lease.inspect(text)` exists, however installed (column `present`).
pub(crate) const INSTALLED: &str =
    "SELECT to_regprocedure('lease.inspect(text)') IS NOT NULL AS present";

/// The recorded versions (column `version`).
pub(crate) const RECORDED_VERSIONS: &str = "SELECT version FROM lease.schema_migrations";

/// Uninstall: the bookkeeping table, then (after `down.sql`) the emptied schema.
pub(crate) const DROP_BOOKKEEPING: &str = "DROP TABLE lease.schema_migrations";
/// See [`DROP_BOOKKEEPING`].
pub(crate) const DROP_SCHEMA: &str = "DROP SCHEMA IF EXISTS lease RESTRICT";

/// The installed extension's version, if any (column `version`).
pub(crate) const EXTENSION_VERSION: &str =
    "SELECT e.extversion::text AS version FROM pg_catalog.pg_extension AS e WHERE e.extname = 'leasehold'";

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound's three spellings (error, `SET LOCAL`, migrations) agree.
    #[test]
    fn every_statement_of_the_lock_bound_says_the_same_time() {
        let spelled = format!(
            "SET LOCAL lock_timeout = '{}s'",
            INSTALL_LOCK_TIMEOUT.as_secs()
        );
        assert_eq!(SET_LOCK_TIMEOUT, spelled);
        for (name, sql) in crate::sql_files::MIGRATION_SQL
            .iter()
            .map(|(name, up, _)| (name, up))
            .chain(
                crate::sql_files::FUNCTION_SQL
                    .iter()
                    .map(|(name, text)| (name, text)),
            )
        {
            assert!(
                sql.lines().any(|line| line.trim() == format!("{spelled};")),
                "migration {name} does not set the install's lock bound"
            );
        }
    }
}
