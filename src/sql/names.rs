//! Names the SQL functions raise and return; change them here and in the SQL together.

/// `CONSTRAINT` name of invalid-input errors (SQLSTATE 22023).
pub(crate) const INVALID_INPUT: &str = "lease_invalid_input";
/// `CONSTRAINT` name of blocking-acquire timeouts (SQLSTATE 57014).
pub(crate) const WAIT_TIMEOUT: &str = "lease_wait_timeout";
/// `CONSTRAINT` name of a refused stale epoch (SQLSTATE 55000).
pub(crate) const GUARD_STALE: &str = "lease_guard_stale_epoch";
/// `CONSTRAINT` name of a token of the wrong lease key (SQLSTATE 22023).
pub(crate) const GUARD_WRONG_KEY: &str = "lease_guard_wrong_key";
/// `CONSTRAINT` name of an epoch above the key's counter, never granted (22023).
pub(crate) const GUARD_EPOCH_NOT_GRANTED: &str = "lease_guard_epoch_not_granted";
/// `CONSTRAINT` name of a lease-checked write whose lease is not held (55000).
pub(crate) const GUARD_NOT_HELD: &str = "lease_guard_lease_not_held";

/// `CONSTRAINT` name of a write to a fenced table whose transaction presented
/// no token of its key (55000; DETAIL `{"table": …, "key": …}`).
pub(crate) const FENCE_NO_TOKEN: &str = "lease_fence_no_token";
/// `CONSTRAINT` name of a written row with a NULL key column (55000).
pub(crate) const FENCE_NULL_KEY: &str = "lease_fence_null_key";
/// `CONSTRAINT` name of a TRUNCATE of a row-fenced table (55000).
pub(crate) const FENCE_TRUNCATE: &str = "lease_fence_truncate";
/// `CONSTRAINT` name of a change of a table's fence by a non-owner (42501).
pub(crate) const TABLE_NOT_OWNED: &str = "lease_table_not_owned";
/// `CONSTRAINT` name of a fence asked for a table that cannot carry one (22023).
pub(crate) const TABLE_NOT_FENCEABLE: &str = "lease_table_not_fenceable";
/// A table already fenced otherwise: unprotect it first.
pub(crate) const TABLE_ALREADY_FENCED: &str = "lease_table_already_fenced";

/// `CONSTRAINT` name of a namespace refusal (42501; DETAIL `{"<argument>": <name>, "role": <user>}`).
pub(crate) const NAMESPACE_DENIED: &str = "lease_namespace_denied";

/// `CONSTRAINT` name of an install into a schema `lease` another role owns (42501).
pub(crate) const SCHEMA_NOT_OWNED: &str = "lease_schema_not_owned";

/// `CONSTRAINT` name of an install into a schema others can put code into (42501).
pub(crate) const SCHEMA_NOT_PRIVATE: &str = "lease_schema_not_private";

/// `CONSTRAINT` name of an install refused on a server older than 14 (0A000).
pub(crate) const UNSUPPORTED_VERSION: &str = "lease_unsupported_version";

/// `CONSTRAINT` name of a waiter registration beyond the session's cap (22023).
pub(crate) const WAITER_LIMIT: &str = "lease_waiter_limit";

/// `CONSTRAINT` name of `raise_generation` at or below the current one (22023).
pub(crate) const GENERATION_NOT_ABOVE: &str = "lease_generation_not_above";

/// The channel `lease.release` notifies on (payload: the key's hex SHA-256).
pub(crate) const RELEASE_CHANNEL: &str = "lease_released";

/// The channel a grant of a new term notifies on (payload as for releases).
pub(crate) const GRANT_CHANNEL: &str = "lease_granted";

/// `CONSTRAINT` name of a key that changed twice under a call (40001; retry the call).
pub(crate) const CONTENTION: &str = "lease_contention";

/// `CONSTRAINT` name of a snapshot older than a namespace rule change (40001; retry the transaction).
pub(crate) const NAMESPACE_CHANGED: &str = "lease_namespace_changed";

/// `CONSTRAINT` name of `CREATE EXTENSION` over a migrations install (raised by the
/// extension script, sql/extension/checks.sql; never mapped here).
pub(crate) const INSTALLED_BY_MIGRATIONS: &str = "lease_installed_by_migrations";

/// `CONSTRAINT` name of `CREATE EXTENSION` into a non-empty schema `lease` (42P07).
pub(crate) const SCHEMA_NOT_EMPTY: &str = "lease_schema_not_empty";

/// `CONSTRAINT` name of an install by a role that may not create schema `lease` (42501).
pub(crate) const INSTALL_NOT_PERMITTED: &str = "lease_install_not_permitted";

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// Every `CONSTRAINT` name the SQL raises, extension and installer scripts included.
    fn raised() -> BTreeSet<String> {
        let mut texts = vec![include_str!("../../sql/install/checks.sql").to_owned()];
        for (_, up, _) in crate::sql_files::MIGRATION_SQL {
            texts.push((*up).to_owned());
        }
        // The extension scripts as generated, with the generator's statements.
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

    /// The specification's table of error names lists exactly those the SQL raises.
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
