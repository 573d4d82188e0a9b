//! Operator actions (docs/SPECIFICATION.md §4): binding key namespaces to
//! roles, listing and removing those bindings, and freeing a key whatever
//! its state. (`fence`, the guard-side operator action, lives with the
//! guards.)
//!
//! The SQL functions behind these are granted to nobody: the role that
//! installed leasehold runs them, or grants EXECUTE on them to an operator
//! role (README.md, "Security model"). Application roles cannot run them.
//! They do not obey namespace rules: an operator acts on every name, which
//! is what lets it repair a key whose role was dropped.
//!
//! A namespace rule binds a prefix to a role. A key or resource name is
//! governed by the rule with the longest prefix it starts with; only members
//! of that rule's role (and superusers) may act on it, and a rule whose role
//! was dropped admits nobody. Without any rule every role may act on every
//! name. Membership is judged for the *login* role (`session_user`), with
//! every role it is a member of; `SET ROLE` changes nothing about it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::pg::PgConnection;
use diesel::RunQueryDsl;

use crate::errors::{LeaseError, NamespaceError, Operation};
use crate::leases::check_text;
use crate::sql::calls::{
    BindNamespaceCall, ForceReleaseCall, ListNamespacesCall, UnbindNamespaceCall,
};
use crate::sql::{decode, input};

/// One namespace rule, as [`list_namespaces`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceRule {
    /// The bound prefix: every key and resource name starting with it, for
    /// which no longer bound prefix matches, is governed by this rule.
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
    /// The role was dropped after the rule was made. The rule fails closed:
    /// nobody but superusers may act on its names until an operator rebinds
    /// or unbinds the prefix. (A new role with the old name does not revive
    /// it: rules hold the role's oid.)
    Dropped {
        /// The dropped role's oid.
        oid: u32,
    },
}

impl std::fmt::Display for BoundRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BoundRole::Role(name) => f.write_str(name),
            BoundRole::Dropped { oid } => write!(f, "(dropped role, oid {oid})"),
        }
    }
}

/// Operator action: binds `prefix` to the existing role named `role` (the
/// name as stored, not an SQL identifier: no quotes, case matters), or
/// rebinds it. From the commit on, names governed by this prefix may be used
/// only by members of `role`.
///
/// Rules protect names, not rows: a key already held by a non-member stays
/// held, but its holder can no longer renew, release or admit with it, so
/// bind prefixes before applications use them (or [`force_release`] the
/// keys concerned).
///
/// ```no_run
/// # fn demo(conn: &mut diesel::PgConnection) -> Result<(), leasehold::NamespaceError> {
/// leasehold::bind_namespace(conn, "billing/", "billing_app")?;
/// # Ok(()) }
/// ```
pub fn bind_namespace(
    conn: &mut PgConnection,
    prefix: &str,
    role: &str,
) -> Result<(), NamespaceError> {
    check_name("prefix", prefix)?;
    check_name("role", role)?;
    BindNamespaceCall {
        prefix,
        role,
        _borrow: std::marker::PhantomData,
    }
    .get_result::<bool>(conn)
    .map(|_| ())
    .map_err(|error| NamespaceError::from_diesel(Operation::BindNamespace, error))
}

/// Operator action: removes the rule for exactly `prefix`. Returns whether
/// there was one. The names it governed fall to the next-longest bound
/// prefix, or to no rule at all (every role may act).
pub fn unbind_namespace(conn: &mut PgConnection, prefix: &str) -> Result<bool, NamespaceError> {
    check_name("prefix", prefix)?;
    UnbindNamespaceCall {
        prefix,
        _borrow: std::marker::PhantomData,
    }
    .get_result::<bool>(conn)
    .map_err(|error| NamespaceError::from_diesel(Operation::UnbindNamespace, error))
}

/// Operator action: every namespace rule, ordered by prefix (byte order).
pub fn list_namespaces(conn: &mut PgConnection) -> Result<Vec<NamespaceRule>, NamespaceError> {
    let rows = ListNamespacesCall {
        _borrow: std::marker::PhantomData,
    }
    .get_results::<(String, String, DateTime<Utc>)>(conn)
    .map_err(|error| NamespaceError::from_diesel(Operation::ListNamespaces, error))?;
    Ok(rows
        .into_iter()
        .map(|(prefix, role, created_at)| NamespaceRule {
            prefix,
            role: match decode::dropped_role(&role) {
                Some(oid) => BoundRole::Dropped { oid },
                None => BoundRole::Role(role),
            },
            created_at,
        })
        .collect())
}

/// Operator action: frees `key` whatever its state. A held or lapsed grant
/// ends as a release would end it: the counter moves on by one, so its
/// epoch (and every lower one) is stale from then on, its holder's renew
/// and release answer `not_owner`, and waiters for the key are woken.
///
/// Returns the key's counter after the call, `None` for a key that was
/// never leased (nothing is written). Every epoch at or below the counter
/// is stale: fence resources up to it ([`crate::fence`]) so that even a
/// writer that never heard of the forced release is refused by a
/// token-checked guard. A key that was already free keeps its counter.
///
/// Acts on every key, whatever the namespace rules say: only the grant of
/// EXECUTE on `lease.force_release(text)` limits who may call it. A role
/// without it gets [`LeaseError::Database`], whose source is PostgreSQL's
/// "permission denied for function force_release".
pub fn force_release(conn: &mut PgConnection, key: &str) -> Result<Option<i64>, LeaseError> {
    check_text("key", key)?;
    let call = ForceReleaseCall {
        key,
        _borrow: std::marker::PhantomData,
    };
    let autocommit = crate::leases::in_autocommit(conn);
    call.get_result::<Option<i64>>(conn).map_err(|error| {
        LeaseError::from_diesel(
            Operation::ForceRelease,
            error,
            key,
            Duration::ZERO,
            autocommit,
        )
    })
}

/// Checks a name for what PostgreSQL cannot store.
fn check_name(field: &str, value: &str) -> Result<(), NamespaceError> {
    input::text(field, value).map_err(NamespaceError::invalid)
}
