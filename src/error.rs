//! Every error type, each keeping its source. One call returns one of
//! them: lease calls [`LeaseError`], guard calls [`GuardError`], and so on.
//!
//! Callers match on meaning, never on message text: the SQL functions put a
//! stable name in the error's `CONSTRAINT` field (see `sql::names`),
//! and this module turns those names into variants. Messages are one line
//! that says what happened; the underlying error is kept and reachable
//! through [`std::error::Error::source`], never flattened into text. What to
//! do about each error is in the variant's documentation.

use std::fmt;
use std::time::Duration;

pub use crate::admin::extension::ExtensionError;
pub use crate::guard::database::FencedError;
pub use crate::lease::token::TokenError;
pub use crate::wait::WaitError;
pub(crate) use call::CallError;

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::lease::epoch::Epoch;
use crate::lease::outcome::Refusal;
use crate::sql::decode::{self, Status};
use crate::sql::names;

/// How long a call without a wait (`acquire`, and `acquire_waiting` with a
/// zero wait) waits at most for a row lock another transaction holds on its
/// key before it gives up with [`LeaseError::TimedOut`]: an uncommitted
/// grant, or a transaction that checked the lease (docs/SPECIFICATION.md
/// §1.5). A call with a wait waits for locks within that wait.
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
    /// `lease.join_group`: renew several keys of one owner and put them in
    /// one heartbeat group.
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
    /// `lease.prune_keys` / `lease.prune_guards`: an operator removes idle
    /// rows.
    Prune,
    /// A listing of keys ([`crate::admin::Operator::list_leases`]): an operator reads
    /// `lease.leases` and `lease.groups`.
    ListLeases,
    /// A privilege question ([`crate::admin::function_privilege`]): may the
    /// connected role run a function.
    Privilege,
}

impl Operation {
    /// Whether the call can change state, so that a connection lost while
    /// it autocommits leaves its outcome unknown.
    fn mutates(self) -> bool {
        !matches!(
            self,
            Operation::Inspect
                | Operation::InspectGuard
                | Operation::ListNamespaces
                | Operation::Generation
                | Operation::ListLeases
                | Operation::Privilege
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
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the server refused a write because it accepts only reads
/// (SQLSTATE 25006, which diesel reports as
/// [`DatabaseErrorKind::ReadOnlyTransaction`]). A hot standby raises it
/// for every write ("cannot execute ... in a read-only transaction", and
/// "... during recovery" for `NOTIFY`), and so does a primary with
/// `default_transaction_read_only = on`: that is the state a server is in
/// while an operator or a failover manager demotes it.
/// Whether `error` says one of diesel's named prepared statements
/// (`__diesel_stmt_<n>`) was missing on the server session or already
/// existed there: what a transaction-mode pooler does to them, handing the
/// next transaction a server session other than the one that prepared it.
/// diesel does not expose the SQLSTATE (26000 or 42P05), so the message is
/// matched; it names diesel's own statement, so no other error matches.
pub(crate) fn is_prepared_statement_lost(error: &DieselError) -> bool {
    let DieselError::DatabaseError(_, info) = error else {
        return false;
    };
    let message = info.message();
    message.contains("prepared statement \"__diesel_stmt_")
        && (message.contains("does not exist") || message.contains("already exists"))
}

/// Whether `error` says the lease schema or one of its functions does not
/// exist: leasehold is not installed in this database (or is older than
/// this crate). Read from the server's message (diesel does not expose the
/// SQLSTATE, 3F000 or 42883); a server whose messages are translated
/// (`lc_messages`) falls back to the `Database` variant, whose message
/// carries the server's own.
fn is_not_installed(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(_, info) => {
            let message = info.message();
            message.contains("schema \"lease\" does not exist")
                || ((message.starts_with("function lease.")
                    || message.starts_with("relation \"lease."))
                    && message.ends_with("does not exist"))
        }
        _ => false,
    }
}

fn is_read_only(error: &DieselError) -> bool {
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _)
    )
}

/// Errors of the lease operations: acquire, renew, release and inspect.
///
/// A refused acquire, a lapsed lease or an epoch mismatch are *not* errors:
/// they are ordinary outcomes ([`crate::Acquisition::Denied`],
/// [`crate::Refusal`]). These variants are failures of the call itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The arguments broke the lease functions' input rules; nothing
    /// changed. Fix the arguments; calling again unchanged fails again.
    #[error("invalid lease input: {}", .violations.join("; "))]
    InvalidInput {
        /// Every violated rule, e.g. `"key must not be empty"`.
        violations: Vec<String>,
    },
    /// An acquire gave up; nothing changed. Either another owner held the
    /// key for the whole wait, or another transaction kept the key's row
    /// locked for the whole wait — for a call without a wait, for
    /// [`LOCK_WAIT_BOUND`] (an uncommitted grant, or a transaction that
    /// checked the lease and has not ended). Retry later, wait longer, or
    /// inspect the key.
    #[error("timed out after {waited:?} waiting for lease {key:?}")]
    TimedOut {
        /// The key waited for.
        key: String,
        /// How long the call waited: its wait bound, or
        /// [`LOCK_WAIT_BOUND`] for a call without a wait.
        waited: Duration,
    },
    /// An operator bound the key's prefix to a role the connected login role
    /// is not a member of (docs/SPECIFICATION.md §4.2, SQLSTATE 42501,
    /// constraint `lease_namespace_denied`); nothing changed and nothing
    /// about the key's state was revealed. Calling again as the same login
    /// role fails again, whatever `SET ROLE` says: connect as a member of
    /// the role the prefix is bound to, or ask an operator to change the rule.
    #[error("role {role:?} may not {operation} key {key:?}: an operator bound its prefix to another role")]
    Forbidden {
        /// The refused call.
        operation: Operation,
        /// The key refused.
        key: String,
        /// The login role (`session_user`) that was refused.
        role: String,
    },
    /// The connection broke while an autocommitted acquire, renew or release
    /// was in flight, so it may or may not have committed. Neither success
    /// nor failure may be assumed: re-read the key with `inspect` (or repeat
    /// an acquire, which is idempotent for its owner) before acting.
    #[error("connection lost during lease {operation} of key {key:?}: the outcome is unknown")]
    OutcomeUnknown {
        /// The call in flight: acquire, renew or release (or a batch of
        /// them).
        operation: Operation,
        /// The key concerned; for a batch call, its first key.
        key: String,
        /// The connection error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// Retry: the call changed nothing because the state it depends on
    /// changed under it (SQLSTATE 40001). Either the key's row changed twice
    /// while the call settled it (`lease_contention`: retry the call), or,
    /// under REPEATABLE READ or SERIALIZABLE, the namespace rules changed
    /// after the transaction's snapshot was taken
    /// (`lease_namespace_changed`: roll back and retry the transaction,
    /// whose new snapshot sees the rules as they are).
    #[error("lease {operation} of key {key:?} must be retried: {reason}; nothing changed")]
    Retry {
        /// The call to retry.
        operation: Operation,
        /// The key concerned; for a batch call, its first key.
        key: String,
        /// What changed, in words.
        reason: &'static str,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// The database failed the call (connection lost, lease functions not
    /// installed, the caller's transaction already aborted, ...). The call's
    /// effect is undone with its transaction. Check the connection and that
    /// [`crate::install`] has run on this database.
    #[error("lease {operation} failed in the database: {source}")]
    Database {
        /// The failed call.
        operation: Operation,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// leasehold is not installed in this database, or is older than this
    /// crate (the lease schema or function does not exist). Nothing
    /// changed. Run [`crate::install`] (or `leasehold install`) as the
    /// role that should own leasehold.
    #[error("leasehold is not installed in this database (lease {operation}: {source}); run leasehold::install or `leasehold install` first")]
    NotInstalled {
        /// The call.
        operation: Operation,
        /// The server's error.
        #[source]
        source: DieselError,
    },
    /// The server accepts only reads (SQLSTATE 25006): a hot standby, a
    /// primary being demoted or not yet promoted during a failover (e.g.
    /// `default_transaction_read_only = on`), or a `READ ONLY` transaction
    /// of the caller's. Nothing changed: a read-only server refuses the
    /// call before it writes. Connect to the primary: list every host in the
    /// URL and add `target_session_attrs=read-write`, so that libpq skips
    /// read-only servers. The pooled clients ([`crate::LeaseClient`],
    /// [`crate::wait::LeaseWaiter`], [`crate::Keeper`]) discard the connection
    /// after this error, so their next call connects anew and reaches
    /// whichever server is the primary by then.
    #[error("lease {operation} refused: the server is read-only (a standby, or a primary being demoted); connect to the primary")]
    ReadOnlyServer {
        /// The refused call.
        operation: Operation,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// A statement the connection had prepared was missing on the server,
    /// or its name was already taken there: the connection goes through a
    /// pooler in transaction mode (PgBouncer `pool_mode = transaction`),
    /// which runs each transaction on whichever server session is free.
    /// Whether the call was applied is unknown only if it was the execution
    /// that failed; it never was, since a missing statement fails before it
    /// runs. Use [`crate::pool::PreparedStatements::Uncached`] (or disable the
    /// statement cache of your own connection) with such a pooler, or point
    /// the client at a session-mode pooler or at the server. The pooled
    /// clients discard the connection after this error.
    #[error("lease {operation} failed: a prepared statement went missing between transactions; a transaction-mode pooler needs PreparedStatements::Uncached")]
    PreparedStatementLost {
        /// The failed call.
        operation: Operation,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// [`crate::admin::Operator::list_leases`]: the connected role may not read
    /// `lease.leases` and `lease.groups`, which a listing reads and which
    /// are closed to every role but their owner (the role that installed
    /// leasehold) by design (docs/PRIVILEGES.md). Nothing was read, and the
    /// caller's transaction is not aborted: the server was asked first.
    /// Calling again as the same role fails again: connect as the owner or
    /// a superuser, have the owner `GRANT SELECT ON lease.leases,
    /// lease.groups` to the role, or ask about single keys with
    /// [`crate::Leases::inspect`], which every role may.
    #[error("role {role:?} may not list leases: it lacks SELECT on lease.leases and lease.groups, which are closed to callers by design; nothing was read")]
    ListNotPermitted {
        /// The role refused (`current_user`: the one `SET ROLE` chose).
        role: String,
    },
    /// [`crate::admin::Operator::raise_generation`] was asked for a generation not
    /// above the current one: a generation is only ever raised. Nothing
    /// changed.
    #[error("generation {requested} is not above the current generation {current}")]
    GenerationNotAbove {
        /// The generation asked for.
        requested: i64,
        /// The server's current generation.
        current: i64,
    },
    /// [`crate::admin::Operator::raise_generation`] was asked for a generation above
    /// [`crate::admin::MAX_GENERATION`]. Nothing changed.
    #[error(
        "generation {requested} is above the highest generation, {}",
        crate::admin::MAX_GENERATION
    )]
    GenerationTooHigh {
        /// The generation asked for.
        requested: i64,
    },
    /// No connection could be taken from the pool: the database is
    /// unreachable or the pool is too small for the load. The message
    /// carries r2d2's, which names the last connection error when there
    /// was one.
    #[error("no database connection available from the pool: {0}")]
    Pool(#[from] r2d2::Error),
    /// The async face's [`crate::aio::AsyncLeaseClient`]: no connection
    /// could be taken from its pool within the checkout timeout (the
    /// database is unreachable, or the pool is too small for the load). The
    /// message carries deadpool's, which names the connection error when
    /// there was one.
    #[cfg(feature = "async")]
    #[error("no database connection available from the pool: {0}")]
    AsyncPool(#[from] diesel_async::pooled_connection::deadpool::PoolError),
    /// Building a client, waiter or pool: the first connection failed, so
    /// no pool was built (a wrong password, user, host, port or database
    /// name, or a server that is down). The message is libpq's, at once,
    /// instead of a pool that waits for connections that never come.
    #[error("cannot connect to the database: {source}")]
    Connect {
        /// What libpq said.
        #[source]
        source: diesel::ConnectionError,
    },
    /// Building an [`crate::aio::AsyncLeaseClient`]: the first connection
    /// failed or ran out of its `connect_timeout`, so no pool was built.
    /// The source says which: [`crate::aio::ConnectError::TimedOut`]
    /// (which servers, after how long, which setting), or the driver's
    /// error with its whole reason (`Connection refused (os error 111)`,
    /// the server's FATAL).
    #[cfg(feature = "async")]
    #[error("cannot connect to the database: {source}")]
    AsyncConnect {
        /// Why the connection could not be opened.
        #[source]
        source: ConnectError,
    },
}

impl LeaseError {
    /// Maps a diesel error raised by a lease function to its typed meaning.
    /// `autocommit` says whether the call ran outside any transaction of
    /// the caller's (read before the call; see `crate::leases`).
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
        if is_not_installed(&error) {
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
        if is_prepared_statement_lost(&error) {
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
                    let refused = info.details().and_then(decode::forbidden);
                    return LeaseError::Forbidden {
                        operation,
                        key: refused.as_ref().map_or(key, |r| r.name).to_owned(),
                        role: refused.map_or_else(String::new, |r| r.role.to_owned()),
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

    /// [`LeaseError::from_diesel`] for a call that names no key and never
    /// waits: the operator calls and prune.
    pub(crate) fn from_keyless(operation: Operation, error: DieselError, autocommit: bool) -> Self {
        LeaseError::from_diesel(operation, error, "", Duration::ZERO, autocommit)
    }

    /// Maps a diesel error raised by `lease.raise_generation` for the
    /// generation `requested`: a generation not above the current one is
    /// [`LeaseError::GenerationNotAbove`], anything else as any call.
    pub(crate) fn from_raise_generation(
        error: DieselError,
        requested: i64,
        autocommit: bool,
    ) -> Self {
        if let DieselError::DatabaseError(_, info) = &error {
            if info.constraint_name() == Some(names::GENERATION_NOT_ABOVE) {
                if let Some(current) = info
                    .details()
                    .and_then(|detail| decode::detail_field(detail, "current"))
                    .and_then(|current| current.parse::<i64>().ok())
                {
                    return LeaseError::GenerationNotAbove { requested, current };
                }
            }
        }
        LeaseError::from_keyless(Operation::RaiseGeneration, error, autocommit)
    }
}

/// Errors of [`crate::install`] and [`crate::admin::uninstall`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstallError {
    /// A migration's SQL failed; the whole install was rolled back. The
    /// installing role needs CREATE on the database
    /// (`GRANT CREATE ON DATABASE <db> TO <role>`).
    #[error("leasehold migration {version} failed; the install was rolled back")]
    Migration {
        /// The failing migration's version.
        version: String,
        /// What the migration harness reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Schema `lease` already exists and another role owns it; nothing was
    /// installed or changed. Whoever owns the schema could replace
    /// leasehold's functions and run code as their owner, so leasehold never
    /// installs into a schema it did not create. Have `owner` (or a
    /// superuser) drop the schema, or install as `owner` if that role is
    /// meant to own leasehold.
    #[error("schema lease already exists and is owned by role {owner:?}, not by the installing role; leasehold installs only into a schema the installing role owns")]
    SchemaNotOwned {
        /// The role that owns the existing schema `lease`.
        owner: String,
    },
    /// Schema `lease` is the installing role's, but another role can put
    /// code into it: an object of its own there, CREATE on the schema, or
    /// TRIGGER on one of its tables. The migrations would run that code as
    /// the installing role (a superuser's install included), so nothing was
    /// installed. Drop the object or revoke the privilege first.
    #[error("another role can put code into schema lease ({what}), which the install would run as the installing role; drop that object or revoke that privilege first")]
    SchemaNotPrivate {
        /// The object or privilege, and the role that holds it.
        what: String,
    },
    /// Leasehold is installed in this database as the PostgreSQL extension
    /// `leasehold` (`CREATE EXTENSION`), so its migrations are not run
    /// (nothing was changed): the two install paths are never mixed in one
    /// database. Upgrade it with `ALTER EXTENSION leasehold UPDATE`, or
    /// `DROP EXTENSION leasehold` first to switch to the migrations.
    #[error("leasehold is installed in this database as the extension `leasehold` (version {version}); it is upgraded with ALTER EXTENSION leasehold UPDATE, not by leasehold::install (the two install paths are never mixed)")]
    ExtensionInstalled {
        /// The installed extension version (`pg_extension.extversion`).
        version: String,
    },
    /// The server is older than the oldest supported PostgreSQL major
    /// version (14); nothing was installed or changed. Migration 1 refuses
    /// such a server the same way (SQLSTATE 0A000, constraint
    /// `lease_unsupported_version`), so Diesel's runner refuses it too.
    #[error("PostgreSQL {found} is not supported: leasehold needs PostgreSQL {minimum} or newer; nothing was installed")]
    UnsupportedVersion {
        /// The server's version as it reports it (`server_version`, e.g.
        /// `13.11` or `13.11 (Debian 13.11-1.pgdg120+1)`).
        found: String,
        /// The oldest supported major version (14).
        minimum: u32,
    },
    /// Another session held a lock the install needs (the install lock of a
    /// concurrent `install`, schema `lease` being created, a table being
    /// used) for longer than the install waits, [`crate::admin::INSTALL_LOCK_TIMEOUT`];
    /// nothing was installed or changed. Find the session in `pg_locks` and
    /// `pg_stat_activity`, let it finish, and install again.
    #[error("leasehold install was blocked: another session held a lock it needs for more than {waited:?} (lock_timeout); nothing was installed")]
    Blocked {
        /// How long the install waited for the lock.
        waited: std::time::Duration,
        /// The server's lock-timeout error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The installing role may not create schema `lease` in this database
    /// (it has no CREATE on the database, and there is no schema `lease` of
    /// its own). Nothing was installed.
    #[error("role {role:?} may not create schema lease in database {database:?}: GRANT CREATE ON DATABASE to it, or install as the database owner; nothing was installed")]
    NotPermitted {
        /// The installing role.
        role: String,
        /// The database.
        database: String,
    },
    /// The install bookkeeping (schema `lease`, its version table, the
    /// install lock) could not be read or written.
    #[error("leasehold install bookkeeping failed: {0}")]
    Database(#[from] DieselError),
    /// The migrations embedded in the crate could not be listed: a build
    /// problem, fixed by rebuilding the crate.
    #[error("the embedded leasehold migrations could not be read")]
    Embedded(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl InstallError {
    /// An install step's error as [`InstallError::Blocked`] when the server
    /// cancelled it for its lock_timeout, else as `otherwise`. The server
    /// reports it as `canceling statement due to lock timeout` (SQLSTATE
    /// 55P03, which diesel does not expose).
    pub(crate) fn blocked_or(
        source: Box<dyn std::error::Error + Send + Sync>,
        otherwise: impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> InstallError,
    ) -> InstallError {
        if source.to_string().contains("lock timeout") {
            InstallError::Blocked {
                waited: crate::sql::install::INSTALL_LOCK_TIMEOUT,
                source,
            }
        } else {
            otherwise(source)
        }
    }

    /// Maps a diesel error of the install bookkeeping to its typed meaning.
    pub(crate) fn from_diesel(error: DieselError) -> Self {
        if error.to_string().contains("lock timeout") {
            return InstallError::Blocked {
                waited: crate::sql::install::INSTALL_LOCK_TIMEOUT,
                source: Box::new(error),
            };
        }
        if let DieselError::DatabaseError(_, info) = &error {
            if info.constraint_name() == Some(names::UNSUPPORTED_VERSION) {
                if let Some((minimum, found)) = info.details().and_then(decode::unsupported_version)
                {
                    return InstallError::UnsupportedVersion {
                        found: found.to_owned(),
                        minimum,
                    };
                }
            }
            if info.constraint_name() == Some(names::INSTALL_NOT_PERMITTED) {
                if let Some((role, database)) = info.details().and_then(decode::role_and_database) {
                    return InstallError::NotPermitted {
                        role: role.to_owned(),
                        database: database.to_owned(),
                    };
                }
            }
            if info.constraint_name() == Some(names::SCHEMA_NOT_PRIVATE) {
                if let Some(what) = info.details().and_then(decode::schema_not_private) {
                    return InstallError::SchemaNotPrivate {
                        what: what.to_owned(),
                    };
                }
            }
            if info.constraint_name() == Some(names::SCHEMA_NOT_OWNED) {
                if let Some(owner) = info.details().and_then(decode::schema_owner) {
                    return InstallError::SchemaNotOwned {
                        owner: owner.to_owned(),
                    };
                }
            }
        }
        InstallError::Database(error)
    }
}

/// Errors of the guard operations. A refusal rolls back the caller's
/// transaction (or savepoint): nothing of the refused write is visible.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// The presented epoch is below the resource's record: a newer holder
    /// has written (or an operator fenced this epoch out). Stop acting on
    /// this lease; re-acquire it for a new epoch if needed.
    #[error(
        "stale epoch {presented} for resource {resource:?}: it accepts only epochs >= {accepted}"
    )]
    StaleEpoch {
        /// The guarded resource.
        resource: String,
        /// The epoch the writer presented.
        presented: Epoch,
        /// The resource's record: the lowest epoch it admits.
        accepted: Epoch,
    },
    /// The token belongs to another lease key than the one fencing the
    /// resource: a programming error, refused rather than ignored.
    #[error("resource {resource:?} is fenced by lease key {fenced_by:?}, not {presented:?}")]
    WrongLeaseKey {
        /// The guarded resource.
        resource: String,
        /// The key that fences it.
        fenced_by: String,
        /// The key of the presented token.
        presented: String,
    },
    /// The presented epoch was never granted for the key: above its counter,
    /// or any epoch of a key never leased in this database. A forged or
    /// mistaken token, refused so that nobody can fence out the key's real
    /// holders with it (G7); nothing changed. From [`crate::guard::Fencing::fence`], the
    /// `up_to` was above the counter.
    #[error(
        "epoch {presented} of lease key {key:?} was never granted (its counter is {counter}), so it cannot fence resource {resource:?}"
    )]
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
    /// A lease-checked write found the lease not held by the token's owner
    /// and epoch. Stop acting on it; re-acquire it for a new epoch if needed.
    #[error("lease {key:?} is not held by {owner:?} at epoch {epoch}: {reason}")]
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
    /// An operator bound the prefix of the resource or of the token's key to
    /// a role the connected login role is not a member of
    /// (docs/SPECIFICATION.md §4.2, SQLSTATE 42501, constraint
    /// `lease_namespace_denied`). Nothing was admitted, and the caller's
    /// transaction (or savepoint) is rolled back. Connect as a member of the
    /// bound role; `SET ROLE` does not change who the guard sees.
    #[error("role {role:?} may not {operation} {argument} {name:?}: an operator bound its prefix to another role")]
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
    /// The arguments broke the guard functions' input rules; nothing changed.
    #[error("invalid guard input: {}", .violations.join("; "))]
    InvalidInput {
        /// Every violated rule.
        violations: Vec<String>,
    },
    /// leasehold is not installed in this database, or is older than this
    /// crate; the caller's transaction is rolled back. Run
    /// [`crate::install`] (or `leasehold install`).
    #[error("leasehold is not installed in this database (guard {operation}: {source}); run leasehold::install or `leasehold install` first")]
    NotInstalled {
        /// The call.
        operation: Operation,
        /// The server's error.
        #[source]
        source: DieselError,
    },
    /// The database failed the call; the caller's transaction is rolled
    /// back. Check the connection and that [`crate::install`] has run.
    #[error("guard {operation} failed in the database: {source}")]
    Database {
        /// The failed call.
        operation: Operation,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// The server accepts only reads (SQLSTATE 25006): a hot standby, a
    /// primary being demoted during a failover, or a `READ ONLY`
    /// transaction. Nothing was admitted and the caller's transaction is
    /// rolled back. Run fenced writes on the primary (see
    /// [`LeaseError::ReadOnlyServer`]).
    #[error("guard {operation} refused: the server is read-only (a standby, or a primary being demoted); connect to the primary")]
    ReadOnlyServer {
        /// The refused call.
        operation: Operation,
        /// The database error as diesel reported it.
        #[source]
        source: DieselError,
    },
    /// No connection could be taken from the pool (r2d2's message, which
    /// names the last connection error when there was one).
    #[error("no database connection available from the pool: {0}")]
    Pool(#[from] r2d2::Error),
    /// The async face's [`crate::aio::AsyncLeaseClient`]: no connection
    /// could be taken from its pool (deadpool's message).
    #[cfg(feature = "async")]
    #[error("no database connection available from the pool: {0}")]
    AsyncPool(#[from] diesel_async::pooled_connection::deadpool::PoolError),
}

/// Why a keeper could not be built or stopped cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeeperError {
    /// The configuration cannot keep a lease alive; fix the setting and
    /// start again.
    #[error("invalid keeper configuration: {reason}")]
    InvalidConfig {
        /// Which rule the settings broke.
        reason: String,
    },
    /// A keeper thread could not be started (the process is out of
    /// threads or memory).
    #[error("cannot start a keeper thread")]
    Spawn(#[source] std::io::Error),
    /// The first renew found the lease already lost.
    #[error("lease {key:?} is no longer held: {reason}")]
    NotHeld {
        /// The lease key.
        key: String,
        /// What the renew answered.
        reason: Refusal,
    },
    /// A renew or release call failed.
    #[error("a keeper's lease call failed")]
    Lease(#[from] LeaseError),
}

/// What a guard call was about, so a refusal can be reported with its facts.
pub(crate) struct GuardContext<'a> {
    pub(crate) operation: Operation,
    pub(crate) resource: &'a str,
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) epoch: Epoch,
}

impl GuardError {
    pub(crate) fn from_diesel(context: &GuardContext<'_>, error: DieselError) -> Self {
        if is_not_installed(&error) {
            return GuardError::NotInstalled {
                operation: context.operation,
                source: error,
            };
        }
        if is_read_only(&error) {
            return GuardError::ReadOnlyServer {
                operation: context.operation,
                source: error,
            };
        }
        if let DieselError::DatabaseError(_, info) = &error {
            let detail = info.details().unwrap_or("");
            match info.constraint_name() {
                Some(names::INVALID_INPUT) => {
                    return GuardError::InvalidInput {
                        violations: decode::violations(info.as_ref()),
                    }
                }
                Some(names::GUARD_STALE) => {
                    if let Some(accepted) =
                        decode::detail_field(detail, "accepted").and_then(|v| v.parse().ok())
                    {
                        return GuardError::StaleEpoch {
                            resource: context.resource.to_owned(),
                            presented: context.epoch,
                            accepted,
                        };
                    }
                }
                Some(names::GUARD_WRONG_KEY) => {
                    if let Some(fenced_by) = decode::fenced_by(detail) {
                        return GuardError::WrongLeaseKey {
                            resource: context.resource.to_owned(),
                            fenced_by: fenced_by.to_owned(),
                            presented: context.key.to_owned(),
                        };
                    }
                }
                Some(names::GUARD_EPOCH_NOT_GRANTED) => {
                    if let Some(counter) =
                        decode::detail_field(detail, "counter").and_then(|v| v.parse().ok())
                    {
                        return GuardError::EpochNotGranted {
                            resource: context.resource.to_owned(),
                            key: context.key.to_owned(),
                            presented: context.epoch,
                            counter,
                        };
                    }
                }
                Some(names::NAMESPACE_DENIED) => {
                    let refused = decode::forbidden(detail);
                    let (argument, name) = match &refused {
                        Some(refused) => (refused.argument, refused.name),
                        // A DETAIL this client cannot read: the resource is
                        // the name a guard call is about.
                        None if context.resource.is_empty() => ("key", context.key),
                        None => ("resource", context.resource),
                    };
                    return GuardError::Forbidden {
                        operation: context.operation,
                        argument: argument.to_owned(),
                        name: name.to_owned(),
                        role: refused.map_or_else(String::new, |r| r.role.to_owned()),
                    };
                }
                Some(names::GUARD_NOT_HELD) => {
                    let newest = decode::detail_field(detail, "newest")
                        .and_then(|newest| newest.parse().ok());
                    let reason = decode::detail_field(detail, "reason")
                        .and_then(Status::parse)
                        .and_then(|status| {
                            let why = decode::detail_field(detail, "why");
                            Refusal::from_answer(status, why, newest, context.epoch.get())
                        });
                    if let Some(reason) = reason {
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

    /// An input rule broken before the call was sent.
    pub(crate) fn invalid(violation: String) -> Self {
        GuardError::InvalidInput {
            violations: vec![violation],
        }
    }
}

/// The one discard rule, in a private module: nameable by the sealed
/// traits of `crate::api`, not by users.
mod call {
    /// The error of a call on a pooled connection: how a failed checkout reads
    /// in it, and whether it means the connection must not serve another call.
    /// One rule for every face and error type.
    pub trait CallError {
        /// A checkout from the sync pool that failed.
        fn from_checkout(error: r2d2::Error) -> Self;
        /// A checkout from the async pool that failed.
        #[cfg(feature = "async")]
        fn from_async_checkout(error: diesel_async::pooled_connection::deadpool::PoolError)
            -> Self;
        /// Whether the connection the call ran on is dead, reaches a server
        /// that turned read-only, or lost its prepared statements, so it must
        /// leave the pool.
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

impl CallError for GuardError {
    fn from_checkout(error: r2d2::Error) -> Self {
        GuardError::Pool(error)
    }

    #[cfg(feature = "async")]
    fn from_async_checkout(error: diesel_async::pooled_connection::deadpool::PoolError) -> Self {
        GuardError::AsyncPool(error)
    }

    fn discards_connection(&self) -> bool {
        self.is_connection_error()
    }
}

impl LeaseError {
    /// Whether the error says the connection (not the request) failed, or
    /// that it reaches the wrong server: a read-only one, which is what a
    /// failover leaves behind (the old primary demoted, or a standby not
    /// yet promoted). Such a connection is not given back to the pool, and
    /// the waiter and the keeper retry after such an error: the next
    /// connection is opened anew, and libpq, given every host and
    /// `target_session_attrs=read-write`, picks whichever server is the
    /// primary by then.
    pub(crate) fn is_connection_error(&self) -> bool {
        match self {
            LeaseError::Pool(_)
            | LeaseError::OutcomeUnknown { .. }
            | LeaseError::ReadOnlyServer { .. } => true,
            #[cfg(feature = "async")]
            LeaseError::AsyncPool(_) | LeaseError::AsyncConnect { .. } => true,
            LeaseError::Database { source, .. } => is_dead_connection(source),
            _ => false,
        }
    }
}

impl GuardError {
    /// [`LeaseError::is_connection_error`] for a guard call's error: the
    /// same connection failures, and a read-only server.
    pub(crate) fn is_connection_error(&self) -> bool {
        match self {
            GuardError::Pool(_) | GuardError::ReadOnlyServer { .. } => true,
            #[cfg(feature = "async")]
            GuardError::AsyncPool(_) => true,
            GuardError::Database { source, .. } => is_dead_connection(source),
            _ => false,
        }
    }
}

/// Whether diesel says the session itself is gone (not that a statement
/// failed).
fn is_dead_connection(error: &DieselError) -> bool {
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _)
            | DieselError::DatabaseError(DatabaseErrorKind::UnableToSendCommand, _)
            | DieselError::BrokenTransactionManager
    )
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
        let error = InstallError::from_diesel(reported(
            "lease_unsupported_version",
            "minimum=14 server_version=13.11 (Debian 13.11-1.pgdg120+1)",
        ));
        match &error {
            InstallError::UnsupportedVersion { found, minimum } => {
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
        match InstallError::from_diesel(reported("lease_schema_not_owned", "owner=squatter")) {
            InstallError::SchemaNotOwned { owner } => assert_eq!(owner, "squatter"),
            other => panic!("expected SchemaNotOwned, got {other:?}"),
        }
    }

    #[test]
    fn an_unreadable_detail_keeps_the_database_error() {
        let error = InstallError::from_diesel(reported("lease_unsupported_version", "garbled"));
        assert!(matches!(error, InstallError::Database(_)), "{error:?}");
    }
}

/// Why [`crate::aio::connect`] (or an
/// [`AsyncLeaseClient`](crate::aio::AsyncLeaseClient)'s build,
/// [`LeaseError::AsyncConnect`]) could not open a connection.
#[cfg(feature = "async")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The attempt did not complete within `connect_timeout`: the server
    /// accepted nothing, or accepted and never answered (a stopped or
    /// overloaded server, a proxy that hangs). Nothing was left open.
    #[error(
        "no connection to {servers} within {} s (the bound: {setting}, per host)",
        after.as_secs_f64()
    )]
    TimedOut {
        /// The server or servers the URL names, `host:port`, in order.
        servers: String,
        /// How long the attempt was allowed: `connect_timeout` times the
        /// number of hosts.
        after: Duration,
        /// Which `connect_timeout` bounded it and where it came from, e.g.
        /// `connect_timeout=2 from the URL`, `connect_timeout=5 by default`.
        setting: String,
    },
    /// The driver could not connect: refused, unreachable, a wrong
    /// password or database, an invalid URL. The message carries the
    /// whole reason, e.g. `error connecting to server: Connection refused
    /// (os error 111)`.
    #[error("{}", Chain(source))]
    Driver {
        /// tokio-postgres's error, whose source is the reason.
        #[source]
        source: tokio_postgres::Error,
    },
    /// Connected, but the session's first statements (diesel-async's
    /// settings of the session) failed.
    #[error("the new session could not be set up: {source}")]
    Setup {
        /// diesel-async's error.
        #[source]
        source: diesel::ConnectionError,
    },
}

/// An error and its sources, `: `-separated.
#[cfg(feature = "async")]
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

#[cfg(feature = "async")]
impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {error}")?;
            source = error.source();
        }
        Ok(())
    }
}
