//! What the lease operations return: grants, refusals and observed
//! states, as values. Ordinary outcomes are values, not errors: a key held
//! by someone else is [`Acquisition::Denied`]; a renew or release that
//! finds the lease gone is [`Refusal`].
//!
//! These enums are closed on purpose (no `#[non_exhaustive]`): they mirror
//! the SQL functions' fixed set of answers, and a caller must handle each
//! one; a new answer would be a breaking change of the SQL API too.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::epoch::Epoch;
use crate::sql::decode::Status;
use crate::token::FencingToken;

/// A grant: exclusive ownership of `key` by `owner` until `expires_at`
/// (server time), fenced by `epoch`.
///
/// Two `Lease` values are equal when they are the same grant: same key,
/// owner, epoch and expiry. The ttl is this handle's renewal setting, not
/// part of the grant (an idempotent re-acquire with another ttl returns the
/// same grant), so it is left out of the comparison.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The grant's key, owner and epoch.
    pub(crate) token: FencingToken,
    pub(crate) expires_at: DateTime<Utc>,
    pub(crate) ttl: Duration,
}

impl Lease {
    /// The leased key.
    pub fn key(&self) -> &str {
        self.token.key()
    }

    /// The owner the grant was made to.
    pub fn owner(&self) -> &str {
        self.token.owner()
    }

    /// The grant's fencing epoch: present it to guards with every write.
    pub fn epoch(&self) -> Epoch {
        self.token.epoch()
    }

    /// When the grant lapses unless renewed, on the server's clock.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.expires_at
    }

    /// The ttl passed to the acquire that returned this handle: what
    /// [`Lease::renew`] and a [`crate::Keeper`] renew the grant for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The fencing token of this grant, for other services (clone it to
    /// keep it). Calls on the grant take the lease itself.
    pub fn token(&self) -> &FencingToken {
        &self.token
    }
}

/// A lease is a grant: every call that acts on a grant takes
/// `&impl AsRef<FencingToken>`, so it takes a `&Lease` as it takes a token.
impl AsRef<FencingToken> for Lease {
    fn as_ref(&self) -> &FencingToken {
        &self.token
    }
}

impl PartialEq for Lease {
    fn eq(&self, other: &Self) -> bool {
        (&self.token, self.expires_at) == (&other.token, other.expires_at)
    }
}

impl Eq for Lease {}

/// Outcome of [`crate::Leases::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a denied acquire does not grant the lease"]
pub enum Acquisition {
    /// The caller holds the lease. For a caller that already held it, this is
    /// the same grant (same epoch, same expiry).
    Granted(Lease),
    /// Another owner holds a live grant.
    Denied,
}

impl Acquisition {
    /// The lease, if granted.
    pub fn granted(self) -> Option<Lease> {
        match self {
            Acquisition::Granted(lease) => Some(lease),
            Acquisition::Denied => None,
        }
    }
}

/// Why a renew, release or lease-checked write was refused: the caller no
/// longer holds the grant it presented. Stop acting on the lease at once;
/// re-acquire if needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The key is unknown, free, or held (or last held) by someone else.
    NotOwner,
    /// The caller's grant expired (and may have been taken over).
    Lapsed,
    /// The caller holds the key, but under a different epoch.
    EpochMismatch,
}

impl Refusal {
    /// The SQL status text: `not_owner`, `lapsed` or `epoch_mismatch`.
    pub fn as_status(self) -> &'static str {
        match self {
            Refusal::NotOwner => "not_owner",
            Refusal::Lapsed => "lapsed",
            Refusal::EpochMismatch => "epoch_mismatch",
        }
    }

    /// The refusal a SQL status names; `None` for `ok`.
    pub(crate) fn from_status(status: Status) -> Option<Self> {
        match status {
            Status::Ok => None,
            Status::NotOwner => Some(Refusal::NotOwner),
            Status::Lapsed => Some(Refusal::Lapsed),
            Status::EpochMismatch => Some(Refusal::EpochMismatch),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_status())
    }
}

/// Outcome of [`crate::Leases::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused renewal must stop the holder"]
pub enum Renewal {
    /// Extended; the epoch is unchanged.
    Renewed {
        /// The new expiry, server time.
        expires_at: DateTime<Utc>,
    },
    /// Not extended, and nothing changed.
    Refused(Refusal),
}

/// Outcome of [`crate::Leases::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused release did nothing"]
pub enum Release {
    /// The key is free and its fencing counter moved past the released epoch.
    Released,
    /// Nothing changed.
    Refused(Refusal),
}

/// One key's answer to [`crate::Leases::renew_many`]: what [`crate::Leases::renew`] would
/// have answered for that key alone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused renewal must stop the holder of that key"]
pub struct KeyRenewal {
    /// The key, as passed.
    pub key: String,
    /// Renewed with its new expiry, or refused with the reason.
    pub renewal: Renewal,
}

/// One key's answer to [`crate::Leases::release_many`]: what [`crate::Leases::release`]
/// would have answered for that key alone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused release did nothing for that key"]
pub struct KeyRelease {
    /// The key, as passed.
    pub key: String,
    /// Released, or refused with the reason.
    pub release: Release,
}

/// A key's observable state, as [`crate::Leases::inspect`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// A live grant.
    Held {
        /// The holder.
        owner: String,
        /// The grant's epoch.
        epoch: Epoch,
        /// Server-time expiry.
        expires_at: DateTime<Utc>,
    },
    /// Free or lapsed: nobody holds it and anyone may acquire it.
    Unowned {
        /// The fencing counter: every epoch up to and including this one is
        /// stale, and the next grant is strictly greater.
        epoch: Epoch,
    },
}

impl LeaseState {
    /// The epoch reported: the holder's, or the counter when unowned.
    pub fn epoch(&self) -> Epoch {
        match self {
            LeaseState::Held { epoch, .. } | LeaseState::Unowned { epoch } => *epoch,
        }
    }

    /// Whether a live grant exists.
    pub fn is_held(&self) -> bool {
        matches!(self, LeaseState::Held { .. })
    }
}
