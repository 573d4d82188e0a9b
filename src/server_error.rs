//! Turning the server's errors into [`LeaseError`]s: the one place that does.
//!
//! leasehold's SQL names each refusal in the error's `CONSTRAINT` field
//! (`sql::names`) and its facts in a JSON DETAIL (`sql::decode::Detail`),
//! because diesel exposes neither SQLSTATE nor any field beyond message,
//! DETAIL, HINT and constraint name. The few errors the server raises
//! itself are told apart by `sql::decode`, the one module that reads
//! message text.

use std::time::Duration;

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::error::{LeaseError, Operation, Repr, LOCK_WAIT_BOUND};
use crate::lease::epoch::Epoch;
use crate::lease::refusal::Refusal;
use crate::sql::decode::{self, Detail, Status};
use crate::sql::names;

/// A fenced table's refusal of a write, or of a change of its fence, if
/// `error` is one.
fn fence_error(error: &DieselError, operation: Operation) -> Option<Repr> {
    let DieselError::DatabaseError(_, info) = error else {
        return None;
    };
    let detail = Detail::of(info.as_ref());
    let field = |name| {
        detail
            .as_ref()
            .and_then(|detail| detail.text(name))
            .unwrap_or("")
            .to_owned()
    };
    Some(match info.constraint_name()? {
        names::FENCE_NO_TOKEN => Repr::TableNoToken {
            table: field("table"),
            key: field("key"),
        },
        names::FENCE_NULL_KEY => Repr::TableNullKey {
            table: field("table"),
        },
        names::FENCE_TRUNCATE => Repr::TableTruncate {
            table: field("table"),
        },
        names::GUARD_NOT_HELD if !field("table").is_empty() => {
            let detail = detail.as_ref()?;
            let epoch: i64 = detail.number("epoch").unwrap_or(0);
            let reason = detail
                .text("reason")
                .and_then(Status::parse)
                .and_then(|status| {
                    Refusal::from_answer(status, detail.text("why"), detail.number("newest"), epoch)
                });
            Repr::TableNotHeld {
                table: field("table"),
                key: field("key"),
                owner: field("owner"),
                epoch: Epoch::new(epoch),
                reason,
            }
        }
        names::NAMESPACE_DENIED => {
            // A key the writer may not act on; a refused fence (key_prefix) is the operator call's.
            let (argument, name, role) = detail.as_ref()?.forbidden()?;
            if argument != "key" {
                return None;
            }
            Repr::Forbidden {
                operation: Operation::PRESENT,
                argument: "key".to_owned(),
                name: name.to_owned(),
                role: role.to_owned(),
            }
        }
        names::TABLE_NOT_OWNED => Repr::TableNotOwned {
            operation,
            table: field("table"),
            role: field("role"),
        },
        names::TABLE_NOT_FENCEABLE | names::TABLE_ALREADY_FENCED => Repr::InvalidInput {
            violations: vec![info.message().to_owned()],
        },
        _ => return None,
    })
}

/// A statement's error (the caller's own, or leasehold's bookkeeping): a
/// fenced table's refusal when it is one, else a plain database error.
pub(crate) fn statement_error(source: DieselError) -> LeaseError {
    fence_error(&source, Operation::STATEMENT)
        .unwrap_or(Repr::Database {
            operation: Operation::STATEMENT,
            source,
        })
        .into()
}

impl LeaseError {
    /// The connection error of a failed connect, boxed as its source.
    pub(crate) fn connect(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Repr::Connect {
            configuration: is_configuration(&source),
            source: Box::new(source),
        }
        .into()
    }

    /// A failed checkout from either face's pool, its error as the source.
    pub(crate) fn pool(source: Box<dyn std::error::Error + Send + Sync>) -> Self {
        Repr::Pool {
            configuration: is_configuration(source.as_ref()),
            source,
        }
        .into()
    }
}

/// Whether a connection failed on the URL or the credentials (it and its
/// causes, read by `sql::decode`).
fn is_configuration(error: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        error.downcast_ref::<diesel::ConnectionError>(),
        Some(diesel::ConnectionError::InvalidConnectionUrl(_))
    ) || crate::sql::decode::is_configuration_error(&crate::libpq::chain(error))
}

impl LeaseError {
    /// A fenced table's refusal of a write, or of `operation`'s change of
    /// its fence, if `error` is one.
    pub(crate) fn from_fence(error: &DieselError, operation: Operation) -> Option<Self> {
        fence_error(error, operation).map(LeaseError::from)
    }

    /// Maps a lease function's diesel error to its meaning; `autocommit`: the call
    /// ran outside any transaction of the caller's (read before the call).
    pub(crate) fn from_diesel(
        operation: Operation,
        error: DieselError,
        key: &str,
        wait: Duration,
        autocommit: bool,
    ) -> Self {
        call_error(operation, error, key, wait, autocommit).into()
    }
    /// [`LeaseError::from_diesel`] for keyless calls that never wait (operator, prune).
    pub(crate) fn from_keyless(operation: Operation, error: DieselError, autocommit: bool) -> Self {
        LeaseError::from_diesel(operation, error, "", Duration::ZERO, autocommit)
    }

    /// `lease.raise_generation`'s error: not above the current one is a generation refusal.
    pub(crate) fn from_raise_generation(
        operation: Operation,
        error: DieselError,
        requested: i64,
        autocommit: bool,
    ) -> Self {
        if let DieselError::DatabaseError(_, info) = &error {
            if info.constraint_name() == Some(names::GENERATION_NOT_ABOVE) {
                if let Some(current) =
                    Detail::of(info.as_ref()).and_then(|detail| detail.number::<i64>("current"))
                {
                    return Repr::GenerationNotAbove {
                        operation,
                        requested,
                        current,
                    }
                    .into();
                }
            }
        }
        LeaseError::from_keyless(operation, error, autocommit)
    }
}

impl LeaseError {
    /// An install step's error as a timeout when its lock_timeout fired
    /// (matched on the message: diesel does not expose 55P03), else `otherwise`.
    pub(crate) fn install_blocked_or(
        source: Box<dyn std::error::Error + Send + Sync>,
        otherwise: impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> LeaseError,
    ) -> LeaseError {
        if decode::is_lock_timeout(&source.to_string()) {
            Repr::Blocked {
                waited: crate::sql::install::INSTALL_LOCK_TIMEOUT,
                source,
            }
            .into()
        } else {
            otherwise(source)
        }
    }

    /// Maps a diesel error of the install bookkeeping to its typed meaning.
    pub(crate) fn from_install_diesel(error: DieselError) -> Self {
        install_error(error).into()
    }

    pub(crate) fn from_guard_diesel(context: &GuardContext<'_>, error: DieselError) -> Self {
        guard_error(context, error).into()
    }
}

/// A diesel error of the install bookkeeping, read.
fn install_error(error: DieselError) -> Repr {
    if decode::is_lock_timeout(&error.to_string()) {
        return Repr::Blocked {
            waited: crate::sql::install::INSTALL_LOCK_TIMEOUT,
            source: Box::new(error),
        };
    }
    if let DieselError::DatabaseError(_, info) = &error {
        if info.constraint_name() == Some(names::UNSUPPORTED_VERSION) {
            if let Some((minimum, found)) = info.details().and_then(decode::unsupported_version) {
                return Repr::UnsupportedVersion {
                    found: found.to_owned(),
                    minimum,
                };
            }
        }
        if info.constraint_name() == Some(names::INSTALL_NOT_PERMITTED) {
            if let Some((role, database)) = info.details().and_then(decode::role_and_database) {
                return Repr::InstallNotPermitted {
                    role: role.to_owned(),
                    database: database.to_owned(),
                };
            }
        }
        if info.constraint_name() == Some(names::SCHEMA_NOT_PRIVATE) {
            if let Some(what) = info.details().and_then(decode::schema_not_private) {
                return Repr::SchemaNotPrivate {
                    what: what.to_owned(),
                };
            }
        }
        if info.constraint_name() == Some(names::SCHEMA_NOT_OWNED) {
            if let Some(owner) = info.details().and_then(decode::schema_owner) {
                return Repr::SchemaNotOwned {
                    owner: owner.to_owned(),
                };
            }
        }
    }
    Repr::Database {
        operation: Operation::INSTALL,
        source: error,
    }
}

/// What a guard call was about, so a refusal can be reported with its facts.
pub(crate) struct GuardContext<'a> {
    pub(crate) operation: Operation,
    pub(crate) resource: &'a str,
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) epoch: Epoch,
}

/// A guard call's diesel error, read with the facts of the call.
fn guard_error(context: &GuardContext<'_>, error: DieselError) -> Repr {
    if decode::is_not_installed(&error) {
        return Repr::NotInstalled {
            operation: context.operation,
            source: error,
        };
    }
    if is_read_only(&error) {
        return Repr::ReadOnlyServer {
            operation: context.operation,
            source: error,
        };
    }
    if let DieselError::DatabaseError(_, info) = &error {
        if info.constraint_name() == Some(names::INVALID_INPUT) {
            return Repr::InvalidInput {
                violations: decode::violations(info.as_ref()),
            };
        }
        let detail = Detail::of(info.as_ref());
        let field = |name| detail.as_ref().and_then(|detail| detail.text(name));
        let number = |name| {
            detail
                .as_ref()
                .and_then(|detail| detail.number::<i64>(name))
        };
        match info.constraint_name() {
            Some(names::GUARD_STALE) => {
                if let Some(accepted) = number("accepted") {
                    return Repr::StaleEpoch {
                        operation: context.operation,
                        resource: context.resource.to_owned(),
                        presented: context.epoch,
                        accepted: Epoch::new(accepted),
                    };
                }
            }
            Some(names::GUARD_WRONG_KEY) => {
                if let Some(fenced_by) = field("fenced_by") {
                    return Repr::WrongLeaseKey {
                        operation: context.operation,
                        resource: context.resource.to_owned(),
                        fenced_by: fenced_by.to_owned(),
                        presented: context.key.to_owned(),
                    };
                }
            }
            Some(names::GUARD_EPOCH_NOT_GRANTED) => {
                if let Some(counter) = number("counter") {
                    return Repr::EpochNotGranted {
                        operation: context.operation,
                        resource: context.resource.to_owned(),
                        key: context.key.to_owned(),
                        presented: context.epoch,
                        counter: Epoch::new(counter),
                    };
                }
            }
            Some(names::NAMESPACE_DENIED) => {
                let refused = detail.as_ref().and_then(Detail::forbidden);
                let (argument, name) = match refused {
                    Some((argument, name, _)) => (argument, name),
                    // A DETAIL this client cannot read: name the guard call's resource.
                    None if context.resource.is_empty() => ("key", context.key),
                    None => ("resource", context.resource),
                };
                return Repr::Forbidden {
                    operation: context.operation,
                    argument: argument.to_owned(),
                    name: name.to_owned(),
                    role: refused.map_or("", |(_, _, role)| role).to_owned(),
                };
            }
            Some(names::GUARD_NOT_HELD) => {
                let reason = field("reason").and_then(Status::parse).and_then(|status| {
                    Refusal::from_answer(
                        status,
                        field("why"),
                        number("newest"),
                        context.epoch.get(),
                    )
                });
                if let Some(reason) = reason {
                    return Repr::LeaseNotHeld {
                        operation: context.operation,
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
    Repr::Database {
        operation: context.operation,
        source: error,
    }
}

/// A lease call's diesel error, read.
fn call_error(
    operation: Operation,
    error: DieselError,
    key: &str,
    wait: Duration,
    autocommit: bool,
) -> Repr {
    if let DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _) = &error {
        if autocommit && operation.mutates() {
            return Repr::OutcomeUnknown {
                operation,
                key: key.to_owned(),
                source: error,
            };
        }
    }
    if decode::is_not_installed(&error) {
        return Repr::NotInstalled {
            operation,
            source: error,
        };
    }
    if is_read_only(&error) {
        return Repr::ReadOnlyServer {
            operation,
            source: error,
        };
    }
    if decode::is_prepared_statement_lost(&error) {
        return Repr::PreparedStatementLost {
            operation,
            source: error,
        };
    }
    if let DieselError::DatabaseError(_, info) = &error {
        match info.constraint_name() {
            Some(names::INVALID_INPUT) => {
                return Repr::InvalidInput {
                    violations: decode::violations(info.as_ref()),
                }
            }
            Some(names::WAIT_TIMEOUT) => {
                return Repr::TimedOut {
                    operation,
                    key: key.to_owned(),
                    waited: if wait.is_zero() {
                        LOCK_WAIT_BOUND
                    } else {
                        wait
                    },
                }
            }
            Some(names::CONTENTION) => {
                return Repr::Retry {
                    operation,
                    key: key.to_owned(),
                    reason: "the key's state changed under the call twice (retry the call)",
                    source: error,
                };
            }
            Some(names::NAMESPACE_CHANGED) => {
                return Repr::Retry {
                        operation,
                        key: key.to_owned(),
                        reason: "the namespace rules changed after this transaction's snapshot (retry the transaction)",
                        source: error,
                    };
            }
            Some(names::NAMESPACE_DENIED) => {
                let detail = Detail::of(info.as_ref());
                let refused = detail.as_ref().and_then(Detail::forbidden);
                return Repr::Forbidden {
                    operation,
                    argument: refused
                        .map_or("key", |(argument, _, _)| argument)
                        .to_owned(),
                    name: refused.map_or(key, |(_, name, _)| name).to_owned(),
                    role: refused.map_or("", |(_, _, role)| role).to_owned(),
                };
            }
            _ => {}
        }
    }
    Repr::Database {
        operation,
        source: error,
    }
}

/// Whether the server refused a write as read-only (SQLSTATE 25006): a standby, or a primary being demoted.
fn is_read_only(error: &DieselError) -> bool {
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _)
    )
}

/// So `?` works in a transaction mixing the caller's statements with
/// leasehold's; a fenced table's refusal reads as one.
impl From<DieselError> for LeaseError {
    fn from(source: DieselError) -> Self {
        statement_error(source)
    }
}

#[cfg(test)]
mod tests {
    use diesel::result::DatabaseErrorInformation;

    use super::*;

    /// The fields of a server error, as libpq would report them.
    struct Reported {
        constraint: &'static str,
        detail: &'static str,
    }

    impl DatabaseErrorInformation for Reported {
        fn message(&self) -> &str {
            "refused"
        }
        fn details(&self) -> Option<&str> {
            Some(self.detail)
        }
        fn hint(&self) -> Option<&str> {
            None
        }
        fn table_name(&self) -> Option<&str> {
            None
        }
        fn column_name(&self) -> Option<&str> {
            None
        }
        fn constraint_name(&self) -> Option<&str> {
            Some(self.constraint)
        }
        fn statement_position(&self) -> Option<i32> {
            None
        }
    }

    fn reported(constraint: &'static str, detail: &'static str) -> DieselError {
        DieselError::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new(Reported { constraint, detail }),
        )
    }

    #[test]
    fn an_unsupported_version_refusal_is_typed_and_names_the_minimum() {
        let error = LeaseError::from_install_diesel(reported(
            "lease_unsupported_version",
            "minimum=14 server_version=13.11 (Debian 13.11-1.pgdg120+1)",
        ));
        match error.repr() {
            Repr::UnsupportedVersion { found, minimum } => {
                assert_eq!(found, "13.11 (Debian 13.11-1.pgdg120+1)");
                assert_eq!(*minimum, 14);
            }
            other => panic!("expected UnsupportedVersion, got {other:?}"),
        }
        assert_eq!(
            error.to_string(),
            "PostgreSQL 13.11 (Debian 13.11-1.pgdg120+1) is not supported: leasehold needs \
             PostgreSQL 14 or newer; nothing was installed"
        );
    }

    #[test]
    fn a_schema_owner_refusal_stays_typed() {
        match LeaseError::from_install_diesel(reported("lease_schema_not_owned", "owner=squatter"))
            .repr()
        {
            Repr::SchemaNotOwned { owner } => assert_eq!(owner, "squatter"),
            other => panic!("expected SchemaNotOwned, got {other:?}"),
        }
    }

    #[test]
    fn an_unreadable_detail_keeps_the_database_error() {
        let error =
            LeaseError::from_install_diesel(reported("lease_unsupported_version", "garbled"));
        assert!(matches!(error.repr(), Repr::Database { .. }), "{error:?}");
    }
}
