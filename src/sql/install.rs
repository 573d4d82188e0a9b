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

/// Migration 1's `lease_unsupported_version` check, which `install` runs
/// before anything else: the server must be PostgreSQL 14 or newer.
pub(crate) fn version_check() -> Option<&'static str> {
    crate::sql_files::migration_1_check(super::names::UNSUPPORTED_VERSION)
}

/// The statement of `sql/install_checks.sql` that raises `constraint`:
/// the checks only the installer runs.
pub(crate) fn install_check(constraint: &str) -> Option<&'static str> {
    let needle = format!("CONSTRAINT = '{constraint}'");
    crate::sql_files::statements(include_str!("../../sql/install_checks.sql"))
        .into_iter()
        .map(|statement| statement.text)
        .find(|text| text.contains(&needle))
}

/// The schema the migrations install into.
pub(crate) const CREATE_SCHEMA: &str = "CREATE SCHEMA IF NOT EXISTS lease";

/// Migration 1's `lease_schema_not_owned` statement, run by `install` before its
/// bookkeeping and after `CREATE SCHEMA`, so a concurrently created schema is judged too.
pub(crate) fn schema_owner_check() -> Option<&'static str> {
    crate::sql_files::migration_1_check(super::names::SCHEMA_NOT_OWNED)
}

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
