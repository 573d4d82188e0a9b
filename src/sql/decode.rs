//! Reading the SQL functions' answers: status texts and the DETAIL of the
//! errors they raise.

use diesel::result::DatabaseErrorInformation;

/// The status of a renew or release (or the reason a lease-checked write
/// was refused), as the SQL functions spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// The call applied.
    Ok,
    /// Unknown key, free key, or another owner's grant.
    NotOwner,
    /// The caller's grant expired (and may have been taken over).
    Lapsed,
    /// The caller holds the key under another epoch.
    EpochMismatch,
}

impl Status {
    /// Parses a status text; `None` for a text this client does not know
    /// (installed SQL newer than the client).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "ok" => Some(Status::Ok),
            "not_owner" => Some(Status::NotOwner),
            "lapsed" => Some(Status::Lapsed),
            "epoch_mismatch" => Some(Status::EpochMismatch),
            _ => None,
        }
    }
}

/// The violations listed in an invalid-input error's DETAIL (separated by
/// `; `), or its message when there is no DETAIL.
pub(crate) fn violations(info: &(dyn DatabaseErrorInformation + Send + Sync)) -> Vec<String> {
    match info.details() {
        Some(detail) if !detail.is_empty() => detail.split("; ").map(str::to_owned).collect(),
        _ => vec![info.message().to_owned()],
    }
}

/// The value of `name=` in a DETAIL of space-separated fields. The fields
/// are written by our own SQL, and the values read this way never hold
/// spaces.
pub(crate) fn detail_field<'d>(detail: &'d str, name: &str) -> Option<&'d str> {
    detail
        .split(' ')
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
}

/// The key named by a wrong-key refusal's DETAIL (`fenced_by=<key>`; the
/// key may hold spaces, so it is everything after the prefix).
pub(crate) fn fenced_by(detail: &str) -> Option<&str> {
    detail.strip_prefix("fenced_by=")
}

/// The role named by a refused install's DETAIL (`owner=<role>`; a role
/// name may hold spaces, so it is everything after the prefix).
pub(crate) fn schema_owner(detail: &str) -> Option<&str> {
    detail.strip_prefix("owner=")
}
