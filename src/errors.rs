//! Typed errors, one enum per family of operations.
//!
//! Callers match on meaning, never on message text: the SQL functions put a
//! stable machine-readable name in the error's `CONSTRAINT` field (diesel
//! does not expose SQLSTATE, but it does expose that field), and this module
//! turns those names into variants. Every message says what went wrong and
//! what to do about it.

use std::time::Duration;

use diesel::result::{DatabaseErrorInformation, DatabaseErrorKind, Error as DieselError};

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
    /// The connection broke while an autocommitted acquire, renew or release
    /// was in flight, so it may or may not have committed. Neither success
    /// nor failure may be assumed: re-read the key with `inspect` (or repeat
    /// an acquire, which is idempotent for its owner) before acting.
    #[error("the connection was lost while lease {operation} of key {key:?} was in flight; it may or may not have committed: re-read the key with inspect (or repeat the acquire, which is idempotent) before acting")]
    OutcomeUnknown {
        /// `"acquire"`, `"renew"` or `"release"`.
        operation: &'static str,
        /// The key concerned.
        key: String,
        /// The connection error as diesel reported it.
        #[source]
        source: DieselError,
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
        autocommit: bool,
    ) -> Self {
        let mutates = operation != "inspect";
        if let DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _) = &error {
            if autocommit && mutates {
                return LeaseError::OutcomeUnknown {
                    operation,
                    key: key.to_owned(),
                    source: error,
                };
            }
        }
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

/// `CONSTRAINT` name of a refused stale epoch (SQLSTATE 55000).
pub(crate) const GUARD_STALE: &str = "lease_guard_stale_epoch";
/// `CONSTRAINT` name of a token of the wrong lease key (SQLSTATE 22023).
pub(crate) const GUARD_WRONG_KEY: &str = "lease_guard_wrong_key";
/// `CONSTRAINT` name of a lease-checked write whose lease is not held (55000).
pub(crate) const GUARD_NOT_HELD: &str = "lease_guard_lease_not_held";

/// Errors of the guard operations. A refusal rolls back the caller's
/// transaction (or savepoint): nothing of the refused write is visible.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// The presented epoch is below the resource's record: a newer holder
    /// has written (or an operator fenced this epoch out).
    #[error("stale fencing epoch {presented} for resource {resource:?}: it admits only epochs >= {accepted}; stop acting on this lease and re-acquire it for a new epoch if needed")]
    StaleEpoch {
        /// The guarded resource.
        resource: String,
        /// The epoch the writer presented.
        presented: i64,
        /// The resource's record: the lowest epoch it admits.
        accepted: i64,
    },
    /// The token belongs to another lease key than the one fencing the
    /// resource: a programming error, refused rather than ignored.
    #[error("resource {resource:?} is fenced by lease key {fenced_by:?}, but a token of key {presented:?} was presented; present a token of {fenced_by:?}")]
    WrongLeaseKey {
        /// The guarded resource.
        resource: String,
        /// The key that fences it.
        fenced_by: String,
        /// The key of the presented token.
        presented: String,
    },
    /// A lease-checked write found the lease not held by the token's owner
    /// and epoch.
    #[error("lease {key:?} is not held by {owner:?} at epoch {epoch} ({reason}); stop acting on it and re-acquire it for a new epoch if needed")]
    LeaseNotHeld {
        /// The lease key.
        key: String,
        /// The owner that presented the token.
        owner: String,
        /// The presented epoch.
        epoch: i64,
        /// Why: not_owner, lapsed or epoch_mismatch.
        reason: crate::LostLease,
    },
    /// The arguments broke the guard functions' input rules; nothing changed.
    #[error("invalid guard input: {}; nothing was changed, fix the arguments and call again", .violations.join("; "))]
    InvalidInput {
        /// Every violated rule.
        violations: Vec<String>,
    },
    /// The database failed the call; the caller's transaction is rolled back.
    #[error("guard {operation} failed in the database: {source}; check the connection and that leasehold::install has run on this database")]
    Database {
        /// The guard operation.
        operation: &'static str,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// No connection could be taken from the pool.
    #[error("could not get a database connection from the pool: {0}; check that the database is reachable and the pool is large enough")]
    Pool(#[from] r2d2::Error),
}

/// What a guard call was about, so a refusal can be reported with its facts.
pub(crate) struct GuardContext<'a> {
    pub(crate) operation: &'static str,
    pub(crate) resource: &'a str,
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) epoch: i64,
}

impl GuardError {
    pub(crate) fn from_diesel(context: &GuardContext<'_>, error: DieselError) -> Self {
        if let DieselError::DatabaseError(_, info) = &error {
            let detail = info.details().unwrap_or("");
            match info.constraint_name() {
                Some(INVALID_INPUT) => {
                    return GuardError::InvalidInput {
                        violations: split_detail(info.as_ref()),
                    }
                }
                Some(GUARD_STALE) => {
                    if let Some(accepted) =
                        detail_field(detail, "accepted").and_then(|v| v.parse().ok())
                    {
                        return GuardError::StaleEpoch {
                            resource: context.resource.to_owned(),
                            presented: context.epoch,
                            accepted,
                        };
                    }
                }
                Some(GUARD_WRONG_KEY) => {
                    if let Some(fenced_by) = detail.strip_prefix("fenced_by=") {
                        return GuardError::WrongLeaseKey {
                            resource: context.resource.to_owned(),
                            fenced_by: fenced_by.to_owned(),
                            presented: context.key.to_owned(),
                        };
                    }
                }
                Some(GUARD_NOT_HELD) => {
                    if let Some(reason) =
                        detail_field(detail, "reason").and_then(crate::leases::lost_from_status)
                    {
                        return GuardError::LeaseNotHeld {
                            key: context.key.to_owned(),
                            owner: context.owner.to_owned(),
                            epoch: context.epoch,
                            reason,
                        };
                    }
                }
                _ => {}
            }
        }
        GuardError::Database {
            operation: context.operation,
            source: error,
        }
    }
}

/// The value of `name=` in a DETAIL of space-separated fields; fields are
/// written by our own SQL, and the values read this way never hold spaces.
fn detail_field<'d>(detail: &'d str, name: &str) -> Option<&'d str> {
    detail
        .split(' ')
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
}
