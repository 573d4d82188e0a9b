//! Heartbeat groups: one row write keeps a whole set of one owner's grants
//! alive, whatever their number (docs/SPECIFICATION.md §1.9).
//!
//! [`crate::Leases::renew_many`] renews a thousand keys in one call, but still
//! writes a thousand rows: on a disk with fast commits that costs as much as
//! dozens of single renews. A group is what etcd calls attaching keys to one
//! lease: [`join_group`](crate::Leases::join_group) renews the keys once and puts them into a group,
//! and from then on [`renew_group`](crate::Leases::renew_group) extends the group's one row, and with it
//! every member. A member is live until the later of its own expiry and its
//! group's, so every check of a key (a takeover, a guard, inspect, pruning)
//! sees the group's heartbeat.
//!
//! The group's answer counts its members: a member leaves when it is
//! released, force-released, or taken over after the group lapsed, so a
//! heartbeat that answers fewer members than were joined tells the caller
//! to ask [`crate::Leases::renew_many`] which keys it lost. A lapsed group is never
//! renewed again; the keys that are still live join a new one.
//! [`crate::hold::KeeperSet`] does all of this for its keys.
//!
//! ```no_run
//! # fn demo(conn: &mut diesel::PgConnection, held: Vec<leasehold::Lease>) -> Result<(), leasehold::LeaseError> {
//! use std::time::Duration;
//! use leasehold::Leases;
//! let joined = conn.join_group(&held, Duration::from_secs(30))?;
//! let Some(group) = joined.group else { return Ok(()) }; // no key was renewed
//! // ... once per heartbeat:
//! match conn.renew_group(group, "worker-a1", Duration::from_secs(30))? {
//!     leasehold::batch::GroupRenewal::Renewed { members, .. } if members == joined.renewed() => {}
//!     _ => { /* some key is lost: renew_many tells which */ }
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::batch::many::{check_answers, key_renewal, Batch, SplitGrants};
use crate::error::{LeaseError, Operation};
use crate::lease::outcome::{KeyRenewal, Refusal, Renewal};
use crate::lease::{check_text, interval, status_refusal, unexpected};
use crate::sql::calls::{JoinGroupCall, RenewGroupCall};
use crate::sql::execute::{get_result, Execute};
use crate::telemetry;

/// A heartbeat group, as [`join_group`](crate::Leases::join_group) made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupId(i64);

impl GroupId {
    /// The id the SQL functions use (`lease.groups.id`).
    pub fn get(self) -> i64 {
        self.0
    }

    /// A group id read from elsewhere (for example a `lease.join_group`
    /// call made in SQL).
    pub fn from_raw(id: i64) -> Self {
        GroupId(id)
    }
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "group {}", self.0)
    }
}

/// What [`join_group`](crate::Leases::join_group) answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused key was not joined and must stop its holder"]
pub struct GroupJoin {
    /// The new group holding every renewed key; `None` when no key was
    /// renewed (then no group was made).
    pub group: Option<GroupId>,
    /// Each key's answer, in the order given: what [`crate::Leases::renew_many`]
    /// would have answered. The renewed keys are the group's members.
    pub keys: Vec<KeyRenewal>,
}

impl GroupJoin {
    /// How many keys were renewed and joined: the members a heartbeat of
    /// the group should answer while none is lost.
    pub fn renewed(&self) -> usize {
        self.keys
            .iter()
            .filter(|answer| matches!(answer.renewal, Renewal::Renewed { .. }))
            .count()
    }
}

/// What [`renew_group`](crate::Leases::renew_group) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused heartbeat must stop the holder of every member"]
pub enum GroupRenewal {
    /// The group, and every member still in it, is live until `expires_at`.
    Renewed {
        /// The group's new expiry (server time).
        expires_at: DateTime<Utc>,
        /// How many grants are still in the group. Fewer than were joined
        /// means some were lost (see the module documentation).
        members: usize,
    },
    /// Nothing changed: [`Refusal::Lapsed`] when the group's expiry passed
    /// (its members' grants may have been taken over), [`Refusal::NeverHeld`]
    /// when there is no such group or it is another owner's.
    Refused(Refusal),
}

/// The connection's [`crate::Leases::join_group`]: its documentation is there.
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
    telemetry::lease_call(
        Operation::JoinGroup,
        "",
        owner,
        None,
        join_group_unobserved(conn, owner, &grants, ttl),
    )
    .await
}

/// [`join_group`](crate::Leases::join_group) without its span and counters.
async fn join_group_unobserved(
    conn: &mut impl Execute,
    owner: &str,
    grants: &[(&str, i64)],
    ttl: Duration,
) -> Result<GroupJoin, LeaseError> {
    let batch = Batch::new(owner, grants)?;
    let on_error = batch.on_error(Operation::JoinGroup, conn);
    let call = JoinGroupCall {
        keys: batch.keys,
        owner,
        epochs: batch.epochs,
        ttl: interval("ttl", ttl)?,
        key_hashes: batch.key_hashes,
        _borrow: std::marker::PhantomData,
    };
    let rows = conn.load(call).await.map_err(on_error)?;
    check_answers(Operation::JoinGroup, grants, rows.iter().map(|row| &row.0))?;
    let group = rows.first().and_then(|row| row.3).map(GroupId);
    let mut keys = Vec::with_capacity(rows.len());
    for ((key, status, expires_at, _), (_, epoch)) in rows.into_iter().zip(grants) {
        let grant = (key, owner, *epoch);
        keys.push(key_renewal(conn, Operation::JoinGroup, grant, &status, expires_at).await?);
    }
    let joined = GroupJoin { group, keys };
    if joined.group.is_some() != (joined.renewed() > 0) {
        return Err(unexpected(
            Operation::JoinGroup,
            "a group without renewed keys, or renewed keys without a group",
        ));
    }
    Ok(joined)
}

/// The connection's [`crate::Leases::renew_group`]: its documentation is there.
pub(crate) async fn renew_group(
    conn: &mut impl Execute,
    group: GroupId,
    owner: &str,
    ttl: Duration,
) -> Result<GroupRenewal, LeaseError> {
    telemetry::lease_call(
        Operation::RenewGroup,
        "",
        owner,
        None,
        renew_group_unobserved(conn, group, owner, ttl),
    )
    .await
}

/// [`renew_group`](crate::Leases::renew_group) without its span and counters.
async fn renew_group_unobserved(
    conn: &mut impl Execute,
    group: GroupId,
    owner: &str,
    ttl: Duration,
) -> Result<GroupRenewal, LeaseError> {
    check_text("owner", owner)?;
    let call = RenewGroupCall {
        group_id: group.0,
        owner,
        ttl: interval("ttl", ttl)?,
        _borrow: std::marker::PhantomData,
    };
    let autocommit = conn.in_autocommit();
    let (status, expires_at, members) = get_result(conn, call).await.map_err(|error| {
        LeaseError::from_diesel(Operation::RenewGroup, error, "", Duration::ZERO, autocommit)
    })?;
    match (
        status_refusal(Operation::RenewGroup, &status)?,
        expires_at,
        members,
    ) {
        (None, Some(expires_at), Some(members)) => Ok(GroupRenewal::Renewed {
            expires_at,
            members: usize::try_from(members)
                .map_err(|_| unexpected(Operation::RenewGroup, "a negative member count"))?,
        }),
        (Some(refusal), _, _) => Ok(GroupRenewal::Refused(refusal)),
        _ => Err(unexpected(
            Operation::RenewGroup,
            "ok without an expiry or a member count",
        )),
    }
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
