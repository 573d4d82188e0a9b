//! Typed errors, one enum per family of operations.
//!
//! Callers match on meaning, never on message text: the SQL functions put a
//! stable machine-readable name in the error's `CONSTRAINT` field (diesel
//! does not expose SQLSTATE, but it does expose that field), and this module
//! turns those names into variants. Every message says what went wrong and
//! what to do about it.

use std::time::Duration;

use diesel::result::{DatabaseErrorInformation, Error as DieselError};

/// `CONSTRAINT` name carried by invalid-input errors (SQLSTATE 22023).
pub(crate) const INVALID_INPUT: &str = "lease_invalid_input";
/// `CONSTRAINT` name carried by blocking-acquire timeouts (SQLSTATE 57014).
pub(crate) const WAIT_TIMEOUT: &str = "lease_wait_timeout";

/// Errors of the lease operations: acquire, renew, release and inspect.
///
/// A refused acquire, a lapsed lease or an epoch mismatch are *not* errors:
/// they are ordinary outcomes ([`crate::Acquisition::Denied`],
/// [`crate::LostLease`]). These variants are failures of the call itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The arguments broke the lease functions' input rules; nothing changed.
    #[error("invalid lease input: {}; nothing was changed, fix the arguments and call again", .violations.join("; "))]
    InvalidInput {
        /// Every violated rule, e.g. `"key must not be empty"`.
        violations: Vec<String>,
    },
    /// A blocking acquire gave up because another owner held the key for the
    /// whole wait; nothing changed.
    #[error("timed out after waiting {wait:?} for lease {key:?}, which another owner held throughout; retry later, wait longer, or inspect the key")]
    WaitTimedOut {
        /// The key waited for.
        key: String,
        /// The wait bound that passed.
        wait: Duration,
    },
    /// The database failed the call (connection lost, lease functions not
    /// installed, the caller's transaction already aborted, ...). The call's
    /// effect is undone with its transaction.
    #[error("lease {operation} failed in the database: {source}; check the connection and that leasehold::install has run on this database")]
    Database {
        /// `"acquire"`, `"renew"`, `"release"` or `"inspect"`.
        operation: &'static str,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// No connection could be taken from the pool.
    #[error("could not get a database connection from the pool: {0}; check that the database is reachable and the pool is large enough")]
    Pool(#[from] r2d2::Error),
}

impl LeaseError {
    /// Maps a diesel error raised by a lease function to its typed meaning.
    pub(crate) fn from_diesel(
        operation: &'static str,
        error: DieselError,
        key: &str,
        wait: Duration,
    ) -> Self {
        if let DieselError::DatabaseError(_, info) = &error {
            match info.constraint_name() {
                Some(INVALID_INPUT) => {
                    return LeaseError::InvalidInput {
                        violations: split_detail(info.as_ref()),
                    }
                }
                Some(WAIT_TIMEOUT) => {
                    return LeaseError::WaitTimedOut {
                        key: key.to_owned(),
                        wait,
                    }
                }
                _ => {}
            }
        }
        LeaseError::Database {
            operation,
            source: error,
        }
    }
}

/// The DETAIL of an invalid-input error lists violations separated by `; `.
fn split_detail(info: &(dyn DatabaseErrorInformation + Send + Sync)) -> Vec<String> {
    match info.details() {
        Some(detail) if !detail.is_empty() => detail.split("; ").map(str::to_owned).collect(),
        _ => vec![info.message().to_owned()],
    }
}

/// Errors of [`crate::install`] and [`crate::uninstall`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstallError {
    /// A migration's SQL failed; the whole install was rolled back.
    #[error("leasehold migration {version} failed and the install was rolled back: {message}; the role needs CREATE on the database (GRANT CREATE ON DATABASE <db> TO <role>)")]
    Migration {
        /// The failing migration's version.
        version: String,
        /// What the database said.
        message: String,
    },
    /// The install bookkeeping could not be read or written.
    #[error("leasehold install bookkeeping failed: {0}; check the connection and that the role may create schema `lease` (GRANT CREATE ON DATABASE <db> TO <role>)")]
    Database(#[from] DieselError),
    /// The embedded migrations could not be listed (a build problem).
    #[error("the embedded leasehold migrations could not be read: {0}; rebuild the crate")]
    Embedded(String),
}
