//! The crate's one error type, [`LeaseError`], and what to do about it,
//! [`ErrorKind`]. Variants come from the stable names the SQL functions put in
//! the `CONSTRAINT` field (`sql::names`), never from message text.

use std::fmt;
use std::time::Duration;

pub use crate::guard::database::FencedError;
pub(crate) use call::CallError;

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::lease::epoch::Epoch;
use crate::lease::refusal::Refusal;
use crate::sql::decode::{self, Detail, Status};
use crate::sql::names;
use crate::wait::shared::ListenerStatus;

/// How long a call without a wait waits for a row lock another transaction
/// holds on its key before [`LeaseError::TimedOut`] (docs/SPECIFICATION.md §1.5).
pub const LOCK_WAIT_BOUND: Duration = Duration::from_secs(1);

/// The library call an error came from, for matching and reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `lease.acquire` (also each attempt of a waiter).
    Acquire,
    /// `lease.renew`.
    Renew,
    /// `lease.release`.
    Release,
    /// `lease.renew_many`: renew several keys of one owner in one call.
    RenewMany,
    /// `lease.release_many`: release several keys of one owner in one call.
    ReleaseMany,
    /// `lease.join_group`: renew several keys into one heartbeat group.
    JoinGroup,
    /// `lease.renew_group`: one heartbeat for every key of a group.
    RenewGroup,
    /// `lease.inspect`.
    Inspect,
    /// `lease.admit`: a token-checked guard.
    Admit,
    /// `lease.check_held`: the lease is held right now.
    CheckHeld,
    /// `lease.admit_held`: admit, checking the lease is held.
    AdmitHeld,
    /// `lease.renew_admit`: renew and admit together.
    RenewAndAdmit,
    /// `lease.fence`: raise a resource's record by hand.
    Fence,
    /// `lease.inspect_guard`.
    InspectGuard,
    /// `lease.force_release`: an operator frees a key whatever its state.
    ForceRelease,
    /// `lease.bind_namespace`: an operator binds a key prefix to a role.
    BindNamespace,
    /// `lease.unbind_namespace`: an operator removes a prefix's rule.
    UnbindNamespace,
    /// `lease.list_namespaces`: an operator lists the rules.
    ListNamespaces,
    /// `lease.raise_generation`: an operator raises the generation.
    RaiseGeneration,
    /// `lease.generation`: the current generation and timeline.
    Generation,
    /// `lease.prune_keys` / `lease.prune_guards`.
    Prune,
    /// A listing of keys ([`crate::admin::Operator::list_leases`]).
    ListLeases,
    /// A privilege question ([`crate::admin::function_privilege`]).
    Privilege,
    /// `lease.present`: a token presented for the writes of a transaction
    /// to fenced tables.
    Present,
    /// `lease.protect_table`, `lease.protect_rows` or
    /// `lease.unprotect_table`: a table's owner changes its fence.
    ProtectTable,
    /// `lease.fenced_tables`: the fenced tables of the database.
    FencedTables,
    /// [`crate::install()`] or [`crate::admin::uninstall`].
    Install,
    /// Not a leasehold call: install bookkeeping, or the caller's own statement.
    Statement,
}

impl Operation {
    /// Whether the call can change state, so a lost autocommit leaves its outcome unknown.
    fn mutates(self) -> bool {
        !matches!(
            self,
            Operation::Inspect
                | Operation::InspectGuard
                | Operation::ListNamespaces
                | Operation::Generation
                | Operation::ListLeases
                | Operation::Privilege
                | Operation::FencedTables
                | Operation::Install
        )
    }

    /// The operation's name, as the SQL function is called.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Acquire => "acquire",
            Operation::Renew => "renew",
            Operation::Release => "release",
            Operation::RenewMany => "renew_many",
            Operation::ReleaseMany => "release_many",
            Operation::JoinGroup => "join_group",
            Operation::RenewGroup => "renew_group",
            Operation::Inspect => "inspect",
            Operation::Admit => "admit",
            Operation::CheckHeld => "check_held",
            Operation::AdmitHeld => "admit_held",
            Operation::RenewAndAdmit => "renew_admit",
            Operation::Fence => "fence",
            Operation::InspectGuard => "inspect_guard",
            Operation::ForceRelease => "force_release",
            Operation::BindNamespace => "bind_namespace",
            Operation::UnbindNamespace => "unbind_namespace",
            Operation::ListNamespaces => "list_namespaces",
            Operation::RaiseGeneration => "raise_generation",
            Operation::Generation => "generation",
            Operation::Prune => "prune",
            Operation::ListLeases => "list_leases",
            Operation::Privilege => "privilege",
            Operation::Present => "present",
            Operation::ProtectTable => "protect_table",
            Operation::FencedTables => "fenced_tables",
            Operation::Install => "install",
            Operation::Statement => "statement",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the server refused a write as read-only (SQLSTATE 25006): a standby, or a primary being demoted.
fn is_read_only(error: &DieselError) -> bool {
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _)
    )
}

/// Every failure of a leasehold call, one type so `?` works across them; match on
/// [`LeaseError::kind`]. Refusals of acquire, renew and release are values
/// ([`crate::Refusal`]), a guard's refusal is an error: its write must not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The arguments broke an input rule; nothing changed.
    #[error("invalid input: {}; fix the arguments, nothing changed", .violations.join("; "))]
    InvalidInput {
        /// Every violated rule, e.g. `"key must not be empty"`.
        violations: Vec<String>,
    },
    /// `raise_generation` asked for a generation not above the current one.
    #[error("generation {requested} is not above the current generation {current}; ask for a higher one, nothing changed")]
    GenerationNotAbove {
        /// The generation asked for.
        requested: i64,
        /// The server's current generation.
        current: i64,
    },
    /// `raise_generation` asked for more than [`crate::admin::MAX_GENERATION`].
    #[error(
        "generation {requested} is above the highest generation, {}; nothing changed",
        crate::admin::MAX_GENERATION
    )]
    GenerationTooHigh {
        /// The generation asked for.
        requested: i64,
    },
    /// An acquire or a wait gave up (held key, or a row lock past [`LOCK_WAIT_BOUND`]).
    #[error("timed out after {waited:?} waiting for lease {key:?}; retry later or wait longer")]
    TimedOut {
        /// The key waited for.
        key: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// A wait was cancelled through its [`crate::hold::CancelToken`].
    #[error("waiting for lease {key:?} was cancelled; nothing changed")]
    Cancelled {
        /// The key waited for.
        key: String,
    },
    /// The state the call depends on changed under it (SQLSTATE 40001); nothing
    /// changed: retry the call, or for `lease_namespace_changed` the transaction.
    #[error("lease {operation} of key {key:?} must be retried: {reason}; nothing changed")]
    Retry {
        /// The call to retry.
        operation: Operation,
        /// The key concerned; for a batch call, its first key.
        key: String,
        /// What changed, and what to retry.
        reason: &'static str,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// The connection broke during a mutating autocommitted call: outcome unknown.
    #[error("connection lost during lease {operation} of key {key:?}: the outcome is unknown; inspect the key before acting")]
    OutcomeUnknown {
        /// The call in flight.
        operation: Operation,
        /// The key concerned; for a batch call, its first key.
        key: String,
        /// The connection error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// A guard refused: the epoch is below the resource's record.
    #[error("stale epoch {presented} for resource {resource:?}: it accepts only epochs >= {accepted}; stop acting on this lease")]
    StaleEpoch {
        /// The guarded resource.
        resource: String,
        /// The epoch the writer presented.
        presented: Epoch,
        /// The resource's record: the lowest epoch it admits.
        accepted: Epoch,
    },
    /// A guard refused: the token is of another key than the one fencing the resource.
    #[error("resource {resource:?} is fenced by lease key {fenced_by:?}, not {presented:?}; present a token of {fenced_by:?}")]
    WrongLeaseKey {
        /// The guarded resource.
        resource: String,
        /// The key that fences it.
        fenced_by: String,
        /// The key of the presented token.
        presented: String,
    },
    /// The epoch was never granted for the key (G7); from `fence`, `up_to` above the counter.
    #[error("epoch {presented} of lease key {key:?} was never granted (its counter is {counter}), so it cannot fence resource {resource:?}; present a granted token")]
    EpochNotGranted {
        /// The guarded resource.
        resource: String,
        /// The lease key of the token.
        key: String,
        /// The epoch presented (for `fence`, its `up_to`).
        presented: Epoch,
        /// The key's counter: the highest epoch it has granted or passed.
        counter: Epoch,
    },
    /// A lease-checked guard or a keeper's first renew found the lease not held.
    #[error(
        "lease {key:?} is not held by {owner:?} at epoch {epoch}: {reason}; stop acting on it"
    )]
    LeaseNotHeld {
        /// The lease key.
        key: String,
        /// The owner that presented the token.
        owner: String,
        /// The presented epoch.
        epoch: Epoch,
        /// What happened to the grant.
        reason: Refusal,
    },
    /// A fenced table refused a write (docs/SPECIFICATION.md §2.1); nothing
    /// of the transaction's writes to it becomes visible.
    #[error("write to table {table} refused: {refusal}")]
    TableWriteRefused {
        /// The fenced table, schema-qualified.
        table: String,
        /// Why.
        refusal: TableRefusal,
    },
    /// Only the owner of a table (or a member of its owning role) may fence
    /// it or remove its fence (constraint `lease_table_not_owned`).
    #[error("role {role:?} may not change the fence of table {table}: it does not own it; connect as the table's owner")]
    TableNotOwned {
        /// The table.
        table: String,
        /// The login role that was refused.
        role: String,
    },
    /// The key's or resource's prefix is bound to a role the login role is not a
    /// member of (§4.2); `SET ROLE` does not change who is asked.
    #[error("role {role:?} may not {operation} {argument} {name:?}: an operator bound its prefix to another role; connect as a member of that role")]
    Forbidden {
        /// The refused call.
        operation: Operation,
        /// Which name was refused: `"key"` or `"resource"`.
        argument: String,
        /// The refused key or resource name.
        name: String,
        /// The login role (`session_user`) that was refused.
        role: String,
    },
    /// `list_leases`: no SELECT on `lease.leases` and `lease.groups`; the transaction survives.
    #[error("role {role:?} may not list leases: it lacks SELECT on lease.leases and lease.groups; connect as their owner or have it GRANT SELECT, nothing was read")]
    ListNotPermitted {
        /// The role refused (`current_user`).
        role: String,
    },
    /// The installing role may not create schema `lease`.
    #[error("role {role:?} may not create schema lease in database {database:?}: GRANT CREATE ON DATABASE to it, or install as the database owner; nothing was installed")]
    InstallNotPermitted {
        /// The installing role.
        role: String,
        /// The database.
        database: String,
    },
    /// Another role owns schema `lease` and could replace leasehold's functions.
    #[error("schema lease already exists and is owned by role {owner:?}; have it drop the schema, or install as {owner:?}; nothing was installed")]
    SchemaNotOwned {
        /// The role that owns the existing schema `lease`.
        owner: String,
    },
    /// Another role can put code into schema `lease`, which the install would run.
    #[error("another role can put code into schema lease ({what}), which the install would run as the installing role; drop that object or revoke that privilege first")]
    SchemaNotPrivate {
        /// The object or privilege, and the role that holds it.
        what: String,
    },
    /// leasehold is installed as the extension: the two install paths never mix.
    #[error("leasehold is installed in this database as the extension `leasehold` (version {version}); upgrade it with ALTER EXTENSION leasehold UPDATE, or drop the extension first")]
    ExtensionInstalled {
        /// The installed extension version (`pg_extension.extversion`).
        version: String,
    },
    /// The server is older than PostgreSQL 14.
    #[error("PostgreSQL {found} is not supported: leasehold needs PostgreSQL {minimum} or newer; nothing was installed")]
    UnsupportedVersion {
        /// The server's `server_version`.
        found: String,
        /// The oldest supported major version (14).
        minimum: u32,
    },
    /// A lock the install needs was held past [`crate::admin::INSTALL_LOCK_TIMEOUT`].
    #[error("leasehold install was blocked: another session held a lock it needs for more than {waited:?}; let it finish (pg_locks names it) and install again")]
    Blocked {
        /// How long the install waited for the lock.
        waited: Duration,
        /// The server's lock-timeout error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A migration's SQL failed; the whole install was rolled back.
    #[error("leasehold migration {version} failed and the install was rolled back; the installing role needs CREATE on the database")]
    Migration {
        /// The failing migration's version.
        version: String,
        /// What the migration harness reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The SQL compiled into the crate is unusable: a build problem.
    #[error("leasehold's embedded SQL is unusable ({reason}); rebuild the crate")]
    EmbeddedSql {
        /// The file and what it lacked.
        reason: String,
    },
    /// A schema or function is missing: not installed, or older than this crate.
    #[error("leasehold is not installed in this database ({operation}: {source}); run leasehold::install or `leasehold install` first")]
    NotInstalled {
        /// The call.
        operation: Operation,
        /// The server's error.
        #[source]
        source: DieselError,
    },
    /// The server accepts only reads (SQLSTATE 25006); the pooled clients discard
    /// the connection, so the next call connects anew.
    #[error("lease {operation} refused: the server is read-only (a standby, or a primary being demoted); connect to the primary (target_session_attrs=read-write)")]
    ReadOnlyServer {
        /// The refused call.
        operation: Operation,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// A prepared statement went missing between transactions (a transaction-mode pooler).
    #[error("lease {operation} failed: a prepared statement went missing between transactions; with a transaction-mode pooler use PreparedStatements::Uncached")]
    PreparedStatementLost {
        /// The failed call.
        operation: Operation,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// No connection could be taken from the pool within its timeout.
    #[error("no database connection available from the pool: {0}; check the server, or enlarge the pool")]
    Pool(#[from] r2d2::Error),
    /// The async pool gave no connection within its checkout timeout.
    #[cfg(feature = "async")]
    #[error("no database connection available from the pool: {0}; check the server, or enlarge the pool")]
    AsyncPool(#[from] diesel_async::pooled_connection::deadpool::PoolError),
    /// A connection could not be opened; the source has libpq's whole reason.
    #[error("cannot connect to the database: {}; check the URL and that the server is up", Chain(source.as_ref()))]
    Connect {
        /// Why the connection could not be opened.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No host answered within its `connect_timeout`.
    #[error("no connection to {servers} within {} s (the bound: {setting}, per host); check that the server is up and reachable", after.as_secs_f64())]
    ConnectTimedOut {
        /// The server or servers the URL names, `host:port`, in order.
        servers: String,
        /// How long the attempt was allowed: `connect_timeout` times hosts.
        after: Duration,
        /// Which `connect_timeout` bounded it and where it came from.
        setting: String,
    },
    /// From [`crate::wait::LeaseWaiter::ensure_listening`] only: notifications do not
    /// arrive (e.g. a transaction-mode pooler); waiting still works, by polling.
    #[error("the waiters' listener is not listening ({:?}): {}; point the waiter's URL at the server or a session-mode pooler", .status.wake_mode, .status.last_error.as_deref().unwrap_or("not connected yet"))]
    NotListening {
        /// The listener's state when the check gave up.
        status: Box<ListenerStatus>,
    },
    /// A keeper's or a waiter's thread could not be started.
    #[error("cannot start a leasehold thread; the process is out of threads or memory")]
    Spawn(#[source] std::io::Error),
    /// The database failed the call otherwise; its effect is undone with its transaction.
    #[error("lease {operation} failed in the database: {source}; check the connection and the transaction")]
    Database {
        /// The failed call.
        operation: Operation,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
}

/// So `?` works in a transaction mixing the caller's statements with leasehold's;
/// a fenced table's refusal reads as [`LeaseError::TableWriteRefused`].
impl From<DieselError> for LeaseError {
    fn from(source: DieselError) -> Self {
        LeaseError::from_fence(&source).unwrap_or(LeaseError::Database {
            operation: Operation::Statement,
            source,
        })
    }
}

/// Why a fenced table refused a write.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TableRefusal {
    /// The transaction presented no token of the table's key (or of the
    /// row's key): call `lease.present` ([`crate::guard::Fencing::present`])
    /// in the writing transaction first (constraint `lease_fence_no_token`).
    NoToken {
        /// The key whose token was missing.
        key: String,
    },
    /// The token presented is not the key's live grant (constraint
    /// `lease_guard_lease_not_held`): its holder was superseded, or the
    /// lease lapsed or was released.
    NotHeld {
        /// The key.
        key: String,
        /// The token's owner.
        owner: String,
        /// The token's epoch.
        epoch: Epoch,
        /// What happened to the grant, when the server said.
        reason: Option<Refusal>,
    },
    /// A written row of a row-fenced table has a NULL key column
    /// (constraint `lease_fence_null_key`).
    NullKey,
    /// TRUNCATE of a row-fenced table, which would remove every key's rows
    /// (constraint `lease_fence_truncate`).
    Truncate,
}

impl std::fmt::Display for TableRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableRefusal::NoToken { key } => write!(
                f,
                "no token of lease key {key:?} was presented in this transaction; present one (lease.present) before writing"
            ),
            TableRefusal::NotHeld { key, owner, epoch, reason } => {
                write!(f, "lease {key:?} is not held by {owner:?} at epoch {epoch}")?;
                if let Some(reason) = reason {
                    write!(f, ": {reason}")?;
                }
                write!(f, "; stop acting on it")
            }
            TableRefusal::NullKey => write!(f, "a written row has a NULL key column; give every key column a value"),
            TableRefusal::Truncate => write!(
                f,
                "TRUNCATE would remove every key's rows of a row-fenced table; delete with tokens instead"
            ),
        }
    }
}

/// What a caller does about a [`LeaseError`]; match on this, on variants only for facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Fix the arguments or settings: calling again unchanged fails again.
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

impl LeaseError {
    /// What the caller does about this error.
    pub fn kind(&self) -> ErrorKind {
        use LeaseError as E;
        match self {
            E::InvalidInput { .. } | E::GenerationNotAbove { .. } | E::GenerationTooHigh { .. } => {
                ErrorKind::InvalidInput
            }
            E::TimedOut { .. } | E::Blocked { .. } => ErrorKind::TimedOut,
            E::Cancelled { .. } => ErrorKind::Cancelled,
            E::Retry { .. } => ErrorKind::Retry,
            E::OutcomeUnknown { .. } => ErrorKind::OutcomeUnknown,
            E::StaleEpoch { .. }
            | E::WrongLeaseKey { .. }
            | E::EpochNotGranted { .. }
            | E::LeaseNotHeld { .. } => ErrorKind::Fenced,
            E::TableWriteRefused { refusal, .. } => match refusal {
                TableRefusal::NotHeld { .. } => ErrorKind::Fenced,
                TableRefusal::NoToken { .. } => ErrorKind::Forbidden,
                TableRefusal::NullKey | TableRefusal::Truncate => ErrorKind::InvalidInput,
            },
            E::TableNotOwned { .. }
            | E::Forbidden { .. }
            | E::ListNotPermitted { .. }
            | E::InstallNotPermitted { .. }
            | E::SchemaNotOwned { .. }
            | E::SchemaNotPrivate { .. } => ErrorKind::Forbidden,
            E::NotInstalled { .. }
            | E::ExtensionInstalled { .. }
            | E::UnsupportedVersion { .. } => ErrorKind::NotInstalled,
            E::ReadOnlyServer { .. }
            | E::PreparedStatementLost { .. }
            | E::Pool(_)
            | E::Connect { .. }
            | E::ConnectTimedOut { .. }
            | E::NotListening { .. }
            | E::Spawn(_) => ErrorKind::Unavailable,
            #[cfg(feature = "async")]
            E::AsyncPool(_) => ErrorKind::Unavailable,
            E::Database { source, .. } if is_dead_connection(source) => ErrorKind::Unavailable,
            E::Migration { .. } | E::EmbeddedSql { .. } | E::Database { .. } => ErrorKind::Other,
        }
    }

    /// The connection error of a failed connect, boxed as its source.
    pub(crate) fn connect(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        LeaseError::Connect {
            source: Box::new(source),
        }
    }
}

impl LeaseError {
    /// A fenced table's refusal of a write, or of a change of its fence, if
    /// `error` is one.
    pub(crate) fn from_fence(error: &DieselError) -> Option<Self> {
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
        let refusal = match info.constraint_name()? {
            names::FENCE_NO_TOKEN => TableRefusal::NoToken { key: field("key") },
            names::FENCE_NULL_KEY => TableRefusal::NullKey,
            names::FENCE_TRUNCATE => TableRefusal::Truncate,
            names::GUARD_NOT_HELD if !field("table").is_empty() => {
                let detail = detail.as_ref()?;
                let epoch: i64 = detail.number("epoch").unwrap_or(0);
                let reason = detail
                    .text("reason")
                    .and_then(Status::parse)
                    .and_then(|status| {
                        Refusal::from_answer(
                            status,
                            detail.text("why"),
                            detail.number("newest"),
                            epoch,
                        )
                    });
                TableRefusal::NotHeld {
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
                return Some(LeaseError::Forbidden {
                    operation: Operation::Present,
                    argument: "key".to_owned(),
                    name: name.to_owned(),
                    role: role.to_owned(),
                });
            }
            names::TABLE_NOT_OWNED => {
                return Some(LeaseError::TableNotOwned {
                    table: field("table"),
                    role: field("role"),
                })
            }
            names::TABLE_NOT_FENCEABLE | names::TABLE_ALREADY_FENCED => {
                return Some(LeaseError::InvalidInput {
                    violations: vec![info.message().to_owned()],
                })
            }
            _ => return None,
        };
        Some(LeaseError::TableWriteRefused {
            table: field("table"),
            refusal,
        })
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
        if let DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _) = &error {
            if autocommit && operation.mutates() {
                return LeaseError::OutcomeUnknown {
                    operation,
                    key: key.to_owned(),
                    source: error,
                };
            }
        }
        if decode::is_not_installed(&error) {
            return LeaseError::NotInstalled {
                operation,
                source: error,
            };
        }
        if is_read_only(&error) {
            return LeaseError::ReadOnlyServer {
                operation,
                source: error,
            };
        }
        if decode::is_prepared_statement_lost(&error) {
            return LeaseError::PreparedStatementLost {
                operation,
                source: error,
            };
        }
        if let DieselError::DatabaseError(_, info) = &error {
            match info.constraint_name() {
                Some(names::INVALID_INPUT) => {
                    return LeaseError::InvalidInput {
                        violations: decode::violations(info.as_ref()),
                    }
                }
                Some(names::WAIT_TIMEOUT) => {
                    return LeaseError::TimedOut {
                        key: key.to_owned(),
                        waited: if wait.is_zero() {
                            LOCK_WAIT_BOUND
                        } else {
                            wait
                        },
                    }
                }
                Some(names::CONTENTION) => {
                    return LeaseError::Retry {
                        operation,
                        key: key.to_owned(),
                        reason: "the key's state changed under the call twice (retry the call)",
                        source: error,
                    };
                }
                Some(names::NAMESPACE_CHANGED) => {
                    return LeaseError::Retry {
                        operation,
                        key: key.to_owned(),
                        reason: "the namespace rules changed after this transaction's snapshot (retry the transaction)",
                        source: error,
                    };
                }
                Some(names::NAMESPACE_DENIED) => {
                    let detail = Detail::of(info.as_ref());
                    let refused = detail.as_ref().and_then(Detail::forbidden);
                    return LeaseError::Forbidden {
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
        LeaseError::Database {
            operation,
            source: error,
        }
    }

    /// An input rule broken before the call was sent.
    pub(crate) fn invalid(violation: String) -> Self {
        LeaseError::InvalidInput {
            violations: vec![violation],
        }
    }

    /// [`LeaseError::from_diesel`] for keyless calls that never wait (operator, prune).
    pub(crate) fn from_keyless(operation: Operation, error: DieselError, autocommit: bool) -> Self {
        LeaseError::from_diesel(operation, error, "", Duration::ZERO, autocommit)
    }

    /// `lease.raise_generation`'s error: not above the current one is [`LeaseError::GenerationNotAbove`].
    pub(crate) fn from_raise_generation(
        error: DieselError,
        requested: i64,
        autocommit: bool,
    ) -> Self {
        if let DieselError::DatabaseError(_, info) = &error {
            if info.constraint_name() == Some(names::GENERATION_NOT_ABOVE) {
                if let Some(current) =
                    Detail::of(info.as_ref()).and_then(|detail| detail.number::<i64>("current"))
                {
                    return LeaseError::GenerationNotAbove { requested, current };
                }
            }
        }
        LeaseError::from_keyless(Operation::RaiseGeneration, error, autocommit)
    }
}

impl LeaseError {
    /// An install step's error as [`LeaseError::Blocked`] when its lock_timeout fired
    /// (matched on the message: diesel does not expose 55P03), else `otherwise`.
    pub(crate) fn install_blocked_or(
        source: Box<dyn std::error::Error + Send + Sync>,
        otherwise: impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> LeaseError,
    ) -> LeaseError {
        if decode::is_lock_timeout(&source.to_string()) {
            LeaseError::Blocked {
                waited: crate::sql::install::INSTALL_LOCK_TIMEOUT,
                source,
            }
        } else {
            otherwise(source)
        }
    }

    /// Maps a diesel error of the install bookkeeping to its typed meaning.
    pub(crate) fn from_install_diesel(error: DieselError) -> Self {
        if decode::is_lock_timeout(&error.to_string()) {
            return LeaseError::Blocked {
                waited: crate::sql::install::INSTALL_LOCK_TIMEOUT,
                source: Box::new(error),
            };
        }
        if let DieselError::DatabaseError(_, info) = &error {
            if info.constraint_name() == Some(names::UNSUPPORTED_VERSION) {
                if let Some((minimum, found)) = info.details().and_then(decode::unsupported_version)
                {
                    return LeaseError::UnsupportedVersion {
                        found: found.to_owned(),
                        minimum,
                    };
                }
            }
            if info.constraint_name() == Some(names::INSTALL_NOT_PERMITTED) {
                if let Some((role, database)) = info.details().and_then(decode::role_and_database) {
                    return LeaseError::InstallNotPermitted {
                        role: role.to_owned(),
                        database: database.to_owned(),
                    };
                }
            }
            if info.constraint_name() == Some(names::SCHEMA_NOT_PRIVATE) {
                if let Some(what) = info.details().and_then(decode::schema_not_private) {
                    return LeaseError::SchemaNotPrivate {
                        what: what.to_owned(),
                    };
                }
            }
            if info.constraint_name() == Some(names::SCHEMA_NOT_OWNED) {
                if let Some(owner) = info.details().and_then(decode::schema_owner) {
                    return LeaseError::SchemaNotOwned {
                        owner: owner.to_owned(),
                    };
                }
            }
        }
        LeaseError::Database {
            operation: Operation::Install,
            source: error,
        }
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

impl LeaseError {
    pub(crate) fn from_guard_diesel(context: &GuardContext<'_>, error: DieselError) -> Self {
        if decode::is_not_installed(&error) {
            return LeaseError::NotInstalled {
                operation: context.operation,
                source: error,
            };
        }
        if is_read_only(&error) {
            return LeaseError::ReadOnlyServer {
                operation: context.operation,
                source: error,
            };
        }
        if let DieselError::DatabaseError(_, info) = &error {
            if info.constraint_name() == Some(names::INVALID_INPUT) {
                return LeaseError::InvalidInput {
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
                        return LeaseError::StaleEpoch {
                            resource: context.resource.to_owned(),
                            presented: context.epoch,
                            accepted: Epoch::new(accepted),
                        };
                    }
                }
                Some(names::GUARD_WRONG_KEY) => {
                    if let Some(fenced_by) = field("fenced_by") {
                        return LeaseError::WrongLeaseKey {
                            resource: context.resource.to_owned(),
                            fenced_by: fenced_by.to_owned(),
                            presented: context.key.to_owned(),
                        };
                    }
                }
                Some(names::GUARD_EPOCH_NOT_GRANTED) => {
                    if let Some(counter) = number("counter") {
                        return LeaseError::EpochNotGranted {
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
                    return LeaseError::Forbidden {
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
                        return LeaseError::LeaseNotHeld {
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
        LeaseError::Database {
            operation: context.operation,
            source: error,
        }
    }
}

/// The one discard rule, private so only the sealed traits of `crate::api` name it.
mod call {
    /// A pooled call's error: how a failed checkout reads, and whether the connection must go.
    pub trait CallError {
        /// A checkout from the sync pool that failed.
        fn from_checkout(error: r2d2::Error) -> Self;
        /// A checkout from the async pool that failed.
        #[cfg(feature = "async")]
        fn from_async_checkout(error: diesel_async::pooled_connection::deadpool::PoolError)
            -> Self;
        /// Whether the connection is dead, read-only or lost its prepared statements.
        fn discards_connection(&self) -> bool;
    }
}

impl CallError for LeaseError {
    fn from_checkout(error: r2d2::Error) -> Self {
        LeaseError::Pool(error)
    }

    #[cfg(feature = "async")]
    fn from_async_checkout(error: diesel_async::pooled_connection::deadpool::PoolError) -> Self {
        LeaseError::AsyncPool(error)
    }

    fn discards_connection(&self) -> bool {
        self.is_connection_error() || matches!(self, LeaseError::PreparedStatementLost { .. })
    }
}

impl LeaseError {
    /// Whether the connection (not the request) failed, or reaches a read-only server:
    /// it leaves the pool, and the waiter and keeper retry on a new one.
    pub(crate) fn is_connection_error(&self) -> bool {
        match self {
            LeaseError::Pool(_)
            | LeaseError::OutcomeUnknown { .. }
            | LeaseError::ReadOnlyServer { .. }
            | LeaseError::Connect { .. }
            | LeaseError::ConnectTimedOut { .. } => true,
            #[cfg(feature = "async")]
            LeaseError::AsyncPool(_) => true,
            LeaseError::Database { source, .. } => is_dead_connection(source),
            _ => false,
        }
    }
}

/// Whether diesel says the session itself is gone.
fn is_dead_connection(error: &DieselError) -> bool {
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _)
            | DieselError::DatabaseError(DatabaseErrorKind::UnableToSendCommand, _)
            | DieselError::BrokenTransactionManager
    )
}

/// An error and its sources, `: `-separated, as one line.
#[cfg(feature = "async")]
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    Chain(error).to_string()
}

/// An error and its sources, `: `-separated.
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // libpq's messages span lines: joined with spaces, the chain stays one line.
        let one_line = |error: &dyn std::error::Error| {
            error
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        write!(f, "{}", one_line(self.0))?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {}", one_line(error))?;
            source = error.source();
        }
        Ok(())
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
        match &error {
            LeaseError::UnsupportedVersion { found, minimum } => {
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
        {
            LeaseError::SchemaNotOwned { owner } => assert_eq!(owner, "squatter"),
            other => panic!("expected SchemaNotOwned, got {other:?}"),
        }
    }

    #[test]
    fn an_unreadable_detail_keeps_the_database_error() {
        let error =
            LeaseError::from_install_diesel(reported("lease_unsupported_version", "garbled"));
        assert!(matches!(error, LeaseError::Database { .. }), "{error:?}");
    }
}
