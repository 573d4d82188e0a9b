//! Heartbeat groups: `renew_many` still writes a row
//! per key, so `Leases::join_group` puts the keys in a group
//! whose one row `Leases::renew_group` extends; a member is
//! live until the later of its own and the group's expiry. Fewer members than
//! joined means some were lost; a lapsed group is never renewed again.
//! `hold::KeeperSet` does all of this.
//!
//! ```no_run
//! # fn demo(conn: &mut diesel::PgConnection, held: Vec<leasehold::Lease>) -> Result<(), leasehold::LeaseError> {
//! use leasehold::Leases;
//! let ttl = std::time::Duration::from_secs(30);
//! if let Some(group) = conn.join_group(&held, ttl)?.group { conn.renew_group(group, "worker-a1", ttl)?; }
//! # Ok(()) }
//! ```

use diesel::pg::data_types::PgInterval;
use diesel::sql_types::{Array, BigInt, Binary, Integer, Interval, Nullable, Text, Timestamptz};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::batch::many::{check_answers, key_renewal, Batch, SplitGrants};
use crate::error::{LeaseError, Operation};
use crate::lease::outcome::{KeyRenewal, Refusal, Renewal};
use crate::lease::{check_text, interval, status_refusal, unexpected};
use crate::sql::execute::{get_result, Execute};
use crate::telemetry;

impl Operation {
    /// `lease.join_group`: renew several keys into one heartbeat group.
    pub const JOIN_GROUP: Operation = Operation::writes("join_group");
    /// `lease.renew_group`: one heartbeat for every key of a group.
    pub const RENEW_GROUP: Operation = Operation::writes("renew_group");
}

crate::sql::calls::lease_call! {
    /// `lease.join_group(keys, owner, epochs, ttl, key_hashes)`: a row per key, with the new group.
    JoinGroupCall { keys: Vec<&'a str> => Array<Text>, owner: &'a str => Text, epochs: Vec<i64> => Array<BigInt>, ttl: PgInterval => Interval, key_hashes: Vec<Vec<u8>> => Array<Binary> }
    sql = "SELECT key, status, expires_at, group_id FROM lease.join_group";
    row = (Text, Text, Nullable<Timestamptz>, Nullable<BigInt>);
    rust = (String, String, Option<DateTime<Utc>>, Option<i64>);
}

crate::sql::calls::lease_call! {
    /// `lease.renew_group(group_id, owner, ttl)`: one row.
    RenewGroupCall { group_id: i64 => BigInt, owner: &'a str => Text, ttl: PgInterval => Interval }
    sql = "SELECT status, expires_at, members FROM lease.renew_group";
    row = (Text, Nullable<Timestamptz>, Nullable<Integer>);
    rust = (String, Option<DateTime<Utc>>, Option<i32>);
}

/// A heartbeat group, as `Leases::join_group` made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupId(i64);

impl GroupId {
    /// The id the SQL functions use (`lease.groups.id`).
    pub fn get(self) -> i64 {
        self.0
    }

    /// A group id read from elsewhere (e.g. a `lease.join_group` call made in SQL).
    pub fn from_raw(id: i64) -> Self {
        GroupId(id)
    }
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "group {}", self.0)
    }
}

/// What `Leases::join_group` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused key was not joined and must stop its holder"]
pub struct GroupJoin {
    /// The new group of every renewed key; `None` when none was renewed.
    pub group: Option<GroupId>,
    /// Each key's answer in order, as `Leases::renew_many` would; renewed ones are members.
    pub keys: Vec<KeyRenewal>,
}

impl GroupJoin {
    /// How many keys joined: the members a heartbeat should answer while none is lost.
    pub fn renewed(&self) -> usize {
        self.keys
            .iter()
            .filter(|answer| matches!(answer.renewal, Renewal::Renewed { .. }))
            .count()
    }
}

/// What `Leases::renew_group` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused heartbeat must stop the holder of every member"]
pub enum GroupRenewal {
    /// The group, and every member still in it, is live until `expires_at`.
    Renewed {
        /// The group's new expiry (server time).
        expires_at: DateTime<Utc>,
        /// How many grants are still in the group; fewer than joined means some were lost.
        members: usize,
    },
    /// Nothing changed: [`Refusal::Lapsed`] (members may be taken over) or
    /// [`Refusal::NeverHeld`] (no such group, or another owner's).
    Refused(Refusal),
}

/// The connection's `Leases::join_group`.
pub(crate) async fn join_group(
    conn: &mut impl Execute,
    grants: SplitGrants<'_>,
    ttl: Duration,
) -> Result<GroupJoin, LeaseError> {
    let Some((owner, grants)) = grants? else {
        return Ok(GroupJoin {
            group: None,
            keys: Vec::new(),
        });
    };
    telemetry::lease_call(Operation::JOIN_GROUP, "", owner, None, async move {
        let grants = &grants;
        let batch = Batch::new(owner, grants)?;
        let on_error = batch.on_error(Operation::JOIN_GROUP, conn);
        let call = JoinGroupCall {
            keys: batch.keys,
            owner,
            epochs: batch.epochs,
            ttl: interval("ttl", ttl)?,
            key_hashes: batch.key_hashes,
            _borrow: std::marker::PhantomData,
        };
        let rows = conn.load(call).await.map_err(on_error)?;
        check_answers(Operation::JOIN_GROUP, grants, rows.iter().map(|row| &row.0))?;
        let group = rows.first().and_then(|row| row.3).map(GroupId);
        let mut keys = Vec::with_capacity(rows.len());
        for ((key, status, expires_at, _), (_, epoch)) in rows.into_iter().zip(grants) {
            let grant = (key, owner, *epoch);
            keys.push(key_renewal(conn, Operation::JOIN_GROUP, grant, &status, expires_at).await?);
        }
        let joined = GroupJoin { group, keys };
        if joined.group.is_some() != (joined.renewed() > 0) {
            return Err(unexpected(
                Operation::JOIN_GROUP,
                "a group without renewed keys, or renewed keys without a group",
            ));
        }
        Ok(joined)
    })
    .await
}

/// The connection's `Leases::renew_group`.
pub(crate) async fn renew_group(
    conn: &mut impl Execute,
    group: GroupId,
    owner: &str,
    ttl: Duration,
) -> Result<GroupRenewal, LeaseError> {
    telemetry::lease_call(Operation::RENEW_GROUP, "", owner, None, async move {
        check_text("owner", owner)?;
        let call = RenewGroupCall {
            group_id: group.0,
            owner,
            ttl: interval("ttl", ttl)?,
            _borrow: std::marker::PhantomData,
        };
        let autocommit = conn.in_autocommit();
        let (status, expires_at, members) = get_result(conn, call).await.map_err(|error| {
            LeaseError::from_diesel(
                Operation::RENEW_GROUP,
                error,
                "",
                Duration::ZERO,
                autocommit,
            )
        })?;
        match (
            status_refusal(Operation::RENEW_GROUP, &status)?,
            expires_at,
            members,
        ) {
            (None, Some(expires_at), Some(members)) => Ok(GroupRenewal::Renewed {
                expires_at,
                members: usize::try_from(members)
                    .map_err(|_| unexpected(Operation::RENEW_GROUP, "a negative member count"))?,
            }),
            (Some(refusal), _, _) => Ok(GroupRenewal::Refused(refusal)),
            _ => Err(unexpected(
                Operation::RENEW_GROUP,
                "ok without an expiry or a member count",
            )),
        }
    })
    .await
}

impl telemetry::Outcome for GroupJoin {
    fn outcome(&self) -> &'static str {
        if self.group.is_some() {
            "joined"
        } else {
            "refused"
        }
    }
}

impl telemetry::Outcome for GroupRenewal {
    fn outcome(&self) -> &'static str {
        match self {
            GroupRenewal::Renewed { .. } => "renewed",
            GroupRenewal::Refused(why) => why.as_status(),
        }
    }
}
