//! The crate's one error type, [`LeaseError`]: what to do about it
//! ([`ErrorKind`]), which call failed ([`Operation`]) and the facts a caller
//! reports. Its inside is private, so a new fact is never a breaking change.

use std::fmt;
use std::time::Duration;

pub use crate::operation::Operation;

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::lease::epoch::Epoch;
use crate::lease::refusal::Refusal;

/// How long a call without a wait waits for a row lock another transaction
/// holds on its key before it fails with [`ErrorKind::TimedOut`].
pub const LOCK_WAIT_BOUND: Duration = Duration::from_secs(1);

/// Every failure of a leasehold call, one type so `?` works across them.
///
/// Match on [`kind`](Self::kind) to decide what to do; read the facts
/// ([`key`](Self::key), [`refusal`](Self::refusal), …) to report it; the
/// database's or the pool's own error is its [`source`](std::error::Error::source).
/// A refused renew or release is a value (`Renewal::Refused`); a guard's
/// refusal is this error, since its write must not happen.
pub struct LeaseError(Box<Repr>);

/// What a caller does about a [`LeaseError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Fix the arguments or settings (a refused URL too): retrying unchanged fails.
    InvalidInput,
    /// The bound passed: retry later or wait longer.
    TimedOut,
    /// The caller cancelled it.
    Cancelled,
    /// Retry now: the state changed under the call, which changed nothing.
    Retry,
    /// A write may or may not have committed: re-read before acting.
    OutcomeUnknown,
    /// A guard refused the writer, or the lease is not held: stop acting on it.
    Fenced,
    /// The role may not do this: another role, or an operator's grant.
    Forbidden,
    /// leasehold is not installed as this call needs: install or upgrade it.
    NotInstalled,
    /// Connection, pool, server role or process failed: retry on a new connection.
    Unavailable,
    /// Anything else the database or the build reported; the source says.
    Other,
}

/// The failures, each with its message and facts; private, read through
/// [`LeaseError`]'s accessors.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Repr {
    #[error("invalid input: {}; fix the arguments, nothing changed", .violations.join("; "))]
    InvalidInput { violations: Vec<String> },
    #[error("generation {requested} is not above the current generation {current}; ask for a higher one, nothing changed")]
    GenerationNotAbove {
        operation: Operation,
        requested: i64,
        current: i64,
    },
    #[error("generation {requested} is above the highest generation, {highest}; nothing changed")]
    GenerationTooHigh {
        operation: Operation,
        requested: i64,
        highest: i64,
    },
    #[error("timed out after {waited:?} waiting for lease {key:?}; retry later or wait longer")]
    TimedOut {
        operation: Operation,
        key: String,
        waited: Duration,
    },
    #[error("waiting for lease {key:?} was cancelled; nothing changed")]
    Cancelled { operation: Operation, key: String },
    #[error("lease {operation} of key {key:?} must be retried: {reason}; nothing changed")]
    Retry {
        operation: Operation,
        key: String,
        reason: &'static str,
        #[source]
        source: DieselError,
    },
    #[error("connection lost during lease {operation} of key {key:?}: the outcome is unknown; inspect the key before acting")]
    OutcomeUnknown {
        operation: Operation,
        key: String,
        #[source]
        source: DieselError,
    },
    #[error("stale epoch {presented} for resource {resource:?}: it accepts only epochs >= {accepted}; stop acting on this lease")]
    StaleEpoch {
        operation: Operation,
        resource: String,
        presented: Epoch,
        accepted: Epoch,
    },
    #[error("resource {resource:?} is fenced by lease key {fenced_by:?}, not {presented:?}; present a token of {fenced_by:?}")]
    WrongLeaseKey {
        operation: Operation,
        resource: String,
        fenced_by: String,
        presented: String,
    },
    #[error("epoch {presented} of lease key {key:?} was never granted (its counter is {counter}), so it cannot fence resource {resource:?}; present a granted token")]
    EpochNotGranted {
        operation: Operation,
        resource: String,
        key: String,
        presented: Epoch,
        counter: Epoch,
    },
    #[error(
        "lease {key:?} is not held by {owner:?} at epoch {epoch}: {reason}; stop acting on it"
    )]
    LeaseNotHeld {
        operation: Operation,
        key: String,
        owner: String,
        epoch: Epoch,
        reason: Refusal,
    },
    #[error("write to table {table} refused: no token of lease key {key:?} was presented in this transaction; present one (lease.present) before writing")]
    TableNoToken { table: String, key: String },
    #[error("write to table {table} refused: lease {key:?} is not held by {owner:?} at epoch {epoch}{}; stop acting on it", .reason.map(|reason| format!(": {reason}")).unwrap_or_default())]
    TableNotHeld {
        table: String,
        key: String,
        owner: String,
        epoch: Epoch,
        reason: Option<Refusal>,
    },
    #[error("write to table {table} refused: a written row has a NULL key column; give every key column a value")]
    TableNullKey { table: String },
    #[error("write to table {table} refused: TRUNCATE would remove every key's rows of a row-fenced table; delete with tokens instead")]
    TableTruncate { table: String },
    #[error("role {role:?} may not change the fence of table {table}: it does not own it; connect as the table's owner")]
    TableNotOwned {
        operation: Operation,
        table: String,
        role: String,
    },
    #[error("role {role:?} may not {operation} {argument} {name:?}: an operator bound its prefix to another role; connect as a member of that role")]
    Forbidden {
        operation: Operation,
        argument: String,
        name: String,
        role: String,
    },
    #[error("role {role:?} may not list leases: it lacks SELECT on lease.leases and lease.groups; connect as their owner or have it GRANT SELECT, nothing was read")]
    ListNotPermitted { operation: Operation, role: String },
    #[error("role {role:?} may not create schema lease in database {database:?}: GRANT CREATE ON DATABASE to it, or install as the database owner; nothing was installed")]
    InstallNotPermitted { role: String, database: String },
    #[error("schema lease already exists and is owned by role {owner:?}; have it drop the schema, or install as {owner:?}; nothing was installed")]
    SchemaNotOwned { owner: String },
    #[error("another role can put code into schema lease ({what}), which the install would run as the installing role; drop that object or revoke that privilege first")]
    SchemaNotPrivate { what: String },
    #[error("leasehold is installed in this database as the extension `leasehold` (version {version}); upgrade it with ALTER EXTENSION leasehold UPDATE, or drop the extension first")]
    ExtensionInstalled { version: String },
    #[error("PostgreSQL {found} is not supported: leasehold needs PostgreSQL {minimum} or newer; nothing was installed")]
    UnsupportedVersion { found: String, minimum: u32 },
    #[error("leasehold install was blocked: another session held a lock it needs for more than {waited:?}; let it finish (pg_locks names it) and install again")]
    Blocked {
        waited: Duration,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("leasehold migration {version} failed and the install was rolled back; the installing role needs CREATE on the database")]
    Migration {
        version: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("leasehold's embedded SQL is unusable ({reason}); rebuild the crate")]
    EmbeddedSql { reason: String },
    #[error("leasehold is not installed in this database ({operation}: {source}); run leasehold::install or `leasehold install` first")]
    NotInstalled {
        operation: Operation,
        #[source]
        source: DieselError,
    },
    #[error("lease {operation} refused: the server is read-only (a standby, or a primary being demoted); connect to the primary (target_session_attrs=read-write)")]
    ReadOnlyServer {
        operation: Operation,
        #[source]
        source: DieselError,
    },
    #[error("lease {operation} failed: a prepared statement went missing between transactions; with a transaction-mode pooler use PreparedStatements::Uncached")]
    PreparedStatementLost {
        operation: Operation,
        #[source]
        source: DieselError,
    },
    #[error("no database connection available from the pool: {source}; check the server, or enlarge the pool")]
    Pool {
        configuration: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot connect to the database: {}; check the URL and that the server is up", crate::libpq::chain(source.as_ref()))]
    Connect {
        configuration: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    // Only the async face bounds its own connect attempts.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    #[error("no connection to {servers} within {} s (the bound: {setting}, per host); check that the server is up and reachable", after.as_secs_f64())]
    ConnectTimedOut {
        servers: String,
        after: Duration,
        setting: String,
    },
    #[error("the waiters' listener is not listening ({wake_mode}): {}; point the waiter's URL at the server or a session-mode pooler", .last_error.as_deref().unwrap_or("not connected yet"))]
    NotListening {
        wake_mode: String,
        last_error: Option<String>,
    },
    #[error("cannot start a leasehold thread; the process is out of threads or memory")]
    Spawn(#[source] std::io::Error),
    #[error("lease {operation} failed in the database: {source}; check the connection and the transaction")]
    Database {
        operation: Operation,
        #[source]
        source: DieselError,
    },
}

impl From<Repr> for LeaseError {
    fn from(repr: Repr) -> Self {
        LeaseError(Box::new(repr))
    }
}

impl fmt::Debug for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for LeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl LeaseError {
    /// What the caller does about this error.
    pub fn kind(&self) -> ErrorKind {
        use Repr as R;
        match &*self.0 {
            R::InvalidInput { .. }
            | R::GenerationNotAbove { .. }
            | R::GenerationTooHigh { .. }
            | R::TableNullKey { .. }
            | R::TableTruncate { .. } => ErrorKind::InvalidInput,
            R::Connect {
                configuration: true,
                ..
            }
            | R::Pool {
                configuration: true,
                ..
            } => ErrorKind::InvalidInput,
            R::TimedOut { .. } | R::Blocked { .. } => ErrorKind::TimedOut,
            R::Cancelled { .. } => ErrorKind::Cancelled,
            R::Retry { .. } => ErrorKind::Retry,
            R::OutcomeUnknown { .. } => ErrorKind::OutcomeUnknown,
            R::StaleEpoch { .. }
            | R::WrongLeaseKey { .. }
            | R::EpochNotGranted { .. }
            | R::LeaseNotHeld { .. }
            | R::TableNotHeld { .. } => ErrorKind::Fenced,
            R::TableNoToken { .. }
            | R::TableNotOwned { .. }
            | R::Forbidden { .. }
            | R::ListNotPermitted { .. }
            | R::InstallNotPermitted { .. }
            | R::SchemaNotOwned { .. }
            | R::SchemaNotPrivate { .. } => ErrorKind::Forbidden,
            R::NotInstalled { .. }
            | R::ExtensionInstalled { .. }
            | R::UnsupportedVersion { .. } => ErrorKind::NotInstalled,
            R::ReadOnlyServer { .. }
            | R::PreparedStatementLost { .. }
            | R::Pool { .. }
            | R::Connect { .. }
            | R::ConnectTimedOut { .. }
            | R::NotListening { .. }
            | R::Spawn(_) => ErrorKind::Unavailable,
            R::Database { source, .. } if is_dead_connection(source) => ErrorKind::Unavailable,
            R::Migration { .. } | R::EmbeddedSql { .. } | R::Database { .. } => ErrorKind::Other,
        }
    }

    /// The leasehold call that failed; `None` for a connection, a pool
    /// checkout or a thread that failed before any call was made.
    pub fn operation(&self) -> Option<Operation> {
        use Repr as R;
        Some(match &*self.0 {
            R::Retry { operation, .. }
            | R::OutcomeUnknown { operation, .. }
            | R::StaleEpoch { operation, .. }
            | R::WrongLeaseKey { operation, .. }
            | R::EpochNotGranted { operation, .. }
            | R::LeaseNotHeld { operation, .. }
            | R::Forbidden { operation, .. }
            | R::NotInstalled { operation, .. }
            | R::ReadOnlyServer { operation, .. }
            | R::PreparedStatementLost { operation, .. }
            | R::Database { operation, .. }
            | R::GenerationNotAbove { operation, .. }
            | R::GenerationTooHigh { operation, .. }
            | R::TimedOut { operation, .. }
            | R::Cancelled { operation, .. }
            | R::TableNotOwned { operation, .. }
            | R::ListNotPermitted { operation, .. } => *operation,
            R::TableNoToken { .. } | R::TableNotHeld { .. } => Operation::STATEMENT,
            R::TableNullKey { .. } | R::TableTruncate { .. } => Operation::STATEMENT,
            R::InvalidInput { .. } | R::Pool { .. } | R::Connect { .. } | R::Spawn(_) => {
                return None
            }
            R::ConnectTimedOut { .. } | R::NotListening { .. } => return None,
            // What is left are the installer's own refusals and failures.
            _ => Operation::INSTALL,
        })
    }

    /// The lease key concerned (for a batch call, its first key), when the
    /// error is about one.
    pub fn key(&self) -> Option<&str> {
        use Repr as R;
        match &*self.0 {
            R::TimedOut { key, .. }
            | R::Cancelled { key, .. }
            | R::Retry { key, .. }
            | R::OutcomeUnknown { key, .. }
            | R::EpochNotGranted { key, .. }
            | R::LeaseNotHeld { key, .. }
            | R::TableNoToken { key, .. }
            | R::TableNotHeld { key, .. }
            | R::WrongLeaseKey { presented: key, .. } => Some(key).filter(|key| !key.is_empty()),
            R::Forbidden { argument, name, .. } if argument != "resource" => Some(name),
            _ => None,
        }
        .map(String::as_str)
    }

    /// The guarded resource a guard refused, or whose name a namespace rule refused.
    pub fn resource(&self) -> Option<&str> {
        match &*self.0 {
            Repr::StaleEpoch { resource, .. }
            | Repr::WrongLeaseKey { resource, .. }
            | Repr::EpochNotGranted { resource, .. } => Some(resource),
            Repr::Forbidden { argument, name, .. } if argument == "resource" => Some(name),
            _ => None,
        }
    }

    /// The fenced table that refused a write, or whose fence could not be changed.
    pub fn table(&self) -> Option<&str> {
        match &*self.0 {
            Repr::TableNoToken { table, .. }
            | Repr::TableNotHeld { table, .. }
            | Repr::TableNullKey { table }
            | Repr::TableTruncate { table }
            | Repr::TableNotOwned { table, .. } => Some(table),
            _ => None,
        }
    }

    /// Why a guard, a fenced table or a lease-checked call refused the writer.
    pub fn refusal(&self) -> Option<Refusal> {
        match &*self.0 {
            Repr::StaleEpoch { accepted, .. } => Some(Refusal::StaleEpoch {
                accepted: *accepted,
            }),
            Repr::WrongLeaseKey { .. } => Some(Refusal::WrongKey),
            Repr::EpochNotGranted { counter, .. } => {
                Some(Refusal::EpochNotGranted { counter: *counter })
            }
            Repr::LeaseNotHeld { reason, .. } => Some(*reason),
            Repr::TableNotHeld { reason, .. } => *reason,
            Repr::TableNoToken { .. } => Some(Refusal::NoToken),
            Repr::TableNullKey { .. } => Some(Refusal::NullKey),
            Repr::TableTruncate { .. } => Some(Refusal::Truncate),
            _ => None,
        }
    }

    /// The epoch the refused writer presented.
    pub fn epoch(&self) -> Option<Epoch> {
        match &*self.0 {
            Repr::StaleEpoch { presented, .. } | Repr::EpochNotGranted { presented, .. } => {
                Some(*presented)
            }
            Repr::LeaseNotHeld { epoch, .. } | Repr::TableNotHeld { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }

    /// The owner of the refused writer's token.
    pub fn owner(&self) -> Option<&str> {
        match &*self.0 {
            Repr::LeaseNotHeld { owner, .. } | Repr::TableNotHeld { owner, .. } => Some(owner),
            _ => None,
        }
    }

    /// The key that fences the resource, when a token of another key was presented.
    pub fn fenced_by(&self) -> Option<&str> {
        match &*self.0 {
            Repr::WrongLeaseKey { fenced_by, .. } => Some(fenced_by),
            _ => None,
        }
    }

    /// The role that was refused, or that owns schema `lease` already.
    pub fn role(&self) -> Option<&str> {
        match &*self.0 {
            Repr::Forbidden { role, .. }
            | Repr::TableNotOwned { role, .. }
            | Repr::ListNotPermitted { role, .. }
            | Repr::InstallNotPermitted { role, .. }
            | Repr::SchemaNotOwned { owner: role } => Some(role).filter(|role| !role.is_empty()),
            _ => None,
        }
        .map(String::as_str)
    }

    /// Every input rule the arguments broke, e.g. `"key must not be empty"`;
    /// empty for other errors (a bad generation's message names its rule).
    pub fn violations(&self) -> &[String] {
        match &*self.0 {
            Repr::InvalidInput { violations } => violations,
            _ => &[],
        }
    }

    /// How long the call waited before it gave up.
    pub fn waited(&self) -> Option<Duration> {
        match &*self.0 {
            Repr::TimedOut { waited, .. } | Repr::Blocked { waited, .. } => Some(*waited),
            Repr::ConnectTimedOut { after, .. } => Some(*after),
            _ => None,
        }
    }

    /// The server's current generation, when a raise asked for one not above it.
    pub fn current_generation(&self) -> Option<i64> {
        match &*self.0 {
            Repr::GenerationNotAbove { current, .. } => Some(*current),
            _ => None,
        }
    }

    /// The failure itself, taken out (for the async pool's connect error).
    #[cfg(feature = "async")]
    pub(crate) fn into_repr(self) -> Repr {
        *self.0
    }

    /// The failure itself, for the crate's own decisions.
    pub(crate) fn repr(&self) -> &Repr {
        &self.0
    }
    /// An input rule broken before the call was sent.
    pub(crate) fn invalid(violation: String) -> Self {
        Repr::InvalidInput {
            violations: vec![violation],
        }
        .into()
    }

    /// Whether the server refused the call as read-only (a standby, or a
    /// primary being demoted): connect to the primary.
    pub fn is_read_only_server(&self) -> bool {
        matches!(*self.0, Repr::ReadOnlyServer { .. })
    }
}

/// Whether diesel says the session itself is gone.
pub(crate) fn is_dead_connection(error: &DieselError) -> bool {
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _)
            | DieselError::DatabaseError(DatabaseErrorKind::UnableToSendCommand, _)
            | DieselError::BrokenTransactionManager
    )
}
