//! The operator commands: `namespace bind | unbind | ls`, `force-release`
//! and `generation raise` (with `generation show`, which any role may run),
//! and how a refused operator action is explained.
//!
//! Operator functions are granted to nobody by default, so "you were not
//! granted this" is their most common failure, and it deserves a message
//! that says which GRANT fixes it. PostgreSQL reports it as SQLSTATE 42501
//! "permission denied for function", but diesel exposes neither the
//! SQLSTATE nor anything else stable about it, and message text is never
//! parsed here. So when an operator call fails, the command asks the server
//! whether the role holds EXECUTE on the function
//! ([`leasehold::admin::function_privilege`]) and says so; otherwise the
//! failure is reported as it came.

use diesel::PgConnection;
use leasehold::{
    admin::{function_privilege, BoundRole, ForcedRelease, FunctionPrivilege, NamespaceRule},
    error::LeaseError,
};

use crate::failure::{report, CliError};
use crate::json::Json;
use crate::output::Printer;
use crate::table;
use leasehold::admin::Operator;

/// The SQL signatures of the operator functions, as a GRANT names them.
pub const FENCE: &str = "lease.fence(text, text, bigint)";
const FORCE_RELEASE: &str = "lease.force_release(text)";
const FORCE_RELEASE_EPOCH: &str = "lease.force_release(text, bigint)";
const BIND: &str = "lease.bind_namespace(text, text)";
const UNBIND: &str = "lease.unbind_namespace(text)";
const LIST: &str = "lease.list_namespaces()";
const RAISE_GENERATION: &str = "lease.raise_generation(bigint)";

/// `leasehold namespace bind PREFIX ROLE`.
pub fn bind(
    conn: &mut PgConnection,
    out: Printer,
    prefix: &str,
    role: &str,
) -> Result<(), CliError> {
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
pub fn unbind(conn: &mut PgConnection, out: Printer, prefix: &str) -> Result<(), CliError> {
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
pub fn list(conn: &mut PgConnection, out: Printer) -> Result<(), CliError> {
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

/// `leasehold force-release KEY`.
pub fn force_release(conn: &mut PgConnection, out: Printer, key: &str) -> Result<(), CliError> {
    if key.is_empty() {
        return Err(CliError::InvalidInput("KEY must not be empty".into()));
    }
    let counter = match conn.force_release(key) {
        Ok(counter) => counter,
        Err(error @ leasehold::LeaseError::Database { .. }) => {
            return Err(explain(
                conn,
                FORCE_RELEASE,
                CliError::Database(report(&error)),
            ))
        }
        Err(error) => return Err(CliError::from_lease(error)),
    };
    let text = match counter {
        Some(counter) => format!(
            "{key} is free; its counter is {counter}: every epoch up to {counter} is stale from now on (fence guarded resources with `leasehold fence RESOURCE --key {key} --up-to {counter}`)"
        ),
        None => format!("{key} was never leased; nothing changed"),
    };
    let json = Json::Object(vec![
        ("key", Json::str(key)),
        ("exists", Json::Bool(counter.is_some())),
        ("epoch", Json::int(counter.map(leasehold::Epoch::get))),
    ]);
    Ok(out.emit(&text, &json)?)
}

/// `leasehold release --force KEY --epoch N`: ends exactly grant N.
/// Exit 0 when grant N is over afterwards without a newer grant in the way
/// (`released`, or `already_free`: running it twice is harmless); a key
/// held under a newer epoch, or an epoch never granted, is a failure of the
/// command (exit 5 / 6) so a script notices that what it saw is gone.
pub fn force_release_epoch(
    conn: &mut PgConnection,
    out: Printer,
    key: &str,
    epoch: i64,
) -> Result<(), CliError> {
    let outcome = match conn.force_release_epoch(key, leasehold::Epoch::new(epoch)) {
        Ok(outcome) => outcome,
        Err(error @ leasehold::LeaseError::Database { .. }) => {
            return Err(explain(
                conn,
                FORCE_RELEASE_EPOCH,
                CliError::Database(report(&error)),
            ))
        }
        Err(error) => return Err(CliError::from_lease(error)),
    };
    let (status, counter, text) = match outcome {
        ForcedRelease::Released { counter } => (
            "released",
            counter,
            format!(
                "ended grant {epoch} of {key}; its counter is {counter}: every epoch up to {counter} is stale from now on (fence guarded resources with `leasehold fence RESOURCE --key {key} --up-to {counter}`)"
            ),
        ),
        ForcedRelease::AlreadyFree { counter } => (
            "already_free",
            counter,
            format!("{key} is free already (counter {counter}): grant {epoch} has ended; nothing changed"),
        ),
        ForcedRelease::NewerGrant { current_epoch } => {
            return Err(CliError::ForceReleaseRefused {
                key: key.to_owned(),
                epoch,
                status: "newer_grant",
                counter: Some(current_epoch.get()),
            })
        }
        ForcedRelease::NoSuchGrant { counter } => {
            return Err(CliError::ForceReleaseRefused {
                key: key.to_owned(),
                epoch,
                status: "no_such_grant",
                counter: counter.map(leasehold::Epoch::get),
            })
        }
        // ForcedRelease is non_exhaustive: an outcome this command does
        // not know changed nothing it can describe.
        other => {
            return Err(CliError::Database(format!(
                "unexpected answer of lease.force_release: {other:?}"
            )))
        }
    };
    let json = Json::Object(vec![
        ("key", Json::str(key)),
        ("epoch", Json::Int(epoch)),
        ("status", Json::str(status)),
        ("counter", Json::Int(counter.get())),
    ]);
    Ok(out.emit(&text, &json)?)
}

/// `leasehold generation show`.
pub fn show_generation(conn: &mut PgConnection, out: Printer) -> Result<(), CliError> {
    let now = conn
        .generation()
        .map_err(|error| generation_failure(conn, None, error))?;
    let text = format!(
        "generation {} (timeline {}): every grant from now on has an epoch of at least {}",
        now.generation,
        now.timeline,
        now.floor_epoch()
    );
    Ok(out.emit(&text, &generation_json(now))?)
}

/// `leasehold generation raise GENERATION`.
pub fn raise_generation(
    conn: &mut PgConnection,
    out: Printer,
    generation: i64,
) -> Result<(), CliError> {
    conn.raise_generation(generation)
        .map_err(|error| generation_failure(conn, Some(RAISE_GENERATION), error))?;
    let now = conn
        .generation()
        .map_err(|error| generation_failure(conn, None, error))?;
    let text = format!(
        "raised the generation to {}: every grant from now on, of every key, has an epoch of at least {}",
        now.generation,
        now.floor_epoch()
    );
    Ok(out.emit(&text, &generation_json(now))?)
}

fn generation_json(now: leasehold::admin::Generation) -> Json {
    Json::Object(vec![
        ("generation", Json::Int(now.generation)),
        ("timeline", Json::Int(now.timeline)),
        ("floor_epoch", Json::Int(now.floor_epoch().get())),
    ])
}

fn generation_failure(
    conn: &mut PgConnection,
    function: Option<&'static str>,
    error: LeaseError,
) -> CliError {
    match error {
        LeaseError::GenerationNotAbove { requested, current } => CliError::InvalidInput(format!(
            "GENERATION {requested} is not above the current generation {current}; a generation is only ever raised; nothing changed"
        )),
        LeaseError::GenerationTooHigh { requested } => CliError::InvalidInput(format!(
            "GENERATION {requested} is above the highest generation, {}; nothing changed",
            leasehold::admin::MAX_GENERATION
        )),
        LeaseError::InvalidInput { violations } => {
            CliError::InvalidInput(violations.join("; "))
        }
        other => {
            let failure = CliError::Database(report(&other));
            match function {
                Some(function) => explain(conn, function, failure),
                None => failure,
            }
        }
    }
}

fn namespace_failure(
    conn: &mut PgConnection,
    function: &'static str,
    error: LeaseError,
) -> CliError {
    match error {
        LeaseError::InvalidInput { violations } => CliError::InvalidInput(violations.join("; ")),
        other => explain(conn, function, CliError::Database(report(&other))),
    }
}

/// The error to show for a failed call of operator function `function`:
/// [`CliError::NotGranted`] when the role lacks EXECUTE on it, a note that
/// the installed leasehold predates it when it does not exist, else
/// `failure` as it is.
pub fn explain(conn: &mut PgConnection, function: &'static str, failure: CliError) -> CliError {
    match function_privilege(conn, function) {
        Ok(FunctionPrivilege::NotGranted { role }) => CliError::NotGranted { role, function },
        Ok(FunctionPrivilege::Missing) => CliError::Database(format!(
            "{function} does not exist in this database: the installed leasehold is older than this command; run `leasehold install` as the role that installed it"
        )),
        // Granted after all (or the check itself failed): the call failed
        // for another reason, which `failure` tells.
        _ => failure,
    }
}
