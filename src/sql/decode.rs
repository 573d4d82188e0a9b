//! Reading the SQL functions' answers: status texts and error DETAILs.

use diesel::result::DatabaseErrorInformation;

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

/// The value of `name=` in a DETAIL of space-separated fields our SQL writes.
pub(crate) fn detail_field<'d>(detail: &'d str, name: &str) -> Option<&'d str> {
    detail
        .split(' ')
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
}

/// The key of a wrong-key DETAIL: everything after `fenced_by=` (keys may hold spaces).
pub(crate) fn fenced_by(detail: &str) -> Option<&str> {
    detail.strip_prefix("fenced_by=")
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

/// A namespace refusal's DETAIL, `<argument>=<name> role=<role>` (from
/// `lease._raise_forbidden`): the role after the last ` role=`, so names may hold spaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Forbidden<'d> {
    /// `key` or `resource`.
    pub(crate) argument: &'d str,
    /// The refused key or resource name.
    pub(crate) name: &'d str,
    /// The session user that was refused.
    pub(crate) role: &'d str,
}

/// Reads a namespace refusal's DETAIL.
pub(crate) fn forbidden(detail: &str) -> Option<Forbidden<'_>> {
    let (argument, rest) = detail.split_once('=')?;
    let (name, role) = rest.rsplit_once(" role=")?;
    Some(Forbidden {
        argument,
        name,
        role,
    })
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
    fn forbidden_detail_keeps_spaces_and_equals_signs_in_the_name() {
        assert_eq!(
            forbidden("key=billing/a b=c role=attacker"),
            Some(Forbidden {
                argument: "key",
                name: "billing/a b=c",
                role: "attacker",
            })
        );
        assert_eq!(
            forbidden("resource=r role=x role=app"),
            Some(Forbidden {
                argument: "resource",
                name: "r role=x",
                role: "app",
            })
        );
        assert_eq!(forbidden("no fields"), None);
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
