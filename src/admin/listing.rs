//! Listing keys (`leasehold ls`, docs/guide/operations.md) in one call of
//! `lease.list_leases` on the server's clock. An operator call because the tables
//! are closed to callers (docs/PRIVILEGES.md); the privilege is asked first, so a
//! refusal does not abort the caller's transaction. States and expiries come from
//! `lease._live` and `lease._expiry`, so they cannot drift from the lease calls.

use crate::error::Repr;
use chrono::{DateTime, TimeDelta, Utc};
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text, Timestamptz};

use crate::error::{LeaseError, Operation};
use crate::lease::epoch::Epoch;
use crate::sql::execute::{get_result, Execute};
use crate::sql::input;
use crate::telemetry;

impl Operation {
    /// A listing of keys (`Operator::list_leases`).
    pub const LIST_LEASES: Operation = Operation::reads("list_leases");
}

/// (allowed, role) for a listing's SELECTs, asked first so a refusal names the
/// role instead of aborting the caller's transaction.
pub(crate) const LIST_PRIVILEGE: &str = "SELECT has_table_privilege('lease.leases', 'SELECT') \
AND has_table_privilege('lease.groups', 'SELECT'), current_user::text";

crate::sql::calls::cacheable_query! {
    /// [`LIST_PRIVILEGE`]: (allowed, role).
    ListPrivilegeCall {}
    row = (Bool, Text);
    rust = (bool, String);
    |_call, out| {
        out.push_sql(LIST_PRIVILEGE);
        Ok(())
    }
}

crate::sql::calls::lease_call! {
    /// `lease.list_leases(prefix, holder, states, sort, max_rows)`, states and expiries
    /// decided by the SQL's own rules; every row carries `read_at`, the one row if none matched.
    ListLeasesCall {
        prefix: &'a str => Text,
        owner: Option<&'a str> => Nullable<Text>,
        states: Vec<&'a str> => Array<Text>,
        order: &'static str => Text,
        limit: i64 => BigInt
    }
    sql = "SELECT read_at, key, digest, state, owner, epoch, expires_at FROM lease.list_leases";
    row = (Timestamptz, Nullable<Text>, Nullable<Text>, Nullable<Text>, Nullable<Text>, Nullable<BigInt>, Nullable<Timestamptz>);
    rust = (DateTime<Utc>, Option<String>, Option<String>, Option<String>, Option<String>, Option<i64>, Option<DateTime<Utc>>);
}

/// A key's state, decided on the server's clock as every lease call decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyState {
    /// A live grant: its own or its group's expiry is ahead of the server's clock.
    Held,
    /// An expired grant: anyone may acquire the key; the row still names the holder.
    Lapsed,
    /// No grant: released or force-released (the row keeps the counter).
    Free,
}

impl KeyState {
    /// The state as `leasehold ls` prints it: `held`, `lapsed` or `free`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Held => "held",
            KeyState::Lapsed => "lapsed",
            KeyState::Free => "free",
        }
    }

    /// Reads the SQL's spelling back (`None`: the installed SQL is newer).
    fn parse(text: &str) -> Option<Self> {
        match text {
            "held" => Some(KeyState::Held),
            "lapsed" => Some(KeyState::Lapsed),
            "free" => Some(KeyState::Free),
            _ => None,
        }
    }
}

impl std::fmt::Display for KeyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The order of a listing's rows; ties broken by key, so listings are stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ListOrder {
    /// By key, byte order.
    #[default]
    Key,
    /// Soonest effective expiry first (longest lapsed first); free keys last.
    Expires,
    /// Highest epoch (for a free key: its counter) first.
    Epoch,
}

impl ListOrder {
    /// How the statement names the order.
    fn as_sql(self) -> &'static str {
        match self {
            ListOrder::Key => "key",
            ListOrder::Expires => "expires",
            ListOrder::Epoch => "epoch",
        }
    }
}

/// Which keys `Operator::list_leases` returns, and in
/// what order: every key by default.
/// ```
/// use leasehold::admin::{KeyState, ListFilter, ListOrder};
/// let filter = ListFilter::new().prefix("job-").state(KeyState::Lapsed).order(ListOrder::Expires).limit(20);
/// assert_eq!(filter.states, [KeyState::Lapsed]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListFilter {
    /// Only keys starting with this prefix (byte-wise); empty for every key.
    pub prefix: String,
    /// Only keys whose grant, held or lapsed, is this owner's (exact; free never matches).
    pub owner: Option<String>,
    /// Only keys in one of these states; empty for every state.
    pub states: Vec<KeyState>,
    /// The order of the rows.
    pub order: ListOrder,
    /// At most this many rows after filtering and ordering; `None` for all (0 is refused).
    pub limit: Option<u64>,
}

impl ListFilter {
    /// Every key, by key.
    pub fn new() -> Self {
        ListFilter::default()
    }

    /// Only keys starting with `prefix`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Only keys whose grant, held or lapsed, belongs to `owner`.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Adds `state` to the states listed (none added: every state).
    pub fn state(mut self, state: KeyState) -> Self {
        self.states.push(state);
        self
    }

    /// Orders the rows by `order`.
    pub fn order(mut self, order: ListOrder) -> Self {
        self.order = order;
        self
    }

    /// At most `limit` rows (at least 1).
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = Some(limit);
        self
    }
}

/// One key as `Operator::list_leases` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedLease {
    /// The key.
    pub key: String,
    /// The key's hex SHA-256, what its release notifications carry instead of the name.
    pub digest: String,
    /// Decided by `lease._live` on the server's clock, at or just after [`Listing::read_at`].
    pub state: KeyState,
    /// The holder, or the lapsed grant's owner; `None` when free.
    pub owner: Option<String>,
    /// The grant's epoch; for a free key, its counter (every epoch up to it is stale).
    pub epoch: Epoch,
    /// The effective expiry (later of the grant's and its group's); `None` when free.
    pub expires_at: Option<DateTime<Utc>>,
    /// `expires_at` minus [`Listing::read_at`], both server time: time left if held,
    /// since when if lapsed; `None` when free.
    pub remaining: Option<TimeDelta>,
}

/// What `Operator::list_leases` read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listing {
    /// The server's clock when the listing began reading, present even if nothing matched.
    pub read_at: DateTime<Utc>,
    /// The keys the filter selected, in its order.
    pub leases: Vec<ListedLease>,
}

/// The connection's `Operator::list_leases`.
pub(crate) async fn list_leases(
    conn: &mut impl Execute,
    filter: &ListFilter,
) -> Result<Listing, LeaseError> {
    telemetry::lease_call(
        Operation::LIST_LEASES,
        &filter.prefix,
        filter.owner.as_deref().unwrap_or(""),
        None,
        async move {
            let limit = check(filter)?;
            let autocommit = conn.in_autocommit();
            let failed =
                |error| LeaseError::from_keyless(Operation::LIST_LEASES, error, autocommit);
            let (allowed, role) = get_result(
                conn,
                ListPrivilegeCall {
                    _borrow: std::marker::PhantomData,
                },
            )
            .await
            .map_err(failed)?;
            if !allowed {
                return Err(LeaseError::from(Repr::ListNotPermitted {
                    operation: Operation::LIST_LEASES,
                    role,
                }));
            }
            let states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
            let rows = conn
                .load(ListLeasesCall {
                    prefix: &filter.prefix,
                    owner: filter.owner.as_deref(),
                    states,
                    order: filter.order.as_sql(),
                    limit,
                    _borrow: std::marker::PhantomData,
                })
                .await
                .map_err(failed)?;
            let mut read_at = None;
            let mut leases = Vec::with_capacity(rows.len());
            for (now, key, digest, state, owner, epoch, expires_at) in rows {
                read_at = Some(now);
                // The clock's own row when no key matched.
                let (Some(key), Some(digest), Some(state), Some(epoch)) =
                    (key, digest, state, epoch)
                else {
                    continue;
                };
                let state = KeyState::parse(&state)
                    .ok_or_else(|| crate::lease::unexpected(Operation::LIST_LEASES, &state))?;
                leases.push(ListedLease {
                    key,
                    digest,
                    state,
                    owner,
                    epoch: Epoch::new(epoch),
                    remaining: expires_at.map(|expires_at| expires_at - now),
                    expires_at,
                });
            }
            let read_at = read_at
                .ok_or_else(|| crate::lease::unexpected(Operation::LIST_LEASES, "no rows"))?;
            Ok(Listing { read_at, leases })
        },
    )
    .await
}

/// Checks a filter before sending; answers the row limit as the statement takes it.
fn check(filter: &ListFilter) -> Result<i64, LeaseError> {
    let mut violations = Vec::new();
    if let Err(violation) = input::text("prefix", &filter.prefix) {
        violations.push(violation);
    }
    if let Some(owner) = &filter.owner {
        if owner.is_empty() {
            violations.push("owner must not be empty".to_owned());
        } else if let Err(violation) = input::text("owner", owner) {
            violations.push(violation);
        }
    }
    if filter.limit == Some(0) {
        violations.push("limit must be at least 1".to_owned());
    }
    if !violations.is_empty() {
        return Err(LeaseError::from(Repr::InvalidInput { violations }));
    }
    // A limit beyond every row a table can hold is no limit.
    Ok(filter
        .limit
        .map_or(i64::MAX, |limit| i64::try_from(limit).unwrap_or(i64::MAX)))
}

impl telemetry::Outcome for Listing {
    fn outcome(&self) -> &'static str {
        "listed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn states_read_back_as_they_are_spelled() {
        for state in [KeyState::Held, KeyState::Lapsed, KeyState::Free] {
            assert_eq!(KeyState::parse(state.as_str()), Some(state));
            assert_eq!(state.to_string(), state.as_str());
        }
        assert_eq!(KeyState::parse("busy"), None);
    }

    #[test]
    fn bad_filters_are_refused_with_every_violation() {
        let mut filter = ListFilter::new().prefix("a\0").owner("").limit(0);
        match check(&filter) {
            Err(error) if error.kind() == ErrorKind::InvalidInput => assert_eq!(
                error.violations(),
                [
                    "prefix must not contain NUL characters",
                    "owner must not be empty",
                    "limit must be at least 1"
                ]
            ),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
        filter.owner = Some("w\0".to_owned());
        filter.prefix.clear();
        filter.limit = None;
        assert!(matches!(check(&filter), Err(error) if error.kind() == ErrorKind::InvalidInput));
    }

    #[test]
    fn limits_are_passed_on_and_huge_ones_mean_all() {
        assert_eq!(check(&ListFilter::new()).ok(), Some(i64::MAX));
        assert_eq!(check(&ListFilter::new().limit(3)).ok(), Some(3));
        assert_eq!(
            check(&ListFilter::new().limit(u64::MAX)).ok(),
            Some(i64::MAX)
        );
    }
}
