//! The one-shot commands: install, acquire, renew, release, inspect, fence.
//!
//! Each is a thin layer over the library call of the same name: it prints
//! the outcome the caller asked for, and turns every other outcome into a
//! [`CliError`] so the exit code tells a script what happened.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::PgConnection;
use leasehold::{
    Acquisition, Epoch, FencingToken, Lease, LeaseState, Leases, Refusal, Release, Renewal,
};

use crate::duration;
use crate::failure::CliError;
use crate::json::Json;
use crate::output::Printer;

/// `leasehold install`.
pub fn install(conn: &mut PgConnection, out: Printer) -> Result<(), CliError> {
    let report = leasehold::install(conn)
        .map_err(|error| CliError::Database(crate::failure::report(&error)))?;
    let installed = leasehold::admin::installed_versions(conn)
        .map_err(|error| CliError::Database(crate::failure::report(&error)))?;
    let text = if report.applied.is_empty() {
        format!(
            "leasehold is already installed (versions {}); nothing to do",
            installed.join(", ")
        )
    } else {
        format!(
            "installed leasehold migrations {}; the lease functions are ready",
            report.applied.join(", ")
        )
    };
    let strings = |list: &[String]| Json::Array(list.iter().map(Json::str).collect());
    let json = Json::Object(vec![
        ("applied", strings(&report.applied)),
        ("installed", strings(&installed)),
    ]);
    Ok(out.emit(&text, &json)?)
}

/// `leasehold acquire KEY OWNER --ttl T [--wait W]`.
pub fn acquire(
    conn: &mut PgConnection,
    url: &str,
    out: Printer,
    key: &str,
    owner: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<(), CliError> {
    let lease = obtain(conn, url, key, owner, ttl, wait)?;
    print_grant(out, &lease, ttl)
}

/// Acquires `key` for `owner`, waiting up to `wait` when given (and not
/// zero); a denial or a wait that timed out is the error.
pub fn obtain(
    conn: &mut PgConnection,
    url: &str,
    key: &str,
    owner: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<Lease, CliError> {
    check_names(key, owner)?;
    Ok(match wait.filter(|w| !w.is_zero()) {
        // Wake on release (LISTEN/NOTIFY) or at the holder's expiry, holding
        // no transaction while waiting, instead of the SQL 50 ms poll.
        Some(wait) => {
            let client = leasehold::LeaseClient::connect(url, 1).map_err(CliError::from_lease)?;
            let waiter = leasehold::wait::LeaseWaiter::new(&client);
            waiter
                .acquire(key, owner, ttl, leasehold::wait::Wait::AtMost(wait))
                .map_err(|error| match error {
                    leasehold::error::WaitError::TimedOut { key, .. } => {
                        CliError::WaitTimedOut { key, wait }
                    }
                    leasehold::error::WaitError::Lease(error) => CliError::from_lease(error),
                    other => CliError::Database(crate::failure::report(&other)),
                })?
        }
        None => match conn
            .acquire(key, owner, ttl)
            .map_err(CliError::from_lease)?
        {
            Acquisition::Granted(lease) => lease,
            Acquisition::Denied => return Err(denied(conn, key)),
        },
    })
}

/// Builds the denial error, naming the holder if it is still there.
fn denied(conn: &mut PgConnection, key: &str) -> CliError {
    let holder = match conn.inspect(key) {
        Ok(Some(LeaseState::Held {
            owner,
            epoch,
            expires_at,
        })) => Some((owner, epoch.get(), expires_at)),
        _ => None,
    };
    CliError::Denied {
        key: key.to_owned(),
        holder,
    }
}

fn print_grant(out: Printer, lease: &Lease, ttl: Duration) -> Result<(), CliError> {
    let text = format!(
        "acquired {} for {} at epoch {}, expires {} (ttl {})\ntoken: {}",
        lease.key(),
        lease.owner(),
        lease.epoch(),
        lease.expires_at(),
        duration::format(ttl),
        lease.token()
    );
    let json = Json::Object(vec![
        ("acquired", Json::Bool(true)),
        ("key", Json::str(lease.key())),
        ("owner", Json::str(lease.owner())),
        ("epoch", Json::Int(lease.epoch().get())),
        ("expires_at", Json::time(Some(lease.expires_at()))),
        ("token", Json::str(lease.token().to_string())),
    ]);
    Ok(out.emit(&text, &json)?)
}

/// The grant named on the command line, checked as every name the command
/// takes ([`check_names`]) and as every token (an epoch of at least 1).
fn token_of(key: &str, owner: &str, epoch: i64) -> Result<FencingToken, CliError> {
    check_names(key, owner)?;
    FencingToken::new(key, owner, Epoch::new(epoch))
        .map_err(|error| CliError::InvalidInput(error.to_string()))
}

/// `leasehold renew KEY OWNER EPOCH --ttl T`.
pub fn renew(
    conn: &mut PgConnection,
    out: Printer,
    key: &str,
    owner: &str,
    epoch: i64,
    ttl: Duration,
) -> Result<(), CliError> {
    let grant = token_of(key, owner, epoch)?;
    match conn.renew(&grant, ttl).map_err(CliError::from_lease)? {
        Renewal::Renewed { expires_at } => {
            let text = format!(
                "renewed {key} for {owner} at epoch {epoch}, expires {expires_at} (ttl {})",
                duration::format(ttl)
            );
            Ok(out.emit(&text, &status_json(key, owner, epoch, Some(expires_at)))?)
        }
        Renewal::Refused(why) => Err(CliError::Lost {
            operation: "renew",
            key: key.to_owned(),
            owner: owner.to_owned(),
            epoch,
            why,
        }),
    }
}

/// `leasehold release KEY OWNER EPOCH`.
pub fn release(
    conn: &mut PgConnection,
    out: Printer,
    key: &str,
    owner: &str,
    epoch: i64,
) -> Result<(), CliError> {
    let grant = token_of(key, owner, epoch)?;
    match conn.release(&grant).map_err(CliError::from_lease)? {
        Release::Released => {
            let text = format!(
                "released {key} (owner {owner}, epoch {epoch}); epoch {epoch} is stale from now on and the next grant gets a higher one"
            );
            Ok(out.emit(&text, &status_json(key, owner, epoch, None))?)
        }
        // Released before (or freed by an operator): the grant is over and
        // the key free, which is what the caller asked for. Answered like
        // `release --force`'s already_free, so running it twice is harmless.
        Release::Refused(Refusal::NotOwner) if ended_and_free(conn, key, epoch) => {
            let text = format!("{key} is free already: grant {epoch} has ended; nothing changed");
            let mut json = status_json(key, owner, epoch, None);
            if let Json::Object(fields) = &mut json {
                fields[0] = ("status", Json::str("already_released"));
            }
            Ok(out.emit(&text, &json)?)
        }
        Release::Refused(why) => Err(CliError::Lost {
            operation: "release",
            key: key.to_owned(),
            owner: owner.to_owned(),
            epoch,
            why,
        }),
    }
}

/// Whether grant `epoch` of `key` is over with the key free: the key's
/// counter has reached it and nobody holds the key.
fn ended_and_free(conn: &mut PgConnection, key: &str, epoch: i64) -> bool {
    matches!(
        conn.inspect(key),
        Ok(Some(LeaseState::Unowned { epoch: counter })) if epoch >= 1 && epoch <= counter
    )
}

fn status_json(key: &str, owner: &str, epoch: i64, expires_at: Option<DateTime<Utc>>) -> Json {
    let mut fields = vec![
        ("status", Json::str("ok")),
        ("key", Json::str(key)),
        ("owner", Json::str(owner)),
        ("epoch", Json::Int(epoch)),
    ];
    if expires_at.is_some() {
        fields.push(("expires_at", Json::time(expires_at)));
    }
    Json::Object(fields)
}

/// `leasehold inspect KEY`. A never-leased key is a normal answer (exit 0).
pub fn inspect(conn: &mut PgConnection, out: Printer, key: &str) -> Result<(), CliError> {
    if key.is_empty() {
        return Err(CliError::InvalidInput("KEY must not be empty".into()));
    }
    let state = conn.inspect(key).map_err(CliError::from_lease)?;
    let (text, json) = match state {
        None => (
            format!("{key} was never leased (no row); the first grant will be epoch 1"),
            Json::Object(vec![
                ("key", Json::str(key)),
                ("exists", Json::Bool(false)),
                ("held", Json::Bool(false)),
                ("owner", Json::Null),
                ("epoch", Json::Null),
                ("expires_at", Json::Null),
            ]),
        ),
        Some(LeaseState::Held {
            owner,
            epoch,
            expires_at,
        }) => (
            crate::table::render(
                &["KEY", "STATE", "HOLDER", "EPOCH", "EXPIRES_AT"],
                &[vec![
                    key.to_owned(),
                    "held".into(),
                    owner.clone(),
                    epoch.to_string(),
                    expires_at.to_string(),
                ]],
            ),
            Json::Object(vec![
                ("key", Json::str(key)),
                ("exists", Json::Bool(true)),
                ("held", Json::Bool(true)),
                ("owner", Json::str(owner)),
                ("epoch", Json::Int(epoch.get())),
                ("expires_at", Json::time(Some(expires_at))),
            ]),
        ),
        Some(LeaseState::Unowned { epoch }) => (
            crate::table::render(
                &["KEY", "STATE", "HOLDER", "EPOCH", "EXPIRES_AT"],
                &[vec![
                    key.to_owned(),
                    "free".into(),
                    "-".into(),
                    epoch.to_string(),
                    "-".into(),
                ]],
            ),
            Json::Object(vec![
                ("key", Json::str(key)),
                ("exists", Json::Bool(true)),
                ("held", Json::Bool(false)),
                ("owner", Json::Null),
                ("epoch", Json::Int(epoch.get())),
                ("expires_at", Json::Null),
            ]),
        ),
    };
    Ok(out.emit(&text, &json)?)
}

/// `leasehold fence RESOURCE --key KEY --up-to EPOCH`.
pub fn fence(
    conn: &mut PgConnection,
    out: Printer,
    resource: &str,
    key: &str,
    up_to: i64,
) -> Result<(), CliError> {
    let accepted = match conn.fence(resource, key, Epoch::new(up_to)) {
        Ok(accepted) => accepted,
        // An operator action since security part 2: say when the role was
        // not granted it (see `operator::explain`).
        Err(error @ leasehold::error::GuardError::Database { .. }) => {
            return Err(crate::operator::explain(
                conn,
                crate::operator::FENCE,
                CliError::Database(crate::failure::report(&error)),
            ))
        }
        Err(error) => return Err(error.into()),
    };
    let text = format!(
        "fenced {resource} (lease key {key}): epochs up to {} are refused, it admits epochs >= {accepted}",
        accepted.get() - 1
    );
    let json = Json::Object(vec![
        ("resource", Json::str(resource)),
        ("key", Json::str(key)),
        ("accepted_epoch", Json::Int(accepted.get())),
    ]);
    Ok(out.emit(&text, &json)?)
}

/// Empty names are refused by the database too, but saying it here names
/// the argument as the user typed it.
fn check_names(key: &str, owner: &str) -> Result<(), CliError> {
    let mut problems = Vec::new();
    if key.is_empty() {
        problems.push("KEY must not be empty");
    }
    if owner.is_empty() {
        problems.push("OWNER must not be empty");
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::InvalidInput(problems.join("; ")))
    }
}
