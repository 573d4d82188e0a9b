//! A grant as the command line names it (KEY OWNER EPOCH, or a fencing
//! token), checked before any call, and the status object `renew` and
//! `release` print about it.

use chrono::{DateTime, Utc};
use leasehold::{Epoch, FencingToken};

use crate::failure::CliError;
use crate::json::Json;

/// Parses a fencing token as `acquire` prints it (`--token`).
pub fn parse_token(text: &str) -> Result<FencingToken, String> {
    text.parse()
        .map_err(|error| format!("not a fencing token as acquire prints it: {error}"))
}

/// The grant named on the command line, checked as every name the command
/// takes ([`check_names`]) and as every token (an epoch of at least 1).
pub fn token_of(key: &str, owner: &str, epoch: i64) -> Result<FencingToken, CliError> {
    check_names(key, owner)?;
    FencingToken::new(key, owner, Epoch::new(epoch))
        .map_err(|error| CliError::InvalidInput(error.to_string()))
}

/// Empty names are refused by the database too, but saying it here names
/// the argument as the user typed it.
pub fn check_names(key: &str, owner: &str) -> Result<(), CliError> {
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

/// The JSON of a grant that was renewed or released: `status` first, so a
/// caller may replace it.
pub fn status_json(key: &str, owner: &str, epoch: i64, expires_at: Option<DateTime<Utc>>) -> Json {
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
