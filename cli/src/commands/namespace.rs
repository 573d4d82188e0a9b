//! `leasehold namespace bind | unbind | ls`: the operator binds key
//! prefixes to roles, so that only a role's members may use the keys and
//! resources under a prefix.

use clap::Subcommand;
use diesel::PgConnection;
use leasehold::admin::{BoundRole, NamespaceRule};
use leasehold::error::LeaseError;

use crate::connect::Needs;
use crate::context::Context;
use crate::failure::{report, CliError};
use crate::help::SEE_EXIT_CODES;
use crate::json::Json;
use crate::output::Printer;
use crate::privilege::explain;
use crate::table;
use leasehold::admin::Operator;

/// The operator functions these commands call, as a GRANT names them.
const BIND: &str = "lease.bind_namespace(text, text)";
const UNBIND: &str = "lease.unbind_namespace(text)";
const LIST: &str = "lease.list_namespaces()";

/// Operator: bind key prefixes to roles, so that only a role's members
/// may use the keys and resources under a prefix. Needs EXECUTE on the
/// lease.*_namespace functions (granted to nobody by default).
#[derive(Debug, Subcommand)]
#[command(after_help = SEE_EXIT_CODES)]
pub enum Action {
    /// Bind PREFIX to ROLE (or rebind it): from now on only members of ROLE
    /// (and superusers) may act on keys and resources whose longest bound
    /// prefix is PREFIX.
    #[command(after_help = SEE_EXIT_CODES)]
    Bind {
        /// The prefix of key and resource names, e.g. billing/.
        prefix: String,
        /// The role's name as stored in PostgreSQL (no quotes; case matters).
        role: String,
    },
    /// Remove the rule for exactly PREFIX (names under it fall to the next
    /// longest bound prefix, or to no rule: every role may act).
    #[command(after_help = SEE_EXIT_CODES)]
    Unbind {
        /// The bound prefix.
        prefix: String,
    },
    /// List the rules: prefix, role, when bound.
    #[command(after_help = SEE_EXIT_CODES)]
    Ls,
}

/// `leasehold namespace ...`.
pub fn run(action: Action, ctx: &Context) -> Result<(), CliError> {
    let mut session = ctx.connect(Needs::Installed)?;
    let conn = &mut session.conn;
    let out = ctx.out;
    match action {
        Action::Bind { prefix, role } => bind(conn, out, &prefix, &role),
        Action::Unbind { prefix } => unbind(conn, out, &prefix),
        Action::Ls => list(conn, out),
    }
}

/// `leasehold namespace bind PREFIX ROLE`.
fn bind(conn: &mut PgConnection, out: Printer, prefix: &str, role: &str) -> Result<(), CliError> {
    conn.bind_namespace(prefix, role)
        .map_err(|error| namespace_failure(conn, BIND, error))?;
    let text = format!(
        "bound prefix {prefix:?} to role {role:?}: from now on only members of {role:?} (and superusers) may act on keys and resources under it, unless a longer bound prefix governs them"
    );
    let json = Json::Object(vec![
        ("prefix", Json::str(prefix)),
        ("role", Json::str(role)),
        ("bound", Json::Bool(true)),
    ]);
    Ok(out.emit(&text, &json)?)
}

/// `leasehold namespace unbind PREFIX`. Removing a rule that is not there
/// is not an error (the state asked for holds), but the text says so.
fn unbind(conn: &mut PgConnection, out: Printer, prefix: &str) -> Result<(), CliError> {
    let removed = conn
        .unbind_namespace(prefix)
        .map_err(|error| namespace_failure(conn, UNBIND, error))?;
    let text = if removed {
        format!("removed the rule for prefix {prefix:?}; names under it fall to the next longest bound prefix, or to no rule")
    } else {
        format!("no rule for prefix {prefix:?} (it must match exactly; `leasehold namespace ls` lists the rules); nothing changed")
    };
    let json = Json::Object(vec![
        ("prefix", Json::str(prefix)),
        ("removed", Json::Bool(removed)),
    ]);
    Ok(out.emit(&text, &json)?)
}

/// `leasehold namespace ls`.
fn list(conn: &mut PgConnection, out: Printer) -> Result<(), CliError> {
    let rules = conn
        .list_namespaces()
        .map_err(|error| namespace_failure(conn, LIST, error))?;
    let text = if rules.is_empty() {
        "no namespace rules: every role may act on every key and resource".to_owned()
    } else {
        let rows: Vec<Vec<String>> = rules
            .iter()
            .map(|rule| {
                vec![
                    rule.prefix.clone(),
                    rule.role.to_string(),
                    rule.created_at.to_string(),
                ]
            })
            .collect();
        table::render(&["PREFIX", "ROLE", "CREATED_AT"], &rows)
    };
    let json = Json::Object(vec![(
        "namespaces",
        Json::Array(rules.iter().map(rule_json).collect()),
    )]);
    Ok(out.emit(&text, &json)?)
}

fn rule_json(rule: &NamespaceRule) -> Json {
    let (role, dropped_oid, missing) = match &rule.role {
        BoundRole::Role(name) => (Json::str(name), Json::Null, Json::Null),
        BoundRole::Dropped { oid } => (Json::Null, Json::Int(i64::from(*oid)), Json::Null),
        BoundRole::Missing { name } => (Json::Null, Json::Null, Json::str(name)),
        // BoundRole is non_exhaustive; a future kind shows as text.
        other => (Json::str(other.to_string()), Json::Null, Json::Null),
    };
    Json::Object(vec![
        ("prefix", Json::str(&rule.prefix)),
        ("role", role),
        (
            "role_dropped",
            Json::Bool(!matches!(dropped_oid, Json::Null)),
        ),
        ("dropped_role_oid", dropped_oid),
        ("missing_role", missing),
        ("created_at", Json::time(Some(rule.created_at))),
    ])
}

fn namespace_failure(
    conn: &mut PgConnection,
    function: &'static str,
    error: LeaseError,
) -> CliError {
    match error.violations() {
        [] => explain(conn, function, CliError::Database(report(&error))),
        violations => CliError::InvalidInput(violations.join("; ")),
    }
}
