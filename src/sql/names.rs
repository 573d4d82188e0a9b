//! Names the SQL functions raise and return, shared by the SQL
//! (`migrations/`, `sql/functions/`) and this crate. Changing one here
//! means changing it in the SQL too.

/// `CONSTRAINT` name of invalid-input errors (SQLSTATE 22023).
pub(crate) const INVALID_INPUT: &str = "lease_invalid_input";
/// `CONSTRAINT` name of blocking-acquire timeouts (SQLSTATE 57014).
pub(crate) const WAIT_TIMEOUT: &str = "lease_wait_timeout";
/// `CONSTRAINT` name of a refused stale epoch (SQLSTATE 55000).
pub(crate) const GUARD_STALE: &str = "lease_guard_stale_epoch";
/// `CONSTRAINT` name of a token of the wrong lease key (SQLSTATE 22023).
pub(crate) const GUARD_WRONG_KEY: &str = "lease_guard_wrong_key";
/// `CONSTRAINT` name of an epoch above the key's counter, never granted
/// (SQLSTATE 22023).
pub(crate) const GUARD_EPOCH_NOT_GRANTED: &str = "lease_guard_epoch_not_granted";
/// `CONSTRAINT` name of a lease-checked write whose lease is not held (55000).
pub(crate) const GUARD_NOT_HELD: &str = "lease_guard_lease_not_held";

/// `CONSTRAINT` name of a write to a fenced table in a transaction that
/// presented no token of its key (SQLSTATE 55000; DETAIL `table=<table>
/// key=<key>`).
pub(crate) const FENCE_NO_TOKEN: &str = "lease_fence_no_token";
/// `CONSTRAINT` name of a write to a row-fenced table of a row with a NULL
/// key column (SQLSTATE 55000; DETAIL `table=<table>`).
pub(crate) const FENCE_NULL_KEY: &str = "lease_fence_null_key";
/// `CONSTRAINT` name of a TRUNCATE of a row-fenced table (SQLSTATE 55000;
/// DETAIL `table=<table>`).
pub(crate) const FENCE_TRUNCATE: &str = "lease_fence_truncate";
/// `CONSTRAINT` name of a change of a table's fence by a role that does not
/// own it (SQLSTATE 42501; DETAIL `table=<table>`).
pub(crate) const TABLE_NOT_OWNED: &str = "lease_table_not_owned";
/// `CONSTRAINT` name of a fence asked for a table that cannot carry one: a
/// partitioned table, a partition, an inheritance parent or child, not a
/// table (SQLSTATE 22023; DETAIL `table=<table>`).
pub(crate) const TABLE_NOT_FENCEABLE: &str = "lease_table_not_fenceable";

/// `CONSTRAINT` name of a call refused because an operator bound the key's
/// or resource's prefix to a role the caller is not a member of (SQLSTATE
/// 42501; DETAIL `<argument>=<name> role=<session user>`).
pub(crate) const NAMESPACE_DENIED: &str = "lease_namespace_denied";

/// `CONSTRAINT` name of an install refused because schema `lease` exists
/// and another role owns it (SQLSTATE 42501).
pub(crate) const SCHEMA_NOT_OWNED: &str = "lease_schema_not_owned";

/// `CONSTRAINT` name of an install refused because another role can put
/// code into schema `lease` (SQLSTATE 42501; DETAIL `what=<object and role>`).
pub(crate) const SCHEMA_NOT_PRIVATE: &str = "lease_schema_not_private";

/// `CONSTRAINT` name of an install refused because the server is older than
/// PostgreSQL 14 (SQLSTATE 0A000; DETAIL
/// `minimum=14 server_version=<server_version>`).
pub(crate) const UNSUPPORTED_VERSION: &str = "lease_unsupported_version";

/// `CONSTRAINT` name of a waiter registration beyond the session's cap
/// (SQLSTATE 22023).
pub(crate) const WAITER_LIMIT: &str = "lease_waiter_limit";

/// `CONSTRAINT` name of a `lease.raise_generation` to a generation at or
/// below the current one (SQLSTATE 22023; DETAIL `current=<generation>
/// requested=<generation>`).
pub(crate) const GENERATION_NOT_ABOVE: &str = "lease_generation_not_above";

/// The channel `lease.release` notifies waiters on (payload: the hex
/// SHA-256 digest of the released key).
pub(crate) const RELEASE_CHANNEL: &str = "lease_released";

/// `CONSTRAINT` name of a call that could not settle a key's state in its
/// fixed number of steps because it changed under the call twice (SQLSTATE
/// 40001; retry the call).
pub(crate) const CONTENTION: &str = "lease_contention";

/// `CONSTRAINT` name of a call whose transaction's snapshot predates a
/// change of the namespace rules, under REPEATABLE READ or SERIALIZABLE
/// (SQLSTATE 40001; retry the transaction).
pub(crate) const NAMESPACE_CHANGED: &str = "lease_namespace_changed";

/// `CONSTRAINT` name of a `CREATE EXTENSION leasehold` refused because the
/// migrations installed leasehold in the database already (SQLSTATE 55000;
/// raised by the extension's first script, src/admin/extension.rs). Nothing in
/// this crate maps it: `CREATE EXTENSION` is a statement users run.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const INSTALLED_BY_MIGRATIONS: &str = "lease_installed_by_migrations";

/// `CONSTRAINT` name of a `CREATE EXTENSION leasehold` refused because
/// schema `lease` already holds objects (SQLSTATE 42P07; DETAIL
/// `object=<object>`). Raised by the extension's first script only, so
/// nothing in this crate maps it.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const SCHEMA_NOT_EMPTY: &str = "lease_schema_not_empty";

/// `CONSTRAINT` name of an install refused because the installing role may
/// not create schema `lease` (SQLSTATE 42501; DETAIL `role=<role>
/// database=<database>`).
pub(crate) const INSTALL_NOT_PERMITTED: &str = "lease_install_not_permitted";

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// Every `CONSTRAINT` name the SQL raises: the migrations', the files
    /// of functions' (through the extension scripts, which hold them), the
    /// extension scripts' own and the installer's `RAISE ... USING CONSTRAINT =
    /// '...'`.
    fn raised() -> BTreeSet<String> {
        let root = env!("CARGO_MANIFEST_DIR");
        let mut texts =
            vec![std::fs::read_to_string(format!("{root}/src/sql/install.rs")).unwrap_or_default()];
        for (_, up, _) in crate::sql_files::MIGRATION_SQL {
            texts.push((*up).to_owned());
        }
        // The extension scripts as generated, with the statements the
        // generator adds.
        for file in crate::admin::extension_files().unwrap_or_default() {
            texts.push(file.contents);
        }
        let mut names = BTreeSet::new();
        for text in texts {
            for piece in text.split("CONSTRAINT = '").skip(1) {
                if let Some(name) = piece.split('\'').next() {
                    names.insert(name.to_owned());
                }
            }
        }
        names
    }

    /// The names this module knows are exactly the names the SQL raises.
    #[test]
    fn every_raised_constraint_name_is_named_here() {
        assert_eq!(known(), raised());
        assert!(
            raised().len() >= 10,
            "the scan found too few: {:?}",
            raised()
        );
    }

    /// The specification's table of error names (§1.4) lists exactly the
    /// names the SQL raises, so a user reading it meets every one.
    #[test]
    fn the_specification_lists_every_constraint_name() {
        let spec = include_str!("../../docs/SPECIFICATION.md");
        let listed: BTreeSet<String> = spec
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix("| `lease_"))
            .filter_map(|rest| rest.split('`').next())
            .map(|name| format!("lease_{name}"))
            .collect();
        assert_eq!(listed, known());
    }

    fn known() -> BTreeSet<String> {
        [
            super::INVALID_INPUT,
            super::WAIT_TIMEOUT,
            super::GUARD_STALE,
            super::GUARD_WRONG_KEY,
            super::GUARD_EPOCH_NOT_GRANTED,
            super::GUARD_NOT_HELD,
            super::NAMESPACE_DENIED,
            super::SCHEMA_NOT_OWNED,
            super::SCHEMA_NOT_PRIVATE,
            super::UNSUPPORTED_VERSION,
            super::WAITER_LIMIT,
            super::GENERATION_NOT_ABOVE,
            super::CONTENTION,
            super::NAMESPACE_CHANGED,
            super::INSTALLED_BY_MIGRATIONS,
            super::SCHEMA_NOT_EMPTY,
            super::INSTALL_NOT_PERMITTED,
        ]
        .into_iter()
        .map(str::to_owned)
        .collect()
    }
}
