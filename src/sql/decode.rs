//! Reading the server's answers: status texts, the JSON DETAIL of a
//! refusal, the invalid-input DETAIL, role labels, and the few errors the
//! server raises itself that diesel gives no code for. diesel exposes
//! neither SQLSTATE nor any field beyond message, DETAIL, HINT and
//! constraint name, so those few are told by their message text; this
//! module is the only place that reads one. Turning an error into a
//! `LeaseError` is `server_error`'s job.

use diesel::result::{DatabaseErrorInformation, Error as DieselError};

/// The status of a renew or release, or why a lease-checked write was refused.
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
    /// `None` for a status this client does not know (newer installed SQL).
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

/// The violations in an invalid-input DETAIL (`; `-separated), else the message.
pub(crate) fn violations(info: &(dyn DatabaseErrorInformation + Send + Sync)) -> Vec<String> {
    match info.details() {
        Some(detail) if !detail.is_empty() => detail.split("; ").map(str::to_owned).collect(),
        _ => vec![info.message().to_owned()],
    }
}

/// A refusal's DETAIL as `lease._detail` writes it: one JSON object whose
/// values are strings or null, so a key or owner may hold any character.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Detail(serde_json::Map<String, serde_json::Value>);

impl Detail {
    /// The DETAIL of `info`, when it is such an object (`None` for another
    /// server's or an older installation's text).
    pub(crate) fn of(info: &(dyn DatabaseErrorInformation + Send + Sync)) -> Option<Self> {
        Self::parse(info.details()?)
    }

    /// Reads a DETAIL's text.
    pub(crate) fn parse(detail: &str) -> Option<Self> {
        match serde_json::from_str(detail).ok()? {
            serde_json::Value::Object(fields) => Some(Detail(fields)),
            _ => None,
        }
    }

    /// The text of field `name`; `None` when absent or null.
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.0.get(name)?.as_str()
    }

    /// Field `name` read as a number (numbers travel as decimal text).
    pub(crate) fn number<T: std::str::FromStr>(&self, name: &str) -> Option<T> {
        self.text(name)?.parse().ok()
    }

    /// The argument and name of a namespace refusal (`key` or `resource`,
    /// or `key_prefix` when a fence was refused) and the refused role.
    pub(crate) fn forbidden(&self) -> Option<(&str, &str, &str)> {
        let role = self.text("role")?;
        ["key", "resource", "key_prefix"]
            .into_iter()
            .find_map(|argument| Some((argument, self.text(argument)?, role)))
    }
}

/// The role of a refused install's DETAIL: everything after `owner=`.
pub(crate) fn schema_owner(detail: &str) -> Option<&str> {
    detail.strip_prefix("owner=")
}

/// What a refused install's DETAIL says another role can change (`what=`).
pub(crate) fn schema_not_private(detail: &str) -> Option<&str> {
    detail.strip_prefix("what=")
}

/// The role and database of `role=<role> database=<database>`, split at the last ` database=`.
pub(crate) fn role_and_database(detail: &str) -> Option<(&str, &str)> {
    detail.strip_prefix("role=")?.rsplit_once(" database=")
}

/// The minimum major and server version of `minimum=<major> server_version=<text>`.
pub(crate) fn unsupported_version(detail: &str) -> Option<(u32, &str)> {
    let (minimum, found) = detail
        .strip_prefix("minimum=")?
        .split_once(" server_version=")?;
    Some((minimum.parse().ok()?, found))
}

/// Whether diesel's named prepared statement was missing or duplicated on
/// the session (a transaction-mode pooler): the message names diesel's own
/// statement.
pub(crate) fn is_prepared_statement_lost(error: &DieselError) -> bool {
    let DieselError::DatabaseError(_, info) = error else {
        return false;
    };
    let message = info.message();
    message.contains("prepared statement \"__diesel_stmt_")
        && (message.contains("does not exist") || message.contains("already exists"))
}

/// Whether the lease schema or one of its functions is missing (not
/// installed, or an older installation); a translated server's message
/// falls back to a plain database error.
pub(crate) fn is_not_installed(error: &DieselError) -> bool {
    let DieselError::DatabaseError(_, info) = error else {
        return false;
    };
    let message = info.message();
    message.contains("schema \"lease\" does not exist")
        || ((message.starts_with("function lease.") || message.starts_with("relation \"lease."))
            && message.ends_with("does not exist"))
}

/// Whether an error's text is a lock_timeout's (55P03, which diesel does not expose).
pub(crate) fn is_lock_timeout(text: &str) -> bool {
    text.contains("lock timeout")
}

#[cfg(feature = "async")]
/// Whether the server said it is terminating the session (an administrator
/// command or a shutdown), which diesel-async reports as an unknown error.
pub(crate) fn is_session_terminated(info: &(dyn DatabaseErrorInformation + Send + Sync)) -> bool {
    info.message().starts_with("terminating connection")
}

/// Whether a failed connection's text (libpq's, or tokio-postgres's, with
/// its causes) says the URL or the credentials are wrong: retrying it
/// unchanged fails again. A server that is down, slow or unreachable by
/// name is not one of them.
pub(crate) fn is_configuration_error(text: &str) -> bool {
    const MARKS: &[&str] = &[
        "password authentication failed",
        "no pg_hba.conf entry",
        "invalid connection option",
        "invalid connection url",
        "missing \"=\" after",
        "invalid uri",
        "invalid integer value",
        "invalid port number",
        "invalid sslmode value",
        "invalid value for parameter",
        "invalid connection string",
        "invalid configuration",
        "unknown option",
        "ssl was required",
        "password missing",
        "password authentication",
    ];
    let text = text.to_lowercase();
    MARKS.iter().any(|mark| text.contains(mark))
        || ((text.contains("role \"") || text.contains("database \""))
            && text.contains("\" does not exist"))
}

/// The oid in a dropped role's label `pg_dropped_role(<oid>)`; no real role starts with `pg_`.
pub(crate) fn dropped_role(label: &str) -> Option<u32> {
    label
        .strip_prefix("pg_dropped_role(")?
        .strip_suffix(')')?
        .parse()
        .ok()
}

/// The name in `pg_missing_role(<name>)` (a rule from another cluster), up to the last `)`.
pub(crate) fn missing_role(label: &str) -> Option<&str> {
    label
        .strip_prefix("pg_missing_role(")?
        .strip_suffix(')')
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_keeps_spaces_equals_signs_and_quotes_in_its_values() {
        let detail = Detail::parse(
            r#"{"key" : "billing/a b=c \"q\"", "role" : "attacker", "newest" : null, "epoch" : "7"}"#,
        )
        .unwrap();
        assert_eq!(detail.text("key"), Some("billing/a b=c \"q\""));
        assert_eq!(
            detail.forbidden(),
            Some(("key", "billing/a b=c \"q\"", "attacker"))
        );
        assert_eq!(detail.text("newest"), None);
        assert_eq!(detail.number::<i64>("epoch"), Some(7));
        assert_eq!(detail.number::<i64>("key"), None);
        assert_eq!(Detail::parse("key=a role=b"), None);
        assert_eq!(Detail::parse("[1]"), None);
    }

    #[test]
    fn unsupported_version_detail_keeps_spaces_in_the_version() {
        assert_eq!(
            unsupported_version("minimum=14 server_version=13.11 (Debian 13.11-1)"),
            Some((14, "13.11 (Debian 13.11-1)"))
        );
        assert_eq!(unsupported_version("minimum=x server_version=13.1"), None);
        assert_eq!(unsupported_version("owner=app"), None);
    }

    #[test]
    fn dropped_role_labels_are_told_from_role_names() {
        assert_eq!(dropped_role("pg_dropped_role(16390)"), Some(16390));
        assert_eq!(dropped_role("app"), None);
        assert_eq!(dropped_role("pg_dropped_role(x)"), None);
        assert_eq!(missing_role("pg_missing_role(alice)"), Some("alice"));
        assert_eq!(missing_role("pg_missing_role(a(b))"), Some("a(b)"));
        assert_eq!(missing_role("pg_missing_role()"), None);
        assert_eq!(missing_role("alice"), None);
        assert_eq!(dropped_role("pg_missing_role(16390)"), None);
    }
}
