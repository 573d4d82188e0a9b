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
use leasehold::guard::Fencing;

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
        // Released before, by its holder or an operator, and the key still
        // free: the grant is over, which is what the caller asked for, so
        // running it twice is harmless (exit 0). The words are the
        // refusal's, as everywhere: SQL answered not_owner.
        Release::Refused(why @ (Refusal::Released | Refusal::ForceReleased)) => {
            let by = match why {
                Refusal::ForceReleased => "by an operator",
                _ => "by its holder",
            };
            let text = format!(
                "grant {epoch} of {key} was released already, {by}, and the key is free; nothing changed"
            );
            let mut json = status_json(key, owner, epoch, None);
            if let Json::Object(fields) = &mut json {
                fields[0] = ("status", Json::str(why.as_reason()));
                fields.insert(1, ("sql_status", Json::str(why.as_status())));
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
    let Some(state) = conn.inspect(key).map_err(CliError::from_lease)? else {
        let text = format!("{key} was never leased (no row); the first grant will be epoch 1");
        let json = Json::Object(vec![
            ("key", Json::str(key)),
            ("exists", Json::Bool(false)),
            ("state", Json::Null),
            ("held", Json::Bool(false)),
            ("owner", Json::Null),
            ("epoch", Json::Null),
            ("expires_at", Json::Null),
        ]);
        return Ok(out.emit(&text, &json)?);
    };
    // The words `leasehold ls` prints: the holder and expiry of a grant,
    // held or lapsed; how a free key's last grant ended.
    let (owner, expires_at, ended) = match &state {
        LeaseState::Held {
            owner, expires_at, ..
        } => (Some(owner.as_str()), Some(*expires_at), None),
        LeaseState::Lapsed {
            owner, expired_at, ..
        } => (Some(owner.as_str()), Some(*expired_at), None),
        LeaseState::Free { force_released, .. } => (
            None,
            None,
            Some(if *force_released {
                "force_released"
            } else {
                "released"
            }),
        ),
    };
    let text = crate::table::render(
        &["KEY", "STATE", "HOLDER", "EPOCH", "EXPIRES_AT", "ENDED"],
        &[vec![
            key.to_owned(),
            state.as_str().into(),
            owner.unwrap_or("-").into(),
            state.epoch().to_string(),
            expires_at.map_or_else(|| "-".into(), |at| at.to_string()),
            ended.unwrap_or("-").into(),
        ]],
    );
    let json = Json::Object(vec![
        ("key", Json::str(key)),
        ("exists", Json::Bool(true)),
        ("state", Json::str(state.as_str())),
        ("held", Json::Bool(state.is_held())),
        ("owner", owner.map_or(Json::Null, Json::str)),
        ("epoch", Json::Int(state.epoch().get())),
        ("expires_at", Json::time(expires_at)),
        ("ended", ended.map_or(Json::Null, Json::str)),
    ]);
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
