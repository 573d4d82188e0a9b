//! Operator actions: namespace rules and forced
//! releases. Their functions are granted to nobody (docs/guide/security.md) and
//! ignore namespace rules, so an operator can repair a key whose role was dropped.
//! A name is governed by its longest bound prefix; membership is judged for the
//! login role (`session_user`), which `SET ROLE` does not change.

use crate::error::Repr;
use diesel::sql_types::{BigInt, Bool, Nullable, Text, Timestamptz};
use std::time::Duration;

use chrono::{DateTime, Utc};

use diesel::pg::PgConnection;

use crate::error::{LeaseError, Operation};
use crate::lease::check_text;
use crate::lease::epoch::Epoch;
use crate::sql::execute::{get_result, Execute};
use crate::sql::{decode, input};
use crate::telemetry;

impl Operation {
    /// `lease.force_release`: an operator frees a key whatever its state.
    pub const FORCE_RELEASE: Operation = Operation::writes("force_release");
    /// `lease.bind_namespace`: an operator binds a key prefix to a role.
    pub const BIND_NAMESPACE: Operation = Operation::writes("bind_namespace");
    /// `lease.unbind_namespace`: an operator removes a prefix's rule.
    pub const UNBIND_NAMESPACE: Operation = Operation::writes("unbind_namespace");
    /// `lease.list_namespaces`: an operator lists the rules.
    pub const LIST_NAMESPACES: Operation = Operation::reads("list_namespaces");
    /// `lease.raise_generation`: an operator raises the generation.
    pub const RAISE_GENERATION: Operation = Operation::writes("raise_generation");
    /// `lease.generation`: the current generation and timeline.
    pub const GENERATION: Operation = Operation::reads("generation");
    /// A privilege question (`admin::function_privilege`).
    pub const PRIVILEGE: Operation = Operation::reads("privilege");
}

crate::sql::calls::lease_call! {
    /// `lease.force_release(key)`: the counter after, NULL if never leased.
    ForceReleaseCall { key: &'a str => Text }
    sql = "SELECT lease.force_release";
    row = Nullable<BigInt>;
    rust = Option<i64>;
}

crate::sql::calls::lease_call! {
    /// `lease.force_release(key, epoch)`: what became of the grant, and the counter.
    ForceReleaseEpochCall { key: &'a str => Text, epoch: i64 => BigInt }
    sql = "SELECT status, counter FROM lease.force_release";
    row = (Text, Nullable<BigInt>);
    rust = (String, Option<i64>);
}

crate::sql::calls::lease_call! {
    /// `lease.bind_namespace(prefix, role)`.
    BindNamespaceCall { prefix: &'a str => Text, role: &'a str => Text }
    sql = "SELECT true AS bound FROM lease.bind_namespace";
    row = Bool;
    rust = bool;
}

crate::sql::calls::lease_call! {
    /// `lease.unbind_namespace(prefix)`: whether a rule was removed.
    UnbindNamespaceCall { prefix: &'a str => Text }
    sql = "SELECT lease.unbind_namespace";
    row = Bool;
    rust = bool;
}

crate::sql::calls::lease_call! {
    /// `lease.list_namespaces()`: every rule, by prefix.
    ListNamespacesCall {}
    sql = "SELECT prefix, role, created_at FROM lease.list_namespaces";
    row = (Text, Text, Timestamptz);
    rust = (String, String, DateTime<Utc>);
}

crate::sql::calls::lease_call! {
    /// `lease.raise_generation(generation)`: the new generation.
    RaiseGenerationCall { generation: i64 => BigInt }
    sql = "SELECT lease.raise_generation";
    row = BigInt;
    rust = i64;
}

crate::sql::calls::lease_call! {
    /// `lease.generation()`: the current generation and timeline.
    GenerationCall {}
    sql = "SELECT generation, timeline FROM lease.generation";
    row = (BigInt, BigInt);
    rust = (i64, i64);
}

crate::sql::calls::cacheable_query! {
    /// (allowed, role): whether the connected role may execute the function named.
    FunctionPrivilegeCall { function: &'a str => Text }
    row = (Nullable<Bool>, Text);
    rust = (Option<bool>, String);
    |call, out| {
        out.push_sql("SELECT has_function_privilege(to_regprocedure(");
        out.push_bind_param::<Text, _>(&call.function)?;
        out.push_sql("), 'EXECUTE'), current_user::text");
        Ok(())
    }
}

/// One namespace rule, as `Operator::list_namespaces` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceRule {
    /// The bound prefix: names starting with it, with no longer bound prefix, follow this rule.
    pub prefix: String,
    /// Whose members may act on the names the rule governs.
    pub role: BoundRole,
    /// When the prefix was bound (or last rebound), on the server's clock.
    pub created_at: DateTime<Utc>,
}

/// The role a namespace rule admits.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BoundRole {
    /// An existing role, by name: its members may act.
    Role(String),
    /// The role was dropped or renamed after the rule was made, in the
    /// cluster where it was made. The rule fails closed: nobody but
    /// superusers may act on its names until an operator rebinds or unbinds
    /// the prefix. (A new role with the old name does not revive it: within
    /// a cluster, rules hold the role's oid.)
    Dropped {
        /// The dropped role's oid.
        oid: u32,
    },
    /// The rule came from another cluster (a restored dump) and no role
    /// here has the name it was bound to. It fails closed like
    /// [`BoundRole::Dropped`]; creating a role of that name, or binding the
    /// prefix again, repairs it (across clusters, rules follow names).
    Missing {
        /// The name the rule was bound to.
        name: String,
    },
}

impl std::fmt::Display for BoundRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BoundRole::Role(name) => f.write_str(name),
            BoundRole::Dropped { oid } => write!(f, "(dropped role, oid {oid})"),
            BoundRole::Missing { name } => write!(f, "(missing role {name})"),
        }
    }
}

/// The connection's `Operator::bind_namespace`: its documentation is there.
pub(crate) async fn bind_namespace(
    conn: &mut impl Execute,
    prefix: &str,
    role: &str,
) -> Result<(), LeaseError> {
    telemetry::lease_call(Operation::BIND_NAMESPACE, prefix, "", None, async move {
        let autocommit = conn.in_autocommit();
        check_name("prefix", prefix)?;
        check_name("role", role)?;
        get_result(
            conn,
            BindNamespaceCall {
                prefix,
                role,
                _borrow: std::marker::PhantomData,
            },
        )
        .await
        .map(|_| ())
        .map_err(|error| LeaseError::from_keyless(Operation::BIND_NAMESPACE, error, autocommit))
    })
    .await
}

/// The connection's `Operator::unbind_namespace`: its documentation is there.
pub(crate) async fn unbind_namespace(
    conn: &mut impl Execute,
    prefix: &str,
) -> Result<bool, LeaseError> {
    telemetry::lease_call(Operation::UNBIND_NAMESPACE, prefix, "", None, async move {
        let autocommit = conn.in_autocommit();
        check_name("prefix", prefix)?;
        get_result(
            conn,
            UnbindNamespaceCall {
                prefix,
                _borrow: std::marker::PhantomData,
            },
        )
        .await
        .map_err(|error| LeaseError::from_keyless(Operation::UNBIND_NAMESPACE, error, autocommit))
    })
    .await
}

/// The connection's `Operator::list_namespaces`: its documentation is there.
pub(crate) async fn list_namespaces(
    conn: &mut impl Execute,
) -> Result<Vec<NamespaceRule>, LeaseError> {
    telemetry::lease_call(Operation::LIST_NAMESPACES, "", "", None, async move {
        let autocommit = conn.in_autocommit();
        let rows = conn
            .load(ListNamespacesCall {
                _borrow: std::marker::PhantomData,
            })
            .await
            .map_err(|error| {
                LeaseError::from_keyless(Operation::LIST_NAMESPACES, error, autocommit)
            })?;
        Ok(rows
            .into_iter()
            .map(|(prefix, role, created_at)| NamespaceRule {
                prefix,
                role: match (decode::dropped_role(&role), decode::missing_role(&role)) {
                    (Some(oid), _) => BoundRole::Dropped { oid },
                    (None, Some(name)) => BoundRole::Missing {
                        name: name.to_owned(),
                    },
                    (None, None) => BoundRole::Role(role),
                },
                created_at,
            })
            .collect())
    })
    .await
}

/// The connection's `Operator::force_release`: its documentation is there.
pub(crate) async fn force_release(
    conn: &mut impl Execute,
    key: &str,
) -> Result<Option<Epoch>, LeaseError> {
    telemetry::lease_call(Operation::FORCE_RELEASE, key, "", None, async move {
        check_text("key", key)?;
        let call = ForceReleaseCall {
            key,
            _borrow: std::marker::PhantomData,
        };
        let autocommit = conn.in_autocommit();
        get_result(conn, call).await.map_err(|error| {
            LeaseError::from_diesel(
                Operation::FORCE_RELEASE,
                error,
                key,
                Duration::ZERO,
                autocommit,
            )
        })
    })
    .await
    .map(|counter| counter.map(Epoch::new))
}

/// What `Operator::force_release_epoch` did with the grant it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForcedRelease {
    /// The grant ended, as its holder's release would have ended it: its
    /// epoch and every lower one are stale, its holder hears `not_owner`,
    /// and waiters were woken.
    Released {
        /// The key's counter now, the grant's epoch + 1: every epoch up to
        /// it is stale; fence resources up to it (`Fencing::fence`).
        counter: Epoch,
    },
    /// The key is held (or lapsed) under a higher epoch: the grant asked
    /// for ended already and someone acquired the key since. Nothing
    /// changed; that newer grant is left alone.
    NewerGrant {
        /// The epoch of the grant the key has now.
        current_epoch: Epoch,
    },
    /// The key is free and its counter is at or above the epoch asked for:
    /// that grant, if there ever was one, has ended. Nothing changed.
    AlreadyFree {
        /// The key's counter.
        counter: Epoch,
    },
    /// The key was never leased (`counter` is `None`), or the epoch is
    /// above every epoch the key was granted. Nothing changed.
    NoSuchGrant {
        /// The key's counter, `None` for a never-leased key.
        counter: Option<Epoch>,
    },
}

/// The connection's `Operator::force_release_epoch`: its documentation is there.
pub(crate) async fn force_release_epoch(
    conn: &mut impl Execute,
    key: &str,
    epoch: Epoch,
) -> Result<ForcedRelease, LeaseError> {
    let epoch = epoch.get();
    telemetry::lease_call(
        Operation::FORCE_RELEASE,
        key,
        "",
        Some(epoch),
        async move {
    check_text("key", key)?;
    if epoch < 1 {
        return Err(LeaseError::from(Repr::InvalidInput {
            violations: vec!["epoch must be at least 1".to_owned()],
        }));
    }
    let call = ForceReleaseEpochCall {
        key,
        epoch,
        _borrow: std::marker::PhantomData,
    };
    let autocommit = conn.in_autocommit();
    let (status, counter) = get_result(conn, call).await.map_err(|error| {
        LeaseError::from_diesel(
            Operation::FORCE_RELEASE,
            error,
            key,
            Duration::ZERO,
            autocommit,
        )
    })?;
    match (status.as_str(), counter) {
        ("released", Some(counter)) => Ok(ForcedRelease::Released {
            counter: Epoch::new(counter),
        }),
        ("newer_grant", Some(current_epoch)) => Ok(ForcedRelease::NewerGrant {
            current_epoch: Epoch::new(current_epoch),
        }),
        ("already_free", Some(counter)) => Ok(ForcedRelease::AlreadyFree {
            counter: Epoch::new(counter),
        }),
        ("no_such_grant", counter) => Ok(ForcedRelease::NoSuchGrant {
            counter: counter.map(Epoch::new),
        }),
        // An answer this client cannot read: the installed SQL is newer.
        _ => Err(LeaseError::from(Repr::Database {
            operation: Operation::FORCE_RELEASE,
            source: diesel::result::Error::DeserializationError(
                format!("unexpected lease force_release answer {status:?}: the installed SQL is newer than this client").into(),
            ),
        })),
    }
},
    )
    .await
}

/// How far an epoch's generation is shifted: a grant's epoch is at least
/// `(generation << GENERATION_SHIFT) + 1`, above every epoch of a lower generation.
pub const GENERATION_SHIFT: u32 = 40;

/// The highest generation, 2^23 − 1: the epochs of its first 2^40 grants
/// and releases of a key, from `(MAX_GENERATION << GENERATION_SHIFT) + 1`
/// on, are still positive `bigint`s.
pub const MAX_GENERATION: i64 = (1 << 23) - 1;

/// The server's generation, as `Operator::generation` reports it: a promotion
/// raises it, so the new primary's epochs start above every epoch of the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation {
    /// The generation: 0 on a server that was never promoted, restored onto
    /// a new timeline, restored from a dump or raised by an operator.
    pub generation: i64,
    /// The server's current timeline (on a standby, the timeline of its
    /// last restartpoint).
    pub timeline: i64,
}

impl Generation {
    /// The lowest epoch a grant can get in this generation,
    /// `(generation << 40) + 1`: every grant from now on, of every key, is
    /// at least this.
    pub fn floor_epoch(&self) -> Epoch {
        Epoch::new((self.generation << GENERATION_SHIFT) + 1)
    }
}

/// The connection's `Operator::generation`: its documentation is there.
pub(crate) async fn generation(conn: &mut impl Execute) -> Result<Generation, LeaseError> {
    telemetry::lease_call(Operation::GENERATION, "", "", None, async move {
        let autocommit = conn.in_autocommit();
        let (generation, timeline) = get_result(
            conn,
            GenerationCall {
                _borrow: std::marker::PhantomData,
            },
        )
        .await
        .map_err(|error| LeaseError::from_keyless(Operation::GENERATION, error, autocommit))?;
        Ok(Generation {
            generation,
            timeline,
        })
    })
    .await
}

/// The connection's `Operator::raise_generation`: its documentation is there.
pub(crate) async fn raise_generation(
    conn: &mut impl Execute,
    generation: i64,
) -> Result<i64, LeaseError> {
    telemetry::lease_call(Operation::RAISE_GENERATION, "", "", None, async move {
        let autocommit = conn.in_autocommit();
        if generation > MAX_GENERATION {
            return Err(LeaseError::from(Repr::GenerationTooHigh {
                operation: Operation::RAISE_GENERATION,
                highest: MAX_GENERATION,
                requested: generation,
            }));
        }
        get_result(
            conn,
            RaiseGenerationCall {
                generation,
                _borrow: std::marker::PhantomData,
            },
        )
        .await
        .map_err(|error| {
            LeaseError::from_raise_generation(
                Operation::RAISE_GENERATION,
                error,
                generation,
                autocommit,
            )
        })
    })
    .await
}

/// Whether the connected role may run a function, as
/// [`function_privilege`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FunctionPrivilege {
    /// The role holds EXECUTE on it (or is its owner or a superuser).
    Granted,
    /// The role lacks EXECUTE on it: operator functions are granted to
    /// nobody by default; the owner grants it with
    /// `GRANT EXECUTE ON FUNCTION <function> TO <role>`.
    NotGranted {
        /// The role asked about (`current_user`).
        role: String,
    },
    /// No function has that signature in this database: the installed
    /// leasehold is older than the function (or not installed at all).
    Missing,
}

/// Whether the connected role (`current_user`) may execute `function`, a
/// signature as `GRANT` names it (`lease.force_release(text)`).
///
/// Why: a role without EXECUTE on an operator function gets PostgreSQL's
/// own "permission denied for function" (SQLSTATE 42501, no constraint
/// name), which reaches Rust as [`ErrorKind::Other`](crate::ErrorKind::Other), indistinguishable
/// by anything stable from other failures. Asking after such a failure
/// tells a missing grant apart, so a command can name the GRANT that fixes
/// it. Ask outside a failed transaction: an aborted one refuses every
/// statement until it ends.
///
/// ```no_run
/// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::LeaseError> {
/// use leasehold::admin::{function_privilege, FunctionPrivilege};
/// if let FunctionPrivilege::NotGranted { role } = function_privilege(conn, "lease.force_release(text)")? {
///     eprintln!("GRANT EXECUTE ON FUNCTION lease.force_release(text) TO {role}");
/// }
/// # Ok(()) }
/// ```
pub fn function_privilege(
    conn: &mut PgConnection,
    function: &str,
) -> Result<FunctionPrivilege, LeaseError> {
    crate::sql::execute::finish(function_privilege_on(conn, function))
}

/// [`function_privilege`] on either face's connection (the async face's
/// is the async face's `function_privilege`).
pub(crate) async fn function_privilege_on(
    conn: &mut impl Execute,
    function: &str,
) -> Result<FunctionPrivilege, LeaseError> {
    check_name("function", function)?;
    let autocommit = conn.in_autocommit();
    let (allowed, role) = get_result(
        conn,
        FunctionPrivilegeCall {
            function,
            _borrow: std::marker::PhantomData,
        },
    )
    .await
    .map_err(|error| LeaseError::from_keyless(Operation::PRIVILEGE, error, autocommit))?;
    Ok(match allowed {
        Some(true) => FunctionPrivilege::Granted,
        Some(false) => FunctionPrivilege::NotGranted { role },
        None => FunctionPrivilege::Missing,
    })
}

/// Checks a name for what PostgreSQL cannot store.
fn check_name(field: &str, value: &str) -> Result<(), LeaseError> {
    input::text(field, value).map_err(LeaseError::invalid)
}

impl telemetry::Outcome for Vec<NamespaceRule> {
    fn outcome(&self) -> &'static str {
        "listed"
    }
}

impl telemetry::Outcome for ForcedRelease {
    fn outcome(&self) -> &'static str {
        match self {
            ForcedRelease::Released { .. } => "released",
            ForcedRelease::NewerGrant { .. } => "newer_grant",
            ForcedRelease::AlreadyFree { .. } => "already_free",
            ForcedRelease::NoSuchGrant { .. } => "no_such_grant",
        }
    }
}

impl telemetry::Outcome for Generation {
    fn outcome(&self) -> &'static str {
        "read"
    }
}
