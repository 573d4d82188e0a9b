//! The installer's one-line statements: its lock and its bookkeeping
//! (`lease.schema_migrations`). Its checks are SQL files, picked through
//! `sql_files` by the constraint they raise.

/// The install transaction's lock_timeout, as every migration sets: a blocked
/// install fails instead of queueing and holding up lease calls behind it.
pub(crate) const SET_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '5s'";

/// How long an install waits for a lock before `ErrorKind::TimedOut`.
pub const INSTALL_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serialises installers of one database; the key is "leasehld" in ASCII.
pub(crate) const LOCK: &str = "SELECT pg_catalog.pg_advisory_xact_lock(7810756276994468964)";

/// The schema the migrations install into: migration 1's own statement,
/// which the extension generator leaves out (the extension creates it).
pub(crate) const CREATE_SCHEMA: &str = "CREATE SCHEMA IF NOT EXISTS lease";

/// Records one applied step: `$1` version, `$2` name.
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

/// Deletes from `table` the versions of the functions step that `current`
/// replaced, so the record names what is installed and Diesel's
/// `revert_all_migrations` finds every recorded version in the source.
pub(crate) fn forget_replaced_functions(table: &str, current: &str) -> String {
    format!("DELETE FROM {table} WHERE version ~ '^[0-9]{{14}}[.][0-9a-f]{{12}}$' AND version <> '{current}'")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::names::{SCHEMA_NOT_OWNED, UNSUPPORTED_VERSION};
    use crate::sql_files::{check, statements, MIGRATION_1};

    /// Migration 1 opens with the install's lock bound (every migration and
    /// file of functions sets it: tests/leasehold/sql_rules.rs) and the version
    /// check (PostgreSQL 14), so Diesel's runner refuses an old server before
    /// anything too, then creates and judges the schema as `install` does.
    #[test]
    fn migration_1_opens_as_install_does() {
        let secs = INSTALL_LOCK_TIMEOUT.as_secs();
        assert_eq!(
            SET_LOCK_TIMEOUT,
            format!("SET LOCAL lock_timeout = '{secs}s'")
        );
        assert!(LOCK.ends_with(&format!("({})", i64::from_be_bytes(*b"leasehld"))));
        let version = check(MIGRATION_1, UNSUPPORTED_VERSION).expect("the version check");
        let owner = check(MIGRATION_1, SCHEMA_NOT_OWNED).expect("the schema-owner check");
        for (check, needle) in [
            (version, "OPERATOR(pg_catalog.<) 140000 THEN"),
            (version, "'minimum=14 server_version='"),
            (owner, "n.nspowner OPERATOR(pg_catalog.<>) v_installer"),
        ] {
            assert!(check.contains(needle), "{check}");
        }
        let texts: Vec<&str> = statements(MIGRATION_1).iter().map(|s| s.text).collect();
        let expected = [SET_LOCK_TIMEOUT, version, CREATE_SCHEMA, owner];
        assert_eq!(texts[..4], expected);
    }
}
